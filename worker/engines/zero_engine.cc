#include "worker/engines/zero_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>

#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "worker/engines/layout_check.h"
#include "worker/engines/sharded_state.h"

namespace tessera::worker {
namespace {

// Tags: the setup's, then one per collective in issue order (the same on every rank), in a
// range of their own (allreduce_engine.cc uses 1 << 40 .. 1 << 43).
constexpr uint64_t kFingerprintTag = 1ull << 44;  // and + 1 (layout_check.h)
constexpr uint64_t kBroadcastTag = kFingerprintTag + 2;
constexpr uint64_t kOpTagBase = kFingerprintTag + 16;
// Checkpoints: four per step (save: gather, commit; restore: agree), as allreduce_engine.cc.
constexpr uint64_t kCheckpointTagBase = 1ull << 60;
// The per-step stop agreement (AgreeToStop), as allreduce_engine.cc.
constexpr uint64_t kStopTagBase = 1ull << 59;

constexpr uint64_t kFloat = sizeof(float);

}  // namespace

StatusOr<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(const ZeroEngineOptions& options,
                                                         Collectives* collectives,
                                                         MetricsRegistry* metrics) {
  if (options.stage != 2 && options.stage != 3) {
    return InvalidArgumentError("ZeroEngine runs ZeRO stages 2 and 3, not " +
                                std::to_string(options.stage) + " (stage 1: AllReduceEngine)");
  }
  if (options.max_gradient_blocks_in_flight < 1) {
    return InvalidArgumentError("max_gradient_blocks_in_flight=" +
                                std::to_string(options.max_gradient_blocks_in_flight) +
                                " must be at least 1");
  }
  if (options.wait_timeout_ms <= 0) {
    return InvalidArgumentError("wait_timeout_ms=" + std::to_string(options.wait_timeout_ms) +
                                " must be positive");
  }
  RETURN_IF_ERROR(ValidateOptimizerOptions(options.optimizer));
  RETURN_IF_ERROR(ValidateLrSchedule(options.schedule, options.optimizer.lr));
  std::unique_ptr<ZeroEngine> engine(new ZeroEngine(options, collectives));
  namespace names = metric_names;
  const char* kinds[] = {"parameters", "gradients", "optimizer_state"};
  ASSIGN_OR_RETURN(GaugeFamily * held, metrics->RegisterGauge(names::kModelStateBytes.name,
                                                              names::kModelStateBytes.help,
                                                              {"kind"}));
  ASSIGN_OR_RETURN(GaugeFamily * peak, metrics->RegisterGauge(names::kModelStatePeakBytes.name,
                                                              names::kModelStatePeakBytes.help,
                                                              {"kind"}));
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(engine->held_bytes_[i], held->WithLabels({kinds[i]}));
    ASSIGN_OR_RETURN(engine->peak_bytes_[i], peak->WithLabels({kinds[i]}));
  }
  ASSIGN_OR_RETURN(CounterFamily * bytes,
                   metrics->RegisterCounter(names::kCollectiveBytesTotal.name,
                                            names::kCollectiveBytesTotal.help, {"op"}));
  ASSIGN_OR_RETURN(engine->gathered_total_, bytes->WithLabels({"allgather"}));
  ASSIGN_OR_RETURN(engine->reduced_total_, bytes->WithLabels({"reduce_scatter"}));
  return engine;
}

ZeroEngine::~ZeroEngine() {
  comm_.reset();  // finishes the submitted collectives (each bounded by its deadline) first
}

