#include "worker/nn/mlp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "worker/nn/cpu/cpu_backend.h"

namespace tessera::worker {
namespace {

data::Batch RandomBatch(int64_t batch, int64_t dim, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  data::Batch b;
  b.size = static_cast<size_t>(batch);
  b.feature_dim = static_cast<size_t>(dim);
  for (int64_t i = 0; i < batch * dim; ++i) b.features.push_back(normal(rng));
  for (int64_t i = 0; i < batch; ++i) b.labels.push_back(static_cast<int64_t>(rng() % classes));
  return b;
}

double Loss(Mlp* model, const std::vector<float>& params, const data::Batch& batch) {
  std::vector<SparseRows> none;
  return model->Evaluate(params.data(), batch, &none)->loss;
}

TEST(MlpTest, LayoutNamesAndShapes) {
  CpuBackend backend;
  auto model = Mlp::Create({784, {256, 128}, 10}, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const ParameterLayout& layout = (*model)->layout();
  ASSERT_EQ(layout.views().size(), 6u);
  // nn.Sequential naming: Linear, ReLU, Linear, ReLU, Linear.
  EXPECT_EQ(layout.views()[0].ToString(), "mlp.0.weight [256, 784] @ 0");
  EXPECT_EQ(layout.Find("mlp.4.bias")->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(layout.total_size(), 256u * 784 + 256 + 128 * 256 + 128 + 10 * 128 + 10);
  // The default is the 1.86 M parameter MLP of the benchmarks.
  auto default_model = Mlp::Create(MlpOptions(), &backend);
  EXPECT_EQ((*default_model)->layout().total_size(), 1863690u);
  // With LayerNorm: Linear, LayerNorm, GELU, Linear.
  MlpOptions ln;
  ln.input_dim = 4;
  ln.hidden = {3};
  ln.classes = 2;
  ln.layer_norm = true;
  ln.activation = Activation::kGelu;
  auto with_norm = Mlp::Create(ln, &backend);
  ASSERT_TRUE(with_norm.ok());
  EXPECT_NE((*with_norm)->layout().Find("mlp.1.weight"), nullptr);
  EXPECT_EQ((*with_norm)->layout().Find("mlp.3.weight")->shape, (std::vector<int64_t>{2, 3}));
}

TEST(MlpTest, RejectsBadOptionsAndInputs) {
  CpuBackend backend;
  EXPECT_NE(Mlp::Create({0, {4}, 3}, &backend).status().message().find("input_dim=0"),
            std::string::npos);
  EXPECT_NE(Mlp::Create({4, {4, -1}, 3}, &backend).status().message().find("hidden width 1"),
            std::string::npos);
  EXPECT_FALSE(ParseActivation("tanh").ok());
  auto model = std::move(Mlp::Create({2, {3}, 3}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  data::Batch batch = RandomBatch(2, 2, 3, 1);
  batch.labels = {0, 3};
  std::vector<SparseRows> none;
  auto result = model->ForwardBackward(params.data(), batch, &none, grads.data(), nullptr);
  EXPECT_NE(result.status().message().find("sample 1 of the batch has label 3"), std::string::npos)
      << result.status();
  data::Batch wide = RandomBatch(2, 5, 3, 1);
  EXPECT_NE(model->Evaluate(params.data(), wide, &none).status().message().find("5 features"),
            std::string::npos);
}

// Backward against central differences of the loss for every parameter of a small model with
// smooth activations (GELU, LayerNorm) so no kink can spoil a difference quotient; ReLU is
// checked the same way in layers_test with inputs kept away from 0.
TEST(MlpTest, GradientsMatchNumericalDifferentiation) {
  CpuBackend backend;
  for (bool layer_norm : {false, true}) {
    MlpOptions options;
    options.input_dim = 5;
    options.hidden = {7, 6};
    options.classes = 4;
    options.activation = Activation::kGelu;
    options.layer_norm = layer_norm;
    auto model = std::move(Mlp::Create(options, &backend)).value();
    std::vector<float> params(model->layout().total_size()), grads(params.size());
    model->InitializeParameters(3, params.data());
    data::Batch batch = RandomBatch(3, 5, 4, 11);
    std::vector<SparseRows> none;
    ASSERT_TRUE(model->ForwardBackward(params.data(), batch, &none, grads.data(), nullptr).ok());
    for (size_t i = 0; i < params.size(); ++i) {
      const float h = 1e-2f;
      const float saved = params[i];
      params[i] = saved + h;
      double plus = Loss(model.get(), params, batch);
      params[i] = saved - h;
      double minus = Loss(model.get(), params, batch);
      params[i] = saved;
      // Each loss is float32 (~1e-7 relative, ~1e-5 / 2h in the quotient) and the quotient's
      // truncation error is O(h^2 f''') ~ 1e-4 for these smooth functions.
      EXPECT_NEAR(grads[i], (plus - minus) / (2 * h), 1e-3)
          << model->layout().views().size() << " views, layer_norm " << layer_norm
          << ", parameter " << i;
    }
  }
}

TEST(MlpTest, GradientsReadyRunsLastLayerFirstAndCoversTheBuffer) {
  CpuBackend backend;
  auto model = std::move(Mlp::Create({3, {4, 5}, 2}, &backend)).value();
  std::vector<float> params(model->layout().total_size()), grads(params.size());
  model->InitializeParameters(1, params.data());
  data::Batch batch = RandomBatch(2, 3, 2, 9);
  std::vector<std::pair<uint64_t, uint64_t>> ready;
  std::vector<SparseRows> none;
  ASSERT_TRUE(model->ForwardBackward(params.data(), batch, &none, grads.data(),
                                     [&](uint64_t offset, uint64_t size) {
                                       ready.emplace_back(offset, size);
                                     })
                  .ok());
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[0].first, model->layout().Find("mlp.4.weight")->offset);
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
  data::Batch batch = RandomBatch(256, 2, 2, 21);
  for (int64_t i = 0; i < 256; ++i) {
    batch.labels[i] = batch.features[2 * i] + batch.features[2 * i + 1] > 0;
  }
  std::vector<SparseRows> none;
  double first = Loss(model.get(), params, batch);
  for (int step = 0; step < 300; ++step) {
    ASSERT_TRUE(model->ForwardBackward(params.data(), batch, &none, grads.data(), nullptr).ok());
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.5f * grads[i];
  }
  auto last = model->Evaluate(params.data(), batch, &none);
  EXPECT_LT(last->loss, first * 0.3) << first << " -> " << last->loss;
  EXPECT_GE(last->correct, 245) << "of 256";
}

}  // namespace
}  // namespace tessera::worker
