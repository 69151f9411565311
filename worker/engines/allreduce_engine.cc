#include "worker/engines/allreduce_engine.h"

#include <algorithm>
#include <chrono>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "worker/engines/layout_check.h"
#include "worker/engines/sharded_state.h"

namespace tessera::worker {
namespace {

// Tags: the setup's collectives, then one per (step, bucket), never reused within a job.
constexpr uint64_t kFingerprintTag = 1ull << 40;  // and + 1 (layout_check.h)
constexpr uint64_t kBroadcastTag = kFingerprintTag + 2;
constexpr uint64_t kBucketTagBase = 1ull << 41;
constexpr uint64_t kGatherTagBase = 1ull << 42;
constexpr uint64_t kMaxBuckets = 1 << 16;
// Checkpoints: four tags per step (save: gather, commit; restore: agree), far above the
// per-(step, bucket) ranges.
constexpr uint64_t kCheckpointTagBase = 1ull << 60;
// The per-step stop agreement (AgreeToStop): one tag per step.
constexpr uint64_t kStopTagBase = 1ull << 59;

// Where the last of `tensors` ends in the flat buffer (0 for none).
uint64_t EndOf(const std::vector<ParameterView>& tensors) {
  return tensors.empty() ? 0 : tensors.back().offset + tensors.back().size;
}

int SizeClass(uint64_t bytes) {
  if (bytes < (64u << 10)) return 0;
  if (bytes < (1u << 20)) return 1;
  if (bytes < (16u << 20)) return 2;
  return 3;
}

}  // namespace

StatusOr<std::unique_ptr<AllReduceEngine>> AllReduceEngine::Create(
    const AllReduceEngineOptions& options, Collectives* collectives, MetricsRegistry* metrics) {
  if (options.zero_stage < 0 || options.zero_stage > 1) {
    return InvalidArgumentError("AllReduceEngine runs stages 0 and 1, not " +
                                std::to_string(options.zero_stage) + " (2 and 3: ZeroEngine)");
  }
  if (options.wait_timeout_ms <= 0) {
    return InvalidArgumentError("wait_timeout_ms=" + std::to_string(options.wait_timeout_ms) +
                                " must be positive");
  }
  RETURN_IF_ERROR(ValidateOptimizerOptions(options.optimizer));
  RETURN_IF_ERROR(ValidateLrSchedule(options.schedule, options.optimizer.lr));
  std::unique_ptr<AllReduceEngine> engine(new AllReduceEngine(options, collectives));
  namespace names = metric_names;
  ASSIGN_OR_RETURN(HistogramFamily * seconds,
                   metrics->RegisterHistogram(names::kCollectiveSeconds.name,
                                              names::kCollectiveSeconds.help,
                                              {"op", "size_class"}, DefaultLatencyBuckets()));
  const char* classes[] = {"<64KiB", "<1MiB", "<16MiB", ">=16MiB"};
  for (int i = 0; i < 4; ++i) {
    ASSIGN_OR_RETURN(engine->allreduce_seconds_[i], seconds->WithLabels({"allreduce", classes[i]}));
  }
  ASSIGN_OR_RETURN(CounterFamily * bytes,
                   metrics->RegisterCounter(names::kCollectiveBytesTotal.name,
                                            names::kCollectiveBytesTotal.help, {"op"}));
  ASSIGN_OR_RETURN(engine->allreduce_bytes_, bytes->WithLabels({"allreduce"}));
  ASSIGN_OR_RETURN(GaugeFamily * in_flight, metrics->RegisterGauge(
                                                names::kDdpBucketsInFlight.name,
                                                names::kDdpBucketsInFlight.help));
  ASSIGN_OR_RETURN(engine->in_flight_, in_flight->WithLabels({}));
  ASSIGN_OR_RETURN(GaugeFamily * overlap, metrics->RegisterGauge(names::kDdpOverlapRatio.name,
                                                                 names::kDdpOverlapRatio.help));
  ASSIGN_OR_RETURN(engine->overlap_ratio_, overlap->WithLabels({}));
  ASSIGN_OR_RETURN(HistogramFamily * wait,
                   metrics->RegisterHistogram(names::kDdpWaitSeconds.name,
                                              names::kDdpWaitSeconds.help, {},
                                              DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(engine->wait_seconds_, wait->WithLabels({}));
  ASSIGN_OR_RETURN(GaugeFamily * state, metrics->RegisterGauge(names::kModelStateBytes.name,
                                                               names::kModelStateBytes.help,
                                                               {"kind"}));
  ASSIGN_OR_RETURN(GaugeFamily * peak, metrics->RegisterGauge(names::kModelStatePeakBytes.name,
                                                              names::kModelStatePeakBytes.help,
                                                              {"kind"}));
  const char* kinds[] = {"parameters", "gradients", "optimizer_state"};
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(engine->state_bytes_[i], state->WithLabels({kinds[i]}));
    ASSIGN_OR_RETURN(engine->peak_bytes_[i], peak->WithLabels({kinds[i]}));
  }
  return engine;
}

AllReduceEngine::~AllReduceEngine() {
  // The collectives not started yet are dropped: after a failure they could only wait for peers
  // that will not join them. The one running ends within its deadline; comm_, destroyed first,
  // joins it.
  comm_.CancelPending(std::string(name()) + " engine shutting down");
}

Status AllReduceEngine::Initialize(const ParameterLayout& layout,
                                   const std::vector<EmbeddingTableSpec>& tables, float* params) {
  if (!tables.empty()) {
    return InvalidArgumentError("allreduce mode does not hold embedding tables yet (the " +
                                std::to_string(tables.size()) +
                                " of this model): use a ps-* mode for the ctr model");
  }
  RETURN_IF_ERROR(CheckLayoutsMatch(collectives_, layout, kFingerprintTag));
  size_ = layout.total_size();
  layout_ = layout;
  RETURN_IF_ERROR(collectives_->Broadcast(params, size_, DataType::kFloat32, /*root=*/0,
                                          "initial parameters", kBroadcastTag)
                      .WithContext("broadcasting rank 0's parameters"));
  buckets_ = PlanGradientBuckets(layout, options_.bucket_bytes);
  if (buckets_.size() > kMaxBuckets) {
    return InvalidArgumentError(std::to_string(buckets_.size()) + " gradient buckets; raise "
                                "--bucket-mb (at most " + std::to_string(kMaxBuckets) + ")");
  }
  tracker_.Reset();
  uint64_t owned = size_;
  tensors_.clear();
  owned_.clear();
  if (options_.zero_stage > 0) {
    // Slices per tensor, not per bucket: the parameters are gathered tensor by tensor so that
    // the forward can start on the first layer while the later ones are still travelling.
    owned = 0;
    for (const ParameterView& view : layout.views()) {
      if (view.offset != EndOf(tensors_)) {
        return InternalError("parameter '" + view.name + "' starts at " +
                             std::to_string(view.offset) + ", not where the previous one ends (" +
                             std::to_string(EndOf(tensors_)) + ")");
      }
      Partition slice = PartitionOf(view.size, collectives_->world_size(), collectives_->rank());
      owned_.push_back({view.offset + slice.offset, slice.size});
      tensors_.push_back(view);
      owned += slice.size;
    }
    if (tensors_.size() > kMaxBuckets) {
      return InvalidArgumentError(std::to_string(tensors_.size()) + " parameter tensors; zero1 "
                                  "gathers at most " + std::to_string(kMaxBuckets) + " per step");
    }
  }
  gathered_ = tensors_.size();  // nothing pending
  state_.assign(StateFloatsPerElement(options_.optimizer.kind) * owned, 0.0f);
  InitOptimizerState(options_.optimizer, state_.data(), owned);
  // Nothing transient: the peak during a step is what is held between steps.
  const double bytes[3] = {static_cast<double>(size_ * sizeof(float)),
                           static_cast<double>(size_ * sizeof(float)),
                           static_cast<double>(state_.size() * sizeof(float))};
  for (int i = 0; i < 3; ++i) {
    state_bytes_[i]->Set(bytes[i]);
    peak_bytes_[i]->Set(bytes[i]);
  }
  TLOG(INFO) << "allreduce among " << collectives_->world_size() << " workers: " << size_
             << " parameters in " << buckets_.size() << " buckets of up to "
             << options_.bucket_bytes << " bytes, overlap " << (options_.overlap ? "on" : "off");
  return OkStatus();
}

void AllReduceEngine::OnBackwardStart(int64_t step, float* grads) {
  grads_ = grads;
  step_ = step;
  tracker_.Reset();
  std::lock_guard<std::mutex> lock(mu_);
  comm_seconds_ = 0;
}

void AllReduceEngine::OnGradientsReady(uint64_t offset, uint64_t size) {
  if (!options_.overlap) return;
  for (size_t bucket : tracker_.MarkReady(offset, size)) Enqueue(bucket);
}

void AllReduceEngine::Enqueue(size_t bucket) {
  tracker_.set_started(bucket);
  in_flight_->Add(1);
  reductions_.push_back(comm_.Submit([this, bucket, grads = grads_, step = step_] {
    const auto started = SteadyClock::now();
    Status status = RunAllReduce(bucket, grads, step);
    const double seconds = std::chrono::duration<double>(SteadyClock::now() - started).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      comm_seconds_ += seconds;
    }
    in_flight_->Add(-1);
    return status;
  }));
}

Status AllReduceEngine::RunAllReduce(size_t bucket, float* grads, int64_t step) {
  const GradientBucket& b = buckets_[bucket];
  const uint64_t tag = kBucketTagBase + static_cast<uint64_t>(step) * kMaxBuckets + bucket;
  const auto started = SteadyClock::now();
  const std::string tensor =
      "bucket " + std::to_string(bucket) + " (" + b.first + " .. " + b.last + ")";
  Status status = collectives_->AllReduce(grads + b.offset, b.size, DataType::kFloat32,
                                          ReduceOp::kAverage, tensor, tag);
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - started).count();
  allreduce_seconds_[SizeClass(b.size * sizeof(float))]->Observe(seconds);
  allreduce_bytes_->Increment(static_cast<double>(b.size * sizeof(float)));
  return status;
}

