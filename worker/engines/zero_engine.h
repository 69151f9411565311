// ZeroEngine: ZeRO stages 2 and 3 (`--mode zero2 | zero3`, DeepSpeed ZeRO / PyTorch FSDP):
// data parallelism whose gradients (stage 2) and also parameters (stage 3) are partitioned
// across the ranks, not only the optimizer state (stage 1, allreduce_engine.h).
//
// Partitioning: every parameter tensor t of the layout is cut with PartitionOf(t.size, N, r)
// (collectives.h), so rank r owns about 1/N of every tensor, whatever N and the sizes.
//
// The model runs on this engine's ParameterStorage (parameter_storage.h), one layer block at a
// time:
//   forward   stage 3: Acquire all-gathers the block's tensors into a buffer freed by Release;
//             the next block (in the order recorded in the previous step) is gathered on the
//             communication thread while the current one computes. The last block stays
//             gathered for the start of backward (as FSDP does), and while it computes,
//             backward's next block is prefetched. Stage 2 holds the full parameters, so
//             Acquire only points into them.
//   backward  the same gathers in reverse order; the layer writes its gradients into a block
//             buffer, and GradientsDone reduce-scatters (averages) it on the communication
//             thread into this rank's gradient slices, then frees it, while backward goes on.
//             At most max_gradient_blocks_in_flight blocks wait for their reduce-scatter (or
//             are being written): backward waits for the oldest one before taking another.
//   Step      waits for the reduce-scatters, updates the owned slices (common/training/optimizer.h, the
//             same per-element math as every mode); stage 2 then all-gathers the parameters.
// Gradient accumulation (several micro-batches per step, announced by one OnBackwardStart):
// every micro-batch's blocks are reduce-scattered; the first one's land in the gradient slices,
// the later ones are reduce-scattered in place in their block and added to them (as DeepSpeed
// stage 2 does); Step divides by the number of micro-batches. The memory stays that of one.
//
// Memory between steps (tessera_model_state_bytes), with Ψ parameters and Adam in float32:
//   stage 2: parameters 4Ψ, gradients 4Ψ/N, optimizer state 8Ψ/N;
//   stage 3: parameters 4Ψ/N, gradients 4Ψ/N, optimizer state 8Ψ/N;
// during a step (tessera_model_state_peak_bytes) also, at most:
//   parameters (stage 3) two gathered blocks: the current and the prefetched one;
//   gradients            max_gradient_blocks_in_flight gradient blocks: before backward takes
//                        a block it waits until fewer than that await their reduce-scatter.
// With the defaults both are at most the two largest layers' parameters.
//
// HSDP (`--mode hsdp`, PyTorch's HYBRID_SHARD): with a `replicate` communicator, `collectives`
// is this rank's shard group and `replicate` the ranks holding the same shard in the other
// groups; each reduced gradient slice is then also averaged across `replicate` (an all-reduce,
// on the communication thread right after its reduce-scatter), so every replica updates the
// same slice with the world's mean gradient. Shard groups must be of one size, so that the
// mean of their means is the world's. The initial parameters are world rank 0's (through the
// replicate group, then the shard group), the stop agreement spans both. Checkpoints are the
// sharded ones of zero3 (sharded_state.h): the replicas hold identical shards, so only the
// first replica's shard group (`first_replica`) writes, and every rank restores its slices.
//
// Results equal --mode allreduce up to float rounding (the ring reduces per tensor here, per
// bucket there, so the summation order differs).
//
// Errors: a collective that fails or times out fails the step naming the tensor and peer.
// Thread-safety: the training thread calls everything; the communication thread runs the
// collectives it is handed.
#ifndef TESSERA_WORKER_ENGINES_ZERO_ENGINE_H_
#define TESSERA_WORKER_ENGINES_ZERO_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/comm_thread.h"
#include "worker/engines/training_engine.h"
#include "worker/nn/parameter_storage.h"

namespace tessera::worker {

struct ZeroEngineOptions {
  int stage = 3;  // 2 or 3
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  bool prefetch = true;            // stage 3: gather the next block during the current one
  int max_gradient_blocks_in_flight = 2;  // held at once (see above); at least 1
  int64_t wait_timeout_ms = 60000;  // longest wait for one collective (each also has its own)
  // CommThread's spin_us (the comm thread's, and Wait's before it blocks).
  int64_t comm_spin_us = kDefaultCommSpinUs;
  // RestoreCheckpoint: the modes whose checkpoints this engine restores (sharded_state.h's
  // format), as the mode registry (worker/modes/mode_registry.h) lists them.
  std::vector<std::string> restores_checkpoints_of;
  // HSDP (above): the ranks holding this rank's shard in the other shard groups; not owned,
  // must outlive the engine. Null (zero2, zero3): `collectives` is the whole world.
  Collectives* replicate = nullptr;
  // HSDP: whether this rank's shard group is the first replica (the one holding world rank
  // 0), whose ranks write the checkpoints.
  bool first_replica = true;
};

class ZeroEngine final : public TrainingEngine, private ParameterStorage {
 public:
  // `collectives` (not owned) must outlive the engine.
  static StatusOr<std::unique_ptr<ZeroEngine>> Create(const ZeroEngineOptions& options,
                                                      Collectives* collectives,
                                                      MetricsRegistry* metrics);
  ~ZeroEngine() override;

