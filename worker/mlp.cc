#include "worker/mlp.h"

#include <cmath>
#include <random>

namespace tessera::worker {

StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const MlpOptions& options, ComputeBackend* backend) {
  if (options.input_dim <= 0) {
    return InvalidArgumentError("mlp: input_dim=" + std::to_string(options.input_dim) +
                                " must be positive");
  }
  if (options.classes < 2) {
    return InvalidArgumentError("mlp: classes=" + std::to_string(options.classes) +
                                " must be at least 2");
  }
  std::unique_ptr<Mlp> model(new Mlp(backend, options.input_dim, options.classes));
  std::vector<int64_t> widths = {options.input_dim};
  for (size_t i = 0; i < options.hidden.size(); ++i) {
    if (options.hidden[i] <= 0) {
      return InvalidArgumentError("mlp: hidden width " + std::to_string(i) + " is " +
                                  std::to_string(options.hidden[i]) + "; widths must be positive");
    }
    widths.push_back(options.hidden[i]);
  }
  widths.push_back(options.classes);
  // Views are added first for every layer so that pointers into the layout stay valid.
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    std::string prefix = "fc" + std::to_string(i);
    RETURN_IF_ERROR(model->layout_.Add(prefix + ".weight", {widths[i + 1], widths[i]}).status());
    RETURN_IF_ERROR(model->layout_.Add(prefix + ".bias", {widths[i + 1]}).status());
  }
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    std::string prefix = "fc" + std::to_string(i);
    Linear layer;
    layer.in = widths[i];
    layer.out = widths[i + 1];
    layer.weight = model->layout_.Find(prefix + ".weight");
    layer.bias = model->layout_.Find(prefix + ".bias");
    model->layers_.push_back(layer);
  }
  return model;
}

void Mlp::InitializeParameters(uint64_t seed, float* params) const {
  std::mt19937_64 rng(seed);
  for (const Linear& layer : layers_) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (uint64_t i = 0; i < layer.weight->size; ++i) params[layer.weight->offset + i] = uniform(rng);
    for (uint64_t i = 0; i < layer.bias->size; ++i) params[layer.bias->offset + i] = uniform(rng);
  }
}

Status Mlp::CheckLabels(const int64_t* labels, int64_t batch) const {
  for (int64_t r = 0; r < batch; ++r) {
    if (labels[r] < 0 || labels[r] >= classes_) {
      return InvalidArgumentError("mlp: sample " + std::to_string(r) + " of the batch has label " +
                                  std::to_string(labels[r]) + ", outside [0, " +
                                  std::to_string(classes_) + ")");
    }
  }
  return OkStatus();
}

// Layer i: pre_i = input_i W_i^T + b_i; input_{i+1} = relu(pre_i) except after the last layer,
// whose pre-activations are the logits.
StepStats Mlp::Forward(const float* params, const float* features, const int64_t* labels,
                       int64_t batch) {
  const size_t n = layers_.size();
  pre_activations_.resize(n);
  activations_.resize(n);  // activations_[i]: input of layer i + 1
  const float* input = features;
  for (size_t i = 0; i < n; ++i) {
    const Linear& layer = layers_[i];
    std::vector<float>& pre = pre_activations_[i];
    pre.assign(static_cast<size_t>(batch * layer.out), 0.0f);
    backend_->Gemm(false, true, batch, layer.out, layer.in, 1.0f, input,
                   params + layer.weight->offset, 0.0f, pre.data());
    backend_->AddRowVector(batch, layer.out, params + layer.bias->offset, pre.data());
    if (i + 1 < n) {
      activations_[i].resize(pre.size());
      backend_->ReluForward(pre.size(), pre.data(), activations_[i].data());
      input = activations_[i].data();
    }
  }
  probabilities_.resize(static_cast<size_t>(batch * classes_));
  auto loss = backend_->SoftmaxCrossEntropy(batch, classes_, pre_activations_.back().data(), labels,
                                            probabilities_.data());
  return StepStats{loss.loss, loss.correct, batch};
}

StatusOr<StepStats> Mlp::Evaluate(const float* params, const float* features,
                                  const int64_t* labels, int64_t batch) {
  RETURN_IF_ERROR(CheckLabels(labels, batch));
  return Forward(params, features, labels, batch);
}

StatusOr<StepStats> Mlp::ForwardBackward(const float* params, const float* features,
                                         const int64_t* labels, int64_t batch, float* grads,
                                         const GradientsReady& on_ready) {
  RETURN_IF_ERROR(CheckLabels(labels, batch));
  StepStats stats = Forward(params, features, labels, batch);
  // delta = dLoss/dpre for the current layer, starting at the logits.
  delta_.resize(probabilities_.size());
  backend_->SoftmaxCrossEntropyBackward(batch, classes_, probabilities_.data(), labels,
                                        delta_.data());
  for (size_t i = layers_.size(); i-- > 0;) {
    const Linear& layer = layers_[i];
    const float* input = i == 0 ? features : activations_[i - 1].data();
    // dW = delta^T input  [out x in];  db = column sums of delta.
    backend_->Gemm(true, false, layer.out, layer.in, batch, 1.0f, delta_.data(), input, 0.0f,
                   grads + layer.weight->offset);
    backend_->SumRows(batch, layer.out, delta_.data(), grads + layer.bias->offset,
                      /*accumulate=*/false);
    if (on_ready) on_ready(layer.weight->offset, layer.weight->size + layer.bias->size);
    if (i == 0) break;
    // dinput = delta W [batch x in], then through the ReLU of the previous layer.
    next_delta_.assign(static_cast<size_t>(batch * layer.in), 0.0f);
    backend_->Gemm(false, false, batch, layer.in, layer.out, 1.0f, delta_.data(),
                   params + layer.weight->offset, 0.0f, next_delta_.data());
    backend_->ReluBackward(next_delta_.size(), pre_activations_[i - 1].data(), next_delta_.data(),
                           next_delta_.data());
    delta_.swap(next_delta_);
  }
  return stats;
}

}  // namespace tessera::worker
