// CtrModel: a DLRM-like click-through-rate model.
//
//   dense features (dense_dim) ----------------------------.
//   field 0 id -> emb.0 row (embedding_dim) ---------------+-> concat -> MLP -> 1 logit -> BCE
//   ...                                                    |
//   field T-1 id -> emb.<T-1> row (embedding_dim) ---------'
//
// The embedding tables are sparse parameters (model.h): a batch touches only the rows of the
// ids it contains, the trainer fetches those rows from the engine and hands their gradients
// back, so a parameter server moves only touched rows. The MLP's parameters are dense:
// "top.<i>.weight" / "top.<i>.bias" (Sequential naming). Labels are 0 / 1 (num_classes() 2);
// a sample counts as correct when (logit > 0) == label.
//
// Thread-safety: as Model.
#ifndef TESSERA_WORKER_NN_CTR_MODEL_H_
#define TESSERA_WORKER_NN_CTR_MODEL_H_

#include <memory>
#include <vector>

#include "worker/nn/mlp.h"
#include "worker/nn/model.h"

namespace tessera::worker {

struct CtrModelOptions {
  int64_t dense_dim = 13;
  std::vector<int64_t> field_sizes = {100000, 100000, 10000, 1000, 100};  // rows per table
  int64_t embedding_dim = 16;
  std::vector<int64_t> hidden = {256, 128};
  Activation activation = Activation::kRelu;
  bool layer_norm = false;
  // The tables' rows start from values derived from (seed, table): EmbeddingTableSpec.init_seed.
  uint64_t seed = 0;
};

class CtrModel final : public Model {
 public:
  // InvalidArgument naming the option for a negative dense_dim, no fields, a table or
  // embedding_dim < 1, or a bad hidden width.
  static StatusOr<std::unique_ptr<CtrModel>> Create(const CtrModelOptions& options,
                                                    ComputeBackend* backend);

  std::string_view name() const override { return "ctr"; }
  const ParameterLayout& layout() const override { return layout_; }
  const std::vector<EmbeddingTableSpec>& embedding_tables() const override { return tables_; }
  int64_t input_dim() const override { return options_.dense_dim; }
  int64_t num_classes() const override { return 2; }
  void InitializeParameters(uint64_t seed, float* params) const override;
  using Model::Evaluate;
  using Model::ForwardBackward;
  StatusOr<StepStats> ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                      std::vector<SparseRows>* sparse) override;
  StatusOr<StepStats> Evaluate(ParameterStorage* storage, const data::Batch& batch,
                               std::vector<SparseRows>* sparse) override;

 private:
  struct TableBuffers {
    explicit TableBuffers(ComputeBackend* backend) : rows(backend), grads(backend), slots(backend) {}
    DeviceBuffer<float> rows, grads;
    DeviceBuffer<int32_t> slots;
  };

  CtrModel(const CtrModelOptions& options, ComputeBackend* backend);
  int64_t width() const {
    return options_.dense_dim + static_cast<int64_t>(tables_.size()) * options_.embedding_dim;
  }
  StatusOr<StepStats> Forward(ParameterStorage* storage, const data::Batch& batch,
                              std::vector<SparseRows>* sparse);

  const CtrModelOptions options_;
  ComputeBackend* const backend_;
  std::vector<EmbeddingTableSpec> tables_;
  ParameterLayout layout_;
  Sequential net_;
  DeviceBatch inputs_;
  DeviceBuffer<float> concat_, dconcat_, probabilities_, dlogits_;
  std::vector<TableBuffers> table_buffers_;  // device copies (unused on the CPU)
  // Per table, the rows, slots and row gradients the last Forward used (backend memory).
  std::vector<const float*> rows_;
  std::vector<const int32_t*> slots_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_CTR_MODEL_H_
