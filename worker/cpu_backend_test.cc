#include "worker/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tessera::worker {
namespace {

std::vector<float> Random(size_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(*rng);
  return v;
}

// C = alpha op(A) op(B) + beta C in double, straight from the definition.
std::vector<double> NaiveGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              const std::vector<float>& a, const std::vector<float>& b,
                              float beta, const std::vector<float>& c) {
  std::vector<double> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      out[i * n + j] = alpha * sum + beta * c[i * n + j];
    }
  }
  return out;
}

TEST(CpuBackendTest, GemmMatchesTheDefinitionForEveryTransposeAndShape) {
  CpuBackend backend;
  std::mt19937 rng(7);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {17, 1, 33},
                         {64, 48, 100}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        auto a = Random(m * k, &rng), b = Random(k * n, &rng), c = Random(m * n, &rng);
        auto expected = NaiveGemm(ta, tb, m, n, k, 0.5f, a, b, 2.0f, c);
        backend.Gemm(ta, tb, m, n, k, 0.5f, a.data(), b.data(), 2.0f, c.data());
        for (size_t i = 0; i < c.size(); ++i) {
          // float32 accumulation over k terms: error grows like sqrt(k) * 2^-24 * |terms|.
          EXPECT_NEAR(c[i], expected[i], 1e-4 * (1 + std::fabs(expected[i])))
              << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb;
        }
      }
    }
  }
}

TEST(CpuBackendTest, RowVectorOpsAndRelu) {
  CpuBackend backend;
  std::vector<float> out = {1, 2, 3, 4, 5, 6};
  std::vector<float> bias = {10, 20, 30};
  backend.AddRowVector(2, 3, bias.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33, 14, 25, 36}));
  std::vector<float> sums(3, 100.0f);
  backend.SumRows(2, 3, out.data(), sums.data(), /*accumulate=*/false);
  EXPECT_EQ(sums, (std::vector<float>{25, 47, 69}));
  backend.SumRows(2, 3, out.data(), sums.data(), /*accumulate=*/true);
  EXPECT_EQ(sums, (std::vector<float>{50, 94, 138}));

  std::vector<float> x = {-1, 0, 2}, y(3), dy = {5, 6, 7}, dx(3);
  backend.ReluForward(3, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{0, 0, 2}));
  backend.ReluBackward(3, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 7}));
}

TEST(CpuBackendTest, SoftmaxCrossEntropyAndItsGradient) {
  CpuBackend backend;
  // Row 0 uniform over 3 classes: loss log 3. Row 1 very confident and wrong: must stay finite.
  std::vector<float> logits = {0, 0, 0, 1000, 0, 0};
  std::vector<int64_t> labels = {2, 1};
  std::vector<float> p(6), d(6);
  auto result = backend.SoftmaxCrossEntropy(2, 3, logits.data(), labels.data(), p.data());
  EXPECT_NEAR(result.loss, (std::log(3.0) + 1000.0) / 2, 1e-3);
  EXPECT_EQ(result.correct, 0);
  EXPECT_NEAR(p[0], 1.0 / 3, 1e-6);
  backend.SoftmaxCrossEntropyBackward(2, 3, p.data(), labels.data(), d.data());
  EXPECT_NEAR(d[2], (1.0 / 3 - 1) / 2, 1e-6);
  EXPECT_NEAR(d[3], 0.5, 1e-6);
  EXPECT_NEAR(d[4], -0.5, 1e-6);

  // The gradient against central differences of the loss.
  std::mt19937 rng(3);
  auto z = Random(4 * 5, &rng);
  std::vector<int64_t> l = {0, 4, 2, 2};
  std::vector<float> probs(20), grad(20);
  backend.SoftmaxCrossEntropy(4, 5, z.data(), l.data(), probs.data());
  backend.SoftmaxCrossEntropyBackward(4, 5, probs.data(), l.data(), grad.data());
  for (size_t i = 0; i < z.size(); ++i) {
    const float h = 1e-2f;
    auto plus = z, minus = z;
    plus[i] += h;
    minus[i] -= h;
    double lp = backend.SoftmaxCrossEntropy(4, 5, plus.data(), l.data(), probs.data()).loss;
    double lm = backend.SoftmaxCrossEntropy(4, 5, minus.data(), l.data(), probs.data()).loss;
    EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), 1e-3) << i;
  }
}

}  // namespace
}  // namespace tessera::worker