Status ZeroEngine::Initialize(const ParameterLayout& layout,
                              const std::vector<EmbeddingTableSpec>& tables, float* params) {
  if (!tables.empty()) {
    return InvalidArgumentError(std::string(name()) + " mode does not hold embedding tables (the " +
                                std::to_string(tables.size()) +
                                " of this model): use a ps-* mode for the ctr model");
  }
  Collectives* const replicate = options_.replicate;
  if (replicate != nullptr) {
    RETURN_IF_ERROR(CheckLayoutsMatch(replicate, layout, kFingerprintTag));
  }
  RETURN_IF_ERROR(CheckLayoutsMatch(collectives_, layout, kFingerprintTag));
  layout_ = layout;
  size_ = layout.total_size();
  // HSDP: the first shard group's parameters to every group's rank of the same index first,
  // so that the shard groups' broadcasts below all send the world's rank 0's.
  if (replicate != nullptr) {
    RETURN_IF_ERROR(replicate->Broadcast(params, size_, DataType::kFloat32, /*root=*/0,
                                         "initial parameters", kBroadcastTag)
                        .WithContext("broadcasting the first shard group's parameters"));
  }
  RETURN_IF_ERROR(collectives_->Broadcast(params, size_, DataType::kFloat32, /*root=*/0,
                                          "initial parameters", kBroadcastTag)
                      .WithContext("broadcasting rank 0's parameters"));
  const int world = collectives_->world_size();
  const int rank = collectives_->rank();
  tensors_.clear();
  owned_ = 0;
  for (const ParameterView& view : layout.views()) {
    Tensor t{view.name, view.offset, view.size, PartitionOf(view.size, world, rank), owned_};
    owned_ += t.slice.size;
    tensors_.push_back(std::move(t));
  }
  if (options_.stage == 2) {
    full_.assign(params, params + size_);
  } else {
    shard_.resize(owned_);
    for (const Tensor& t : tensors_) {
      std::memcpy(shard_.data() + t.owned_at, params + t.offset + t.slice.offset,
                  t.slice.size * kFloat);
    }
  }
  grads_.assign(owned_, 0.0f);
  reduced_times_.assign(tensors_.size(), 0);
  state_.assign(StateFloatsPerElement(options_.optimizer.kind) * owned_, 0.0f);
  InitOptimizerState(options_.optimizer, state_.data(), owned_);
  comm_ = std::make_unique<CommThread>(options_.comm_spin_us);
  PublishBytes();
  TLOG(INFO) << name() << " among " << world << " workers"
             << (replicate != nullptr
                     ? " (a shard group, in " + std::to_string(replicate->world_size()) +
                           " replicas)"
                     : std::string())
             << ": " << size_ << " parameters in " << tensors_.size() << " tensors, " << owned_
             << " owned here";
  return OkStatus();
}

void ZeroEngine::OnBackwardStart(int64_t step, float* grads) {
  // Called before the step's forward: the passes from here on are the step's (not an
  // evaluation's) and give the order to prefetch in next time.
  step_ = step;
  in_step_ = true;
  recording_[0].clear();
  recording_[1].clear();
  std::fill(reduced_times_.begin(), reduced_times_.end(), 0);
}

StatusOr<const std::vector<size_t>*> ZeroEngine::TensorsOf(const ParameterBlock& block) {
  auto it = block_tensors_.find(block.offset);
  if (it != block_tensors_.end()) return &it->second;
  std::vector<size_t> inside;
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.offset >= block.offset && t.offset + t.size <= block.offset + block.size) {
      inside.push_back(i);
      covered += t.size;
    }
  }
  if (covered != block.size) {
    return InternalError("parameter block [" + std::to_string(block.offset) + ", " +
                         std::to_string(block.offset + block.size) +
                         ") is not made of whole tensors of the layout");
  }
  return &block_tensors_.emplace(block.offset, std::move(inside)).first->second;
}

void ZeroEngine::AddTransient(std::atomic<uint64_t>* bytes, std::atomic<uint64_t>* peak,
                              int64_t delta) {
  const uint64_t now =
      bytes->fetch_add(static_cast<uint64_t>(delta)) + static_cast<uint64_t>(delta);
  uint64_t seen = peak->load();
  while (now > seen && !peak->compare_exchange_weak(seen, now)) {
  }
}

