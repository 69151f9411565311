// Mlp: a multi-layer perceptron classifier,
//   Linear -> [LayerNorm] -> ReLU|GELU -> ... -> Linear -> softmax cross-entropy,
// built from Sequential layers. Parameters are "mlp.<i>.weight" / "mlp.<i>.bias" with i the
// layer's position (PyTorch's nn.Sequential naming: with ReLU and no LayerNorm the linear
// layers are mlp.0, mlp.2, mlp.4, ...).
//
// The default, 784-1024-1024-10, has 1.86 M parameters (the size PyTorch is compared at in
// docs/benchmarks.md).
//
// Thread-safety: as Model.
#ifndef TESSERA_WORKER_NN_MLP_H_
#define TESSERA_WORKER_NN_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "worker/nn/model.h"

namespace tessera::worker {

enum class Activation { kRelu, kGelu };
// "relu" / "gelu"; InvalidArgument naming the value otherwise.
StatusOr<Activation> ParseActivation(std::string_view name);

struct MlpOptions {
  int64_t input_dim = 784;
  std::vector<int64_t> hidden = {1024, 1024};
  int64_t classes = 10;
  Activation activation = Activation::kRelu;
  bool layer_norm = false;  // a LayerNorm after every hidden Linear, before the activation
};

// Appends the hidden part of an MLP (Linear, [LayerNorm], activation per hidden width) and,
// when output_dim > 0, a last Linear to output_dim, to `net`. Shared with CtrModel.
Status AppendMlpLayers(int64_t input_dim, const std::vector<int64_t>& hidden, int64_t output_dim,
                       Activation activation, bool layer_norm, ComputeBackend* backend,
                       Sequential* net);

class Mlp final : public Model {
 public:
  // InvalidArgument naming the option for non-positive sizes or fewer than 2 classes.
  static StatusOr<std::unique_ptr<Mlp>> Create(const MlpOptions& options, ComputeBackend* backend);

  std::string_view name() const override { return "mlp"; }
  const ParameterLayout& layout() const override { return layout_; }
  const std::vector<EmbeddingTableSpec>& embedding_tables() const override { return no_tables_; }
  int64_t input_dim() const override { return options_.input_dim; }
  int64_t num_classes() const override { return options_.classes; }
  // Every layer from one std::mt19937_64(seed), in layer order: weights and biases uniform in
  // +-1/sqrt(fan_in) (nn.Linear's default), LayerNorm weight 1 and bias 0.
  void InitializeParameters(uint64_t seed, float* params) const override;
  using Model::Evaluate;
  using Model::ForwardBackward;
  StatusOr<StepStats> ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                      std::vector<SparseRows>* sparse) override;
  StatusOr<StepStats> Evaluate(ParameterStorage* storage, const data::Batch& batch,
                               std::vector<SparseRows>* sparse) override;

 private:
  Mlp(const MlpOptions& options, ComputeBackend* backend)
      : options_(options), backend_(backend), net_(backend), inputs_(backend),
        probabilities_(backend), dlogits_(backend) {}
  StatusOr<StepStats> Forward(ParameterStorage* storage, const data::Batch& batch);

  const MlpOptions options_;
  ComputeBackend* const backend_;
  const std::vector<EmbeddingTableSpec> no_tables_;
  ParameterLayout layout_;
  Sequential net_;
  DeviceBatch inputs_;
  DeviceBuffer<float> probabilities_, dlogits_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_MLP_H_
