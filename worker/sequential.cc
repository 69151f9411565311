#include "worker/sequential.h"

namespace tessera::worker {

Status Sequential::Add(std::unique_ptr<Layer> layer) {
  const std::string where = "layer " + std::to_string(layers_.size()) + " (" +
                            std::string(layer->kind()) + ")";
  if (layer->input_dim() <= 0 || layer->output_dim() <= 0) {
    return InvalidArgumentError(where + ": widths " + std::to_string(layer->input_dim()) + " -> " +
                                std::to_string(layer->output_dim()) + " must be positive");
  }
  if (!layers_.empty() && layers_.back()->output_dim() != layer->input_dim()) {
    return InvalidArgumentError(where + " takes " + std::to_string(layer->input_dim()) +
                                " inputs but the previous layer (" +
                                std::string(layers_.back()->kind()) + ") gives " +
                                std::to_string(layers_.back()->output_dim()));
  }
  layers_.push_back(std::move(layer));
  outputs_.emplace_back(backend_);
  return OkStatus();
}

Status Sequential::DeclareParameters(const std::string& prefix, ParameterLayout* layout) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(layers_[i]->DeclareParameters(prefix + std::to_string(i), layout));
  }
  return OkStatus();
}

void Sequential::InitializeParameters(std::mt19937_64* rng, float* params) const {
  for (const auto& layer : layers_) layer->InitializeParameters(rng, params);
}

int64_t Sequential::input_dim() const { return layers_.front()->input_dim(); }
int64_t Sequential::output_dim() const { return layers_.back()->output_dim(); }

StatusOr<const float*> Sequential::Forward(const float* params, int64_t batch, const float* x) {
  const float* input = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(outputs_[i].Resize(static_cast<size_t>(batch * layers_[i]->output_dim())));
    RETURN_IF_ERROR(layers_[i]->Forward(backend_, params, batch, input, outputs_[i].data())
                        .WithContext("forward of layer " + std::to_string(i)));
    input = outputs_[i].data();
  }
  return input;
}

Status Sequential::Backward(const float* params, int64_t batch, const float* x, const float* dy,
                            float* dx, float* grads, const GradientsReady& on_ready) {
  const float* upstream = dy;
  int next = 0;
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i];
    const float* input = i == 0 ? x : outputs_[i - 1].data();
    float* downstream = dx;
    if (i > 0) {
      RETURN_IF_ERROR(delta_[next].Resize(static_cast<size_t>(batch * layer.input_dim())));
      downstream = delta_[next].data();
    }
    RETURN_IF_ERROR(layer.Backward(backend_, params, batch, input, outputs_[i].data(), upstream,
                                   downstream, grads)
                        .WithContext("backward of layer " + std::to_string(i)));
    std::vector<ParameterView> views = layer.parameters();
    if (on_ready && !views.empty()) {
      const ParameterView& last = views.back();
      on_ready(views.front().offset, last.offset + last.size - views.front().offset);
    }
    upstream = downstream;
    next ^= 1;
  }
  return OkStatus();
}

}  // namespace tessera::worker
