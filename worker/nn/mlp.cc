#include "worker/nn/mlp.h"

#include <random>

#include "worker/nn/layers.h"

namespace tessera::worker {

StatusOr<Activation> ParseActivation(std::string_view name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  return InvalidArgumentError("unknown activation '" + std::string(name) +
                              "'; expected relu or gelu");
}

Status AppendMlpLayers(int64_t input_dim, const std::vector<int64_t>& hidden, int64_t output_dim,
                       Activation activation, bool layer_norm, ComputeBackend* backend,
                       Sequential* net) {
  int64_t width = input_dim;
  for (size_t i = 0; i < hidden.size(); ++i) {
    if (hidden[i] <= 0) {
      return InvalidArgumentError("hidden width " + std::to_string(i) + " is " +
                                  std::to_string(hidden[i]) + "; widths must be positive");
    }
    RETURN_IF_ERROR(net->Add(std::make_unique<Linear>(width, hidden[i])));
    width = hidden[i];
    if (layer_norm) RETURN_IF_ERROR(net->Add(std::make_unique<LayerNorm>(width, backend)));
    if (activation == Activation::kRelu) {
      RETURN_IF_ERROR(net->Add(std::make_unique<Relu>(width)));
    } else {
      RETURN_IF_ERROR(net->Add(std::make_unique<Gelu>(width)));
    }
  }
  if (output_dim > 0) RETURN_IF_ERROR(net->Add(std::make_unique<Linear>(width, output_dim)));
  return OkStatus();
}

StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const MlpOptions& options, ComputeBackend* backend) {
  if (options.input_dim <= 0) {
    return InvalidArgumentError("mlp: input_dim=" + std::to_string(options.input_dim) +
                                " must be positive");
  }
  if (options.classes < 2) {
    return InvalidArgumentError("mlp: classes=" + std::to_string(options.classes) +
                                " must be at least 2");
  }
  std::unique_ptr<Mlp> model(new Mlp(options, backend));
  RETURN_IF_ERROR(AppendMlpLayers(options.input_dim, options.hidden, options.classes,
                                  options.activation, options.layer_norm, backend, &model->net_)
                      .WithContext("mlp"));
  RETURN_IF_ERROR(model->net_.DeclareParameters("mlp.", &model->layout_));
  return model;
}

void Mlp::InitializeParameters(uint64_t seed, float* params) const {
  std::mt19937_64 rng(seed);
  net_.InitializeParameters(&rng, params);
}

StatusOr<StepStats> Mlp::Forward(ParameterStorage* storage, const data::Batch& batch) {
  if (batch.sparse_fields != 0) {
    return InvalidArgumentError("mlp: the batch has " + std::to_string(batch.sparse_fields) +
                                " sparse fields; an MLP takes dense features only");
  }
  RETURN_IF_ERROR(inputs_.Load(batch, options_.input_dim, options_.classes).WithContext("mlp"));
  const int64_t rows = static_cast<int64_t>(batch.size);
  ASSIGN_OR_RETURN(const float* logits, net_.Forward(storage, rows, inputs_.features()));
  RETURN_IF_ERROR(probabilities_.Resize(batch.size * static_cast<size_t>(options_.classes)));
  auto loss = backend_->SoftmaxCrossEntropy(rows, options_.classes, logits, inputs_.labels(),
                                            probabilities_.data());
  return StepStats{loss.loss, loss.correct, rows};
}

StatusOr<StepStats> Mlp::Evaluate(ParameterStorage* storage, const data::Batch& batch,
                                  std::vector<SparseRows>* sparse) {
  return Forward(storage, batch);
}

StatusOr<StepStats> Mlp::ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                         std::vector<SparseRows>* sparse) {
  ASSIGN_OR_RETURN(StepStats stats, Forward(storage, batch));
  const int64_t rows = static_cast<int64_t>(batch.size);
  RETURN_IF_ERROR(dlogits_.Resize(probabilities_.size()));
  backend_->SoftmaxCrossEntropyBackward(rows, options_.classes, probabilities_.data(),
                                        inputs_.labels(), dlogits_.data());
  RETURN_IF_ERROR(net_.Backward(storage, rows, inputs_.features(), dlogits_.data(),
                                /*dx=*/nullptr));
  return stats;
}

}  // namespace tessera::worker
