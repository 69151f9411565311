#include "worker/nn/layers.h"

#include <cmath>

namespace tessera::worker {
namespace {

StatusOr<ParameterView> AddView(ParameterLayout* layout, std::string name,
                                std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(const ParameterView* view, layout->Add(std::move(name), std::move(shape)));
  return *view;
}

}  // namespace

Status Linear::DeclareParameters(const std::string& prefix, ParameterLayout* layout) {
  ASSIGN_OR_RETURN(weight_, AddView(layout, prefix + ".weight", {out_, in_}));
  ASSIGN_OR_RETURN(bias_, AddView(layout, prefix + ".bias", {out_}));
  return OkStatus();
}

void Linear::InitializeParameters(std::mt19937_64* rng, float* params) const {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  for (uint64_t i = 0; i < weight_.size; ++i) params[weight_.offset + i] = uniform(*rng);
  for (uint64_t i = 0; i < bias_.size; ++i) params[bias_.offset + i] = uniform(*rng);
}

Status Linear::Forward(ComputeBackend* backend, const float* params, int64_t batch,
                       const float* x, float* y) {
  backend->Gemm(false, true, batch, out_, in_, 1.0f, x, params, 0.0f, y);
  backend->AddRowVector(batch, out_, params + BiasAt(), y);
  return OkStatus();
}

Status Linear::Backward(ComputeBackend* backend, const float* params, int64_t batch,
                        const float* x, const float* y, const float* dy, float* dx,
                        float* grads) {
  // dW = dy^T x [out x in]; db = column sums of dy; dx = dy W [batch x in].
  backend->Gemm(true, false, out_, in_, batch, 1.0f, dy, x, 0.0f, grads);
  backend->SumRows(batch, out_, dy, grads + BiasAt(), /*accumulate=*/false);
  if (dx != nullptr) {
    backend->Gemm(false, false, batch, in_, out_, 1.0f, dy, params, 0.0f, dx);
  }
  return OkStatus();
}

Status Relu::Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                     float* y) {
  backend->ReluForward(static_cast<size_t>(batch * dim_), x, y);
  return OkStatus();
}

Status Relu::Backward(ComputeBackend* backend, const float* params, int64_t batch,
                      const float* x, const float* y, const float* dy, float* dx, float* grads) {
  if (dx != nullptr) backend->ReluBackward(static_cast<size_t>(batch * dim_), x, dy, dx);
  return OkStatus();
}

Status Gelu::Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                     float* y) {
  backend->GeluForward(static_cast<size_t>(batch * dim_), x, y);
  return OkStatus();
}

Status Gelu::Backward(ComputeBackend* backend, const float* params, int64_t batch,
                      const float* x, const float* y, const float* dy, float* dx, float* grads) {
  if (dx != nullptr) backend->GeluBackward(static_cast<size_t>(batch * dim_), x, dy, dx);
  return OkStatus();
}

Status LayerNorm::DeclareParameters(const std::string& prefix, ParameterLayout* layout) {
  ASSIGN_OR_RETURN(weight_, AddView(layout, prefix + ".weight", {dim_}));
  ASSIGN_OR_RETURN(bias_, AddView(layout, prefix + ".bias", {dim_}));
  return OkStatus();
}

void LayerNorm::InitializeParameters(std::mt19937_64* rng, float* params) const {
  for (uint64_t i = 0; i < weight_.size; ++i) params[weight_.offset + i] = 1.0f;
  for (uint64_t i = 0; i < bias_.size; ++i) params[bias_.offset + i] = 0.0f;
}

Status LayerNorm::Forward(ComputeBackend* backend, const float* params, int64_t batch,
                          const float* x, float* y) {
  RETURN_IF_ERROR(mean_.Resize(static_cast<size_t>(batch)));
  RETURN_IF_ERROR(rstd_.Resize(static_cast<size_t>(batch)));
  backend->LayerNormForward(batch, dim_, eps_, x, params, params + BiasAt(),
                            y, mean_.data(), rstd_.data());
  return OkStatus();
}

Status LayerNorm::Backward(ComputeBackend* backend, const float* params, int64_t batch,
                           const float* x, const float* y, const float* dy, float* dx,
                           float* grads) {
  backend->LayerNormBackward(batch, dim_, x, params, mean_.data(), rstd_.data(),
                             dy, dx, grads, grads + BiasAt());
  return OkStatus();
}

}  // namespace tessera::worker
