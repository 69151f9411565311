// Sequential: layers applied one after another, with the activations kept between forward and
// backward (in backend memory, reused across batches).
//
//   Sequential net(backend);
//   RETURN_IF_ERROR(net.Add(std::make_unique<Linear>(784, 256)));
//   RETURN_IF_ERROR(net.Add(std::make_unique<Relu>(256)));
//   RETURN_IF_ERROR(net.DeclareParameters("mlp.", &layout));    // "mlp.0.weight", ...
//   ASSIGN_OR_RETURN(const float* out, net.Forward(params, batch, x));
//   RETURN_IF_ERROR(net.Backward(params, batch, x, dout, /*dx=*/nullptr, grads, on_ready));
//
// Thread-safety: one thread at a time.
#ifndef TESSERA_WORKER_SEQUENTIAL_H_
#define TESSERA_WORKER_SEQUENTIAL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/device_buffer.h"
#include "worker/layer.h"

namespace tessera::worker {

// Called during backward as soon as the gradients [offset, offset + size) of the flat gradient
// buffer are final, last layer first: the hook for overlapping communication with backward
// (DDP buckets). May be empty.
using GradientsReady = std::function<void(uint64_t offset, uint64_t size)>;

class Sequential {
 public:
  explicit Sequential(ComputeBackend* backend)
      : backend_(backend), delta_{DeviceBuffer<float>(backend), DeviceBuffer<float>(backend)} {}

  // Appends `layer`. InvalidArgument when its input width differs from the previous layer's
  // output width (naming both layers) or a width is not positive.
  Status Add(std::unique_ptr<Layer> layer);
  // Declares every layer's parameters as "<prefix><index>.<name>" (index = position, as
  // PyTorch's nn.Sequential names them). Call once, after the last Add.
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout);
  // Initial values for every layer, in layer order, from one generator.
  void InitializeParameters(std::mt19937_64* rng, float* params) const;

  int64_t input_dim() const;   // REQUIRES: at least one layer
  int64_t output_dim() const;  // REQUIRES: at least one layer
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  // Runs every layer on x (batch x input_dim, backend memory). Returns the output (batch x
  // output_dim), owned here and valid until the next Forward.
  StatusOr<const float*> Forward(const float* params, int64_t batch, const float* x);
  // Backward through every layer from dy = dLoss/doutput, for the x of the last Forward:
  // overwrites every layer's gradients in `grads`, calls on_ready for each layer with
  // parameters once its gradients are final, and writes dx = dLoss/dx unless dx is null.
  Status Backward(const float* params, int64_t batch, const float* x, const float* dy, float* dx,
                  float* grads, const GradientsReady& on_ready);

 private:
  ComputeBackend* const backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<DeviceBuffer<float>> outputs_;  // outputs_[i]: layer i's output
  DeviceBuffer<float> delta_[2];              // ping-pong dLoss/d(activation) during backward
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_SEQUENTIAL_H_