Status ZeroEngine::Wait(const std::shared_future<Status>& done, const std::string& what) {
  SpinUntil([&] { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
            options_.comm_spin_us);
  if (done.wait_for(std::chrono::milliseconds(options_.wait_timeout_ms)) !=
      std::future_status::ready) {
    return DeadlineExceededError(std::string(name()) + ": " + what + " did not finish within " +
                                 std::to_string(options_.wait_timeout_ms) + " ms");
  }
  return done.get();
}

Status ZeroEngine::StartGather(const ParameterBlock& block) {
  ASSIGN_OR_RETURN(const std::vector<size_t>* inside, TensorsOf(block));
  auto values = std::make_shared<std::vector<float>>(block.size);
  AddTransient(&gathered_bytes_, &gathered_peak_, static_cast<int64_t>(block.size * kFloat));
  std::vector<std::pair<size_t, uint64_t>> work;  // (tensor, tag)
  for (size_t i : *inside) work.emplace_back(i, NextTag());
  std::shared_future<Status> done = comm_->Submit([this, values, block, work] {
    for (const auto& [i, tag] : work) {
      const Tensor& t = tensors_[i];
      RETURN_IF_ERROR(collectives_->AllGather(shard_.data() + t.owned_at,
                                              values->data() + (t.offset - block.offset), t.size,
                                              DataType::kFloat32, t.name, kOpTagBase + tag)
                          .WithContext("gathering the parameters of '" + t.name + "'"));
      gathered_total_->Increment(static_cast<double>(t.size * kFloat));
    }
    return OkStatus();
  });
  gathered_[block.offset] = Gathered{std::move(values), std::move(done)};
  return OkStatus();
}

StatusOr<const float*> ZeroEngine::Acquire(const ParameterBlock& block, Pass pass) {
  if (options_.stage == 2) return full_.data() + block.offset;
  const int p = pass == Pass::kForward ? 0 : 1;
  pass_ = pass;
  if (gathered_.count(block.offset) == 0) RETURN_IF_ERROR(StartGather(block));
  auto same = [&](const ParameterBlock& b) { return b.offset == block.offset; };
  // One pass's order (later micro-batches repeat it).
  if (in_step_ && std::none_of(recording_[p].begin(), recording_[p].end(), same)) {
    recording_[p].push_back(block);
  }
  const std::vector<ParameterBlock>& order = order_[p];
  auto at = std::find_if(order.begin(), order.end(), same);
  const bool last_of_forward = in_step_ && p == 0 && at != order.end() && at + 1 == order.end();
  if (last_of_forward) kept_for_backward_ = block.offset;
  // Prefetch the block that followed this one in the previous step's pass; after the
  // forward's last block, the first block of the backward not yet gathered.
  if (options_.prefetch) {
    const ParameterBlock* next = nullptr;
    if (at != order.end() && at + 1 != order.end()) {
      next = &*(at + 1);
    } else if (last_of_forward) {
      for (const ParameterBlock& b : order_[1]) {
        if (gathered_.count(b.offset) == 0) {
          next = &b;
          break;
        }
      }
    }
    if (next != nullptr && gathered_.count(next->offset) == 0) RETURN_IF_ERROR(StartGather(*next));
  }
  const Gathered& gathered = gathered_.at(block.offset);
  RETURN_IF_ERROR(Wait(gathered.done, "the all-gather of the block at offset " +
                                          std::to_string(block.offset)));
  return gathered.values->data();
}

void ZeroEngine::Release(const ParameterBlock& block) {
  if (options_.stage == 2) return;
  if (pass_ == Pass::kForward && block.offset == kept_for_backward_) {
    kept_for_backward_ = kNoBlock;  // the backward's Release frees it
    return;
  }
  auto it = gathered_.find(block.offset);
  if (it == gathered_.end()) return;
  // Acquire waited for it, so the communication thread no longer touches the buffer.
  AddTransient(&gathered_bytes_, &gathered_peak_, -static_cast<int64_t>(block.size * kFloat));
  gathered_.erase(it);
}

StatusOr<float*> ZeroEngine::GradientBlock(const ParameterBlock& block) {
  // Bounds the gradient memory of a step: backward waits for the oldest reduce-scatters.
  RETURN_IF_ERROR(WaitForReductionsAbove(
      static_cast<size_t>(options_.max_gradient_blocks_in_flight) - 1));
  auto buffer = std::make_shared<std::vector<float>>(block.size);
  AddTransient(&gradient_block_bytes_, &gradient_block_peak_,
               static_cast<int64_t>(block.size * kFloat));
  gradient_blocks_[block.offset] = buffer;
  return buffer->data();
}

Status ZeroEngine::GradientsDone(const ParameterBlock& block) {
  ASSIGN_OR_RETURN(const std::vector<size_t>* inside, TensorsOf(block));
  auto it = gradient_blocks_.find(block.offset);
  if (it == gradient_blocks_.end()) {
    return InternalError("gradients of the block at offset " + std::to_string(block.offset) +
                         " reported done without a gradient block");
  }
  std::shared_ptr<std::vector<float>> buffer = std::move(it->second);
  gradient_blocks_.erase(it);
  // The first micro-batch's gradients go straight into the gradient slices; a later one's
  // are reduce-scattered in place in the block and added to them.
  struct Work {
    size_t tensor;
    uint64_t tag;
    bool add;
  };
  std::vector<Work> work;
  for (size_t i : *inside) work.push_back({i, NextTag(), reduced_times_[i]++ > 0});
  std::shared_future<Status> done = comm_->Submit([this, buffer, block, work]() mutable {
    Status status;
    for (const Work& w : work) {
      const Tensor& t = tensors_[w.tensor];
      float* gradients = buffer->data() + (t.offset - block.offset);
      float* slice = grads_.data() + t.owned_at;
      status = collectives_->ReduceScatter(gradients, w.add ? gradients + t.slice.offset : slice,
                                           t.size, DataType::kFloat32, ReduceOp::kAverage, t.name,
                                           kOpTagBase + w.tag)
                   .WithContext("reduce-scattering the gradients of '" + t.name + "'");
      if (!status.ok()) break;
      // HSDP: the shard group's mean of this slice, averaged with the other groups' (each
      // holds the same slice of its own ranks' gradients), under the same tag on the
      // replicate group.
      float* shard = w.add ? gradients + t.slice.offset : slice;
      if (options_.replicate != nullptr && t.slice.size > 0) {
        status = options_.replicate
                     ->AllReduce(shard, t.slice.size, DataType::kFloat32, ReduceOp::kAverage,
                                 t.name, kOpTagBase + w.tag)
                     .WithContext("averaging the gradient shard of '" + t.name +
                                  "' across the replicas");
        if (!status.ok()) break;
      }
      if (w.add) {
        const float* reduced = gradients + t.slice.offset;
        for (uint64_t j = 0; j < t.slice.size; ++j) slice[j] += reduced[j];
      }
      reduced_total_->Increment(static_cast<double>(t.size * kFloat));
    }
    buffer.reset();
    AddTransient(&gradient_block_bytes_, &gradient_block_peak_,
                 -static_cast<int64_t>(block.size * kFloat));
    return status;
  });
  reductions_.emplace_back(std::move(done), "the reduce-scatter of the gradient block at offset " +
                                                std::to_string(block.offset));
  return OkStatus();
}

Status ZeroEngine::WaitForReductionsAbove(size_t limit) {
  while (reductions_.size() - reductions_waited_ > limit) {
    const auto& [done, what] = reductions_[reductions_waited_++];
    Status status = Wait(done, what);
    if (!status.ok() && reduction_error_.ok()) reduction_error_ = status;
  }
  return reduction_error_;
}

Status ZeroEngine::WaitForReductions() {
  Status first = WaitForReductionsAbove(0);
  reductions_.clear();
  reductions_waited_ = 0;
  reduction_error_ = OkStatus();
  return first;
}

Status ZeroEngine::Step(int64_t step, float* params, float* grads,
                        const std::vector<SparseRows>& sparse) {
  if (!sparse.empty()) {
    return InvalidArgumentError(std::string(name()) +
                                " mode got embedding rows; it holds no tables");
  }
  in_step_ = false;
  kept_for_backward_ = kNoBlock;
  RETURN_IF_ERROR(WaitForReductions());
  if (!gradient_blocks_.empty()) {
    return InternalError(std::to_string(gradient_blocks_.size()) +
                         " gradient blocks were written but never reported done");
  }
  // Gathered blocks not yet released (a prefetch nobody used) hold this step's values and may
  // still be read by the communication thread's gather of shard_: finish and drop them before
  // the update.
  while (!gathered_.empty()) {
    auto it = gathered_.begin();
    const uint64_t offset = it->first;
    Status status = Wait(it->second.done, "the all-gather of the block at offset " +
                                              std::to_string(offset));
    Release(ParameterBlock{offset, it->second.values->size()});
    RETURN_IF_ERROR(status);
  }
  for (int p = 0; p < 2; ++p) {
    if (!recording_[p].empty()) order_[p] = std::move(recording_[p]);
    recording_[p].clear();
  }
  // The mean over micro-batches (each reduce-scatter averaged over the ranks).
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    const int times = reduced_times_[i];
    if (times == 0 && t.size > 0) {
      return InternalError(std::string(name()) + " rank " +
                           std::to_string(collectives_->rank()) + ": no gradients of '" + t.name +
                           "' were reduce-scattered in step " + std::to_string(step));
    }
    if (times > 1) {
      const float scale = 1.0f / static_cast<float>(times);
      for (uint64_t j = 0; j < t.slice.size; ++j) grads_[t.owned_at + j] *= scale;
    }
  }
  std::fill(reduced_times_.begin(), reduced_times_.end(), 0);
  ASSIGN_OR_RETURN(bool apply, CheckShard(step));
  if (!apply) return OkStatus();
  const float lr = LearningRate(options_.schedule, options_.optimizer.lr, step - 1);
  const size_t k = StateFloatsPerElement(options_.optimizer.kind);
  for (const Tensor& t : tensors_) {
    float* values = options_.stage == 2 ? full_.data() + t.offset + t.slice.offset
                                        : shard_.data() + t.owned_at;
    DenseUpdate(options_.optimizer, lr, step, values, grads_.data() + t.owned_at, t.slice.size,
                state_.data() + k * t.owned_at);
  }
  if (options_.stage == 2) {  // every rank's slices to every rank
    std::vector<std::pair<size_t, uint64_t>> work;
    for (size_t i = 0; i < tensors_.size(); ++i) work.emplace_back(i, NextTag());
    std::shared_future<Status> done = comm_->Submit([this, work] {
      for (const auto& [i, tag] : work) {
        const Tensor& t = tensors_[i];
        float* values = full_.data() + t.offset;
        RETURN_IF_ERROR(collectives_->AllGather(values + t.slice.offset, values, t.size,
                                                DataType::kFloat32, t.name, kOpTagBase + tag)
                            .WithContext("gathering the updated parameters of '" + t.name + "'"));
        gathered_total_->Increment(static_cast<double>(t.size * kFloat));
      }
      return OkStatus();
    });
    RETURN_IF_ERROR(Wait(done, "gathering the updated parameters"));
  }
  PublishBytes();
  return OkStatus();
}

