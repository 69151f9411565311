// InMemoryDataset: a Dataset whose samples all sit in two vectors; what the file readers
// (binary_dataset, mnist_reader) return, and a convenient fixture for tests.
//
// Thread-safety: immutable after Create; every method may be called concurrently.
#ifndef TESSERA_WORKER_DATA_IN_MEMORY_DATASET_H_
#define TESSERA_WORKER_DATA_IN_MEMORY_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "worker/data/dataset.h"

namespace tessera::worker::data {

class InMemoryDataset : public Dataset {
 public:
  // `features` holds labels.size() rows of feature_dim floats, row-major. Rejects
  // (InvalidArgument) feature_dim == 0, num_classes == 0, a features length that is not
  // labels.size() * feature_dim, and any label outside [0, num_classes).
  static StatusOr<std::unique_ptr<InMemoryDataset>> Create(size_t feature_dim,
                                                           size_t num_classes,
                                                           std::vector<float> features,
                                                           std::vector<int64_t> labels);

  size_t size() const override { return labels_.size(); }
  size_t feature_dim() const override { return feature_dim_; }
  size_t num_classes() const override { return num_classes_; }
  Status Get(size_t index, float* features, int64_t* label) const override;

  // The whole set, row-major (for a trainer that wants to evaluate without copying).
  const std::vector<float>& features() const { return features_; }
  const std::vector<int64_t>& labels() const { return labels_; }

 private:
  InMemoryDataset(size_t feature_dim, size_t num_classes, std::vector<float> features,
                  std::vector<int64_t> labels);

  const size_t feature_dim_;
  const size_t num_classes_;
  const std::vector<float> features_;
  const std::vector<int64_t> labels_;
};

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_IN_MEMORY_DATASET_H_
