// Mlp: a multi-layer perceptron classifier, Linear -> ReLU -> ... -> Linear -> softmax
// cross-entropy, with explicit forward and backward passes written on a ComputeBackend.
//
// Parameters live in one flat buffer described by layout() ("fc<i>.weight" [out, in] and
// "fc<i>.bias" [out], in layer order), gradients in a second buffer of the same layout. The
// model owns neither: the caller (a trainer, an engine) owns both, so distributed engines can
// all-reduce, shard or push them as plain ranges.
//
// Thread-safety: one thread at a time (the model keeps the batch's activations between
// forward and backward).
#ifndef TESSERA_WORKER_MLP_H_
#define TESSERA_WORKER_MLP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/parameter_layout.h"
#include "common/status.h"
#include "worker/compute_backend.h"

namespace tessera::worker {

struct MlpOptions {
  int64_t input_dim = 784;
  std::vector<int64_t> hidden = {1024, 1024};
  int64_t classes = 10;
};

struct StepStats {
  double loss = 0;       // mean over the batch
  int64_t correct = 0;   // argmax == label
  int64_t samples = 0;
};

// Called during Backward as soon as the gradients [offset, offset + size) of the flat
// gradient buffer are final, last layer first: the hook for overlapping communication with
// backward (DDP buckets). May be empty.
using GradientsReady = std::function<void(uint64_t offset, uint64_t size)>;

class Mlp {
 public:
  // InvalidArgument naming the option for non-positive sizes.
  static StatusOr<std::unique_ptr<Mlp>> Create(const MlpOptions& options, ComputeBackend* backend);

  const ParameterLayout& layout() const { return layout_; }

  // Fills `params` (layout().total_size() floats) deterministically from `seed`: weights and
  // biases uniform in +-1/sqrt(fan_in), PyTorch nn.Linear's default.
  void InitializeParameters(uint64_t seed, float* params) const;

  // Forward and backward on `batch` samples (features: batch x input_dim, row-major; labels in
  // [0, classes)): overwrites `grads` with the gradient of the mean loss. InvalidArgument
  // naming the sample for an out-of-range label.
  StatusOr<StepStats> ForwardBackward(const float* params, const float* features,
                                      const int64_t* labels, int64_t batch, float* grads,
                                      const GradientsReady& on_ready = nullptr);
  // Forward only.
  StatusOr<StepStats> Evaluate(const float* params, const float* features, const int64_t* labels,
                               int64_t batch);

 private:
  struct Linear {
    int64_t in = 0, out = 0;
    const ParameterView* weight = nullptr;
    const ParameterView* bias = nullptr;
  };

  Mlp(ComputeBackend* backend, int64_t input_dim, int64_t classes)
      : backend_(backend), input_dim_(input_dim), classes_(classes) {}
  Status CheckLabels(const int64_t* labels, int64_t batch) const;
  StepStats Forward(const float* params, const float* features, const int64_t* labels,
                    int64_t batch);

  ComputeBackend* const backend_;
  const int64_t input_dim_;
  const int64_t classes_;
  ParameterLayout layout_;
  std::vector<Linear> layers_;
  // Per batch: pre_activations_[i] is layer i's output before ReLU (batch x out);
  // inputs_[i] is layer i's input (inputs_[0] points at the caller's features).
  std::vector<std::vector<float>> pre_activations_;
  std::vector<std::vector<float>> activations_;
  std::vector<float> probabilities_;
  std::vector<float> delta_, next_delta_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MLP_H_
