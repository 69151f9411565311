// The built-in layers (layer.h): Linear, ReLU, GELU, LayerNorm.
//
//   Linear(in, out)    y = x W^T + b          "<prefix>.weight" [out, in], "<prefix>.bias" [out]
//                      (PyTorch nn.Linear; init uniform in +-1/sqrt(in) for both, its default)
//   Relu(dim)          y = max(x, 0)
//   Gelu(dim)          y = x Phi(x) (exact, PyTorch's default approximate='none')
//   LayerNorm(dim)     y = (x - mean) / sqrt(var + eps) * weight + bias over each row
//                      "<prefix>.weight" [dim] (init 1), "<prefix>.bias" [dim] (init 0)
//
// Thread-safety: as Layer.
#ifndef TESSERA_WORKER_NN_LAYERS_H_
#define TESSERA_WORKER_NN_LAYERS_H_

#include <memory>

#include "worker/nn/device_buffer.h"
#include "worker/nn/layer.h"

namespace tessera::worker {

class Linear final : public Layer {
 public:
  Linear(int64_t in, int64_t out) : in_(in), out_(out) {}
  std::string_view kind() const override { return "linear"; }
  int64_t input_dim() const override { return in_; }
  int64_t output_dim() const override { return out_; }
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout) override;
  std::vector<ParameterView> parameters() const override { return {weight_, bias_}; }
  void InitializeParameters(std::mt19937_64* rng, float* params) const override;
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;

 private:
  // Where the bias starts in this layer's block (the weight comes first).
  uint64_t BiasAt() const { return bias_.offset - weight_.offset; }

  const int64_t in_, out_;
  ParameterView weight_, bias_;
};

class Relu final : public Layer {
 public:
  explicit Relu(int64_t dim) : dim_(dim) {}
  std::string_view kind() const override { return "relu"; }
  int64_t input_dim() const override { return dim_; }
  int64_t output_dim() const override { return dim_; }
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;

 private:
  const int64_t dim_;
};

class Gelu final : public Layer {
 public:
  explicit Gelu(int64_t dim) : dim_(dim) {}
  std::string_view kind() const override { return "gelu"; }
  int64_t input_dim() const override { return dim_; }
  int64_t output_dim() const override { return dim_; }
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;

 private:
  const int64_t dim_;
};

class LayerNorm final : public Layer {
 public:
  // eps as PyTorch's default.
  LayerNorm(int64_t dim, ComputeBackend* backend, float eps = 1e-5f)
      : dim_(dim), eps_(eps), mean_(backend), rstd_(backend) {}
  std::string_view kind() const override { return "layernorm"; }
  int64_t input_dim() const override { return dim_; }
  int64_t output_dim() const override { return dim_; }
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout) override;
  std::vector<ParameterView> parameters() const override { return {weight_, bias_}; }
  void InitializeParameters(std::mt19937_64* rng, float* params) const override;
  Status Forward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                 float* y) override;
  Status Backward(ComputeBackend* backend, const float* params, int64_t batch, const float* x,
                  const float* y, const float* dy, float* dx, float* grads) override;

 private:
  uint64_t BiasAt() const { return bias_.offset - weight_.offset; }  // in the block

  const int64_t dim_;
  const float eps_;
  ParameterView weight_, bias_;
  DeviceBuffer<float> mean_, rstd_;  // per row of the last Forward
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_LAYERS_H_
