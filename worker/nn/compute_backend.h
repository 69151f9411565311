// ComputeBackend: the numerical primitives layers are written in, on one device.
//
// Layers (worker/nn/layers.h) never touch tensor memory directly: every loop over tensor elements
// is a call here, so the same layer code runs on the CPU (cpu_backend: OpenBLAS GEMM + plain
// loops) and on a GPU (cuda_backend: cuBLAS + kernels). All matrices are row-major float32.
// Every pointer passed to an op points into the backend's own memory: host memory for the CPU
// backend, device memory for a GPU backend (allocate it with DeviceBuffer, device_buffer.h).
// Ops may run asynchronously (on a GPU stream, in order); the ones that return a value and the
// copies to the host synchronise.
//
// Thread-safety: a backend instance is used by one thread at a time.
#ifndef TESSERA_WORKER_NN_COMPUTE_BACKEND_H_
#define TESSERA_WORKER_NN_COMPUTE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/status.h"

namespace tessera::worker {

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  virtual std::string_view name() const = 0;  // "cpu", "cuda:0"

  // ---- Memory -------------------------------------------------------------------------------
  // True when the backend's memory is ordinary host memory (the CPU backend): callers may then
  // hand host pointers to ops directly and skip the copies.
  virtual bool host_memory() const = 0;
  // `bytes` of backend memory, aligned for any element type; ResourceExhausted naming the size
  // and the device when it cannot be had. Zero bytes gives a null pointer.
  virtual StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* pointer) = 0;  // null is fine
  virtual void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) = 0;
  // Waits for every op issued before it.
  virtual void CopyToHost(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) = 0;
  virtual void Fill(size_t n, float value, float* x) = 0;
  // Waits for every op issued before it (a no-op on the CPU).
  virtual void Synchronize() = 0;

  // ---- Dense ops ----------------------------------------------------------------------------
  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op,
  // B is k x n after op; leading dimensions are those of the stored (row-major) matrices.
  virtual void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, const float* b, float beta, float* c) = 0;

  // out[r][j] += bias[j] for every row r of a rows x cols matrix.
  virtual void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) = 0;
  // sums[j] = (accumulate ? sums[j] : 0) + sum over rows r of in[r][j].
  virtual void SumRows(int64_t rows, int64_t cols, const float* in, float* sums,
                       bool accumulate) = 0;
  // dst[r * dst_stride + j] = src[r * src_stride + j] for r < rows, j < cols (strides in
  // floats): copies a block of columns into or out of a wider matrix.
  virtual void CopyColumns(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                           float* dst, int64_t dst_stride) = 0;

  // y = max(x, 0); dx = dy where x > 0, else 0 (dx may alias dy).
  virtual void ReluForward(size_t n, const float* x, float* y) = 0;
  virtual void ReluBackward(size_t n, const float* x, const float* dy, float* dx) = 0;
  // The exact GELU, PyTorch's default: y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));
  // dx = dy * (Phi(x) + x * phi(x)), phi the standard normal density (dx may alias dy).
  virtual void GeluForward(size_t n, const float* x, float* y) = 0;
  virtual void GeluBackward(size_t n, const float* x, const float* dy, float* dx) = 0;

  // Layer normalisation of each row of a rows x cols matrix (PyTorch's nn.LayerNorm over the
  // last dimension): mean and biased variance over the row, rstd = 1 / sqrt(var + eps),
  // y = (x - mean) * rstd * gamma[j] + beta[j]. Writes mean[r] and rstd[r] for the backward.
  virtual void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                const float* gamma, const float* beta, float* y, float* mean,
                                float* rstd) = 0;
  // Gradients of the above: overwrites dgamma and dbeta (cols floats each) with sums over the
  // rows, and dx (rows x cols) unless it is null (dx may alias dy).
  virtual void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, const float* dy, float* dx,
                                 float* dgamma, float* dbeta) = 0;

  // ---- Losses -------------------------------------------------------------------------------
  // Mean loss over the rows and how many rows were classified right. Both are computed on the
  // device and copied back (this synchronises).
  struct LossResult {
    double loss = 0;
    int64_t correct = 0;
  };
  // Softmax cross-entropy over `rows` samples of `classes` logits: writes the softmax
  // probabilities; correct counts rows whose argmax equals the label.
  // REQUIRES: every label in [0, classes) (callers validate; see layers.h).
  virtual LossResult SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                         const int64_t* labels, float* probabilities) = 0;
  // dlogits = (probabilities - onehot(labels)) / rows.
  virtual void SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes,
                                           const float* probabilities, const int64_t* labels,
                                           float* dlogits) = 0;
  // Binary cross-entropy on one logit per row (PyTorch's BCEWithLogitsLoss, mean reduction):
  // loss = max(z, 0) - z*y + log(1 + exp(-|z|)), which never overflows. Writes the
  // probabilities sigmoid(z); correct counts rows where (z > 0) == (label == 1).
  // REQUIRES: every label is 0 or 1.
  virtual LossResult BinaryCrossEntropy(int64_t rows, const float* logits, const int64_t* labels,
                                        float* probabilities) = 0;
  // dlogits = (probabilities - labels) / rows.
  virtual void BinaryCrossEntropyBackward(int64_t rows, const float* probabilities,
                                          const int64_t* labels, float* dlogits) = 0;

  // ---- Embeddings (sparse rows) -------------------------------------------------------------
  // out[r * out_stride + j] = table[slots[r] * dim + j] for r < rows, j < dim: looks up each
  // sample's row among the batch's rows (`table` holds the rows this batch touched, not the
  // whole embedding table).
  virtual void GatherRows(int64_t rows, int64_t dim, const float* table, const int32_t* slots,
                          float* out, int64_t out_stride) = 0;
  // table_grad[slots[r] * dim + j] += dout[r * in_stride + j] for r < rows, j < dim. The CPU
  // adds in row order (deterministic); a GPU may add in any order.
  virtual void ScatterAddRows(int64_t rows, int64_t dim, const float* dout, int64_t in_stride,
                              const int32_t* slots, float* table_grad) = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_COMPUTE_BACKEND_H_
