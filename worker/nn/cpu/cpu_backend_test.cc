#include "worker/nn/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
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

// ---- Memory -----------------------------------------------------------------------------------

TEST(CpuBackendTest, AllocateCopiesAndFreeRoundTripHostMemory) {
  CpuBackend backend;
  EXPECT_TRUE(backend.host_memory());

  auto empty = backend.Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, nullptr);
  backend.Free(*empty);  // null is fine
  backend.Free(nullptr);
  // Zero-byte copies may name null pointers (what Allocate(0) gives).
  backend.CopyToDevice(nullptr, nullptr, 0);
  backend.CopyToHost(nullptr, nullptr, 0);
  backend.CopyOnDevice(nullptr, nullptr, 0);

  // Odd sizes, so the rounding up to the alignment is exercised.
  for (size_t n : {size_t{1}, size_t{3}, size_t{16}, size_t{1001}}) {
    auto a = backend.Allocate(n * sizeof(float));
    auto b = backend.Allocate(n * sizeof(float));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_NE(*a, nullptr);
    ASSERT_NE(*b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % CpuBackend::kAlignment, 0u) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % CpuBackend::kAlignment, 0u) << n;

    std::vector<float> host(n), back(n, -1.0f);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f - 7.0f;
    backend.CopyToDevice(*a, host.data(), n * sizeof(float));
    backend.CopyOnDevice(*b, *a, n * sizeof(float));
    backend.Fill(n, 42.0f, static_cast<float*>(*a));  // the copy in b must not see this
    backend.Synchronize();
    backend.CopyToHost(back.data(), *b, n * sizeof(float));
    EXPECT_EQ(back, host) << n;
    backend.CopyToHost(back.data(), *a, n * sizeof(float));
    EXPECT_EQ(back, std::vector<float>(n, 42.0f)) << n;
    backend.Free(*a);
    backend.Free(*b);
  }
}

TEST(CpuBackendTest, AllocateRejectsSizesThatOverflowTheRoundingAndNamesThem) {
  CpuBackend backend;
  // These never reach the allocator: rounding up to 64 bytes would wrap around size_t.
  for (size_t bytes : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 5}) {
    auto result = backend.Allocate(bytes);
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.status().message().find(std::to_string(bytes)), std::string::npos)
        << result.status();
    EXPECT_NE(result.status().message().find("cpu"), std::string::npos) << result.status();
  }
}

TEST(CpuBackendTest, AllocateReportsAllocatorFailureNamingTheBytes) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer allocators abort on impossible sizes instead of returning null";
#endif
  CpuBackend backend;
  // 4 EiB is past any x86-64 / AArch64 virtual address space, so this fails even with overcommit.
  // The + 1 makes the request differ from its rounded-up size, which must not stand in for it.
  const size_t bytes = (size_t{1} << 62) + 1;
  auto result = backend.Allocate(bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(std::to_string(bytes)), std::string::npos)
      << result.status();
}

TEST(CpuBackendTest, FillWritesExactlyNElements) {
  CpuBackend backend;
  std::vector<float> x(10, -3.0f);
  backend.Fill(7, 2.5f, x.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], i < 7 ? 2.5f : -3.0f) << i;
  backend.Fill(0, 9.0f, x.data());  // n = 0 writes nothing
  EXPECT_EQ(x[0], 2.5f);
}

