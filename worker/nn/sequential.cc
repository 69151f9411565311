#include "worker/nn/sequential.h"

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

Status Sequential::DeclareParameters(const std::string& prefix, ParameterLayout* layout,
                                     int first_index) {
  blocks_.clear();
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(layers_[i]->DeclareParameters(
        prefix + std::to_string(first_index + static_cast<int>(i)), layout));
    ParameterBlock block;
    std::vector<ParameterView> views = layers_[i]->parameters();
    if (!views.empty()) block.offset = views.front().offset;
    for (const ParameterView& view : views) {
      if (view.offset != block.offset + block.size) {
        return InternalError("layer " + std::to_string(i) + " (" +
                             std::string(layers_[i]->kind()) + "): parameter '" + view.name +
                             "' does not follow the previous one (a layer's block is contiguous)");
      }
      block.size += view.size;
    }
    blocks_.push_back(block);
  }
  return OkStatus();
}

void Sequential::InitializeParameters(std::mt19937_64* rng, float* params) const {
  for (const auto& layer : layers_) layer->InitializeParameters(rng, params);
}

int64_t Sequential::input_dim() const { return layers_.front()->input_dim(); }
int64_t Sequential::output_dim() const { return layers_.back()->output_dim(); }

StatusOr<const float*> Sequential::Forward(ParameterStorage* storage, int64_t batch,
                                           const float* x) {
  const float* input = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string where = "forward of layer " + std::to_string(i);
    RETURN_IF_ERROR(outputs_[i].Resize(static_cast<size_t>(batch * layers_[i]->output_dim())));
    const ParameterBlock& block = blocks_[i];
    const float* params = nullptr;
    if (block.size > 0) {
      StatusOr<const float*> acquired = storage->Acquire(block, Pass::kForward);
      if (!acquired.ok()) return acquired.status().WithContext(where);
      params = *acquired;
    }
    Status ran = layers_[i]->Forward(backend_, params, batch, input, outputs_[i].data());
    if (block.size > 0) storage->Release(block);
    RETURN_IF_ERROR(ran.WithContext(where));
    input = outputs_[i].data();
  }
  return input;
}

Status Sequential::Backward(ParameterStorage* storage, int64_t batch, const float* x,
                            const float* dy, float* dx) {
  const float* upstream = dy;
  int next = 0;
  for (size_t i = layers_.size(); i-- > 0;) {
    const std::string where = "backward of layer " + std::to_string(i);
    Layer& layer = *layers_[i];
    const float* input = i == 0 ? x : outputs_[i - 1].data();
    float* downstream = dx;
    if (i > 0) {
      RETURN_IF_ERROR(delta_[next].Resize(static_cast<size_t>(batch * layer.input_dim())));
      downstream = delta_[next].data();
    }
    const ParameterBlock& block = blocks_[i];
    const float* params = nullptr;
    float* grads = nullptr;
    if (block.size > 0) {
      StatusOr<const float*> acquired = storage->Acquire(block, Pass::kBackward);
      if (!acquired.ok()) return acquired.status().WithContext(where);
      params = *acquired;
      StatusOr<float*> gradient_block = storage->GradientBlock(block);
      if (!gradient_block.ok()) {
        storage->Release(block);
        return gradient_block.status().WithContext(where);
      }
      grads = *gradient_block;
    }
    Status ran = layer.Backward(backend_, params, batch, input, outputs_[i].data(), upstream,
                                downstream, grads);
    if (block.size > 0) {
      storage->Release(block);
      if (ran.ok()) ran = storage->GradientsDone(block);
    }
    RETURN_IF_ERROR(ran.WithContext(where));
    upstream = downstream;
    next ^= 1;
  }
  return OkStatus();
}

}  // namespace tessera::worker
