#include "worker/mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <random>

#include "worker/cpu_backend.h"

namespace tessera::worker {
namespace {

struct Data {
  std::vector<float> features;
  std::vector<int64_t> labels;
};

Data RandomData(int64_t batch, int64_t dim, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Data d;
  for (int64_t i = 0; i < batch * dim; ++i) d.features.push_back(normal(rng));
  for (int64_t i = 0; i < batch; ++i) d.labels.push_back(static_cast<int64_t>(rng() % classes));
  return d;
}

TEST(MlpTest, LayoutNamesAndShapes) {
  CpuBackend backend;
  auto model = Mlp::Create({784, {256, 128}, 10}, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const ParameterLayout& layout = (*model)->layout();
  ASSERT_EQ(layout.views().size(), 6u);
  EXPECT_EQ(layout.views()[0].ToString(), "fc0.weight [256, 784] @ 0");
  EXPECT_EQ(layout.Find("fc2.bias")->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(layout.total_size(), 256u * 784 + 256 + 128 * 256 + 128 + 10 * 128 + 10);
}

TEST(MlpTest, RejectsBadOptionsAndLabels) {
  CpuBackend backend;
  EXPECT_NE(Mlp::Create({0, {4}, 3}, &backend).status().message().find("input_dim=0"),
            std::string::npos);
  EXPECT_NE(Mlp::Create({4, {4, -1}, 3}, &backend).status().message().find("hidden width 1"),
            std::string::npos);
  auto model = std::move(Mlp::Create({2, {3}, 3}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int64_t> bad = {0, 3};
  auto result = model->ForwardBackward(params.data(), x.data(), bad.data(), 2, grads.data());
  EXPECT_NE(result.status().message().find("sample 1 of the batch has label 3"), std::string::npos)
      << result.status();
}

// The smallest |pre-activation| of the hidden layers, in double, straight from the layout.
double SmallestHiddenPreActivation(const Mlp& model, const std::vector<float>& params,
                                   const std::vector<float>& features, int64_t batch) {
  const auto& views = model.layout().views();
  std::vector<double> input(features.begin(), features.end());
  double smallest = 1e300;
  for (size_t layer = 0; layer + 2 < views.size(); layer += 2) {  // hidden layers only
    const ParameterView& w = views[layer];
    const ParameterView& b = views[layer + 1];
    const int64_t out = w.shape[0], in = w.shape[1];
    std::vector<double> next(static_cast<size_t>(batch * out));
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double pre = params[b.offset + o];
        for (int64_t i = 0; i < in; ++i) pre += params[w.offset + o * in + i] * input[r * in + i];
        smallest = std::min(smallest, std::fabs(pre));
        next[r * out + o] = std::max(pre, 0.0);
      }
    }
    input.swap(next);
  }
  return smallest;
}

// Backward against central differences of the loss, every parameter of a small model. A ReLU
// makes the loss non-differentiable where a pre-activation is 0, so the test uses data and
// parameters (the first seed that qualifies, deterministically) whose hidden pre-activations
// are all at least 0.05 from 0: a step of h = 1e-3 in one parameter moves none across.
TEST(MlpTest, GradientsMatchNumericalDifferentiation) {
  CpuBackend backend;
  auto model = std::move(Mlp::Create({5, {7, 6}, 4}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  Data data;
  uint32_t seed = 0;
  for (; seed < 10000; ++seed) {
    model->InitializeParameters(seed, params.data());
    data = RandomData(3, 5, 4, seed);
    if (SmallestHiddenPreActivation(*model, params, data.features, 3) > 0.05) break;
  }
  ASSERT_LT(seed, 10000u) << "no seed keeps the ReLUs away from their kink";
  ASSERT_TRUE(model->ForwardBackward(params.data(), data.features.data(), data.labels.data(), 3,
                                     grads.data())
                  .ok());
  for (size_t i = 0; i < params.size(); ++i) {
    const float h = 1e-3f;
    const float saved = params[i];
    params[i] = saved + h;
    double plus = model->Evaluate(params.data(), data.features.data(), data.labels.data(), 3)->loss;
    params[i] = saved - h;
    double minus = model->Evaluate(params.data(), data.features.data(), data.labels.data(), 3)->loss;
    params[i] = saved;
    // Each loss is a float32 computation (~1e-7 relative); divided by 2h that is ~1e-4.
    EXPECT_NEAR(grads[i], (plus - minus) / (2 * h), 5e-4) << "parameter " << i << " seed " << seed;
  }
}

TEST(MlpTest, GradientsReadyRunsLastLayerFirstAndCoversTheBuffer) {
  CpuBackend backend;
  auto model = std::move(Mlp::Create({3, {4, 5}, 2}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  model->InitializeParameters(1, params.data());
  Data data = RandomData(2, 3, 2, 9);
  std::vector<std::pair<uint64_t, uint64_t>> ready;
  ASSERT_TRUE(model->ForwardBackward(params.data(), data.features.data(), data.labels.data(), 2,
                                     grads.data(),
                                     [&](uint64_t offset, uint64_t size) {
                                       ready.emplace_back(offset, size);
                                     })
                  .ok());
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[0].first, model->layout().Find("fc2.weight")->offset);
  EXPECT_EQ(ready[2].first, 0u);
  uint64_t covered = 0;
  for (auto& [offset, size] : ready) covered += size;
  EXPECT_EQ(covered, model->layout().total_size());
}

TEST(MlpTest, PlainGradientDescentLearnsALinearlySeparableProblem) {
  CpuBackend backend;
  auto model = std::move(Mlp::Create({2, {16}, 2}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  model->InitializeParameters(3, params.data());
  // Label: which side of the line x0 + x1 = 0.
  Data data = RandomData(256, 2, 2, 21);
  for (int64_t i = 0; i < 256; ++i) data.labels[i] = data.features[2 * i] + data.features[2 * i + 1] > 0;
  auto first = model->Evaluate(params.data(), data.features.data(), data.labels.data(), 256);
  for (int step = 0; step < 300; ++step) {
    ASSERT_TRUE(model->ForwardBackward(params.data(), data.features.data(), data.labels.data(),
                                       256, grads.data())
                    .ok());
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.5f * grads[i];
  }
  auto last = model->Evaluate(params.data(), data.features.data(), data.labels.data(), 256);
  EXPECT_LT(last->loss, first->loss * 0.3) << first->loss << " -> " << last->loss;
  EXPECT_GE(last->correct, 245) << "of 256";
}

}  // namespace
}  // namespace tessera::worker
