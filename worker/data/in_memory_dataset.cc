#include "worker/data/in_memory_dataset.h"

#include <cstring>
#include <string>
#include <utility>

namespace tessera::worker::data {

StatusOr<std::unique_ptr<InMemoryDataset>> InMemoryDataset::Create(size_t feature_dim,
                                                                   size_t num_classes,
                                                                   std::vector<float> features,
                                                                   std::vector<int64_t> labels) {
  if (feature_dim == 0) return InvalidArgumentError("in-memory dataset: feature_dim must be >= 1");
  if (num_classes == 0) return InvalidArgumentError("in-memory dataset: num_classes must be >= 1");
  // Compare by division so a huge label count cannot overflow the product.
  if (features.size() % feature_dim != 0 || features.size() / feature_dim != labels.size()) {
    return InvalidArgumentError("in-memory dataset: " + std::to_string(features.size()) +
                                " features are not " + std::to_string(labels.size()) +
                                " samples x feature_dim " + std::to_string(feature_dim));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || static_cast<uint64_t>(labels[i]) >= num_classes) {
      return InvalidArgumentError("in-memory dataset: sample " + std::to_string(i) + " label " +
                                  std::to_string(labels[i]) + " is outside [0, " +
                                  std::to_string(num_classes) + ")");
    }
  }
  return std::unique_ptr<InMemoryDataset>(
      new InMemoryDataset(feature_dim, num_classes, std::move(features), std::move(labels)));
}

InMemoryDataset::InMemoryDataset(size_t feature_dim, size_t num_classes,
                                 std::vector<float> features, std::vector<int64_t> labels)
    : feature_dim_(feature_dim),
      num_classes_(num_classes),
      features_(std::move(features)),
      labels_(std::move(labels)) {}

Status InMemoryDataset::Get(size_t index, float* features, int64_t* label) const {
  if (index >= labels_.size()) {
    return OutOfRangeError("sample index " + std::to_string(index) + " >= dataset size " +
                           std::to_string(labels_.size()));
  }
  std::memcpy(features, features_.data() + index * feature_dim_, feature_dim_ * sizeof(float));
  *label = labels_[index];
  return OkStatus();
}

}  // namespace tessera::worker::data
