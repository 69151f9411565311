#include "worker/data/synthetic_classification.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace tessera::worker::data {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SyntheticClassification> Make(size_t n, size_t d, size_t c, uint64_t seed,
                                              size_t h = 32) {
  SyntheticClassificationOptions options;
  options.num_samples = n;
  options.feature_dim = d;
  options.num_classes = c;
  options.hidden_dim = h;
  options.seed = seed;
  auto dataset = SyntheticClassification::Create(options);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return std::move(dataset).value();
}

TEST(SyntheticClassificationTest, RejectsBadOptionsNamingTheField) {
  SyntheticClassificationOptions options;
  options.num_classes = 1;
  auto status = SyntheticClassification::Create(options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("num_classes=1 must be >= 2"));
  options.num_classes = 10;
  options.feature_dim = 0;
  EXPECT_THAT(SyntheticClassification::Create(options).status().message(),
              HasSubstr("feature_dim=0"));
  options.feature_dim = size_t{1} << 40;
  EXPECT_THAT(SyntheticClassification::Create(options).status().message(),
              HasSubstr("exceeds"));
}

TEST(SyntheticClassificationTest, SampleDependsOnlyOnSeedAndIndex) {
  auto a = Make(1000, 8, 4, /*seed=*/5);
  auto b = Make(1000, 8, 4, /*seed=*/5);
  std::vector<float> fa(8), fb(8);
  int64_t la = -1, lb = -2;
  // Read b in a different order first: order must not matter.
  ASSERT_TRUE(b->Get(999, fb.data(), &lb).ok());
  ASSERT_TRUE(b->Get(0, fb.data(), &lb).ok());
  for (size_t i : {size_t{17}, size_t{0}, size_t{999}}) {
    ASSERT_TRUE(a->Get(i, fa.data(), &la).ok());
    ASSERT_TRUE(b->Get(i, fb.data(), &lb).ok());
    EXPECT_EQ(fa, fb) << "index " << i;
    EXPECT_EQ(la, lb) << "index " << i;
  }
  // Neighbouring samples and other seeds differ.
  ASSERT_TRUE(a->Get(17, fa.data(), &la).ok());
  ASSERT_TRUE(a->Get(18, fb.data(), &lb).ok());
  EXPECT_NE(fa, fb);
  auto c = Make(1000, 8, 4, /*seed=*/6);
  ASSERT_TRUE(c->Get(17, fb.data(), &lb).ok());
  EXPECT_NE(fa, fb);
  // A larger N does not change the samples that both sets have.
  auto bigger = Make(5000, 8, 4, /*seed=*/5);
  ASSERT_TRUE(bigger->Get(17, fb.data(), &lb).ok());
  EXPECT_EQ(fa, fb);

  Status out_of_range = a->Get(1000, fa.data(), &la);
  EXPECT_EQ(out_of_range.code(), StatusCode::kOutOfRange);
}

TEST(SyntheticClassificationTest, FeaturesLookStandardNormal) {
  auto dataset = Make(2000, 16, 4, 1);
  std::vector<float> features(16);
  int64_t label;
  double sum = 0, sum_sq = 0;
  for (size_t i = 0; i < 2000; ++i) {
    ASSERT_TRUE(dataset->Get(i, features.data(), &label).ok());
    for (float f : features) {
      ASSERT_TRUE(std::isfinite(f));
      sum += f;
      sum_sq += static_cast<double>(f) * f;
    }
  }
  const double count = 2000.0 * 16;
  EXPECT_NEAR(sum / count, 0.0, 0.03);
  EXPECT_NEAR(sum_sq / count, 1.0, 0.05);
}

TEST(SyntheticClassificationTest, EveryClassAppears) {
  for (uint64_t seed : {0, 1, 2, 3, 4}) {
    for (size_t classes : {size_t{2}, size_t{10}}) {
      auto dataset = Make(5000, 32, classes, seed);
      std::vector<size_t> counts(classes, 0);
      std::vector<float> features(32);
      int64_t label;
      for (size_t i = 0; i < 5000; ++i) {
        ASSERT_TRUE(dataset->Get(i, features.data(), &label).ok());
        ASSERT_GE(label, 0);
        ASSERT_LT(static_cast<size_t>(label), classes);
        ++counts[static_cast<size_t>(label)];
      }
      for (size_t cls = 0; cls < classes; ++cls) {
        // Not degenerate: every class holds at least a fifth of its fair share.
        EXPECT_GE(counts[cls], 5000 / classes / 5)
            << "seed " << seed << " classes " << classes << " class " << cls;
      }
    }
  }
}

// Softmax regression by plain SGD on 3000 samples, evaluated on 1000 others: a linear student
// must clearly beat chance, or the labels are noise.
TEST(SyntheticClassificationTest, LinearStudentBeatsChanceClearly) {
  constexpr size_t kDim = 16, kClasses = 4, kTrain = 3000, kTest = 1000;
  auto dataset = Make(kTrain + kTest, kDim, kClasses, /*seed=*/7);
  std::vector<std::vector<float>> x(kTrain + kTest, std::vector<float>(kDim));
  std::vector<int64_t> y(kTrain + kTest);
  for (size_t i = 0; i < kTrain + kTest; ++i) {
    ASSERT_TRUE(dataset->Get(i, x[i].data(), &y[i]).ok());
  }
  std::vector<double> w(kClasses * (kDim + 1), 0.0);  // last column is the bias
  auto logits = [&](const std::vector<float>& xi, double* out) {
    for (size_t c = 0; c < kClasses; ++c) {
      double sum = w[c * (kDim + 1) + kDim];
      for (size_t j = 0; j < kDim; ++j) sum += w[c * (kDim + 1) + j] * xi[j];
      out[c] = sum;
    }
  };
  const double lr = 0.05;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (size_t i = 0; i < kTrain; ++i) {
      double z[kClasses];
      logits(x[i], z);
      double max_z = z[0];
      for (double v : z) max_z = std::max(max_z, v);
      double norm = 0;
      for (double& v : z) norm += (v = std::exp(v - max_z));
      for (size_t c = 0; c < kClasses; ++c) {
        const double grad = z[c] / norm - (static_cast<int64_t>(c) == y[i] ? 1.0 : 0.0);
        for (size_t j = 0; j < kDim; ++j) w[c * (kDim + 1) + j] -= lr * grad * x[i][j];
        w[c * (kDim + 1) + kDim] -= lr * grad;
      }
    }
  }
  size_t correct = 0;
  for (size_t i = kTrain; i < kTrain + kTest; ++i) {
    double z[kClasses];
    logits(x[i], z);
    size_t best = 0;
    for (size_t c = 1; c < kClasses; ++c) {
      if (z[c] > z[best]) best = c;
    }
    correct += static_cast<int64_t>(best) == y[i];
  }
  const double accuracy = static_cast<double>(correct) / kTest;
  RecordProperty("held_out_accuracy", std::to_string(accuracy));
  // Chance is 0.25 (or the majority class's share, which EveryClassAppears keeps far below
  // this bar).
  EXPECT_GT(accuracy, 0.6) << "held-out accuracy " << accuracy;
}

TEST(SplitMix64Test, MatchesTheReferenceOutputs) {
  // First outputs of the reference splitmix64.c seeded with 0: the stream is state += gamma,
  // then mix.
  EXPECT_EQ(SplitMix64Mix(0x9e3779b97f4a7c15ull), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64Mix(0x9e3779b97f4a7c15ull * 2), 0x6e789e6aa1b965f4ull);
}

}  // namespace
}  // namespace tessera::worker::data
