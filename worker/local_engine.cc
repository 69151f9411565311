#include "worker/local_engine.h"

#include <memory>

namespace tessera::worker {

StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(const OptimizerOptions& optimizer,
                                                           const LrScheduleOptions& schedule) {
  RETURN_IF_ERROR(ValidateOptimizerOptions(optimizer));
  RETURN_IF_ERROR(ValidateLrSchedule(schedule, optimizer.lr));
  return std::unique_ptr<LocalEngine>(new LocalEngine(optimizer, schedule));
}

Status LocalEngine::Initialize(const ParameterLayout& layout,
                               const std::vector<EmbeddingTableSpec>& tables, float* params) {
  size_ = layout.total_size();
  state_.assign(StateFloatsPerElement(optimizer_.kind) * size_, 0.0f);
  InitOptimizerState(optimizer_, state_.data(), size_);
  tables_.clear();
  for (const EmbeddingTableSpec& spec : tables) {
    if (spec.rows < 1 || spec.dim < 1) {
      return InvalidArgumentError("local engine: embedding table '" + spec.name + "' has " +
                                  std::to_string(spec.rows) + " rows of " +
                                  std::to_string(spec.dim) + " floats");
    }
    tables_.push_back(std::make_unique<EmbeddingTable>(spec, optimizer_));
  }
  return OkStatus();
}

Status LocalEngine::LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) {
  if (table >= tables_.size()) {
    return InvalidArgumentError("local engine: no embedding table " + std::to_string(table) +
                                " (the model has " + std::to_string(tables_.size()) + ")");
  }
  return tables_[table]->Lookup(ids.data(), ids.size(), values);
}

Status LocalEngine::Step(int64_t step, float* params, float* grads,
                         const std::vector<SparseRows>& sparse) {
  if (step < 1) return InvalidArgumentError("local engine: step " + std::to_string(step) + " < 1");
  if (sparse.size() != tables_.size()) {
    return InvalidArgumentError("local engine: gradients for " + std::to_string(sparse.size()) +
                                " embedding tables, the model has " +
                                std::to_string(tables_.size()));
  }
  last_lr_ = LearningRate(schedule_, optimizer_.lr, step - 1);  // after step - 1 updates
  DenseUpdate(optimizer_, last_lr_, step, params, grads, size_, state_.data());
  for (size_t t = 0; t < sparse.size(); ++t) {
    RETURN_IF_ERROR(tables_[t]->ApplyGradients(last_lr_, step, sparse[t].ids.data(),
                                               sparse[t].grads.data(), sparse[t].ids.size()));
  }
  return OkStatus();
}

}  // namespace tessera::worker