TEST(CpuBackendTest, CopyColumnsMovesABlockBetweenMatricesOfDifferentWidths) {
  CpuBackend backend;
  const int64_t rows = 4, src_stride = 9, dst_stride = 6, cols = 3, first = 2;
  std::vector<float> src(rows * src_stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  std::vector<float> dst(rows * dst_stride, -1.0f);
  // Out of the wider matrix: columns [2, 5) of src into columns [1, 4) of dst.
  backend.CopyColumns(rows, cols, src.data() + first, src_stride, dst.data() + 1, dst_stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dst_stride; ++j) {
      const bool inside = j >= 1 && j < 1 + cols;
      const float expected = inside ? static_cast<float>(r * src_stride + first + j - 1) : -1.0f;
      EXPECT_EQ(dst[r * dst_stride + j], expected) << "r=" << r << " j=" << j;
    }
  }
  // And back into a third matrix, dense (stride == cols).
  std::vector<float> dense(rows * cols, 0.0f);
  backend.CopyColumns(rows, cols, dst.data() + 1, dst_stride, dense.data(), cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_EQ(dense[r * cols + j], src[r * src_stride + first + j]) << r << "," << j;
    }
  }
  backend.CopyColumns(0, cols, nullptr, 0, nullptr, 0);  // no rows: touches nothing
}

// ---- GELU -------------------------------------------------------------------------------------

// The exact GELU in double, from the definition (std::erf, not erfc).
double GeluReference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

std::vector<float> GeluInputs() {
  std::vector<float> x = {0.0f, 1e-3f, -1e-3f, 0.5f, -0.5f, 1.0f,  -1.0f, 2.0f, -2.0f,
                          3.0f, -3.0f, 5.0f,   -5.0f, 8.0f, -8.0f, 80.0f, -80.0f};
  std::mt19937 rng(11);
  for (float v : Random(64, &rng)) x.push_back(2.0f * v);
  return x;
}

TEST(CpuBackendTest, GeluForwardMatchesTheExactErfDefinition) {
  CpuBackend backend;
  const auto x = GeluInputs();
  std::vector<float> y(x.size());
  backend.GeluForward(x.size(), x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    // float erfc and two products: a few ulps relative (2^-24 ~ 6e-8 each). 1e-6 relative plus
    // 1e-7 absolute leaves margin, yet is >100x tighter than the tanh approximation's error
    // (~2e-4 near |x| = 2).
    const double expected = GeluReference(x[i]);
    EXPECT_NEAR(y[i], expected, 1e-6 * std::fabs(expected) + 1e-7) << "x=" << x[i];
  }
}

TEST(CpuBackendTest, GeluBackwardMatchesCentralDifferences) {
  CpuBackend backend;
  const auto x = GeluInputs();
  std::mt19937 rng(12);
  const auto dy = Random(x.size(), &rng);
  std::vector<float> dx(x.size());
  backend.GeluBackward(x.size(), x.data(), dy.data(), dx.data());
  for (size_t i = 0; i < x.size(); ++i) {
    // Central differences in double around the float input: truncation h^2 |GELU'''| / 6 with
    // |GELU'''| < 2 is ~3e-9 at h = 1e-4; rounding ~1e-16 / h ~ 1e-12. The backend's float
    // Phi + x phi is good to a few 1e-7, so 2e-6 (1 + |dx|) passes it and fails any wrong
    // formula (dropping x phi is off by up to ~0.3, the tanh form by ~1e-3).
    const double h = 1e-4;
    const double derivative = (GeluReference(x[i] + h) - GeluReference(x[i] - h)) / (2 * h);
    const double expected = dy[i] * derivative;
    EXPECT_NEAR(dx[i], expected, 2e-6 * (1 + std::fabs(expected))) << "x=" << x[i];
  }
  // dx may alias dy.
  std::vector<float> in_place = dy;
  backend.GeluBackward(x.size(), x.data(), in_place.data(), in_place.data());
  EXPECT_EQ(in_place, dx);
}

// ---- LayerNorm --------------------------------------------------------------------------------

struct LayerNormShape {
  int64_t rows;
  int64_t cols;
};

// y of a rows x cols matrix in double, from the definition (two-pass, biased variance).
std::vector<double> LayerNormReference(int64_t rows, int64_t cols, double eps,
                                       const std::vector<double>& x,
                                       const std::vector<double>& gamma,
                                       const std::vector<double>& beta) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += xr[j];
    mean /= cols;
    for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= cols;
    const double rstd = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
  }
  return y;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

