// TrainingEngine: where a distributed mode plugs into the training loop.
//
// The trainer (worker/trainer.h) runs forward and backward on this rank's batch; everything
// that makes training distributed happens in the engine, between backward and the next step:
//   local      applies the optimizer to the local gradients (local_engine.h);
//   allreduce  averages gradients across ranks, then applies the optimizer (buckets can start
//              in OnGradientsReady, overlapping backward);
//   ps-*       pushes gradients to the servers, which apply the optimizer, and pulls the
//              updated parameters back;
//   zero1-3    reduce-scatters gradients, updates this rank's slice, all-gathers parameters.
// Dense parameters and gradients are flat buffers in one ParameterLayout, so every engine
// works on plain ranges. Sparse parameters (embedding tables, common/training/embedding_table.h) live
// in the engine: the trainer asks it for the rows each batch touches (LookupRows) and hands
// their gradients to Step. Everything an engine sees is host memory (on a GPU the trainer
// copies around it).
//
// Thread-safety: called from the training thread only.
#ifndef TESSERA_WORKER_ENGINES_TRAINING_ENGINE_H_
#define TESSERA_WORKER_ENGINES_TRAINING_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/training/embedding_table.h"
#include "common/training/parameter_layout.h"
#include "worker/collectives/collectives.h"
#include "worker/nn/model.h"
#include "worker/nn/parameter_storage.h"

namespace tessera::worker {

// What an engine runs on the gradients its update reads (the trainer installs it for
// --on-nonfinite).
struct GradientCheck {
  // Checks the dense gradients of update `step` that are the layout's elements [offset,
  // offset + size), at grads[0, size), before the engine applies or sends them: true to go
  // on, false to skip this step's update, an error to stop.
  std::function<StatusOr<bool>(int64_t step, const float* grads, uint64_t offset,
                               uint64_t size)>
      scan;
  // Whether `scan` may answer false (--on-nonfinite skip). An engine whose ranks each see
  // part of a step's gradients then asks every rank after each step (one small collective) so
  // that a skip is every rank's, and an engine that sends gradients as they are ready waits
  // for all of them first.
  bool may_skip = false;
  // Told, on a rank whose own scan passed, that rank `rank` skipped `step` (its scan failed on
  // the gradients from layout element `offset` on, when known): this rank skips it too.
  std::function<void(int64_t step, int rank, std::optional<uint64_t> offset)> skipped_by_peer;
};

// Pipeline and tensor parallelism (issue 46): the engine's layout is one rank's part of a
// larger model's (its stages' tensors, their tensor-parallel slices), and its checkpoints are
// to be that model's, so that a job resumes with another split or none (issue 46, item 5).
struct CheckpointPlacement {
  // One run of consecutive local elements that are consecutive in the full layout too.
  struct Run {
    uint64_t local_offset = 0, full_offset = 0, size = 0;
  };
  const ParameterLayout* full_layout = nullptr;  // must outlive the engine
  // The runs of local elements [offset, offset + size), in local order, covering them all;
  // with `writing`, leaving out those another rank writes (a replicated tensor's copies).
  std::function<std::vector<Run>(uint64_t offset, uint64_t size, bool writing)> runs;
  // This rank's part of the full parameters `full` into `local` (the engine's layout).
  std::function<void(const float* full, float* local)> take_part;
  // Every rank of the job (the writers of one checkpoint); must outlive the engine.
  Collectives* world = nullptr;
};

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  // Installs `check`, which every engine runs on the gradients its update reads: local and
  // allreduce (zero1 too) on the whole reduced gradient, the same on every rank, so a skip
  // is every rank's without a word; zero2/3 on this rank's reduced shard, then (may_skip)
  // every rank's verdict; ps-* on each chunk before it is sent (may_skip: on every chunk
  // before the first is sent, and a skip travels to the servers, which drop the step).
  void SetGradientCheck(GradientCheck check) { gradient_check_ = std::move(check); }

  virtual std::string_view name() const = 0;

  // Once, before the first step. `params` holds this rank's initial parameters; an engine may
  // replace them (broadcast from rank 0, pull from the servers) and allocates its state.
  // `tables` are the model's embedding tables (empty for a dense model); an engine that cannot
  // hold them returns InvalidArgument saying so.
  virtual Status Initialize(const ParameterLayout& layout,
                            const std::vector<EmbeddingTableSpec>& tables, float* params) = 0;