StatusOr<bool> ZeroEngine::CheckShard(int64_t step) {
  std::optional<uint64_t> failed;  // the layout offset of the first slice that failed
  for (const Tensor& t : tensors_) {
    const uint64_t offset = t.offset + t.slice.offset;
    ASSIGN_OR_RETURN(bool go_on,
                     CheckGradients(step, grads_.data() + t.owned_at, offset, t.slice.size));
    if (!go_on) {
      failed = offset;
      break;
    }
  }
  if (!MaySkip()) return true;  // a failed check stopped the job above
  // Each rank saw only its shard: every rank's verdict, as the offset where it failed (the
  // largest int64 where it did not), the smallest offset naming the rank that skipped.
  const int world = collectives_->world_size();
  const int rank = collectives_->rank();
  constexpr int64_t kPassed = std::numeric_limits<int64_t>::max();
  // Shared with the communication thread, which may outlive a Wait that timed out.
  auto verdicts = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(world), kPassed);
  if (failed) (*verdicts)[static_cast<size_t>(rank)] = static_cast<int64_t>(*failed);
  const uint64_t tag = NextTag();
  std::shared_future<Status> done = comm_->Submit([this, verdicts, tag] {
    return collectives_->AllReduce(verdicts->data(), verdicts->size(), DataType::kInt64,
                                   ReduceOp::kMin, "gradient check", kOpTagBase + tag);
  });
  RETURN_IF_ERROR(Wait(done, "every rank's verdict on its gradient shard"));
  for (int r = 0; r < world; ++r) {
    const int64_t at = (*verdicts)[static_cast<size_t>(r)];
    if (at == kPassed) continue;
    if (!failed) SkippedByPeer(step, r, static_cast<uint64_t>(at));
    return false;  // a rank that failed was told by its own check
  }
  return true;
}