double Dot(const std::vector<double>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// d loss / d v[i] by central differences in double around each (float-valued) entry of v.
std::vector<double> NumericalGradient(
    const std::vector<double>& v, double h,
    const std::function<double(const std::vector<double>&)>& loss) {
  std::vector<double> grad(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    auto plus = v, minus = v;
    plus[i] += h;
    minus[i] -= h;
    grad[i] = (loss(plus) - loss(minus)) / (2 * h);
  }
  return grad;
}

TEST(CpuBackendTest, LayerNormForwardMatchesTheDefinition) {
  CpuBackend backend;
  std::mt19937 rng(21);
  const float eps = 1e-5f;
  for (auto [rows, cols] : {LayerNormShape{1, 1}, {5, 1}, {1, 7}, {4, 16}, {3, 33}, {2, 256}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
    auto x = Random(rows * cols, &rng), gamma = Random(cols, &rng), beta = Random(cols, &rng);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    backend.LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y.data(),
                             mean.data(), rstd.data());
    auto expected =
        LayerNormReference(rows, cols, eps, ToDouble(x), ToDouble(gamma), ToDouble(beta));
    for (size_t i = 0; i < y.size(); ++i) {
      // A handful of float ops at ~6e-8 relative each on values |xhat gamma| of order 1-10:
      // 1e-5 (1 + |y|) is loose for float, yet far below what a wrong mean, the unbiased
      // variance (a factor cols / (cols - 1)) or eps outside the sqrt would give.
      EXPECT_NEAR(y[i], expected[i], 1e-5 * (1 + std::fabs(expected[i]))) << i;
    }
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (int64_t j = 0; j < cols; ++j) m += x[r * cols + j];
      m /= cols;
      for (int64_t j = 0; j < cols; ++j) v += (x[r * cols + j] - m) * (x[r * cols + j] - m);
      v /= cols;
      const double rs = 1 / std::sqrt(v + eps);
      // Both are stored as float: one rounding, 6e-8 relative.
      EXPECT_NEAR(mean[r], m, 1e-6 * (1 + std::fabs(m))) << r;
      EXPECT_NEAR(rstd[r], rs, 1e-6 * rs) << r;
    }
  }
}

TEST(CpuBackendTest, LayerNormForwardKeepsTheVarianceWhenTheMeanIsLarge) {
  CpuBackend backend;
  std::mt19937 rng(22);
  const int64_t rows = 3, cols = 512;
  auto x = Random(rows * cols, &rng);
  for (float& v : x) v = 1000.0f + 0.1f * v;  // mean 1e3, spread 0.1
  std::vector<float> gamma(cols, 1.0f), beta(cols, 0.0f), y(x.size()), mean(rows), rstd(rows);
  backend.LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(),
                           mean.data(), rstd.data());
  auto expected =
      LayerNormReference(rows, cols, 1e-5, ToDouble(x), ToDouble(gamma), ToDouble(beta));
  for (size_t i = 0; i < y.size(); ++i) {
    // A one-pass float variance E[x^2] - E[x]^2 is off by ~1e6 * 6e-8 = 0.06 against a true
    // 0.01 here (y wrong by a factor ~2 or NaN). Two passes in double leave only the float
    // rounding of the mean (3e-5) times rstd (10): 3e-4, so 1e-3 passes with margin.
    EXPECT_NEAR(y[i], expected[i], 1e-3) << i;
  }
}

