// Model: what the trainer trains. Dense parameters live in one flat buffer described by
// layout(); sparse parameters (embedding tables) are described by embedding_tables() and live
// wherever the training engine keeps them (the worker in local mode, the parameter servers in
// PS modes): for each batch the trainer asks the engine for the rows the batch touches
// (SparseRows::values) and hands the rows' gradients back (SparseRows::grads). The model owns
// neither buffer, so engines can all-reduce, shard or push them as plain ranges.
//
// Built-in models: Mlp (mlp.h, classification) and CtrModel (ctr_model.h, click-through with
// embedding tables).
//
// Thread-safety: one thread at a time (a model keeps the batch's activations between forward
// and backward).
#ifndef TESSERA_WORKER_NN_MODEL_H_
#define TESSERA_WORKER_NN_MODEL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/training/embedding_table.h"
#include "common/training/parameter_layout.h"
#include "worker/data/dataset.h"
#include "worker/nn/compute_backend.h"
#include "worker/nn/device_buffer.h"
#include "worker/nn/parameter_storage.h"
#include "worker/nn/sequential.h"

namespace tessera::worker {

struct StepStats {
  double loss = 0;      // mean over the batch
  int64_t correct = 0;  // samples classified right
  int64_t samples = 0;
};

// One embedding table's part of a batch, in host memory.
struct SparseRows {
  std::vector<int64_t> ids;    // the distinct ids the batch touches, ascending
  std::vector<int32_t> slots;  // per sample: the position of its id in `ids`
  std::vector<float> values;   // ids.size() x dim: the rows' current values (the engine's)
  std::vector<float> grads;    // ids.size() x dim: dLoss/drow, written by ForwardBackward
};

// Fills (*sparse)[t].ids and .slots from column t of batch.sparse_ids for every table t, and
// sizes values and grads. InvalidArgument when the batch has a different number of sparse
// fields than there are tables, or an id is outside its table (naming sample, table and id).
Status GroupSparseIds(const data::Batch& batch, const std::vector<EmbeddingTableSpec>& tables,
                      std::vector<SparseRows>* sparse);

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string_view name() const = 0;  // "mlp", "ctr"
  virtual const ParameterLayout& layout() const = 0;
  virtual const std::vector<EmbeddingTableSpec>& embedding_tables() const = 0;
  virtual int64_t input_dim() const = 0;    // dense features per sample
  virtual int64_t num_classes() const = 0;  // labels are in [0, num_classes())

  // Fills `params` (host memory, layout().total_size() floats) deterministically from `seed`.
  virtual void InitializeParameters(uint64_t seed, float* params) const = 0;

  // Forward and backward on `batch` (host memory): each layer's parameters come from
  // `storage` and its gradients (of the mean loss) go back to it (parameter_storage.h); each
  // sparse[t].grads gets its rows' gradients. `sparse` comes from GroupSparseIds with values
  // filled in (empty for a model without tables). InvalidArgument naming the sample for a bad
  // label or a batch that does not fit the model.
  virtual StatusOr<StepStats> ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                              std::vector<SparseRows>* sparse) = 0;
  // Forward only.
  virtual StatusOr<StepStats> Evaluate(ParameterStorage* storage, const data::Batch& batch,
                                       std::vector<SparseRows>* sparse) = 0;

  // The same on the flat buffers (the backend's memory, layout size): overwrites `grads` and
  // reports each layer's gradients to on_ready (may be empty) as they become final.
  StatusOr<StepStats> ForwardBackward(const float* params, const data::Batch& batch,
                                      std::vector<SparseRows>* sparse, float* grads,
                                      const GradientsReady& on_ready) {
    FlatParameterStorage flat(params, grads, on_ready);
    return ForwardBackward(&flat, batch, sparse);
  }
  StatusOr<StepStats> Evaluate(const float* params, const data::Batch& batch,
                               std::vector<SparseRows>* sparse) {
    FlatParameterStorage flat(params, nullptr);
    return Evaluate(&flat, batch, sparse);
  }
};

// A batch's features and labels in a backend's memory: on the CPU the batch's own vectors, on
// a GPU device copies. Shared by the models' implementations.
class DeviceBatch {
 public:
  explicit DeviceBatch(ComputeBackend* backend) : backend_(backend), features_(backend),
                                                  labels_(backend) {}
  // Checks batch against the model's shape and labels, then makes them available.
  Status Load(const data::Batch& batch, int64_t input_dim, int64_t num_classes);
  const float* features() const { return features_ptr_; }
  const int64_t* labels() const { return labels_ptr_; }

 private:
  ComputeBackend* const backend_;
  DeviceBuffer<float> features_;
  DeviceBuffer<int64_t> labels_;
  const float* features_ptr_ = nullptr;
  const int64_t* labels_ptr_ = nullptr;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_MODEL_H_
