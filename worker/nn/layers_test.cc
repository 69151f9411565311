// Every built-in layer's backward (parameter gradients and dx) against central differences,
// through Sequential, plus Sequential's shape checks and naming.
#include "worker/nn/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "worker/nn/cpu/cpu_backend.h"
#include "worker/nn/sequential.h"

namespace tessera::worker {
namespace {

// L(y) = sum_i w_i * y_i with fixed random w: dL/dy = w, so backward from dy = w must give
// the gradient of L. Computed in double over the float outputs.
double Objective(const float* y, const std::vector<float>& w) {
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) sum += static_cast<double>(w[i]) * y[i];
  return sum;
}

void CheckGradients(std::unique_ptr<Layer> layer, float input_offset, double tolerance) {
  CpuBackend backend;
  const std::string kind(layer->kind());
  Sequential net(&backend);
  const int64_t in = layer->input_dim(), out = layer->output_dim(), batch = 3;
  ASSERT_TRUE(net.Add(std::move(layer)).ok());
  ParameterLayout layout;
  ASSERT_TRUE(net.DeclareParameters("l", &layout).ok());
  std::vector<float> params(layout.total_size()), grads(params.size());
  std::mt19937_64 rng(5);
  net.InitializeParameters(&rng, params.data());
  // Perturb so LayerNorm's weight 1 / bias 0 are not a special case.
  std::normal_distribution<float> normal;
  for (float& p : params) p += 0.3f * normal(rng);
  std::vector<float> x(static_cast<size_t>(batch * in)), w(static_cast<size_t>(batch * out));
  for (float& v : x) {
    v = normal(rng);
    v += v >= 0 ? input_offset : -input_offset;  // keeps ReLU inputs away from its kink
  }
  for (float& v : w) v = normal(rng);
  std::vector<float> dx(x.size());
  ASSERT_TRUE(net.Forward(params.data(), batch, x.data()).ok());
  ASSERT_TRUE(net.Backward(params.data(), batch, x.data(), w.data(), dx.data(), grads.data(),
                           nullptr)
                  .ok());
  auto objective = [&]() { return Objective(*net.Forward(params.data(), batch, x.data()), w); };
  const float h = 1e-2f;
  for (size_t i = 0; i < params.size(); ++i) {
    const float saved = params[i];
    params[i] = saved + h;
    double plus = objective();
    params[i] = saved - h;
    double minus = objective();
    params[i] = saved;
    EXPECT_NEAR(grads[i], (plus - minus) / (2 * h), tolerance) << kind << " parameter " << i;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    double plus = objective();
    x[i] = saved - h;
    double minus = objective();
    x[i] = saved;
    EXPECT_NEAR(dx[i], (plus - minus) / (2 * h), tolerance) << kind << " input " << i;
  }
}

// Tolerances: float32 outputs summed over ~20 terms (~1e-6 absolute) divided by 2h = 0.02 give
// ~1e-4; the quotient's truncation error h^2/6 f''' is below 1e-4 for these functions (Linear
// and ReLU are piecewise linear: exact away from the kink).
TEST(LayersTest, LinearGradients) { CheckGradients(std::make_unique<Linear>(4, 5), 0, 5e-4); }
TEST(LayersTest, ReluGradients) { CheckGradients(std::make_unique<Relu>(6), 0.1f, 5e-4); }
TEST(LayersTest, GeluGradients) { CheckGradients(std::make_unique<Gelu>(6), 0, 5e-4); }
TEST(LayersTest, LayerNormGradients) {
  CpuBackend backend;
  CheckGradients(std::make_unique<LayerNorm>(6, &backend), 0, 2e-3);
}

TEST(LayersTest, SequentialChecksWidthsAndNamesParametersByPosition) {
  CpuBackend backend;
  Sequential net(&backend);
  ASSERT_TRUE(net.Add(std::make_unique<Linear>(4, 8)).ok());
  Status mismatch = net.Add(std::make_unique<Relu>(7));
  EXPECT_NE(mismatch.message().find("layer 1 (relu) takes 7 inputs but the previous layer "
                                    "(linear) gives 8"),
            std::string::npos)
      << mismatch;
  EXPECT_FALSE(net.Add(std::make_unique<Linear>(8, 0)).ok());
  ASSERT_TRUE(net.Add(std::make_unique<Relu>(8)).ok());
  ASSERT_TRUE(net.Add(std::make_unique<LayerNorm>(8, &backend)).ok());
  ParameterLayout layout;
  ASSERT_TRUE(net.DeclareParameters("net.", &layout).ok());
  ASSERT_EQ(layout.views().size(), 4u);
  EXPECT_EQ(layout.views()[0].name, "net.0.weight");
  EXPECT_EQ(layout.views()[3].name, "net.2.bias");
  EXPECT_EQ(net.input_dim(), 4);
  EXPECT_EQ(net.output_dim(), 8);
}

}  // namespace
}  // namespace tessera::worker
