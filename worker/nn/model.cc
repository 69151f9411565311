#include "worker/nn/model.h"

#include <algorithm>
#include <string>

namespace tessera::worker {

Status GroupSparseIds(const data::Batch& batch, const std::vector<EmbeddingTableSpec>& tables,
                      std::vector<SparseRows>* sparse) {
  if (batch.sparse_fields != tables.size()) {
    return InvalidArgumentError("the batch has " + std::to_string(batch.sparse_fields) +
                                " sparse fields but the model has " +
                                std::to_string(tables.size()) + " embedding tables");
  }
  sparse->resize(tables.size());
  const size_t fields = tables.size();
  for (size_t t = 0; t < fields; ++t) {
    SparseRows& rows = (*sparse)[t];
    rows.ids.clear();
    for (size_t i = 0; i < batch.size; ++i) {
      const int64_t id = batch.sparse_ids[i * fields + t];
      if (id < 0 || id >= tables[t].rows) {
        return InvalidArgumentError("sample " + std::to_string(i) + " of the batch has id " +
                                    std::to_string(id) + " for table '" + tables[t].name +
                                    "', outside [0, " + std::to_string(tables[t].rows) + ")");
      }
      rows.ids.push_back(id);
    }
    std::sort(rows.ids.begin(), rows.ids.end());
    rows.ids.erase(std::unique(rows.ids.begin(), rows.ids.end()), rows.ids.end());
    rows.slots.resize(batch.size);
    for (size_t i = 0; i < batch.size; ++i) {
      const int64_t id = batch.sparse_ids[i * fields + t];
      rows.slots[i] = static_cast<int32_t>(
          std::lower_bound(rows.ids.begin(), rows.ids.end(), id) - rows.ids.begin());
    }
    const size_t floats = rows.ids.size() * static_cast<size_t>(tables[t].dim);
    rows.values.resize(floats);
    rows.grads.resize(floats);
  }
  return OkStatus();
}

Status DeviceBatch::Load(const data::Batch& batch, int64_t input_dim, int64_t num_classes) {
  if (batch.feature_dim != static_cast<size_t>(input_dim)) {
    return InvalidArgumentError("the batch has " + std::to_string(batch.feature_dim) +
                                " features per sample but the model takes " +
                                std::to_string(input_dim));
  }
  for (size_t r = 0; r < batch.size; ++r) {
    if (batch.labels[r] < 0 || batch.labels[r] >= num_classes) {
      return InvalidArgumentError("sample " + std::to_string(r) + " of the batch has label " +
                                  std::to_string(batch.labels[r]) + ", outside [0, " +
                                  std::to_string(num_classes) + ")");
    }
  }
  if (backend_->host_memory()) {
    features_ptr_ = batch.features.data();
    labels_ptr_ = batch.labels.data();
    return OkStatus();
  }
  RETURN_IF_ERROR(features_.Resize(batch.features.size()));
  RETURN_IF_ERROR(labels_.Resize(batch.labels.size()));
  backend_->CopyToDevice(features_.data(), batch.features.data(),
                         batch.features.size() * sizeof(float));
  backend_->CopyToDevice(labels_.data(), batch.labels.data(), batch.labels.size() * sizeof(int64_t));
  features_ptr_ = features_.data();
  labels_ptr_ = labels_.data();
  return OkStatus();
}

}  // namespace tessera::worker
