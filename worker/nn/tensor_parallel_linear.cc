#include "worker/nn/tensor_parallel_linear.h"

namespace tessera::worker {
namespace {

StatusOr<ParameterView> AddView(ParameterLayout* layout, std::string name,
                                std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(const ParameterView* view, layout->Add(std::move(name), std::move(shape)));
  return *view;
}

}  // namespace

Status ColumnParallelLinear::DeclareParameters(const std::string& prefix,
                                               ParameterLayout* layout) {
  prefix_ = prefix;
  ASSIGN_OR_RETURN(weight_, AddView(layout, prefix + ".weight", {out_, in_}));
  ASSIGN_OR_RETURN(bias_, AddView(layout, prefix + ".bias", {out_}));
  return OkStatus();
}

Status ColumnParallelLinear::Forward(ComputeBackend* backend, const float* params,
                                     int64_t batch, const float* x, float* y) {
  backend->Gemm(false, true, batch, out_, in_, 1.0f, x, params, 0.0f, y);
  backend->AddRowVector(batch, out_, params + weight_.size, y);
  return OkStatus();
}

Status ColumnParallelLinear::Backward(ComputeBackend* backend, const float* params,
                                      int64_t batch, const float* x, const float* y,
                                      const float* dy, float* dx, float* grads) {
  backend->Gemm(true, false, out_, in_, batch, 1.0f, dy, x, 0.0f, grads);
  backend->SumRows(batch, out_, dy, grads + weight_.size, /*accumulate=*/false);
  if (dx == nullptr) return OkStatus();  // every rank of the group agrees: none needs it
  // Each rank's dx comes from its output features only: the input's gradient is their sum.
  backend->Gemm(false, false, batch, in_, out_, 1.0f, dy, params, 0.0f, dx);
  return sum_(dx, static_cast<size_t>(batch * in_), prefix_ + " input gradient");
}

Status RowParallelLinear::DeclareParameters(const std::string& prefix, ParameterLayout* layout) {
  prefix_ = prefix;
  ASSIGN_OR_RETURN(weight_, AddView(layout, prefix + ".weight", {out_, in_}));
  ASSIGN_OR_RETURN(bias_, AddView(layout, prefix + ".bias", {out_}));
  return OkStatus();
}

Status RowParallelLinear::Forward(ComputeBackend* backend, const float* params, int64_t batch,
                                  const float* x, float* y) {
  // The partial products of this rank's input features, summed over the group, then the bias
  // once (every rank holds it whole).
  backend->Gemm(false, true, batch, out_, in_, 1.0f, x, params, 0.0f, y);
  RETURN_IF_ERROR(sum_(y, static_cast<size_t>(batch * out_), prefix_ + " output"));
  backend->AddRowVector(batch, out_, params + weight_.size, y);
  return OkStatus();
}

Status RowParallelLinear::Backward(ComputeBackend* backend, const float* params, int64_t batch,
                                   const float* x, const float* y, const float* dy, float* dx,
                                   float* grads) {
  // dy is the whole output's gradient on every rank: this rank's weight columns and its input
  // features' gradient need no communication.
  backend->Gemm(true, false, out_, in_, batch, 1.0f, dy, x, 0.0f, grads);
  backend->SumRows(batch, out_, dy, grads + weight_.size, /*accumulate=*/false);
  if (dx != nullptr) backend->Gemm(false, false, batch, in_, out_, 1.0f, dy, params, 0.0f, dx);
  return OkStatus();
}

}  // namespace tessera::worker
