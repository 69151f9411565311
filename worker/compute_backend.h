// ComputeBackend: the numerical primitives layers are written in, on one device.
//
// Layers (worker/layers.h) never touch memory directly: every loop over tensor elements is a
// call here, so the same layer code runs on the CPU (cpu_backend: OpenBLAS GEMM + plain
// loops) and on a GPU (a CUDA backend with cuBLAS and kernels, mirroring cpu_backend's file
// names). All matrices are row-major float32; pointers point into the backend's own memory
// (host memory for the CPU backend).
//
// Thread-safety: a backend instance is used by one thread at a time.
#ifndef TESSERA_WORKER_COMPUTE_BACKEND_H_
#define TESSERA_WORKER_COMPUTE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace tessera::worker {

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  virtual std::string_view name() const = 0;  // "cpu", "cuda:0"

  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op,
  // B is k x n after op; leading dimensions are those of the stored (row-major) matrices.
  virtual void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, const float* b, float beta, float* c) = 0;

  // out[r][j] += bias[j] for every row r of a rows x cols matrix.
  virtual void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) = 0;
  // sums[j] = (accumulate ? sums[j] : 0) + sum over rows r of in[r][j].
  virtual void SumRows(int64_t rows, int64_t cols, const float* in, float* sums,
                       bool accumulate) = 0;

  // y = max(x, 0); dx = dy where x > 0, else 0 (dx may alias dy).
  virtual void ReluForward(size_t n, const float* x, float* y) = 0;
  virtual void ReluBackward(size_t n, const float* x, const float* dy, float* dx) = 0;

  // Mean softmax cross-entropy over `rows` samples of `classes` logits: writes the softmax
  // probabilities, returns the mean loss and how many rows' argmax equals the label.
  // REQUIRES: every label in [0, classes) (callers validate; see layers.h).
  struct LossResult {
    double loss = 0;
    int64_t correct = 0;
  };
  virtual LossResult SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                         const int64_t* labels, float* probabilities) = 0;
  // dlogits = (probabilities - onehot(labels)) / rows.
  virtual void SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes,
                                           const float* probabilities, const int64_t* labels,
                                           float* dlogits) = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COMPUTE_BACKEND_H_
