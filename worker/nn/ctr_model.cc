#include "worker/nn/ctr_model.h"

#include <random>
#include <string>

namespace tessera::worker {

CtrModel::CtrModel(const CtrModelOptions& options, ComputeBackend* backend)
    : options_(options), backend_(backend), net_(backend), inputs_(backend), concat_(backend),
      dconcat_(backend), probabilities_(backend), dlogits_(backend) {}

StatusOr<std::unique_ptr<CtrModel>> CtrModel::Create(const CtrModelOptions& options,
                                                     ComputeBackend* backend) {
  if (options.dense_dim < 0) {
    return InvalidArgumentError("ctr: dense_dim=" + std::to_string(options.dense_dim) +
                                " is negative");
  }
  if (options.field_sizes.empty()) {
    return InvalidArgumentError("ctr: the model needs at least one sparse field (embedding table)");
  }
  if (options.embedding_dim < 1) {
    return InvalidArgumentError("ctr: embedding_dim=" + std::to_string(options.embedding_dim) +
                                " must be at least 1");
  }
  std::unique_ptr<CtrModel> model(new CtrModel(options, backend));
  for (size_t t = 0; t < options.field_sizes.size(); ++t) {
    if (options.field_sizes[t] < 1) {
      return InvalidArgumentError("ctr: table " + std::to_string(t) + " has " +
                                  std::to_string(options.field_sizes[t]) +
                                  " rows; tables need at least 1");
    }
    // Distinct, seed-dependent streams per table (the golden-ratio step keeps them apart).
    const uint64_t init_seed = options.seed * 0x9e3779b97f4a7c15ULL + t + 1;
    model->tables_.push_back(
        {"emb." + std::to_string(t), options.field_sizes[t], options.embedding_dim, init_seed});
    model->table_buffers_.emplace_back(backend);
  }
  RETURN_IF_ERROR(AppendMlpLayers(model->width(), options.hidden, 1, options.activation,
                                  options.layer_norm, backend, &model->net_)
                      .WithContext("ctr"));
  RETURN_IF_ERROR(model->net_.DeclareParameters("top.", &model->layout_));
  return model;
}

void CtrModel::InitializeParameters(uint64_t seed, float* params) const {
  std::mt19937_64 rng(seed);
  net_.InitializeParameters(&rng, params);
}

StatusOr<StepStats> CtrModel::Forward(ParameterStorage* storage, const data::Batch& batch,
                                      std::vector<SparseRows>* sparse) {
  RETURN_IF_ERROR(inputs_.Load(batch, options_.dense_dim, 2).WithContext("ctr"));
  if (sparse->size() != tables_.size()) {
    return InvalidArgumentError("ctr: got rows for " + std::to_string(sparse->size()) +
                                " embedding tables, the model has " +
                                std::to_string(tables_.size()));
  }
  const int64_t rows = static_cast<int64_t>(batch.size);
  const int64_t dim = options_.embedding_dim;
  RETURN_IF_ERROR(concat_.Resize(static_cast<size_t>(rows * width())));
  if (options_.dense_dim > 0) {
    backend_->CopyColumns(rows, options_.dense_dim, inputs_.features(), options_.dense_dim,
                          concat_.data(), width());
  }
  rows_.assign(tables_.size(), nullptr);
  slots_.assign(tables_.size(), nullptr);
  for (size_t t = 0; t < tables_.size(); ++t) {
    const SparseRows& table = (*sparse)[t];
    if (table.slots.size() != batch.size ||
        table.values.size() != table.ids.size() * static_cast<size_t>(dim)) {
      return InvalidArgumentError("ctr: the rows of table '" + tables_[t].name +
                                  "' do not match the batch (fill them with GroupSparseIds)");
    }
    if (backend_->host_memory()) {
      rows_[t] = table.values.data();
      slots_[t] = table.slots.data();
    } else {
      TableBuffers& buffers = table_buffers_[t];
      RETURN_IF_ERROR(buffers.rows.Resize(table.values.size()));
      RETURN_IF_ERROR(buffers.slots.Resize(table.slots.size()));
      backend_->CopyToDevice(buffers.rows.data(), table.values.data(),
                             table.values.size() * sizeof(float));
      backend_->CopyToDevice(buffers.slots.data(), table.slots.data(),
                             table.slots.size() * sizeof(int32_t));
      rows_[t] = buffers.rows.data();
      slots_[t] = buffers.slots.data();
    }
    backend_->GatherRows(rows, dim, rows_[t], slots_[t],
                         concat_.data() + options_.dense_dim + static_cast<int64_t>(t) * dim,
                         width());
  }
  ASSIGN_OR_RETURN(const float* logits, net_.Forward(storage, rows, concat_.data()));
  RETURN_IF_ERROR(probabilities_.Resize(batch.size));
  auto loss = backend_->BinaryCrossEntropy(rows, logits, inputs_.labels(), probabilities_.data());
  return StepStats{loss.loss, loss.correct, rows};
}

StatusOr<StepStats> CtrModel::Evaluate(ParameterStorage* storage, const data::Batch& batch,
                                       std::vector<SparseRows>* sparse) {
  return Forward(storage, batch, sparse);
}

StatusOr<StepStats> CtrModel::ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                              std::vector<SparseRows>* sparse) {
  ASSIGN_OR_RETURN(StepStats stats, Forward(storage, batch, sparse));
  const int64_t rows = static_cast<int64_t>(batch.size);
  const int64_t dim = options_.embedding_dim;
  RETURN_IF_ERROR(dlogits_.Resize(batch.size));
  backend_->BinaryCrossEntropyBackward(rows, probabilities_.data(), inputs_.labels(),
                                       dlogits_.data());
  RETURN_IF_ERROR(dconcat_.Resize(concat_.size()));
  RETURN_IF_ERROR(net_.Backward(storage, rows, concat_.data(), dlogits_.data(), dconcat_.data()));
  for (size_t t = 0; t < tables_.size(); ++t) {
    SparseRows& table = (*sparse)[t];
    table.grads.resize(table.values.size());
    float* row_grads = table.grads.data();
    if (!backend_->host_memory()) {
      RETURN_IF_ERROR(table_buffers_[t].grads.Resize(table.grads.size()));
      row_grads = table_buffers_[t].grads.data();
    }
    backend_->Fill(table.grads.size(), 0.0f, row_grads);
    backend_->ScatterAddRows(rows, dim,
                             dconcat_.data() + options_.dense_dim + static_cast<int64_t>(t) * dim,
                             width(), slots_[t], row_grads);
    if (!backend_->host_memory()) {
      backend_->CopyToHost(table.grads.data(), row_grads, table.grads.size() * sizeof(float));
    }
  }
  return stats;
}

}  // namespace tessera::worker
