#include "worker/data/dataset.h"

#include <string>

namespace tessera::worker::data {

Status MakeBatch(const Dataset& dataset, const std::vector<size_t>& indices, Batch* batch) {
  const size_t dim = dataset.feature_dim();
  batch->size = indices.size();
  batch->feature_dim = dim;
  batch->features.resize(indices.size() * dim);
  batch->labels.resize(indices.size());
  const size_t fields = dataset.sparse_field_sizes().size();
  batch->sparse_fields = fields;
  batch->sparse_ids.resize(indices.size() * fields);
  for (size_t i = 0; i < indices.size(); ++i) {
    Status status = dataset.Get(indices[i], batch->features.data() + i * dim, &batch->labels[i]);
    if (status.ok() && fields > 0) {
      status = dataset.GetSparse(indices[i], batch->sparse_ids.data() + i * fields);
    }
    if (!status.ok()) {
      return status.WithContext("make batch: position " + std::to_string(i) + " index " +
                                std::to_string(indices[i]));
    }
  }
  return OkStatus();
}

}  // namespace tessera::worker::data