  // The current values of rows `ids` of table `table` (an index into Initialize's `tables`),
  // ids.size() x dim floats into `values`. Called before each forward pass that uses them.
  virtual Status LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) {
    return FailedPreconditionError(std::string(name()) + " mode holds no embedding tables");
  }

  // Before the backward pass of update `step` whose gradients go to `grads` (host memory,
  // layout size): the buffer OnGradientsReady's ranges refer to until Step returns.
  virtual void OnBackwardStart(int64_t step, float* grads) {}

  // The gradient buffers given to OnBackwardStart and Step from now on lie in memory that
  // `owner` keeps alive (null: no owner, the default). An engine that sends gradients may then
  // send them from there without a copy, holding `owner` while the transport does. A Step
  // that succeeds returns once its replies prove the bytes received, so the caller may write
  // the next step's gradients there; after a failed Step, requests still out may yet send
  // whatever the buffer holds by then (the job has failed). Without an owner a sent gradient
  // is copied: a request can outlive the step that sent it (a stop or timeout ends the wait
  // while the transport still holds it), and the buffer may be gone by then.
  virtual void SetGradientOwner(std::shared_ptr<const void> owner) {}

  // During backward: grads[offset, offset + size) are final (last layer first). The default
  // does nothing; an engine that overlaps communication with backward starts it here.
  virtual void OnGradientsReady(uint64_t offset, uint64_t size) {}

  // After backward of update number `step` (1-based): turns this rank's gradients into the
  // parameters for the next step, in place. `grads` may be overwritten. `sparse` holds the
  // embedding rows this batch touched and their gradients, one entry per table (empty for a
  // dense model); their new values are read back through LookupRows.
  virtual Status Step(int64_t step, float* params, float* grads,
                      const std::vector<SparseRows>& sparse) = 0;

  // Before the model reads params[offset, offset + size) (host memory, layout size) after
  // Step: an engine that finishes the update in the background (zero1's all-gathers of the
  // updated parameters overlap the next forward) waits until that range is final. Errors name
  // the tensor. The default: the parameters are final when Step returns.
  virtual Status AwaitParameters(uint64_t offset, uint64_t size) { return OkStatus(); }

  // An engine that holds the dense parameters itself, partitioned across ranks (ZeRO stages 2
  // and 3, zero_engine.h), returns the storage the model runs on: it supplies each layer's
  // parameters and takes each layer's gradients during the pass (parameter_storage.h). The
  // trainer then keeps no full parameter or gradient buffer after Initialize and
  // RestoreCheckpoint, passes null buffers to OnBackwardStart, Step and SaveCheckpoint, and
  // asks for the full parameters only at the end (GatherParameters). Null, the default: the
  // model runs on the trainer's flat buffers.
  virtual ParameterStorage* parameter_storage() { return nullptr; }
  // With parameter_storage(): writes the full dense parameters into `params` (layout size,
  // host memory). A collective: every rank calls it.
  virtual Status GatherParameters(float* params) {
    return UnimplementedError(std::string(name()) + " mode does not hold the parameters");
  }

  // After Step of `step`, when the trainer can be asked to stop (a signal, preemption): `stop`
  // says whether this rank was. An engine whose ranks run collectives together returns whether
  // any rank was, so that all stop, and checkpoint, after the same step instead of one rank
  // leaving the others inside a collective. The default: this rank's own answer.
  virtual StatusOr<bool> AgreeToStop(int64_t step, bool stop) { return stop; }

  // Checkpoints (common/training/checkpoint.h) under `root`. Save: after Step(step), everything needed
  // to continue (parameters, optimizer state, embedding rows), committed only when complete.
  // Restore: after Initialize, replaces parameters and state with those of `step` and writes
  // the dense parameters to `params`. Errors name the file. Unimplemented by default.
  virtual Status SaveCheckpoint(const std::string& root, int64_t step, const float* params) {
    return UnimplementedError(std::string(name()) + " mode cannot checkpoint");
  }
  virtual Status RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
    return UnimplementedError(std::string(name()) + " mode cannot restore a checkpoint");
  }
  // Before Initialize: checkpoints are of `placement`'s full model, written and read by every
  // rank of its world. Unimplemented by default (the engines that support it: allreduce and
  // zero1).
  virtual Status SetCheckpointPlacement(CheckpointPlacement placement) {
    return UnimplementedError(std::string(name()) + " mode cannot checkpoint part of a model");
  }

 protected:
  // The installed check's verdict (true without one).
  StatusOr<bool> CheckGradients(int64_t step, const float* grads, uint64_t offset,
                                uint64_t size) const {
    if (!gradient_check_.scan) return true;
    return gradient_check_.scan(step, grads, offset, size);
  }
  bool MaySkip() const { return gradient_check_.scan && gradient_check_.may_skip; }
  // Tells the check that rank `rank` skipped `step` (from layout element `offset`).
  void SkippedByPeer(int64_t step, int rank, std::optional<uint64_t> offset) const {
    if (gradient_check_.skipped_by_peer) gradient_check_.skipped_by_peer(step, rank, offset);
  }

 private:
  GradientCheck gradient_check_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_TRAINING_ENGINE_H_
