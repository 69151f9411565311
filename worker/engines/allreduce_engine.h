// AllReduceEngine: data-parallel training without servers (`--mode allreduce`, PyTorch DDP /
// Horovod style). Every rank holds a replica; gradients are averaged across ranks by
// all-reduce, then every rank applies the same optimizer step (common/training/optimizer.h, the math of
// --mode local), so the replicas stay identical.
//
//   Initialize  ranks compare a fingerprint of what they will reduce (parameter names, shapes,
//               order): a mismatch fails every rank naming the rank and the tensor that differ;
//               then rank 0's parameters are broadcast;
//   backward    gradients are grouped into buckets (gradient_buckets.h: reverse layer order,
//               --bucket-mb); a bucket's all-reduce starts on the communication thread as soon
//               as backward produced its last gradient, while backward goes on;
//   Step        waits for the remaining buckets, then the optimizer step.
// With overlap off, every bucket starts in Step (the same results, bitwise).
//
// ZeRO stage 1 (`--mode zero1`): the optimizer state is partitioned. Rank r owns, in every
// parameter tensor t, the slice PartitionOf(t.size, N, r) (collectives.h), so each rank keeps
// the optimizer state of about 1/N of the parameters and updates only those. The gradient
// buckets are all-reduced as in stage 0, so the parameters are bitwise those of stage 0 (the
// same reduction, the same per-element optimizer math). Step then hands one all-gather per
// tensor, in layout (forward) order, to the communication thread and returns: the gathers
// overlap the next step's forward, which waits only for the tensors of the layer it runs
// (AwaitParameters, called from the model's parameter storage). Stages 2 and 3 partition
// gradients and parameters: zero_engine.h.
//
// Memory, reported by tessera_model_state_bytes{kind}: parameters 4Ψ, gradients 4Ψ (the
// trainer's gradient buffer), optimizer state 8Ψ/N for Adam in stage 1 instead of 8Ψ.
//
// Checkpoints (worker/engines/sharded_state.h): each rank writes its owned slices of the parameters
// and their optimizer state (data parallel: rank 0 writes everything, the others nothing) and
// rank 0 commits once all are written. The format depends on neither the world size nor the
// bucket plan, so a checkpoint of allreduce or zero1-3 restores into any of them at any
// world size and --bucket-mb.
//
// Errors: a peer that fails or hangs makes the collective fail within its deadline naming it
// (collectives.h); the step returns that error with the bucket.
//
// Thread-safety: the training thread calls the TrainingEngine methods; the engine's
// communication thread (comm_thread.h) runs the all-reduces and zero1's all-gathers, in the
// order handed over (the same on every rank).
#ifndef TESSERA_WORKER_ENGINES_ALLREDUCE_ENGINE_H_
#define TESSERA_WORKER_ENGINES_ALLREDUCE_ENGINE_H_

#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "common/training/parameter_layout.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/comm_thread.h"
#include "worker/engines/gradient_buckets.h"
#include "worker/engines/training_engine.h"

namespace tessera::worker {

struct AllReduceEngineOptions {
  int zero_stage = 0;  // 0: plain data parallel (DDP); 1: ZeRO stage 1 (see above)
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  uint64_t bucket_bytes = 25ull << 20;  // PyTorch DDP's default bucket_cap_mb = 25
  bool overlap = true;                  // start buckets during backward
  // CommThread's spin_us (the comm thread's, and Step's wait for each bucket's reduction).
  int64_t comm_spin_us = kDefaultCommSpinUs;
  // Longest wait for zero1's parameter all-gather of one tensor (each collective also has its
  // own deadline).
  int64_t wait_timeout_ms = 60000;
  // RestoreCheckpoint: the modes whose checkpoints this engine restores (sharded_state.h's
  // format), as the mode registry (worker/modes/mode_registry.h) lists them.
  std::vector<std::string> restores_checkpoints_of;
};

class AllReduceEngine final : public TrainingEngine {
 public:
  // `collectives` (not owned) must outlive the engine.
  static StatusOr<std::unique_ptr<AllReduceEngine>> Create(const AllReduceEngineOptions& options,
                                                           Collectives* collectives,
                                                           MetricsRegistry* metrics);
  ~AllReduceEngine() override;

