#include "worker/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace tessera::worker {

void CpuBackend::Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int lda = static_cast<int>(transpose_a ? m : k);
  const int ldb = static_cast<int>(transpose_b ? k : n);
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
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

void CpuBackend::ReluForward(size_t n, const float* x, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void CpuBackend::ReluBackward(size_t n, const float* x, const float* dy, float* dx) {
  for (size_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

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

}  // namespace tessera::worker