TEST(CpuBackendTest, LayerNormBackwardMatchesCentralDifferences) {
  CpuBackend backend;
  std::mt19937 rng(23);
  const float eps = 1e-5f;
  for (auto [rows, cols] :
       {LayerNormShape{1, 1}, {4, 1}, {1, 2}, {1, 9}, {3, 5}, {4, 16}, {2, 33}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
    auto x = Random(rows * cols, &rng), gamma = Random(cols, &rng), beta = Random(cols, &rng);
    auto dy = Random(rows * cols, &rng);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    backend.LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y.data(),
                             mean.data(), rstd.data());
    // dgamma and dbeta are overwritten, not accumulated: start them with garbage.
    std::vector<float> dx(x.size()), dgamma(cols, 123.0f), dbeta(cols, -55.0f);
    backend.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                              dy.data(), dx.data(), dgamma.data(), dbeta.data());

    // The scalar loss sum(dy * y), whose gradient with respect to y is dy, in double.
    const auto xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta);
    const double h = 1e-3;
    auto num_dx = NumericalGradient(xd, h, [&](const std::vector<double>& v) {
      return Dot(LayerNormReference(rows, cols, eps, v, gd, bd), dy);
    });
    auto num_dgamma = NumericalGradient(gd, h, [&](const std::vector<double>& v) {
      return Dot(LayerNormReference(rows, cols, eps, xd, v, bd), dy);
    });
    auto num_dbeta = NumericalGradient(bd, h, [&](const std::vector<double>& v) {
      return Dot(LayerNormReference(rows, cols, eps, xd, gd, v), dy);
    });
    // Truncation h^2 |L'''| / 6, and L''' grows like rstd^3: for these N(0, 1) rows (spread
    // >~ 0.1) that is ~1e-6 typically, 2e-4 at worst; the backend's float arithmetic adds
    // ~1e-6 relative. 2e-3 (1 + |g|) is safe from both, and every wrong or missing term of the
    // formula is O(|g| / cols) >= 3e-2 here.
    for (size_t i = 0; i < dx.size(); ++i) {
      EXPECT_NEAR(dx[i], num_dx[i], 2e-3 * (1 + std::fabs(num_dx[i]))) << "dx " << i;
    }
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_NEAR(dgamma[j], num_dgamma[j], 2e-3 * (1 + std::fabs(num_dgamma[j])))
          << "dgamma " << j;
      // y is linear in beta, so its difference quotient is exact up to rounding (~1e-12);
      // the float sum over rows is good to ~1e-7.
      EXPECT_NEAR(dbeta[j], num_dbeta[j], 1e-5 * (1 + std::fabs(num_dbeta[j]))) << "dbeta " << j;
    }

    // dx may alias dy, and a null dx still gives dgamma and dbeta.
    std::vector<float> in_place = dy, dgamma2(cols, 7.0f), dbeta2(cols, 7.0f);
    backend.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                              in_place.data(), in_place.data(), dgamma2.data(), dbeta2.data());
    EXPECT_EQ(in_place, dx);
    EXPECT_EQ(dgamma2, dgamma);
    EXPECT_EQ(dbeta2, dbeta);
    std::fill(dgamma2.begin(), dgamma2.end(), 7.0f);
    std::fill(dbeta2.begin(), dbeta2.end(), 7.0f);
    backend.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                              dy.data(), nullptr, dgamma2.data(), dbeta2.data());
    EXPECT_EQ(dgamma2, dgamma);
    EXPECT_EQ(dbeta2, dbeta);
  }
}

// ---- Binary cross-entropy ---------------------------------------------------------------------

// log(1 + e^t), accurate for every t in double.
double Softplus(double t) { return t > 0 ? t + std::log1p(std::exp(-t)) : std::log1p(std::exp(t)); }

// One sample's BCE from its definition -[y log s + (1 - y) log(1 - s)], s = sigmoid(z), using
// log s = -softplus(-z) and log(1 - s) = -softplus(z) (the naive logs are -inf at |z| = 80).
double BceReference(double z, int64_t label) { return label == 1 ? Softplus(-z) : Softplus(z); }

double SigmoidReference(double z) { return 1 / (1 + std::exp(-z)); }

