// CpuBackend: ComputeBackend on host memory; GEMM through OpenBLAS (cblas_sgemm), the
// elementwise and reduction parts as plain loops the compiler vectorises. Every op runs
// synchronously on the calling thread, so Synchronize() has nothing to wait for.
//
// Memory is ordinary host memory (host_memory() is true): Allocate returns 64-byte aligned
// blocks (a cache line, and enough for any SIMD width the loops use), the copies are memcpy.
// Per-row reductions (layer-norm mean and variance, loss sums) accumulate in double.
//
// Thread-safety: stateless; as the interface says, one thread at a time per instance.
#ifndef TESSERA_WORKER_NN_CPU_CPU_BACKEND_H_
#define TESSERA_WORKER_NN_CPU_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/status.h"
#include "worker/nn/compute_backend.h"

namespace tessera::worker {

class CpuBackend final : public ComputeBackend {
 public:
  // Alignment of every block Allocate returns; sizes are rounded up to a multiple of it.
  static constexpr size_t kAlignment = 64;

  std::string_view name() const override { return "cpu"; }

  bool host_memory() const override { return true; }
  StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* pointer) override;
  void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* device_src, size_t bytes) override;
  void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) override;
  void Fill(size_t n, float value, float* x) override;
  void Synchronize() override {}

  void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override;
  void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) override;
  void SumRows(int64_t rows, int64_t cols, const float* in, float* sums, bool accumulate) override;
  void CopyColumns(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                   int64_t dst_stride) override;

  void ReluForward(size_t n, const float* x, float* y) override;
  void ReluBackward(size_t n, const float* x, const float* dy, float* dx) override;
  void GeluForward(size_t n, const float* x, float* y) override;
  void GeluBackward(size_t n, const float* x, const float* dy, float* dx) override;

  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd) override;
  void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* dy, float* dx,
                         float* dgamma, float* dbeta) override;

  LossResult SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                 const int64_t* labels, float* probabilities) override;
  void SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes, const float* probabilities,
                                   const int64_t* labels, float* dlogits) override;
  LossResult BinaryCrossEntropy(int64_t rows, const float* logits, const int64_t* labels,
                                float* probabilities) override;
  void BinaryCrossEntropyBackward(int64_t rows, const float* probabilities,
                                  const int64_t* labels, float* dlogits) override;

  void GatherRows(int64_t rows, int64_t dim, const float* table, const int32_t* slots,
                  float* out, int64_t out_stride) override;
  void ScatterAddRows(int64_t rows, int64_t dim, const float* dout, int64_t in_stride,
                      const int32_t* slots, float* table_grad) override;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_CPU_CPU_BACKEND_H_
