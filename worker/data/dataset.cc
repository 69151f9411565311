#include "worker/data/dataset.h"

#include <string>

namespace tessera::worker::data {

Status MakeBatch(const Dataset& dataset, const std::vector<size_t>& indices, Batch* batch) {
  const size_t dim = dataset.feature_dim();
  batch->size = indices.size();
  batch->feature_dim = dim;
  batch->features.resize(indices.size() * dim);
  batch->labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    Status status = dataset.Get(indices[i], batch->features.data() + i * dim, &batch->labels[i]);
    if (!status.ok()) {
      return status.WithContext("make batch: position " + std::to_string(i) + " index " +
                                std::to_string(indices[i]));
    }
  }
  return OkStatus();
}

}  // namespace tessera::worker::data