Status ZeroEngine::GatherParameters(float* params) {
  if (options_.stage == 2) {
    std::memcpy(params, full_.data(), size_ * kFloat);
    return OkStatus();
  }
  std::vector<std::pair<size_t, uint64_t>> work;
  for (size_t i = 0; i < tensors_.size(); ++i) work.emplace_back(i, NextTag());
  std::shared_future<Status> done = comm_->Submit([this, params, work] {
    for (const auto& [i, tag] : work) {
      const Tensor& t = tensors_[i];
      RETURN_IF_ERROR(collectives_->AllGather(shard_.data() + t.owned_at, params + t.offset,
                                              t.size, DataType::kFloat32, t.name,
                                              kOpTagBase + tag)
                          .WithContext("gathering the parameters of '" + t.name + "'"));
    }
    return OkStatus();
  });
  return Wait(done, "gathering all parameters");
}

std::vector<Partition> ZeroEngine::OwnedSlices() const {
  std::vector<Partition> slices;
  for (const Tensor& t : tensors_) slices.push_back({t.offset + t.slice.offset, t.slice.size});
  return slices;
}

Status ZeroEngine::SaveCheckpoint(const std::string& root, int64_t step, const float* params) {
  const ShardedCheckpointSpec spec{std::string(name()), &layout_, options_.optimizer.kind,
                                   options_.restores_checkpoints_of};
  const std::vector<Partition> slices = OwnedSlices();
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step);
  if (options_.replicate != nullptr) {
    // HSDP: the replicas' shards are identical; the first replica's shard group writes them
    // as a zero3 world of its size would, and the other replicas learn whether it did.
    Status saved;
    if (options_.first_replica) {
      saved = SaveShardedCheckpoint(root, step, spec, slices, shard_.data(), state_.data(),
                                    collectives_, tag);
    }
    ASSIGN_OR_RETURN(bool failed,
                     AnyRank(options_.replicate, !saved.ok(),
                             "whether the checkpoint of step " + std::to_string(step) +
                                 " was saved",
                             tag));
    RETURN_IF_ERROR(saved);
    if (failed) {
      return AbortedError("hsdp: the first replica failed to save the checkpoint of step " +
                          std::to_string(step) + " (its ranks name the cause)");
    }
    return OkStatus();
  }
  std::vector<float> stage2_slices;
  const float* values = shard_.data();
  if (options_.stage == 2) {
    for (const Partition& slice : slices) {
      stage2_slices.insert(stage2_slices.end(), full_.data() + slice.offset,
                           full_.data() + slice.end());
    }
    values = stage2_slices.data();
  }
  return SaveShardedCheckpoint(root, step, spec, slices, values, state_.data(), collectives_,
                               tag);
}