Status AllReduceEngine::RunAllGather(size_t tensor, float* params, int64_t step) {
  // Every rank's slice of the tensor to every rank, in place (owned_ is this rank's slice).
  const ParameterView& t = tensors_[tensor];
  const uint64_t tag = kGatherTagBase + static_cast<uint64_t>(step) * kMaxBuckets + tensor;
  return collectives_->AllGather(params + owned_[tensor].offset, params + t.offset, t.size,
                                 DataType::kFloat32, t.name, tag)
      .WithContext("gathering the updated parameters of '" + t.name + "' after step " +
                   std::to_string(step));
}

Status AllReduceEngine::AwaitParameters(uint64_t offset, uint64_t size) {
  if (options_.zero_stage == 0 || size == 0) return OkStatus();
  // Tensors are contiguous in layout order: the range needs those up to the one holding its
  // last element.
  const uint64_t last = offset + size - 1;
  const auto after = std::upper_bound(
      tensors_.begin(), tensors_.end(), last,
      [](uint64_t at, const ParameterView& t) { return at < t.offset; });
  const size_t needed = static_cast<size_t>(after - tensors_.begin());
  std::unique_lock<std::mutex> lock(mu_);
  const bool finished = cv_.wait_for(lock, std::chrono::milliseconds(options_.wait_timeout_ms),
                                     [&] { return gathered_ >= needed || !gather_error_.ok(); });
  if (!gather_error_.ok()) return gather_error_;
  if (!finished) {
    return DeadlineExceededError(
        "zero1 rank " + std::to_string(collectives_->rank()) + ": the all-gather of the "
        "parameters of '" + tensors_[gathered_].name + "' updated in step " +
        std::to_string(gather_step_) + " did not finish within " +
        std::to_string(options_.wait_timeout_ms) + " ms");
  }
  return OkStatus();
}

