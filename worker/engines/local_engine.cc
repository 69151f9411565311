#include "worker/engines/local_engine.h"

#include <cstring>
#include <memory>

#include "common/training/checkpoint.h"

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
  fingerprint_ = layout.Fingerprint();
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

void LocalEngine::OnBackwardStart(int64_t step, float* grads) {
  early_step_ = grads != nullptr ? step : 0;
  early_grads_ = grads;
  early_checked_ = 0;
  early_verdict_ = true;
}

void LocalEngine::OnGradientsReady(uint64_t offset, uint64_t size) {
  // Ranges are disjoint and cover the layout once per step; after a skip or an error the rest
  // need no scan.
  if (early_step_ == 0 || !early_verdict_.ok() || !*early_verdict_) return;
  early_verdict_ = CheckGradients(early_step_, early_grads_ + offset, offset, size);
  early_checked_ += size;
}

Status LocalEngine::Step(int64_t step, float* params, float* grads,
                         const std::vector<SparseRows>& sparse) {
  if (step < 1) return InvalidArgumentError("local engine: step " + std::to_string(step) + " < 1");
  if (sparse.size() != tables_.size()) {
    return InvalidArgumentError("local engine: gradients for " + std::to_string(sparse.size()) +
                                " embedding tables, the model has " +
                                std::to_string(tables_.size()));
  }
  const bool early = early_step_ == step && early_grads_ == grads &&
                     (early_checked_ == size_ || !early_verdict_.ok() || !*early_verdict_);
  early_step_ = 0;
  ASSIGN_OR_RETURN(bool apply, early ? early_verdict_ : CheckGradients(step, grads, 0, size_));
  if (!apply) return OkStatus();
  last_lr_ = LearningRate(schedule_, optimizer_.lr, step - 1);  // after step - 1 updates
  DenseUpdate(optimizer_, last_lr_, step, params, grads, size_, state_.data());
  for (size_t t = 0; t < sparse.size(); ++t) {
    RETURN_IF_ERROR(tables_[t]->ApplyGradients(last_lr_, step, sparse[t].ids.data(),
                                               sparse[t].grads.data(), sparse[t].ids.size()));
  }
  return OkStatus();
}

Status LocalEngine::SaveCheckpoint(const std::string& root, int64_t step, const float* params) {
  RETURN_IF_ERROR(PrepareCheckpointStep(root, step));
  CheckpointShard shard;
  shard.floats["params"].assign(params, params + size_);
  shard.floats["optimizer_state"] = state_;
  for (const auto& table : tables_) {
    const std::string& name = table->spec().name;
    table->Export(&shard.ints[name + ".ids"], &shard.floats[name + ".values"],
                  &shard.floats[name + ".state"]);
  }
  ASSIGN_OR_RETURN(ShardFileInfo info,
                   WriteCheckpointShard(CheckpointStepDirectory(root, step) + "/local.ckpt", shard));
  CheckpointManifest manifest;
  manifest.step = step;
  manifest.mode = "local";
  manifest.layout_fingerprint = fingerprint_;
  manifest.dense_elements = size_;
  manifest.files = {info};
  return CommitCheckpoint(root, manifest);
}

Status LocalEngine::RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
  const std::string directory = CheckpointStepDirectory(root, step);
  if (manifest.layout_fingerprint != fingerprint_ || manifest.dense_elements != size_) {
    return FailedPreconditionError("checkpoint " + directory + " is of another model (" +
                                   std::to_string(manifest.dense_elements) +
                                   " dense parameters, layout fingerprint " +
                                   std::to_string(manifest.layout_fingerprint) + "; this one has " +
                                   std::to_string(size_) + ")");
  }
  if (manifest.files.size() != 1) {
    return DataLossError(directory + "/MANIFEST.json lists " +
                         std::to_string(manifest.files.size()) + " files; a local checkpoint has 1");
  }
  const std::string path = directory + "/" + manifest.files[0].file;
  ASSIGN_OR_RETURN(CheckpointShard shard, ReadCheckpointShard(path, manifest.files[0]));
  auto floats = [&](const std::string& name, size_t expected) -> StatusOr<std::vector<float>*> {
    auto it = shard.floats.find(name);
    if (it == shard.floats.end() || (expected > 0 && it->second.size() != expected)) {
      return DataLossError(path + ": entry '" + name + "' is missing or has the wrong size");
    }
    return &it->second;
  };
  ASSIGN_OR_RETURN(std::vector<float>* saved_params, floats("params", size_));
  ASSIGN_OR_RETURN(std::vector<float>* saved_state, floats("optimizer_state", state_.size()));
  for (const auto& table : tables_) {
    const std::string& name = table->spec().name;
    ASSIGN_OR_RETURN(std::vector<float>* values, floats(name + ".values", 0));
    ASSIGN_OR_RETURN(std::vector<float>* state, floats(name + ".state", 0));
    RETURN_IF_ERROR(table->Import(shard.ints[name + ".ids"], *values, *state).WithContext(path));
  }
  if (size_ > 0) std::memcpy(params, saved_params->data(), size_ * sizeof(float));
  state_ = std::move(*saved_state);
  return OkStatus();
}

}  // namespace tessera::worker