  std::string_view name() const override {
    return options_.zero_stage == 0 ? "allreduce" : "zero1";
  }
  Status Initialize(const ParameterLayout& layout, const std::vector<EmbeddingTableSpec>& tables,
                    float* params) override;
  void OnBackwardStart(int64_t step, float* grads) override;
  void OnGradientsReady(uint64_t offset, uint64_t size) override;
  Status Step(int64_t step, float* params, float* grads,
              const std::vector<SparseRows>& sparse) override;
  Status SaveCheckpoint(const std::string& root, int64_t step, const float* params) override;
  Status RestoreCheckpoint(const std::string& root, int64_t step, float* params) override;
  Status SetCheckpointPlacement(CheckpointPlacement placement) override {
    placement_ = std::move(placement);
    return OkStatus();
  }
  // zero1: waits until the all-gathers Step started cover params[offset, offset + size).
  Status AwaitParameters(uint64_t offset, uint64_t size) override;

  // Whether any rank was asked to stop (one tiny all-reduce per step).
  StatusOr<bool> AgreeToStop(int64_t step, bool stop) override;
  const std::vector<GradientBucket>& buckets() const { return buckets_; }

 private:
  AllReduceEngine(const AllReduceEngineOptions& options, Collectives* collectives)
      : options_(options),
        collectives_(collectives),
        tracker_(&buckets_),
        comm_(options.comm_spin_us) {}
  // Hands the all-reduce of `bucket` to the communication thread.
  void Enqueue(size_t bucket);
  Status RunAllReduce(size_t bucket, float* grads, int64_t step);
  Status RunAllGather(size_t tensor, float* params, int64_t step);

  const AllReduceEngineOptions options_;
  Collectives* const collectives_;
  std::vector<GradientBucket> buckets_;
  BucketTracker tracker_;
  uint64_t size_ = 0;
  ParameterLayout layout_;  // a copy of Initialize's, for checkpoints
  std::vector<float> state_;  // optimizer state, interleaved per element (of the owned slices)
  CheckpointPlacement placement_;  // full_layout null: checkpoints of layout_ on collectives_
  // The ranges of layout_ whose optimizer state state_ holds, in its order.
  std::vector<Partition> StateRanges() const;
  Status SavePlacedCheckpoint(const std::string& root, int64_t step, const float* params);
  Status RestorePlacedCheckpoint(const std::string& root, int64_t step, float* params);
  // ZeRO: the parameter tensors (layout order) and the slice of each this rank owns
  // (absolute offsets into the flat buffer), in the same order.
  std::vector<ParameterView> tensors_;
  std::vector<Partition> owned_;

  // The current step, on the training thread only: the gradient buffer and step its
  // all-reduces work on (set in OnBackwardStart) and their results, in the order handed over.
  float* grads_ = nullptr;
  int64_t step_ = 0;
  std::vector<std::shared_future<Status>> reductions_;
  int64_t gather_step_ = 0;  // the step whose updated parameters zero1 is gathering

  // What the work on the communication thread reports back.
  std::mutex mu_;
  std::condition_variable cv_;  // gathered_ or gather_error_ changed
  double comm_seconds_ = 0;     // this step's all-reduce time so far; guarded by mu_
  // zero1's parameter all-gathers, started by Step: tensors [0, gathered_) are done, the rest
  // up to tensors_.size() pending (the communication thread runs them in order).
  size_t gathered_ = 0;  // guarded by mu_
  Status gather_error_;  // guarded by mu_

  Histogram* allreduce_seconds_[4] = {};
  Counter* allreduce_bytes_ = nullptr;
  Gauge* in_flight_ = nullptr;
  Gauge* overlap_ratio_ = nullptr;
  Histogram* wait_seconds_ = nullptr;
  Gauge* state_bytes_[3] = {};  // parameters, gradients, optimizer_state
  Gauge* peak_bytes_[3] = {};

  // Runs the all-reduces and zero1's all-gathers. Last, so that it is destroyed (and its
  // thread joined) before anything its work touches.
  CommThread comm_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_ALLREDUCE_ENGINE_H_