Status ZeroEngine::RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
  const ShardedCheckpointSpec spec{std::string(name()), &layout_, options_.optimizer.kind,
                                   options_.restores_checkpoints_of};
  const uint64_t tag = kCheckpointTagBase + 4 * static_cast<uint64_t>(step) + 2;
  Status restored = RestoreShardedCheckpoint(
      root, step, spec, OwnedSlices(), options_.stage == 3 ? shard_.data() : nullptr, state_.data(),
      params, collectives_, tag);
  if (options_.replicate != nullptr) {
    // HSDP: every shard group agreed within itself; the replicas agree too.
    ASSIGN_OR_RETURN(bool failed,
                     AnyRank(options_.replicate, !restored.ok(),
                             "whether the checkpoint of step " + std::to_string(step) +
                                 " was restored",
                             tag));
    if (restored.ok() && failed) {
      restored = AbortedError("hsdp: another replica failed to restore the checkpoint of step " +
                              std::to_string(step) + " (its ranks name the cause)");
    }
  }
  RETURN_IF_ERROR(restored);
  if (options_.stage == 2) full_.assign(params, params + size_);
  TLOG(INFO) << "restored the checkpoint of step " << step << " from "
             << CheckpointStepDirectory(root, step);
  return OkStatus();
}

ZeroEngine::Bytes ZeroEngine::held() const {
  Bytes b;
  b.parameters = (options_.stage == 2 ? size_ : owned_) * kFloat;
  b.gradients = owned_ * kFloat;
  b.optimizer_state = state_.size() * kFloat;
  return b;
}

ZeroEngine::Bytes ZeroEngine::peak() const {
  Bytes b = held();
  b.parameters += gathered_peak_.load();
  b.gradients += gradient_block_peak_.load();
  return b;
}

void ZeroEngine::PublishBytes() {
  const Bytes h = held(), p = peak();
  held_bytes_[0]->Set(static_cast<double>(h.parameters));
  held_bytes_[1]->Set(static_cast<double>(h.gradients));
  held_bytes_[2]->Set(static_cast<double>(h.optimizer_state));
  peak_bytes_[0]->Set(static_cast<double>(p.parameters));
  peak_bytes_[1]->Set(static_cast<double>(p.gradients));
  peak_bytes_[2]->Set(static_cast<double>(p.optimizer_state));
  // The next step's peaks start from what is held now (nothing transient between steps,
  // except a prefetch issued during evaluation).
  gathered_peak_.store(gathered_bytes_.load());
  gradient_block_peak_.store(gradient_block_bytes_.load());
}

StatusOr<bool> ZeroEngine::AgreeToStop(int64_t step, bool stop) {
  // The communication thread is idle after Step, so the call can run here.
  const std::string what = "whether to stop after step " + std::to_string(step);
  const uint64_t tag = kStopTagBase + static_cast<uint64_t>(step);
  ASSIGN_OR_RETURN(bool any_in_group, AnyRank(collectives_, stop, what, tag));
  if (options_.replicate == nullptr) return any_in_group;
  // Any rank of any shard group: every group's answer, across the replicas.
  return AnyRank(options_.replicate, any_in_group, what, tag);
}

}  // namespace tessera::worker