Status AllReduceEngine::Step(int64_t step, float* params, float* grads,
                             const std::vector<SparseRows>& sparse) {
  if (!sparse.empty()) {
    return InvalidArgumentError("allreduce mode got embedding rows; it holds no tables");
  }
  const auto backward_done = SteadyClock::now();
  if (grads_ != grads || step_ != step) {
    // The trainer did not announce this backward (or another buffer): nothing was started.
    OnBackwardStart(step, grads);
  }
  double hidden_seconds = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hidden_seconds = comm_seconds_;  // finished before backward ended
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!tracker_.started(b)) Enqueue(b);
  }
  // Every bucket's all-reduce ends, failed or not, before the step goes on; the first to fail
  // (they run in order) is the step's error.
  Status error;
  for (const std::shared_future<Status>& reduction : reductions_) {
    const Status status = comm_.Wait(reduction);
    if (error.ok() && !status.ok()) error = status;
  }
  reductions_.clear();
  grads_ = nullptr;
  double comm_seconds = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm_seconds = comm_seconds_;
  }
  const double waited =
      std::chrono::duration<double>(SteadyClock::now() - backward_done).count();
  wait_seconds_->Observe(waited);
  if (comm_seconds > 0) overlap_ratio_->Set(std::min(1.0, hidden_seconds / comm_seconds));
  if (!error.ok()) return error;
  // The reduced gradients are every rank's: so is the verdict, without a word between ranks.
  ASSIGN_OR_RETURN(bool apply, CheckGradients(step, grads, 0, size_));
  if (!apply) return OkStatus();
  const float lr = LearningRate(options_.schedule, options_.optimizer.lr, step - 1);
  if (options_.zero_stage == 0) {
    DenseUpdate(options_.optimizer, lr, step, params, grads, size_, state_.data());
    return OkStatus();
  }
  // ZeRO: the previous step's gathers read the owned slices; the forward waited for them,
  // but a tensor no layer reads may still be on its way.
  RETURN_IF_ERROR(AwaitParameters(0, size_));
  // Update the owned slices (their state is contiguous, tensor after tensor), then every rank's
  // slices travel to every rank on the communication thread, tensor by tensor in forward
  // order, while the trainer goes on to the next step's forward (AwaitParameters).
  const size_t k = StateFloatsPerElement(options_.optimizer.kind);
  size_t state_offset = 0;
  for (const Partition& slice : owned_) {
    DenseUpdate(options_.optimizer, lr, step, params + slice.offset, grads + slice.offset,
                slice.size, state_.data() + state_offset);
    state_offset += k * slice.size;
  }
  gather_step_ = step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gathered_ = 0;
  }
  for (size_t t = 0; t < tensors_.size(); ++t) {
    comm_.Submit([this, t, params, step] {
      Status status = RunAllGather(t, params, step);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++gathered_;
        if (!status.ok() && gather_error_.ok()) gather_error_ = status;
      }
      cv_.notify_all();
      return status;
    });
  }
  return OkStatus();
}