  std::string_view name() const override {
    if (options_.replicate != nullptr) return "hsdp";
    return options_.stage == 2 ? "zero2" : "zero3";
  }
  Status Initialize(const ParameterLayout& layout, const std::vector<EmbeddingTableSpec>& tables,
                    float* params) override;
  void OnBackwardStart(int64_t step, float* grads) override;
  Status Step(int64_t step, float* params, float* grads,
              const std::vector<SparseRows>& sparse) override;
  // Whether any rank was asked to stop (one tiny all-reduce per step; HSDP: one per group).
  StatusOr<bool> AgreeToStop(int64_t step, bool stop) override;
  ParameterStorage* parameter_storage() override { return this; }
  Status GatherParameters(float* params) override;
  // Sharded checkpoints (sharded_state.h): each rank writes its slices of every tensor (HSDP:
  // each rank of the first replica).
  // `params` is ignored (null from the trainer): the engine holds them.
  Status SaveCheckpoint(const std::string& root, int64_t step, const float* params) override;
  // Restores into this rank's slices, at any world size, from any sharded mode; also writes
  // the full parameters into `params` (layout size).
  Status RestoreCheckpoint(const std::string& root, int64_t step, float* params) override;

  // Model-state bytes held between steps and at most during the last step, by kind.
  struct Bytes {
    uint64_t parameters = 0, gradients = 0, optimizer_state = 0;
  };
  Bytes held() const;
  Bytes peak() const;

 private:
  // One parameter tensor and this rank's slice of it.
  struct Tensor {
    std::string name;
    uint64_t offset = 0;   // in the flat layout
    uint64_t size = 0;
    Partition slice;       // PartitionOf(size, N, rank), relative to offset
    uint64_t owned_at = 0;  // where the slice starts in the owned buffers (grads_, shard_)
  };
  struct Gathered {  // a stage-3 block being or having been all-gathered
    std::shared_ptr<std::vector<float>> values;
    std::shared_future<Status> done;
  };

  ZeroEngine(const ZeroEngineOptions& options, Collectives* collectives)
      : options_(options), collectives_(collectives) {}

  // ParameterStorage.
  StatusOr<const float*> Acquire(const ParameterBlock& block, Pass pass) override;
  void Release(const ParameterBlock& block) override;
  StatusOr<float*> GradientBlock(const ParameterBlock& block) override;
  Status GradientsDone(const ParameterBlock& block) override;

  StatusOr<const std::vector<size_t>*> TensorsOf(const ParameterBlock& block);
  std::vector<Partition> OwnedSlices() const;  // absolute, in owned order
  Status StartGather(const ParameterBlock& block);
  Status Wait(const std::shared_future<Status>& done, const std::string& what);
  // The installed gradient check on this rank's reduced shard, then (MaySkip) every rank's
  // verdict: false when any rank's check said skip.
  StatusOr<bool> CheckShard(int64_t step);
  Status WaitForReductions();
  // Waits for the oldest reduce-scatters until fewer than `limit` are unfinished.
  Status WaitForReductionsAbove(size_t limit);
  uint64_t NextTag() { return next_tag_++; }
  void AddTransient(std::atomic<uint64_t>* bytes, std::atomic<uint64_t>* peak, int64_t delta);
  void PublishBytes();

  const ZeroEngineOptions options_;
  Collectives* const collectives_;
  std::unique_ptr<CommThread> comm_;
  ParameterLayout layout_;
  std::vector<Tensor> tensors_;
  std::map<uint64_t, std::vector<size_t>> block_tensors_;  // by block offset
  uint64_t size_ = 0;         // Ψ
  uint64_t owned_ = 0;        // elements of all owned slices
  std::vector<float> full_;   // stage 2: all parameters
  std::vector<float> shard_;  // stage 3: the owned slices of the parameters
  std::vector<float> grads_;  // the owned slices of the averaged gradients
  std::vector<float> state_;  // optimizer state of the owned slices
  uint64_t next_tag_ = 0;
  int64_t step_ = 0;

  // Stage 3: gathered blocks by offset; the block order of the previous step's passes (for
  // prefetching) and of this one.
  std::map<uint64_t, Gathered> gathered_;
  std::vector<ParameterBlock> order_[2], recording_[2];
  // Between OnBackwardStart and Step: the passes are the step's (not an evaluation's).
  bool in_step_ = false;
  Pass pass_ = Pass::kForward;  // of the last Acquire
  // The forward's last block, kept gathered for the start of backward (its forward Release
  // leaves it; the backward's frees it). No block: kNoBlock.
  static constexpr uint64_t kNoBlock = ~uint64_t{0};
  uint64_t kept_for_backward_ = kNoBlock;
  // Reduce-scatters handed to the communication thread this step; those before
  // reductions_waited_ have been waited for, and the first error among them kept.
  std::vector<std::pair<std::shared_future<Status>, std::string>> reductions_;
  size_t reductions_waited_ = 0;
  Status reduction_error_;
  // Gradient blocks reduce-scattered this step, per tensor (micro-batches).
  std::vector<int> reduced_times_;
  // Block buffers awaiting their reduce-scatter.
  std::map<uint64_t, std::shared_ptr<std::vector<float>>> gradient_blocks_;

  // Transient bytes (gathered parameter blocks, gradient blocks) now and at most this step;
  // the communication thread frees gradient blocks, hence atomics.
  std::atomic<uint64_t> gathered_bytes_{0}, gathered_peak_{0};
  std::atomic<uint64_t> gradient_block_bytes_{0}, gradient_block_peak_{0};

  Gauge* held_bytes_[3] = {};
  Gauge* peak_bytes_[3] = {};
  Counter* gathered_total_ = nullptr;      // bytes all-gathered
  Counter* reduced_total_ = nullptr;       // bytes reduce-scattered
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_ZERO_ENGINE_H_
