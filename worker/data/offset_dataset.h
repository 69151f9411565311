// OffsetDataset: samples [offset, base.size()) of another dataset, renumbered from 0. Used to
// hold out the tail of a synthetic set for evaluation: the same teacher, samples the training
// set never contains.
//
// Thread-safety: as the base dataset (read-only).
#ifndef TESSERA_WORKER_DATA_OFFSET_DATASET_H_
#define TESSERA_WORKER_DATA_OFFSET_DATASET_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

namespace tessera::worker::data {

class OffsetDataset final : public Dataset {
 public:
  // REQUIRES: offset <= base->size().
  OffsetDataset(std::unique_ptr<Dataset> base, size_t offset)
      : base_(std::move(base)), offset_(offset) {}

  size_t size() const override { return base_->size() - offset_; }
  size_t feature_dim() const override { return base_->feature_dim(); }
  size_t num_classes() const override { return base_->num_classes(); }
  Status Get(size_t index, float* features, int64_t* label) const override {
    if (index >= size()) return OutOfRange(index);
    return base_->Get(offset_ + index, features, label);
  }
  std::vector<int64_t> sparse_field_sizes() const override {
    return base_->sparse_field_sizes();
  }
  Status GetSparse(size_t index, int64_t* ids) const override {
    if (index >= size()) return OutOfRange(index);
    return base_->GetSparse(offset_ + index, ids);
  }

 private:
  Status OutOfRange(size_t index) const {
    return OutOfRangeError("held-out sample " + std::to_string(index) + " >= " +
                           std::to_string(size()));
  }

  const std::unique_ptr<Dataset> base_;
  const size_t offset_;
};

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_OFFSET_DATASET_H_