std::vector<Partition> AllReduceEngine::StateRanges() const {
  if (options_.zero_stage == 0) return {{0, size_}};
  return owned_;
}

// A part of a model (CheckpointPlacement): the checkpoint is the full model's, in the same
// format, so any split of it, or a plain run, restores it. The ranks that write an element
// are as without the placement (data parallel: the replicas' rank 0; zero1: each its owned
// slices), of those the placement says write it (one copy of a replicated tensor).
Status AllReduceEngine::SavePlacedCheckpoint(const std::string& root, int64_t step,
                                             const float* params) {
  const ShardedCheckpointSpec spec{std::string(name()), placement_.full_layout,
                                   options_.optimizer.kind, options_.restores_checkpoints_of};
  const size_t k = StateFloatsPerElement(options_.optimizer.kind);
  std::vector<Partition> slices;
  std::vector<float> slice_params, slice_state;
  const bool writes = options_.zero_stage != 0 || collectives_->rank() == 0;
  uint64_t at = 0;  // where the range's state starts in state_, in elements
  for (const Partition& range : StateRanges()) {
    if (writes && range.size > 0) {
      for (const auto& run : placement_.runs(range.offset, range.size, /*writing=*/true)) {
        slices.push_back({run.full_offset, run.size});
        slice_params.insert(slice_params.end(), params + run.local_offset,
                            params + run.local_offset + run.size);
        const float* state = state_.data() + (at + run.local_offset - range.offset) * k;
        slice_state.insert(slice_state.end(), state, state + run.size * k);
      }
    }
    at += range.size;
  }
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step);
  return SaveShardedCheckpoint(root, step, spec, slices, slice_params.data(),
                               slice_state.data(), placement_.world, tag);
}

