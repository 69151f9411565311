// Layer: one step of a model with an explicit forward and backward pass, written on a
// ComputeBackend so the same code runs on the CPU and the GPU.
//
// A layer maps a batch of rows of input_dim() values to rows of output_dim() values. Its dense
// parameters occupy one contiguous block of the model's flat layout (common/training/parameter_layout.h),
// its gradients the same block of the flat gradient buffer. Forward and Backward get pointers
// to the block itself, not to the whole buffer, so the block can live elsewhere for a pass
// (ZeRO stage 3 gathers it just in time: parameter_storage.h). Compose layers with Sequential
// (sequential.h); write a new layer by implementing this interface (see layers.h for Linear,
// ReLU, GELU and LayerNorm).
//
// Thread-safety: one thread at a time (a layer may keep per-batch state between Forward and
// Backward, e.g. LayerNorm's row statistics).
#ifndef TESSERA_WORKER_NN_LAYER_H_
#define TESSERA_WORKER_NN_LAYER_H_

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/training/parameter_layout.h"
#include "worker/nn/compute_backend.h"

namespace tessera::worker {

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string_view kind() const = 0;  // "linear", "relu", "gelu", "layernorm"
  virtual int64_t input_dim() const = 0;
  virtual int64_t output_dim() const = 0;

  // Adds this layer's dense parameters to `layout` as "<prefix>.<name>", consecutively (its
  // block). Layers without parameters add nothing. Called once, before anything else.
  virtual Status DeclareParameters(const std::string& prefix, ParameterLayout* layout) {
    return OkStatus();
  }
  // Where this layer's parameters are (copies of the views DeclareParameters added).
  virtual std::vector<ParameterView> parameters() const { return {}; }
  // Writes initial values for this layer's parameters into `params` (host memory, the whole
  // flat buffer, at the layout's offsets), drawing from `rng` in a fixed order.
  virtual void InitializeParameters(std::mt19937_64* rng, float* params) const {}

  // y = f(x) for `batch` rows. x: batch x input_dim(), y: batch x output_dim(), `params` this
  // layer's parameter block (null for a layer without parameters); all in backend memory.
  virtual Status Forward(ComputeBackend* backend, const float* params, int64_t batch,
                         const float* x, float* y) = 0;
  // Given dy = dLoss/dy for the x and y of the last Forward: overwrites this layer's gradient
  // block `grads` and writes dx = dLoss/dx unless dx is null (the first layer's input needs
  // none). dx never aliases x, y or dy.
  virtual Status Backward(ComputeBackend* backend, const float* params, int64_t batch,
                          const float* x, const float* y, const float* dy, float* dx,
                          float* grads) = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_LAYER_H_
