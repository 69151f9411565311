// Tensor-parallel Linear layers (Megatron-LM, Shoeybi et al. 2019): a Linear(in, hidden)
// split by its output features across the T ranks of a tensor-parallel group (column
// parallel), followed, after an elementwise activation, by a Linear(hidden, out) split by its
// input features (row parallel). Rank t of the group holds
//   column parallel   weight rows [t h/T, (t+1) h/T) of [h, in] and the same part of the bias;
//   row parallel      weight columns [t h/T, (t+1) h/T) of [out, h] and the whole bias.
// The pair's forward ends with one all-reduce (the row-parallel layer's partial products
// summed before the bias is added, once); its backward ends with one all-reduce (the
// column-parallel layer's input gradient, whose parts each rank computed from its columns).
// Between them each rank works on its h/T features alone, so an elementwise activation runs
// unchanged on the slice (a LayerNorm there would need the whole row: not supported).
//
// The all-reduce is a callback (a sum over the group, in place) so that this layer knows no
// communicator: worker/nn sits below the collectives.
//
// Parameters are declared under the full model's names with the slice's shape; their values
// come from the full model's (tensor_slice.h): InitializeParameters does nothing.
//
// Thread-safety: as Layer.
#ifndef TESSERA_WORKER_NN_TENSOR_PARALLEL_LINEAR_H_
#define TESSERA_WORKER_NN_TENSOR_PARALLEL_LINEAR_H_

#include <functional>
#include <string>

#include "worker/nn/layer.h"
#include "worker/nn/tensor_slice.h"

namespace tessera::worker {

// Sums data[0, count) over the tensor-parallel group, in place; `what` names the tensor for
// errors.
using TensorParallelSum =
    std::function<Status(float* data, size_t count, const std::string& what)>;

class ColumnParallelLinear final : public Layer {
 public:
  // REQUIRES: ranks divides out.
  ColumnParallelLinear(int64_t in, int64_t out, int rank, int ranks, TensorParallelSum sum)
      : in_(in), out_(out / ranks), rank_(rank), ranks_(ranks), sum_(std::move(sum)) {}
  std::string_view kind() const override { return "linear (column parallel)"; }
  int64_t input_dim() const override { return in_; }
  int64_t output_dim() const override { return out_; }  // this rank's features
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout) override;
  std::vector<ParameterView> parameters() const override { return {weight_, bias_}; }
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;
  // Where weight and bias lie in the full model's.
  TensorSlice weight_slice() const { return EvenSlice(0, out_ * ranks_, rank_, ranks_); }
  TensorSlice bias_slice() const { return weight_slice(); }

 private:
  const int64_t in_, out_;
  const int rank_, ranks_;
  const TensorParallelSum sum_;
  std::string prefix_;
  ParameterView weight_, bias_;
};

class RowParallelLinear final : public Layer {
 public:
  // REQUIRES: ranks divides in.
  RowParallelLinear(int64_t in, int64_t out, int rank, int ranks, TensorParallelSum sum)
      : in_(in / ranks), out_(out), rank_(rank), ranks_(ranks), sum_(std::move(sum)) {}
  std::string_view kind() const override { return "linear (row parallel)"; }
  int64_t input_dim() const override { return in_; }  // this rank's features
  int64_t output_dim() const override { return out_; }
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout) override;
  std::vector<ParameterView> parameters() const override { return {weight_, bias_}; }
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;
  TensorSlice weight_slice() const { return EvenSlice(1, in_ * ranks_, rank_, ranks_); }
  TensorSlice bias_slice() const { return TensorSlice{}; }  // whole, on every rank

 private:
  const int64_t in_, out_;
  const int rank_, ranks_;
  const TensorParallelSum sum_;
  std::string prefix_;
  ParameterView weight_, bias_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_TENSOR_PARALLEL_LINEAR_H_