Status AllReduceEngine::RestorePlacedCheckpoint(const std::string& root, int64_t step,
                                                float* params) {
  const ShardedCheckpointSpec spec{std::string(name()), placement_.full_layout,
                                   options_.optimizer.kind, options_.restores_checkpoints_of};
  // The runs cover each range in local order, so the slices' state lands in state_'s order.
  std::vector<Partition> slices;
  for (const Partition& range : StateRanges()) {
    if (range.size == 0) continue;
    for (const auto& run : placement_.runs(range.offset, range.size, /*writing=*/false)) {
      slices.push_back({run.full_offset, run.size});
    }
  }
  std::vector<float> full(placement_.full_layout->total_size());
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step) + 2;
  RETURN_IF_ERROR(RestoreShardedCheckpoint(root, step, spec, slices, /*slice_params=*/nullptr,
                                           state_.data(), full.data(), placement_.world, tag));
  placement_.take_part(full.data(), params);
  TLOG(INFO) << "restored this rank's part of the checkpoint of step " << step << " from "
             << CheckpointStepDirectory(root, step);
  return OkStatus();
}

Status AllReduceEngine::SaveCheckpoint(const std::string& root, int64_t step,
                                       const float* params) {
  RETURN_IF_ERROR(AwaitParameters(0, size_));  // complete parameters, no gather still reading
  if (placement_.full_layout != nullptr) return SavePlacedCheckpoint(root, step, params);
  const ShardedCheckpointSpec spec{std::string(name()), &layout_, options_.optimizer.kind,
                                   options_.restores_checkpoints_of};
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step);
  if (options_.zero_stage == 0) {
    // The replicas are identical: rank 0 writes all of it, the others nothing.
    std::vector<Partition> slices;
    if (collectives_->rank() == 0) slices.push_back({0, size_});
    return SaveShardedCheckpoint(root, step, spec, slices, params, state_.data(), collectives_,
                                 tag);
  }
  std::vector<float> owned_params;
  for (const Partition& slice : owned_) {
    owned_params.insert(owned_params.end(), params + slice.offset, params + slice.end());
  }
  return SaveShardedCheckpoint(root, step, spec, owned_, owned_params.data(), state_.data(),
                               collectives_, tag);
}

Status AllReduceEngine::RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
  RETURN_IF_ERROR(AwaitParameters(0, size_));  // no gather may write `params` meanwhile
  if (placement_.full_layout != nullptr) return RestorePlacedCheckpoint(root, step, params);
  const ShardedCheckpointSpec spec{std::string(name()), &layout_, options_.optimizer.kind,
                                   options_.restores_checkpoints_of};
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step) + 2;
  const std::vector<Partition> everything = {{0, size_}};
  RETURN_IF_ERROR(RestoreShardedCheckpoint(root, step, spec,
                                           options_.zero_stage == 0 ? everything : owned_,
                                           /*slice_params=*/nullptr, state_.data(), params,
                                           collectives_, tag));
  TLOG(INFO) << "restored the checkpoint of step " << step << " from "
             << CheckpointStepDirectory(root, step);
  return OkStatus();
}

StatusOr<bool> AllReduceEngine::AgreeToStop(int64_t step, bool stop) {
  // zero1's gathers may still run on the communication thread: a different tag, so the
  // collectives allow it (collectives.h).
  return AnyRank(collectives_, stop, "whether to stop after step " + std::to_string(step),
                 kStopTagBase + static_cast<uint64_t>(step));
}

}  // namespace tessera::worker
