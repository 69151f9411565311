#include "worker/nn/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/shared_library.h"

namespace tessera::worker {
namespace {

constexpr float kInvSqrt2 = 0.707106781186547524f;    // 1 / sqrt(2), for GELU
constexpr float kInvSqrt2Pi = 0.398942280401432678f;  // 1 / sqrt(2 pi), for GELU

// The message carries the size, which is what a user needs to act on.
// OpenBLAS is dlopen'ed on first use rather than linked: a linked library's static TLS is
// reserved on every thread's stack, libopenblas has 60 KiB of it, and threads created with
// fixed small stacks (civetweb's 100 KiB /metrics threads) then overflow; under AddressSanitizer
// they did on every scrape. A dlopen'ed library's TLS is allocated on demand instead. <cblas.h>
// is included for the prototype and the enum values only.
decltype(&cblas_sgemm) Sgemm() {
  static decltype(&cblas_sgemm) const sgemm = [] {
    decltype(&cblas_sgemm) function = nullptr;
    auto library = SharedLibrary::Open("libopenblas.so.0", "OpenBLAS");
    Status bound = library.ok() ? library->Bind(&function, "cblas_sgemm") : library.status();
    if (!bound.ok()) {
      std::fprintf(stderr, "tessera: %s. Install Debian's libopenblas0 (tools/install_deps.sh "
                   "does).\n", bound.message().c_str());
      std::abort();
    }
    return function;
  }();
  return sgemm;
}

Status HostMemoryExhausted(size_t bytes, std::string_view why) {
  return ResourceExhaustedError("cpu: cannot allocate " + std::to_string(bytes) +
                                " bytes of host memory: " + std::string(why));
}

}  // namespace

// ---- Memory ---------------------------------------------------------------------------------

StatusOr<void*> CpuBackend::Allocate(size_t bytes) {
  void* none = nullptr;
  if (bytes == 0) return none;
  // std::aligned_alloc wants a size that is a multiple of the alignment.
  if (bytes > std::numeric_limits<size_t>::max() - (kAlignment - 1)) {
    return HostMemoryExhausted(bytes, "the size rounded up to the alignment overflows size_t");
  }
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* pointer = std::aligned_alloc(kAlignment, rounded);
  if (pointer == nullptr) {
    return HostMemoryExhausted(bytes, "aligned_alloc(" + std::to_string(kAlignment) + ", " +
                                          std::to_string(rounded) + ") failed");
  }
  return pointer;
}

void CpuBackend::Free(void* pointer) { std::free(pointer); }

// memcpy with a null pointer is undefined even for zero bytes, and zero-byte buffers are null
// (Allocate(0)), so the copies skip empty ranges.
void CpuBackend::CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(device_dst, host_src, bytes);
}

void CpuBackend::CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, device_src, bytes);
}

void CpuBackend::CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes > 0) std::memcpy(device_dst, device_src, bytes);
}

void CpuBackend::Fill(size_t n, float value, float* x) { std::fill_n(x, n, value); }

// ---- Dense ops ------------------------------------------------------------------------------

void CpuBackend::Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int lda = static_cast<int>(transpose_a ? m : k);
  const int ldb = static_cast<int>(transpose_b ? k : n);
  Sgemm()(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, lda, b, ldb, beta, c, static_cast<int>(n));
}

void CpuBackend::AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
  }
}

void CpuBackend::SumRows(int64_t rows, int64_t cols, const float* in, float* sums,
                         bool accumulate) {
  if (!accumulate) std::fill(sums, sums + cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * cols;
    for (int64_t j = 0; j < cols; ++j) sums[j] += row[j];
  }
}

void CpuBackend::CopyColumns(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                             float* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(src + r * src_stride, cols, dst + r * dst_stride);
  }
}

void CpuBackend::ReluForward(size_t n, const float* x, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void CpuBackend::ReluBackward(size_t n, const float* x, const float* dy, float* dx) {
  for (size_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

// Phi(x) is written 0.5 erfc(-x / sqrt 2), which equals the header's 0.5 (1 + erf(x / sqrt 2))
// but keeps its relative accuracy for negative x, where 1 + erf(...) cancels.
void CpuBackend::GeluForward(size_t n, const float* x, float* y) {
  for (size_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * std::erfc(-x[i] * kInvSqrt2);
    y[i] = x[i] * cdf;
  }
}

void CpuBackend::GeluBackward(size_t n, const float* x, const float* dy, float* dx) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * std::erfc(-v * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);  // reads dy[i] before writing dx[i]: aliasing is fine
  }
}

// The mean and the variance are two passes in double: the one-pass E[x^2] - E[x]^2 in float
// loses every digit of the variance when |mean| is large against the spread.
void CpuBackend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                  const float* gamma, const float* beta, float* y, float* mean,
                                  float* rstd) {
  const double inverse_cols = cols > 0 ? 1.0 / static_cast<double>(cols) : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += xr[j];
    const double row_mean = sum * inverse_cols;
    double squares = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double centred = xr[j] - row_mean;
      squares += centred * centred;
    }
    const double variance = squares * inverse_cols;  // biased, as nn.LayerNorm
    const float mu = static_cast<float>(row_mean);
    const float rs = static_cast<float>(1.0 / std::sqrt(variance + static_cast<double>(eps)));
    mean[r] = mu;
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
  }
}