TEST(CpuBackendTest, BinaryCrossEntropyLossProbabilitiesAndCorrectCount) {
  CpuBackend backend;
  // Correct means (z > 0) == (label == 1); z = 0 predicts 0, and more z = 0 rows are labelled 0
  // than 1, so counting z >= 0 as positive would change the count.
  const std::vector<float> z = {2.0f,  -1.5f, 0.0f,   0.0f,  0.0f,  0.3f,
                                -0.7f, 80.0f, -80.0f, 80.0f, -80.0f};
  const std::vector<int64_t> y = {1, 0, 0, 0, 1, 0, 1, 1, 0, 0, 1};
  const int64_t expected_correct = 1 + 1 + 1 + 1 + 0 + 0 + 0 + 1 + 1 + 0 + 0;
  const int64_t rows = z.size();
  std::vector<float> p(rows, -1.0f);
  auto result = backend.BinaryCrossEntropy(rows, z.data(), y.data(), p.data());
  double expected_loss = 0;
  for (int64_t i = 0; i < rows; ++i) expected_loss += BceReference(z[i], y[i]);
  expected_loss /= rows;
  ASSERT_TRUE(std::isfinite(result.loss));
  // Both are means of 11 double terms computed a little differently: they agree to ~1e-15
  // relative; 1e-12 leaves margin.
  EXPECT_NEAR(result.loss, expected_loss, 1e-12 * expected_loss);
  EXPECT_GT(result.loss, 160.0 / rows);  // two rows are confidently wrong by 80 each
  EXPECT_EQ(result.correct, expected_correct);
  for (int64_t i = 0; i < rows; ++i) {
    // One float rounding of the double sigmoid: 6e-8 relative, also for sigmoid(-80) ~ 1.8e-35,
    // which is a normal float.
    const double sigmoid = SigmoidReference(z[i]);
    EXPECT_NEAR(p[i], sigmoid, 1e-7 * sigmoid) << "z=" << z[i];
  }

  auto none = backend.BinaryCrossEntropy(0, nullptr, nullptr, nullptr);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_EQ(none.correct, 0);
}

TEST(CpuBackendTest, BinaryCrossEntropyBackwardMatchesCentralDifferences) {
  CpuBackend backend;
  std::mt19937 rng(31);
  auto z = Random(12, &rng);
  for (float& v : z) v *= 3.0f;
  z.insert(z.end(), {80.0f, -80.0f, 80.0f, -80.0f, 0.0f});
  std::vector<int64_t> y;
  for (size_t i = 0; i < z.size(); ++i) y.push_back((i * 7) % 3 == 0 ? 1 : 0);
  y[12] = 1, y[13] = 0, y[14] = 0, y[15] = 1;  // right, right, wrong, wrong at |z| = 80
  const int64_t rows = z.size();
  std::vector<float> p(rows), grad(rows, 99.0f), scratch(rows);
  backend.BinaryCrossEntropy(rows, z.data(), y.data(), p.data());
  backend.BinaryCrossEntropyBackward(rows, p.data(), y.data(), grad.data());
  for (int64_t i = 0; i < rows; ++i) {
    SCOPED_TRACE("z=" + std::to_string(z[i]) + " y=" + std::to_string(y[i]));
    ASSERT_TRUE(std::isfinite(grad[i]));
    // Central differences of the backend's own double loss around the float logits, dividing
    // by the step actually taken (1/64 is exact in float here). Truncation
    // h^2 |sigma''| / (6 rows) < 2e-7 at h = 1/64; rounding ~1e-16 / h. Against the float
    // gradient (6e-8 relative) 1e-5 is a safe margin that still catches a missing 1/rows, a
    // wrong sign or an overflowing loss (errors ~1e-2 and up).
    auto plus = z, minus = z;
    plus[i] += 1.0f / 64;
    minus[i] -= 1.0f / 64;
    const double lp = backend.BinaryCrossEntropy(rows, plus.data(), y.data(), scratch.data()).loss;
    const double lm = backend.BinaryCrossEntropy(rows, minus.data(), y.data(), scratch.data()).loss;
    ASSERT_TRUE(std::isfinite(lp) && std::isfinite(lm));
    const double numerical = (lp - lm) / (static_cast<double>(plus[i]) - minus[i]);
    EXPECT_NEAR(grad[i], numerical, 1e-5);
    // And the closed form (sigmoid(z) - y) / rows in double: float rounding only, < 1e-7.
    EXPECT_NEAR(grad[i], (SigmoidReference(z[i]) - y[i]) / rows, 1e-7);
  }
  // At |z| = 80 the wrong rows have gradient +-1/rows and the right ones ~1e-35.
  EXPECT_NEAR(grad[14], 1.0 / rows, 1e-9);
  EXPECT_NEAR(grad[15], -1.0 / rows, 1e-9);
  EXPECT_NEAR(grad[12], 0.0, 1e-9);
  EXPECT_NEAR(grad[13], 0.0, 1e-9);
}

