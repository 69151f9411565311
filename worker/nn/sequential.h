// Sequential: layers applied one after another, with the activations kept between forward and
// backward (in backend memory, reused across batches).
//
//   Sequential net(backend);
//   RETURN_IF_ERROR(net.Add(std::make_unique<Linear>(784, 256)));
//   RETURN_IF_ERROR(net.Add(std::make_unique<Relu>(256)));
//   RETURN_IF_ERROR(net.DeclareParameters("mlp.", &layout));    // "mlp.0.weight", ...
//   ASSIGN_OR_RETURN(const float* out, net.Forward(params, batch, x));
//   RETURN_IF_ERROR(net.Backward(params, batch, x, dout, /*dx=*/nullptr, grads, on_ready));
// Or with each layer's parameters from a ParameterStorage (parameter_storage.h).
//
// Thread-safety: one thread at a time.
#ifndef TESSERA_WORKER_NN_SEQUENTIAL_H_
#define TESSERA_WORKER_NN_SEQUENTIAL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/device_buffer.h"
#include "worker/nn/layer.h"
#include "worker/nn/parameter_storage.h"

namespace tessera::worker {

class Sequential {
 public:
  explicit Sequential(ComputeBackend* backend)
      : backend_(backend), delta_{DeviceBuffer<float>(backend), DeviceBuffer<float>(backend)} {}

  // Appends `layer`. InvalidArgument when its input width differs from the previous layer's
  // output width (naming both layers) or a width is not positive.
  Status Add(std::unique_ptr<Layer> layer);
  // Declares every layer's parameters as "<prefix><index>.<name>" (index = first_index +
  // position, as PyTorch's nn.Sequential names them; a pipeline stage holding layers k.. of a
  // model passes k). Call once, after the last Add.
  Status DeclareParameters(const std::string& prefix, ParameterLayout* layout,
                           int first_index = 0);
  // Initial values for every layer, in layer order, from one generator.
  void InitializeParameters(std::mt19937_64* rng, float* params) const;

  int64_t input_dim() const;   // REQUIRES: at least one layer
  int64_t output_dim() const;  // REQUIRES: at least one layer
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  // Each layer's parameter block, in layer order (size 0 for a layer without parameters).
  // Valid after DeclareParameters.
  const std::vector<ParameterBlock>& blocks() const { return blocks_; }

  // Runs every layer on x (batch x input_dim, backend memory), each with its parameter block
  // from `storage`. Returns the output (batch x output_dim), owned here and valid until the
  // next Forward.
  StatusOr<const float*> Forward(ParameterStorage* storage, int64_t batch, const float* x);
  // Backward through every layer from dy = dLoss/doutput, for the x of the last Forward, last
  // layer first: each layer with parameters overwrites its gradient block from `storage` and
  // reports it done. Writes dx = dLoss/dx unless dx is null.
  Status Backward(ParameterStorage* storage, int64_t batch, const float* x, const float* dy,
                  float* dx);

  // The same on the flat buffers (FlatParameterStorage).
  StatusOr<const float*> Forward(const float* params, int64_t batch, const float* x) {
    FlatParameterStorage flat(params, nullptr);
    return Forward(&flat, batch, x);
  }
  Status Backward(const float* params, int64_t batch, const float* x, const float* dy, float* dx,
                  float* grads, const GradientsReady& on_ready) {
    FlatParameterStorage flat(params, grads, on_ready);
    return Backward(&flat, batch, x, dy, dx);
  }

 private:
  ComputeBackend* const backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParameterBlock> blocks_;        // blocks_[i]: layer i's parameters
  std::vector<DeviceBuffer<float>> outputs_;  // outputs_[i]: layer i's output
  DeviceBuffer<float> delta_[2];              // ping-pong dLoss/d(activation) during backward
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_SEQUENTIAL_H_
