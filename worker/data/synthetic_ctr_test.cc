#include "worker/data/synthetic_ctr.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

namespace tessera::worker::data {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SyntheticCtr> Make(const SyntheticCtrOptions& options) {
  auto dataset = SyntheticCtr::Create(options);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return std::move(dataset).value();
}

SyntheticCtrOptions Small(uint64_t seed) {
  SyntheticCtrOptions options;
  options.num_samples = 1000;
  options.dense_dim = 4;
  options.field_sizes = {50, 20, 10};
  options.seed = seed;
  return options;
}

// One sample as Get and GetSparse return it.
struct Sample {
  std::vector<float> dense;
  std::vector<int64_t> ids;
  int64_t label = -1;
};

Sample Read(const SyntheticCtr& dataset, size_t index) {
  Sample sample;
  sample.dense.resize(dataset.feature_dim());
  sample.ids.resize(dataset.sparse_field_sizes().size());
  EXPECT_TRUE(dataset.Get(index, sample.dense.data(), &sample.label).ok()) << index;
  EXPECT_TRUE(dataset.GetSparse(index, sample.ids.data()).ok()) << index;
  return sample;
}

bool operator==(const Sample& a, const Sample& b) {
  return a.dense == b.dense && a.ids == b.ids && a.label == b.label;
}

// H(n, s) = sum_{r=1..n} r^-s, so P(rank 0) = 1 / H(n, s).
double Harmonic(int64_t n, double s) {
  double sum = 0;
  for (int64_t r = n; r >= 1; --r) sum += std::pow(static_cast<double>(r), -s);
  return sum;
}

TEST(SyntheticCtrTest, RejectsBadOptionsNamingTheField) {
  auto message = [](const SyntheticCtrOptions& options) {
    Status status = SyntheticCtr::Create(options).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
    return status.message();
  };
  SyntheticCtrOptions options;
  options.field_sizes = {};
  EXPECT_THAT(message(options), HasSubstr("field_sizes must name at least one field"));
  options.field_sizes = {10, 0, 5};
  EXPECT_THAT(message(options), HasSubstr("field_sizes[1]=0 must be >= 1"));
  options.field_sizes = {10, 5, -3};
  EXPECT_THAT(message(options), HasSubstr("field_sizes[2]=-3 must be >= 1"));
  // 2^26 CDF entries in all is the limit; the sum must not overflow on the way.
  options.field_sizes = {int64_t{1} << 26, 1};
  EXPECT_THAT(message(options), HasSubstr("field_sizes[1]=1 brings field_sizes over 67108864"));
  options.field_sizes = {1, std::numeric_limits<int64_t>::max()};
  EXPECT_THAT(message(options), HasSubstr("field_sizes[1]=9223372036854775807 brings"));
  options.field_sizes = {100};

  for (double s : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    options.zipf_exponent = s;
    EXPECT_THAT(message(options), HasSubstr("zipf_exponent=")) << s;
    EXPECT_THAT(message(options), HasSubstr("must be finite and > 0")) << s;
  }
  options.zipf_exponent = 1.05;

  options.teacher_dim = 0;
  EXPECT_THAT(message(options), HasSubstr("teacher_dim=0 must be >= 1"));
  options.teacher_dim = 8;
  options.dense_dim = size_t{1} << 40;
  EXPECT_THAT(message(options), HasSubstr("dense_dim=1099511627776 + 1) exceeds"));
  options.dense_dim = 0;  // sparse fields only is allowed
  EXPECT_TRUE(SyntheticCtr::Create(options).ok());
}

TEST(SyntheticCtrTest, ShapeMatchesTheOptions) {
  auto dataset = Make(Small(0));
  EXPECT_EQ(dataset->size(), 1000u);
  EXPECT_EQ(dataset->feature_dim(), 4u);
  EXPECT_EQ(dataset->num_classes(), 2u);
  EXPECT_EQ(dataset->sparse_field_sizes(), (std::vector<int64_t>{50, 20, 10}));
}

TEST(SyntheticCtrTest, SampleDependsOnlyOnSeedAndIndex) {
  auto a = Make(Small(5));
  auto b = Make(Small(5));
  // Read b in a different order first: order must not matter.
  Read(*b, 999);
  Read(*b, 0);
  for (size_t i : {size_t{17}, size_t{0}, size_t{999}}) {
    EXPECT_TRUE(Read(*a, i) == Read(*b, i)) << "index " << i;
  }
  // Neighbouring samples and other seeds differ, in both the dense and the sparse part.
  EXPECT_NE(Read(*a, 17).dense, Read(*a, 18).dense);
  auto c = Make(Small(6));
  EXPECT_NE(Read(*a, 17).dense, Read(*c, 17).dense);
  size_t ids_differ = 0;
  for (size_t i = 0; i < 100; ++i) ids_differ += Read(*a, i).ids != Read(*c, i).ids;
  EXPECT_GT(ids_differ, 50u);
  // A larger N does not change the samples that both sets have.
  SyntheticCtrOptions bigger_options = Small(5);
  bigger_options.num_samples = 5000;
  auto bigger = Make(bigger_options);
  EXPECT_TRUE(Read(*a, 17) == Read(*bigger, 17));
}

TEST(SyntheticCtrTest, OutOfRangeNamesIndexAndSize) {
  auto dataset = Make(Small(0));
  std::vector<float> dense(4);
  std::vector<int64_t> ids(3);
  int64_t label;
  Status get = dataset->Get(1000, dense.data(), &label);
  EXPECT_EQ(get.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(get.message(), "synthetic ctr: sample index 1000 >= dataset size 1000");
  Status get_sparse = dataset->GetSparse(1234, ids.data());
  EXPECT_EQ(get_sparse.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(get_sparse.message(), "synthetic ctr: sample index 1234 >= dataset size 1000");
}

TEST(SyntheticCtrTest, DenseFeaturesLookStandardNormal) {
  auto dataset = Make(Small(1));
  double sum = 0, sum_sq = 0;
  for (size_t i = 0; i < 1000; ++i) {
    for (float f : Read(*dataset, i).dense) {
      ASSERT_TRUE(std::isfinite(f));
      sum += f;
      sum_sq += static_cast<double>(f) * f;
    }
  }
  EXPECT_NEAR(sum / 4000, 0.0, 0.05);
  EXPECT_NEAR(sum_sq / 4000, 1.0, 0.08);
}

// With small fields every rank is drawn, so seeing exactly the ids [0, N_f) proves the
// permutation is a bijection; the counts, sorted, follow Zipf's law.
TEST(SyntheticCtrTest, IdsCoverEachFieldAndFollowZipf) {
  SyntheticCtrOptions options = Small(3);
  options.num_samples = 20000;
  options.field_sizes = {7, 12, 1};
  options.zipf_exponent = 1.05;
  auto dataset = Make(options);
  std::vector<std::map<int64_t, size_t>> counts(3);
  for (size_t i = 0; i < 20000; ++i) {
    Sample sample = Read(*dataset, i);
    for (size_t f = 0; f < 3; ++f) {
      ASSERT_GE(sample.ids[f], 0);
      ASSERT_LT(sample.ids[f], options.field_sizes[f]);
      ++counts[f][sample.ids[f]];
    }
  }
  for (size_t f = 0; f < 3; ++f) {
    ASSERT_EQ(counts[f].size(), static_cast<size_t>(options.field_sizes[f])) << "field " << f;
    std::vector<size_t> sorted;
    for (const auto& [id, count] : counts[f]) sorted.push_back(count);
    std::sort(sorted.rbegin(), sorted.rend());
    const double h = Harmonic(options.field_sizes[f], 1.05);
    for (size_t r = 0; r < sorted.size(); ++r) {
      const double expected = std::pow(r + 1.0, -1.05) / h;
      // The binomial standard deviation is at most sqrt(0.25 / 20000) = 0.0035.
      EXPECT_NEAR(sorted[r] / 20000.0, expected, 0.015) << "field " << f << " rank " << r;
    }
  }
  // The hot ids are scattered, not 0, 1, 2 (field 1; field 0 has too few ids to tell).
  std::vector<std::pair<size_t, int64_t>> by_count;
  for (const auto& [id, count] : counts[1]) by_count.push_back({count, id});
  std::sort(by_count.rbegin(), by_count.rend());
  std::set<int64_t> hottest = {by_count[0].second, by_count[1].second, by_count[2].second};
  EXPECT_NE(hottest, (std::set<int64_t>{0, 1, 2}));
}

// The default (Criteo-like) field 0 has 100000 ids: the hottest one takes 1/H(100000, 1.05),
// about 10.7% of the samples, where a uniform draw would give 0.001%.
TEST(SyntheticCtrTest, IdsAreHeavyTailed) {
  SyntheticCtrOptions options;  // the defaults
  options.num_samples = 20000;
  auto dataset = Make(options);
  std::vector<std::map<int64_t, size_t>> counts(options.field_sizes.size());
  std::vector<int64_t> ids(options.field_sizes.size());
  for (size_t i = 0; i < 20000; ++i) {
    ASSERT_TRUE(dataset->GetSparse(i, ids.data()).ok());
    for (size_t f = 0; f < ids.size(); ++f) {
      ASSERT_GE(ids[f], 0) << "field " << f;
      ASSERT_LT(ids[f], options.field_sizes[f]) << "field " << f;
      ++counts[f][ids[f]];
    }
  }
  std::vector<std::pair<size_t, int64_t>> by_count;
  for (const auto& [id, count] : counts[0]) by_count.push_back({count, id});
  std::sort(by_count.rbegin(), by_count.rend());
  const double h = Harmonic(100000, 1.05);
  const double top = by_count[0].first / 20000.0;
  const double second = by_count[1].first / 20000.0;
  RecordProperty("field0_top_frequency", std::to_string(top));
  // Uniform would expect 0.2 occurrences of any id in 20000 draws.
  EXPECT_GT(by_count[0].first, 1000u);
  // Binomial standard deviation of the top frequency: sqrt(0.107 * 0.893 / 20000) = 0.0022.
  EXPECT_NEAR(top, 1.0 / h, 0.01) << "H(100000, 1.05) = " << h;
  EXPECT_NEAR(second, std::pow(2.0, -1.05) / h, 0.01);
  EXPECT_NE(by_count[0].second, 0);
  // A heavy tail: fewer distinct ids than samples, and many seen only once.
  EXPECT_LT(counts[0].size(), 20000u / 2);
  size_t singletons = 0;
  for (const auto& [id, count] : counts[0]) singletons += count == 1;
  EXPECT_GT(singletons, 1000u);
}

// Measured with the defaults over 20000 samples: 24.96%, 24.95%, 25.59%, 25.51%, 24.56% for
// seeds 0-4.
TEST(SyntheticCtrTest, ClickRateIsAboutAQuarter) {
  for (uint64_t seed : {0, 1, 2, 3, 4}) {
    SyntheticCtrOptions options;
    options.num_samples = 20000;
    options.seed = seed;
    auto dataset = Make(options);
    std::vector<float> dense(options.dense_dim);
    size_t clicks = 0;
    for (size_t i = 0; i < 20000; ++i) {
      int64_t label = -1;
      ASSERT_TRUE(dataset->Get(i, dense.data(), &label).ok());
      ASSERT_TRUE(label == 0 || label == 1) << label;
      clicks += label;
    }
    const double rate = clicks / 20000.0;
    RecordProperty("click_rate_seed" + std::to_string(seed), std::to_string(rate));
    EXPECT_GT(rate, 0.22) << "seed " << seed;
    EXPECT_LT(rate, 0.28) << "seed " << seed;
  }
}

// The label is the teacher applied to exactly the features Get and GetSparse return, and both
// the dense and the sparse part move the teacher's logit.
TEST(SyntheticCtrTest, LabelIsTheTeacherOfTheReturnedFeatures) {
  auto dataset = Make(Small(9));
  size_t dense_matters = 0, sparse_matters = 0;
  for (size_t i = 0; i < 1000; ++i) {
    Sample sample = Read(*dataset, i);
    const double logit = dataset->TeacherLogit(sample.dense.data(), sample.ids.data());
    ASSERT_EQ(sample.label, logit > 0 ? 1 : 0) << "index " << i << " logit " << logit;
    Sample other = sample;
    other.dense[0] += 1.0f;
    dense_matters += dataset->TeacherLogit(other.dense.data(), other.ids.data()) != logit;
    other = sample;
    other.ids[0] = (other.ids[0] + 1) % 50;
    sparse_matters += dataset->TeacherLogit(other.dense.data(), other.ids.data()) != logit;
  }
  EXPECT_EQ(dense_matters, 1000u);
  EXPECT_EQ(sparse_matters, 1000u);
}

// Logistic regression (one weight per id per field, one per dense feature, a bias) by plain
// SGD on 20000 samples, evaluated on 5000 others: it must clearly beat always predicting "no
// click" (about 75%), or the labels are noise.
TEST(SyntheticCtrTest, LinearStudentBeatsTheMajorityClassClearly) {
  constexpr size_t kTrain = 20000, kTest = 5000;
  SyntheticCtrOptions options = Small(7);
  options.num_samples = kTrain + kTest;
  auto dataset = Make(options);
  const size_t d = options.dense_dim;
  std::vector<Sample> samples;
  for (size_t i = 0; i < kTrain + kTest; ++i) samples.push_back(Read(*dataset, i));
  std::vector<double> w_dense(d, 0.0);
  std::vector<std::vector<double>> w_ids;
  for (int64_t n : options.field_sizes) w_ids.emplace_back(static_cast<size_t>(n), 0.0);
  double bias = 0;
  auto logit = [&](const Sample& s) {
    double z = bias;
    for (size_t j = 0; j < d; ++j) z += w_dense[j] * s.dense[j];
    for (size_t f = 0; f < w_ids.size(); ++f) z += w_ids[f][static_cast<size_t>(s.ids[f])];
    return z;
  };
  const double lr = 0.05;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (size_t i = 0; i < kTrain; ++i) {
      const Sample& s = samples[i];
      const double grad = 1.0 / (1.0 + std::exp(-logit(s))) - static_cast<double>(s.label);
      for (size_t j = 0; j < d; ++j) w_dense[j] -= lr * grad * s.dense[j];
      for (size_t f = 0; f < w_ids.size(); ++f) {
        w_ids[f][static_cast<size_t>(s.ids[f])] -= lr * grad;
      }
      bias -= lr * grad;
    }
  }
  size_t correct = 0, clicks = 0;
  for (size_t i = kTrain; i < kTrain + kTest; ++i) {
    correct += (logit(samples[i]) > 0 ? 1 : 0) == samples[i].label;
    clicks += samples[i].label;
  }
  const double accuracy = static_cast<double>(correct) / kTest;
  const double majority = 1.0 - static_cast<double>(clicks) / kTest;
  RecordProperty("held_out_accuracy", std::to_string(accuracy));
  RecordProperty("majority_accuracy", std::to_string(majority));
  EXPECT_GT(accuracy, majority + 0.08) << "held-out accuracy " << accuracy << ", majority "
                                       << majority;
}

TEST(SyntheticCtrTest, MakeBatchFillsDenseSparseAndLabels) {
  auto dataset = Make(Small(11));
  const std::vector<size_t> indices = {5, 0, 5, 999};
  Batch batch;
  ASSERT_TRUE(MakeBatch(*dataset, indices, &batch).ok());
  ASSERT_EQ(batch.size, 4u);
  ASSERT_EQ(batch.feature_dim, 4u);
  ASSERT_EQ(batch.sparse_fields, 3u);
  ASSERT_EQ(batch.features.size(), 16u);
  ASSERT_EQ(batch.sparse_ids.size(), 12u);
  ASSERT_EQ(batch.labels.size(), 4u);
  for (size_t row = 0; row < indices.size(); ++row) {
    Sample sample = Read(*dataset, indices[row]);
    EXPECT_EQ(std::vector<float>(batch.features.begin() + row * 4,
                                 batch.features.begin() + row * 4 + 4),
              sample.dense)
        << "row " << row;
    EXPECT_EQ(std::vector<int64_t>(batch.sparse_ids.begin() + row * 3,
                                   batch.sparse_ids.begin() + row * 3 + 3),
              sample.ids)
        << "row " << row;
    EXPECT_EQ(batch.labels[row], sample.label) << "row " << row;
  }
  // An index past the end fails with the batch position and the index.
  Status status = MakeBatch(*dataset, {1, 1000}, &batch);
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("position 1 index 1000"));
  EXPECT_THAT(status.message(), HasSubstr("sample index 1000 >= dataset size 1000"));
}

}  // namespace
}  // namespace tessera::worker::data
