// ParameterStorage: where a layer's parameters and gradients are while a model runs it.
//
// Layers address their parameters relative to their own block (the contiguous range of the
// flat layout their parameters occupy), so the block can live anywhere for the duration of a
// pass. Sequential asks the storage for each layer's block just before the layer runs and
// hands it back right after:
//
//   forward, layer i    Acquire(block_i, kForward) ... Forward ... Release(block_i)
//   backward, layer i   Acquire(block_i, kBackward), GradientBlock(block_i) ... Backward ...
//                       Release(block_i), GradientsDone(block_i)        (last layer first)
//
// FlatParameterStorage, the usual case, points into the trainer's flat parameter and gradient
// buffers, waits in Acquire for parameters still being gathered (a ParametersNeeded hook: ZeRO
// stage 1 overlaps its all-gathers with the forward) and reports finished gradients to a
// GradientsReady hook (DDP buckets). An engine
// that partitions parameters (ZeRO stage 3, zero_engine.h) gathers a block in Acquire, frees
// it in Release, and reduce-scatters a block's gradients in GradientsDone.
//
// Thread-safety: called from the training thread only.
#ifndef TESSERA_WORKER_NN_PARAMETER_STORAGE_H_
#define TESSERA_WORKER_NN_PARAMETER_STORAGE_H_

#include <cstdint>
#include <functional>

#include "common/base/status.h"

namespace tessera::worker {

// One layer's parameters: [offset, offset + size) of the flat layout.
struct ParameterBlock {
  uint64_t offset = 0;
  uint64_t size = 0;
};

enum class Pass { kForward, kBackward };

// Called during backward as soon as the gradients [offset, offset + size) of the flat gradient
// buffer are final, last layer first: the hook for overlapping communication with backward
// (DDP buckets). May be empty.
using GradientsReady = std::function<void(uint64_t offset, uint64_t size)>;

// Called before a layer reads the parameters [offset, offset + size) of the flat parameter
// buffer: returns once they are final (or the error that keeps them from being). May be empty.
using ParametersNeeded = std::function<Status(uint64_t offset, uint64_t size)>;

class ParameterStorage {
 public:
  virtual ~ParameterStorage() = default;

  // The block's parameters (block.size floats in the model's backend memory), valid until
  // Release(block).
  virtual StatusOr<const float*> Acquire(const ParameterBlock& block, Pass pass) = 0;
  virtual void Release(const ParameterBlock& block) {}
  // Where the layer's backward writes the block's gradients (block.size floats), valid until
  // GradientsDone(block).
  virtual StatusOr<float*> GradientBlock(const ParameterBlock& block) = 0;
  // The block's gradients are final.
  virtual Status GradientsDone(const ParameterBlock& block) = 0;
};

// The flat buffers (layout size, backend memory) themselves. `grads` may be null for a
// forward-only pass.
class FlatParameterStorage final : public ParameterStorage {
 public:
  FlatParameterStorage(const float* params, float* grads, GradientsReady on_ready = {},
                       ParametersNeeded on_needed = {})
      : params_(params), grads_(grads), on_ready_(std::move(on_ready)),
        on_needed_(std::move(on_needed)) {}

  StatusOr<const float*> Acquire(const ParameterBlock& block, Pass pass) override {
    if (on_needed_) RETURN_IF_ERROR(on_needed_(block.offset, block.size));
    return params_ + block.offset;
  }
  StatusOr<float*> GradientBlock(const ParameterBlock& block) override {
    if (grads_ == nullptr) return FailedPreconditionError("a forward-only pass has no gradients");
    return grads_ + block.offset;
  }
  Status GradientsDone(const ParameterBlock& block) override {
    if (on_ready_) on_ready_(block.offset, block.size);
    return OkStatus();
  }

 private:
  const float* const params_;
  float* const grads_;
  const GradientsReady on_ready_;
  const ParametersNeeded on_needed_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_PARAMETER_STORAGE_H_
