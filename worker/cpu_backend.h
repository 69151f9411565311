// CpuBackend: ComputeBackend on host memory; GEMM through OpenBLAS (cblas_sgemm), the
// elementwise and reduction parts as plain loops the compiler vectorises.
#ifndef TESSERA_WORKER_CPU_BACKEND_H_
#define TESSERA_WORKER_CPU_BACKEND_H_

#include "worker/compute_backend.h"

namespace tessera::worker {

class CpuBackend final : public ComputeBackend {
 public:
  std::string_view name() const override { return "cpu"; }
  void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override;
  void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) override;
  void SumRows(int64_t rows, int64_t cols, const float* in, float* sums, bool accumulate) override;
  void ReluForward(size_t n, const float* x, float* y) override;
  void ReluBackward(size_t n, const float* x, const float* dy, float* dx) override;
  LossResult SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                 const int64_t* labels, float* probabilities) override;
  void SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes, const float* probabilities,
                                   const int64_t* labels, float* dlogits) override;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_CPU_BACKEND_H_