// With xhat = (x - mean) * rstd and g = dy * gamma (per row, N = cols):
//   dbeta  = sum over rows of dy,   dgamma = sum over rows of dy * xhat,
//   dx     = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)).
// Each row reads dy completely (row sums, column sums) before it writes dx, so dx may alias dy.
void CpuBackend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, const float* dy,
                                   float* dx, float* dgamma, float* dbeta) {
  std::vector<double> dgamma_sum(static_cast<size_t>(cols), 0.0);
  std::vector<double> dbeta_sum(static_cast<size_t>(cols), 0.0);
  const double inverse_cols = cols > 0 ? 1.0 / static_cast<double>(cols) : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float mu = mean[r];
    const float rs = rstd[r];
    double sum_g = 0;
    double sum_g_xhat = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - mu) * rs;
      const float g = dyr[j] * gamma[j];
      dgamma_sum[j] += static_cast<double>(dyr[j]) * xhat;
      dbeta_sum[j] += dyr[j];
      sum_g += g;
      sum_g_xhat += static_cast<double>(g) * xhat;
    }
    if (dx == nullptr) continue;
    const float mean_g = static_cast<float>(sum_g * inverse_cols);
    const float mean_g_xhat = static_cast<float>(sum_g_xhat * inverse_cols);
    float* dxr = dx + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - mu) * rs;
      dxr[j] = rs * (dyr[j] * gamma[j] - mean_g - xhat * mean_g_xhat);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    dgamma[j] = static_cast<float>(dgamma_sum[j]);
    dbeta[j] = static_cast<float>(dbeta_sum[j]);
  }
}

// ---- Losses ---------------------------------------------------------------------------------

ComputeBackend::LossResult CpuBackend::SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                                           const float* logits,
                                                           const int64_t* labels,
                                                           float* probabilities) {
  LossResult result;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    float* p = probabilities + r * classes;
    // Subtracting the row maximum keeps exp() finite; the loss uses the log-sum-exp directly
    // rather than log(p), which would underflow to -inf for confident wrong answers.
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j) {
      if (z[j] > z[argmax]) argmax = j;
    }
    const float max = z[argmax];
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) {
      p[j] = std::exp(z[j] - max);
      sum += p[j];
    }
    const float inverse = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < classes; ++j) p[j] *= inverse;
    const int64_t label = labels[r];
    result.loss += std::log(sum) - static_cast<double>(z[label] - max);
    if (argmax == label) ++result.correct;
  }
  if (rows > 0) result.loss /= static_cast<double>(rows);
  return result;
}

void CpuBackend::SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes,
                                             const float* probabilities, const int64_t* labels,
                                             float* dlogits) {
  if (rows == 0) return;
  const float scale = 1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = probabilities + r * classes;
    float* d = dlogits + r * classes;
    for (int64_t j = 0; j < classes; ++j) d[j] = p[j] * scale;
    d[labels[r]] -= scale;
  }
}

// Per row, in double: e = exp(-|z|) lies in (0, 1], so neither the loss
// max(z, 0) - z y + log1p(e) nor the sigmoid (1 / (1 + e) for z >= 0, e / (1 + e) below)
// can overflow, however large |z| is.
ComputeBackend::LossResult CpuBackend::BinaryCrossEntropy(int64_t rows, const float* logits,
                                                          const int64_t* labels,
                                                          float* probabilities) {
  LossResult result;
  for (int64_t r = 0; r < rows; ++r) {
    const double z = logits[r];
    const double label = labels[r] == 1 ? 1.0 : 0.0;
    const double e = std::exp(-std::fabs(z));
    result.loss += std::max(z, 0.0) - z * label + std::log1p(e);
    probabilities[r] = static_cast<float>(z >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e));
    if ((z > 0) == (labels[r] == 1)) ++result.correct;
  }
  if (rows > 0) result.loss /= static_cast<double>(rows);
  return result;
}

void CpuBackend::BinaryCrossEntropyBackward(int64_t rows, const float* probabilities,
                                            const int64_t* labels, float* dlogits) {
  if (rows == 0) return;
  const float scale = 1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float label = labels[r] == 1 ? 1.0f : 0.0f;
    dlogits[r] = (probabilities[r] - label) * scale;
  }
}

// ---- Embeddings -----------------------------------------------------------------------------

void CpuBackend::GatherRows(int64_t rows, int64_t dim, const float* table, const int32_t* slots,
                            float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(table + static_cast<int64_t>(slots[r]) * dim, dim, out + r * out_stride);
  }
}

void CpuBackend::ScatterAddRows(int64_t rows, int64_t dim, const float* dout, int64_t in_stride,
                                const int32_t* slots, float* table_grad) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = dout + r * in_stride;
    float* grad = table_grad + static_cast<int64_t>(slots[r]) * dim;
    for (int64_t j = 0; j < dim; ++j) grad[j] += in[j];
  }
}

}  // namespace tessera::worker