// ---- Embeddings -------------------------------------------------------------------------------

TEST(CpuBackendTest, GatherRowsCopiesEachSlotsRowIntoAStridedOutput) {
  CpuBackend backend;
  const int64_t table_rows = 4, dim = 3, rows = 5, out_stride = 7;
  std::vector<float> table(table_rows * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 10.0f * (i / dim) + (i % dim);
  const std::vector<int32_t> slots = {2, 0, 2, 3, 2};  // repeats; row 1 unused
  std::vector<float> out(rows * out_stride, -1.0f);
  backend.GatherRows(rows, dim, table.data(), slots.data(), out.data(), out_stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < out_stride; ++j) {
      // Columns past dim belong to the caller (e.g. the next feature's block): untouched.
      const float expected = j < dim ? 10.0f * slots[r] + j : -1.0f;
      EXPECT_EQ(out[r * out_stride + j], expected) << "r=" << r << " j=" << j;
    }
  }
  backend.GatherRows(0, dim, table.data(), nullptr, nullptr, out_stride);  // no rows: no-op
}

TEST(CpuBackendTest, ScatterAddRowsAccumulatesRepeatedSlotsInRowOrder) {
  CpuBackend backend;
  const int64_t table_rows = 4, dim = 3, rows = 6, in_stride = 5;
  const std::vector<int32_t> slots = {2, 0, 2, 3, 2, 0};  // slot 2 thrice, 0 twice, 1 never
  std::vector<float> dout(rows * in_stride, 1000.0f);     // the padding must never be added
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) dout[r * in_stride + j] = 0.25f * (r + 1) + j;
  }
  std::vector<float> grad(table_rows * dim, 0.5f);  // it is +=, so start non-zero
  // Make slot 0 column 1 order-sensitive in float: -1e8, then row 1 adds 1 (rounds away:
  // -1e8 + 1 == -1e8), then row 5 adds 1e8, giving 0. Adding the rows the other way round
  // would give 1.
  grad[0 * dim + 1] = -1e8f;
  dout[1 * in_stride + 1] = 1.0f;
  dout[5 * in_stride + 1] = 1e8f;
  // Reference: the same float additions, in row order (the contract is deterministic).
  std::vector<float> expected = grad;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) expected[slots[r] * dim + j] += dout[r * in_stride + j];
  }
  ASSERT_EQ(expected[0 * dim + 1], 0.0f);
  backend.ScatterAddRows(rows, dim, dout.data(), in_stride, slots.data(), grad.data());
  EXPECT_EQ(grad, expected);
  // By hand: slot 2 column 0 is 0.5 + 0.25 + 0.75 + 1.25 (rows 0, 2, 4); slot 1 untouched.
  EXPECT_EQ(grad[2 * dim + 0], 2.75f);
  EXPECT_EQ(grad[3 * dim + 2], 0.5f + 1.0f + 2.0f);
  EXPECT_EQ(grad[1 * dim + 0], 0.5f);
  EXPECT_EQ(grad[1 * dim + 2], 0.5f);
}

}  // namespace
}  // namespace tessera::worker
