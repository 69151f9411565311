// Dataset: random access to dense classification samples, and MakeBatch, which gathers the
// samples a sampler chose into one row-major batch.
//
//   std::vector<size_t> indices = sampler.Indices(epoch);   // this rank's share
//   Batch batch;
//   RETURN_IF_ERROR(MakeBatch(dataset, {indices.begin(), indices.begin() + 64}, &batch));
//   // batch.features: 64 x feature_dim floats, row-major; batch.labels: 64 class ids.
//
// A sample is `feature_dim()` float32 features, one id per sparse field (categorical features
// for embedding tables; dense-only datasets have no sparse fields) and one label in
// [0, num_classes()). Any index
// in [0, size()) may be read in any order, which is what lets every rank read its own share
// without reading the others'.
//
// Thread-safety: implementations must make size(), feature_dim(), num_classes() and Get() safe
// to call concurrently (they are const and read-only), so several loader threads may share
// one Dataset.
#ifndef TESSERA_WORKER_DATA_DATASET_H_
#define TESSERA_WORKER_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace tessera::worker::data {

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual size_t size() const = 0;
  virtual size_t feature_dim() const = 0;
  virtual size_t num_classes() const = 0;

  // Writes sample `index`'s features to features[0 .. feature_dim()) and its label to *label.
  // REQUIRES: `features` has room for feature_dim() floats; `label` is not null.
  // Returns OutOfRange when index >= size(); on error the outputs are unspecified.
  virtual Status Get(size_t index, float* features, int64_t* label) const = 0;

  // The sparse fields: field f's ids lie in [0, sparse_field_sizes()[f]). Empty by default.
  virtual std::vector<int64_t> sparse_field_sizes() const { return {}; }
  // Writes sample `index`'s ids, one per sparse field, to ids[0 .. sparse_field_sizes().size()).
  // Errors as Get. The default (no sparse fields) writes nothing.
  virtual Status GetSparse(size_t index, int64_t* ids) const { return OkStatus(); }
};

// A batch of dense samples.
struct Batch {
  std::vector<float> features;  // size x feature_dim, row-major (row i = sample i)
  std::vector<int64_t> labels;  // size
  std::vector<int64_t> sparse_ids;  // size x sparse_fields, row-major; empty without any
  size_t size = 0;
  size_t feature_dim = 0;
  size_t sparse_fields = 0;
};

// Fills *batch with dataset samples indices[0], indices[1], ... in that order (duplicates are
// allowed: padding repeats indices). Reuses batch's vectors' capacity, so a loader can keep
// one Batch per slot without reallocating. An error names the batch position and the index;
// *batch is unspecified after an error. REQUIRES: batch is not null.
Status MakeBatch(const Dataset& dataset, const std::vector<size_t>& indices, Batch* batch);

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_DATASET_H_
