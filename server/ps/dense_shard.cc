#include "server/ps/dense_shard.h"

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "common/base/and_list.h"
#include "common/base/deadline.h"
#include "common/messages/fleet_view.h"
#include "common/training/lr_schedule.h"
#include "common/training/nonfinite.h"
#include "common/training/optimizer.h"
#include "server/ps/forward_chain.h"
#include "server/ps/replication_log.h"

namespace tessera::server {
namespace {

// The floats of `tensor` where they are, when its frame is aligned for them (a received
// ZeroMQ frame of any size worth avoiding a copy is), else copied into `scratch`.
const float* FloatsOf(const TensorData& tensor, std::vector<float>* scratch) {
  if (reinterpret_cast<uintptr_t>(tensor.bytes.data()) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(tensor.bytes.data());
  }
  *scratch = tensor.Read<float>();
  return scratch->data();
}

// How many steps behind the version a ps-sync chunk remembers who asked to stop (and which
// server joined): a copy of a push (answered again as the pull of its step's values,
// request_ledger.h) comes within a few.
constexpr int64_t kStopMemorySteps = 1024;

// `value` becomes min(value, candidate), -1 counting as none.
void StoreLowestRank(std::atomic<int>* value, int candidate) {
  int current = value->load(std::memory_order_relaxed);
  while ((current < 0 || candidate < current) &&
         !value->compare_exchange_weak(current, candidate, std::memory_order_relaxed)) {
  }
}

// FloatsOf of each of `by_rank`, the copies of unaligned ones (none of a size worth the trouble)
// in `scratch`.
std::vector<const float*> FloatsByRank(const std::vector<TensorData>& by_rank,
                                       std::vector<std::vector<float>>* scratch) {
  scratch->resize(by_rank.size());
  std::vector<const float*> floats;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    floats.push_back(FloatsOf(by_rank[r], &(*scratch)[r]));
  }
  return floats;
}

}  // namespace

// The gradients of the workers that pushed, in rank order: a worker that left before pushing
// (elastic jobs) has an empty slot, and the step's average is over those that pushed. A chunk
// of no floats keeps every slot (all are empty).
std::vector<TensorData> Pushed(std::vector<TensorData> by_rank, size_t chunk_size) {
  if (chunk_size == 0) return by_rank;
  std::vector<TensorData> pushed;
  pushed.reserve(by_rank.size());
  for (TensorData& slot : by_rank) {
    if (!slot.bytes.empty()) pushed.push_back(std::move(slot));
  }
  return pushed;
}

// A chunk's values. Replies send them without a copy: each holds a lease (`readers`) until
// its transport is done with them, and an update while a lease is out writes to a fresh copy
// (Writable), so the values a reply carries never change under it.
struct DenseShard::Values {
  explicit Values(std::vector<float> floats) : floats(std::move(floats)) {}
  std::vector<float> floats;
  std::atomic<int64_t> readers{0};
};

// A push-pull reply assembled from one part per chunk, sent when the last part is filled.
struct DenseShard::PendingReply {
  ReplyCallback send;
  std::vector<std::string> names;  // per part: "chunk<index>"
  std::vector<uint64_t> keys;
  std::vector<TensorData> parts;   // part i written once, under chunk i's lock
  std::atomic<int> remaining{0};   // parts not filled yet
  bool push = false;               // the request gave gradients (or skipped them)
  int rank = 0;                    // the worker's, and the step of its request (DescribeLongWaits)
  int64_t step = 0;
  std::atomic<int> skipped_by{-1};  // ps-sync: who skipped the step this push was of
  std::atomic<int> stopped_by{-1};  // ps-sync: the lowest rank asked to stop in that step
  std::atomic<int> joining{-1};     // ps-sync: the lowest server rank said to join in it
  // A joined server the push's updates went to (CopyTo); written by the request's own thread
  // before the part of its chunk is filled, so before the reply goes.
  std::string copied_to;
};

// A forward taken by a middle copy of a chain (ps-async, ps-ssp with 3 or more copies): it is
// acknowledged (`taken`) once each of its chunks has applied its update and every copy after
// this one has it, so the next primary always holds every update the last copy holds. Also a
// forward in a worker's region (ForwardedStep::in_region), once applied here.
struct DenseShard::ChainAck {
  std::atomic<int> remaining{0};  // chunks still waiting, plus one while it is being served
  std::function<void()> taken;

  // What a chunk (or the serving) calls once done with `ack`, with no chunk's lock held: the
  // last one acknowledges the forward.
  static ReplicationLogBase::Ack ChunkDone(std::shared_ptr<ChainAck> ack) {
    return [ack = std::move(ack)] {
      if (ack->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) ack->taken();
    };
  }
};

// What a chunk's lock released, to be sent once it is released.
struct DenseShard::Ready {
  std::vector<std::shared_ptr<PendingReply>> replies;
  std::vector<ReplicationLogBase::Ack> acks;  // ChainAck::ChunkDone: a chunk of each is done
};

// An update a chain's copy applied (a forward, or one parked here), for the copies after it.
struct DenseShard::Onward {
  Chunk* chunk;
  std::string chain;  // where it goes
  int64_t update;     // its number here
  int rank;
  int64_t step;
  TensorData gradient;
  bool in_region;  // `gradient` is a view of worker `rank`'s region, which `chain` mapped
};

// A part of a PendingReply, with the rule that releases it.
struct DenseShard::Waiter {
  std::shared_ptr<PendingReply> reply;
  size_t part = 0;
  ReleaseRule rule;
  SteadyClock::time_point since = SteadyClock::now();
  bool described = false;  // by DescribeLongWaits, once
};

struct DenseShard::Chunk {
  Chunk(const DenseChunk& where, const PsJobConfig& config)
      : where(where), policy(config.consistency, config.num_workers, config.staleness) {}

  const DenseChunk where;
  mutable std::mutex mu;
  std::shared_ptr<Values> values;  // guarded by mu; never null
  std::vector<float> state;        // guarded by mu
  ConsistencyPolicy policy;        // guarded by mu
  // ps-sync: the gradients of a step not applied yet, by rank, as they arrived (their frames,
  // or views of their workers' regions), and whether every one so far came in its region.
  struct Held {
    std::vector<TensorData> by_rank;
    bool in_regions = true;
  };
  std::map<int64_t, Held> held;  // guarded by mu
  std::vector<Waiter> waiters;                      // guarded by mu
  // ps-sync: the last step dropped because a worker skipped it, and that worker.
  int64_t dropped_step = 0;  // guarded by mu
  int dropped_by = -1;       // guarded by mu
  // ps-sync: by step (of the last kStopMemorySteps), the lowest rank whose push of it asked to
  // stop and the lowest server rank a push of it said joined. Only steps with such a push are
  // here.
  struct StepNotes {
    int stopped_by = -1;
    int joining = -1;
  };
  std::map<int64_t, StepNotes> notes;  // guarded by mu
  // The backup's side, ps-async and ps-ssp: what a forwarded push parked in `log` carries.
  struct ParkedGradient {
    TensorData gradient;  // shares the forward's frame, or a view of the worker's region
    // A view (ForwardedStep::in_region), and the copies after this one the forward named:
    // those mapped the worker's region (it named them).
    bool in_region = false;
    std::string chain;
  };
  // The updates applied here that the backup has not acknowledged yet (ps-sync: the step, at
  // most one; the replies with their values wait); ps-async and ps-ssp: forwarded pushes
  // parked until their turn (ApplyParked), a joined server that took a copy of this chunk
  // (CopyTo: every later update goes there when the push names no backup), and a chain's middle
  // copy's forwards (ChainAck) whose update here is not yet at every copy after this one.
  ReplicationLog<ParkedGradient> log;  // guarded by mu
};

StatusOr<std::unique_ptr<DenseShard>> DenseShard::Create(const PsJobConfig& config,
                                                         const ServerPlacement& placement,
                                                         const std::vector<TensorData>& initial,
                                                         PsMetrics* metrics,
                                                         Forwarder forwarder) {
  ASSIGN_OR_RETURN(std::vector<DenseChunk> plan,
                   PlanDenseChunks(config.dense_elements, config.chunk_elements,
                                   placement.num_servers, placement.key_space));
  std::unique_ptr<DenseShard> shard(
      new DenseShard(config, placement, metrics, std::move(forwarder)));
  std::map<uint64_t, const TensorData*> given;
  for (const TensorData& tensor : initial) given[tensor.key] = &tensor;
  for (const DenseChunk& where : plan) {
    if (where.server != placement.server_rank) continue;
    auto it = given.find(where.key);
    if (it == given.end() || it->second->dtype != DataType::kFloat32 ||
        it->second->bytes.size() != where.size * sizeof(float)) {
      return InvalidArgumentError("init: chunk " + std::to_string(where.index) + " (key " +
                                  std::to_string(where.key) + ", " + std::to_string(where.size) +
                                  " floats) is missing or has the wrong size");
    }
    auto chunk = std::make_unique<Chunk>(where, config);
    chunk->values = std::make_shared<Values>(it->second->Read<float>());
    chunk->state.resize(shard->state_per_element_ * where.size);
    InitOptimizerState(config.optimizer, chunk->state.data(), where.size);
    shard->chunks_[where.key] = std::move(chunk);
  }
  if (given.size() != shard->chunks_.size()) {
    return InvalidArgumentError("init: " + std::to_string(given.size()) +
                                " chunks sent, this server owns " +
                                std::to_string(shard->chunks_.size()));
  }
  for (const auto& [key, chunk] : shard->chunks_) shard->layout_.push_back(chunk->where);
  return shard;
}

DenseShard::DenseShard(const PsJobConfig& config, const ServerPlacement& placement,
                       PsMetrics* metrics, Forwarder forwarder)
    : config_(config),
      placement_(placement),
      metrics_(metrics),
      forwarder_(std::move(forwarder)),
      state_per_element_(StateFloatsPerElement(config.optimizer.kind)) {}

DenseShard::~DenseShard() {
  int64_t dropped = 0;
  for (auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    dropped += static_cast<int64_t>(chunk->waiters.size());
  }
  if (dropped > 0) metrics_->AddWaiting(-dropped);
}

Status DenseShard::PushPull(int rank, int64_t step, const std::vector<TensorData>& tensors,
                            bool push, ReplyCallback reply, bool stop, int join,
                            const std::string& forward_to, bool in_region) {
  return Serve(rank, step, tensors, push ? Gradients::kGiven : Gradients::kNone,
               std::move(reply), stop, join, forward_to, in_region);
}

Status DenseShard::Skip(int rank, int64_t step, const std::vector<TensorData>& tensors,
                        ReplyCallback reply, bool stop, int join,
                        const std::string& forward_to) {
  return Serve(rank, step, tensors, Gradients::kSkipped, std::move(reply), stop, join,
               forward_to, /*in_region=*/false);
}

StatusOr<DenseShard::Chunk*> DenseShard::ChunkFor(const TensorData& tensor, bool given,
                                                  const char* what) const {
  auto it = chunks_.find(tensor.key);
  if (it == chunks_.end()) return NotFoundError(OwnerMessage(tensor.key));
  Chunk* chunk = it->second.get();
  if (given && (tensor.dtype != DataType::kFloat32 ||
                tensor.bytes.size() != chunk->where.size * sizeof(float))) {
    return InvalidArgumentError("chunk " + std::to_string(chunk->where.index) + " has " +
                                std::to_string(chunk->where.size) + " floats; the " + what +
                                " carries " + std::to_string(tensor.bytes.size()) +
                                " bytes of " + std::string(DataTypeName(tensor.dtype)));
  }
  return chunk;
}

Status DenseShard::Serve(int rank, int64_t step, const std::vector<TensorData>& tensors,
                         Gradients gradients, ReplyCallback reply, bool stop, int join,
                         const std::string& forward_to, bool in_region) {
  const bool sync = config_.consistency == PsConsistency::kSync;
  const bool record_stop = stop && sync;
  const bool record_join = join >= 0 && sync;
  const bool push = gradients != Gradients::kNone;
  const bool given = gradients == Gradients::kGiven;
  if (push && step < 1) {
    return InvalidArgumentError("push of step " + std::to_string(step) + "; steps start at 1");
  }
  std::vector<Chunk*> chunks;
  for (const TensorData& tensor : tensors) {
    ASSIGN_OR_RETURN(Chunk * chunk, ChunkFor(tensor, given, "push"));
    // One NaN or Inf applied would reach every worker's next pull: refuse the whole request
    // before any chunk of it is touched.
    if (given) {
      if (std::optional<size_t> at = FirstNonFinite(tensor.bytes.data(), chunk->where.size)) {
        metrics_->DenseNonFinitePush();
        return InvalidArgumentError(
            "worker " + std::to_string(rank) + "'s push of step " + std::to_string(step) +
            ": the gradient of chunk " + std::to_string(chunk->where.index) + " (key " +
            std::to_string(tensor.key) + ") holds " + DescribeNonFinite(tensor.bytes.data(), *at) +
            "; refused, nothing of this push was applied");
      }
    }
    chunks.push_back(chunk);
  }
  auto pending = std::make_shared<PendingReply>();
  pending->send = std::move(reply);
  pending->push = push;
  pending->rank = rank;
  pending->step = step;
  pending->parts.resize(chunks.size());
  for (const Chunk* chunk : chunks) {
    pending->names.push_back("chunk" + std::to_string(chunk->where.index));
    pending->keys.push_back(chunk->where.key);
  }
  pending->remaining = static_cast<int>(chunks.size());
  if (chunks.empty()) {
    Ready ready;
    ready.replies.push_back(pending);
    Send(ready);
    return OkStatus();
  }
  // The updates this request applied (ps-sync: the chunks whose step it completed) go to the
  // backup in one message, once their locks are released (forward_to). (A message per chunk,
  // sent before its apply so that the two overlap, measured slower in ps-sync: 1.65x the time
  // of one copy at 2 x 1, against 1.5x.)
  const bool forward = push && forwarder_ != nullptr && !forward_to.empty();
  // ps-async, ps-ssp: a chunk copied to a joined server names it (`backup`), and where it is
  // set, the update goes along the push's `forward_to` and then there (ChainWith): the push
  // may have been sent (or queued here) before the copy, or name only the range's failed
  // former backup (the forwarder passes over a failed copy), and an update that missed the
  // joined one would leave its copy waiting for it forever. Every chunk of a range names the
  // same server; one of this request applied before CopyTo reached it is in its copy, so
  // sending it there too changes nothing.
  std::string backup;  // set once, by the first chunk that has one
  ForwardedStep forwarded;
  forwarded.step = step;
  if (!sync) forwarded.pushed_by = rank;
  std::vector<std::pair<Chunk*, int64_t>> forwarded_chunks;  // (chunk, update)
  std::vector<Onward> onward;  // parked forwards applied here, for the copies after this one
  // ps-sync: a step whose every gradient came in its worker's region goes to the backup alone
  // named (its chunk without bytes), and the backup averages the regions itself; `named`: one
  // did. Only the averages that travel are made (AverageHeld); the others are applied as they
  // are averaged (ApplyHeld).
  const bool may_name = forward && in_region && forward_to.find(',') == std::string::npos;
  bool named = false;
  Status refused = OkStatus();
  for (size_t i = 0; i < chunks.size() && refused.ok(); ++i) {
    Chunk& chunk = *chunks[i];
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(chunk.mu);
      // A worker's request at a copy holding parked forwards: its primary is gone (workers ask
      // only the primary), and nothing fills their gaps any more. In a chain they go on to
      // the copies after this one, numbered as applied here, so those stay a prefix of this.
      if (chunk.log.has_parked()) {
        ApplyParked(&chunk, /*all=*/true, chunk.log.ChainOfParked(forward_to), &onward);
      }
      // A pull: the values after step - 1 in every model (after a restore, versions restart
      // at the checkpoint's step).
      Waiter waiter{pending, i, chunk.policy.Pull(step)};
      if (push) {
        if (given) {
          metrics_->DenseGradientBytes(static_cast<double>(tensors[i].bytes.size()));
        }
        StatusOr<PushDecision> decided =
            given ? chunk.policy.Push(rank, step) : chunk.policy.Skip(rank, step);
        if (!decided.ok()) {
          refused = decided.status();
          break;
        }
        const PushDecision& decision = *decided;
        // Before the step can be applied (this push may be its last): every reply of the step
        // is released after every worker's push of it was recorded here.
        if (record_stop || record_join) {
          Chunk::StepNotes& notes = chunk.notes[step];
          if (record_stop && (notes.stopped_by < 0 || rank < notes.stopped_by)) {
            notes.stopped_by = rank;
          }
          if (record_join && (notes.joining < 0 || join < notes.joining)) notes.joining = join;
        }
        switch (decision.action) {
          case PushAction::kHold:
          case PushAction::kApplyHeld:
          case PushAction::kDropHeld: {
            Chunk::Held& held = chunk.held[decision.update];
            held.by_rank.resize(static_cast<size_t>(config_.num_workers));
            if (given) held.by_rank[rank] = tensors[i];  // shares the frame: no copy
            held.in_regions &= in_region;
            if (decision.action == PushAction::kHold) break;
            TensorData average{"chunk" + std::to_string(chunk.where.index), chunk.where.key,
                               DataType::kFloat32, {static_cast<int64_t>(chunk.where.size)},
                               Payload()};
            if (decision.action == PushAction::kApplyHeld) {
              const bool name_it = may_name && held.in_regions;
              named |= name_it;
              if (forward && !name_it) {
                average = AverageHeld(decision.update, &chunk);
                std::vector<float> scratch;
                ApplyGradient(decision.update, FloatsOf(average, &scratch), &chunk);
              } else {
                ApplyHeld(decision.update, &chunk);
              }
            } else {
              chunk.held.erase(decision.update);
              chunk.dropped_step = decision.update;
              chunk.dropped_by = decision.skipped_by;
              metrics_->DenseUpdateSkipped();
            }
            if (forward) {
              // Its replies wait for the backup's acknowledgement.
              chunk.log.Sent(decision.update);
              forwarded.gradients.push_back(std::move(average));
              forwarded_chunks.emplace_back(&chunk, decision.update);
              if (decision.action == PushAction::kDropHeld) {
                forwarded.dropped_by = decision.skipped_by;
              }
              if (auto notes = chunk.notes.find(decision.update); notes != chunk.notes.end()) {
                forwarded.stopped_by = notes->second.stopped_by;
                forwarded.joining = notes->second.joining;
              }
            }
            ForgetOldStops(&chunk);
            break;
          }
          case PushAction::kApplyNow: {
            std::vector<float> scratch;
            ApplyGradient(decision.update, FloatsOf(tensors[i], &scratch), &chunk);
            if (forwarder_ != nullptr && backup.empty() && !chunk.log.joined().empty()) {
              backup = chunk.log.joined();
              pending->copied_to = backup;
            }
            if (forwarder_ != nullptr && (!backup.empty() || !forward_to.empty())) {
              // Its reply waits for the backup's acknowledgement; the gradient is the push's
              // frame.
              chunk.log.Sent(decision.update);
              forwarded.gradients.push_back(tensors[i]);
              forwarded.updates.push_back(decision.update);
              forwarded_chunks.emplace_back(&chunk, decision.update);
            }
            break;
          }
          case PushAction::kNone:
          case PushAction::kApplied:
            break;
        }
        waiter.rule = decision.reply;
      }
      chunk.waiters.push_back(std::move(waiter));
      metrics_->AddWaiting(1);
      ReleaseReady(&chunk, &ready);
    }
    Send(ready);
  }
  SendOnward(std::move(onward));
  if (!forwarded_chunks.empty()) {
    std::string chain = ChainWith(forward_to, backup);
    // ps-async, ps-ssp: to the copies the worker named (it sends in its region only while every
    // copy it names mapped it; a chain's middle passes the names on): named, not carried. A
    // joined server the worker has not taken in yet (`backup`, beyond `forward_to`) gets the
    // bytes.
    if (sync) {
      forwarded.in_region = named;
    } else if (in_region && chain == forward_to) {
      forwarded.in_region = true;
      for (TensorData& gradient : forwarded.gradients) gradient.bytes = Payload();
    }
    if (in_region) OwnTheRegionsBytes(tensors, &forwarded.gradients);
    forwarder_(chain, std::move(forwarded),
               [this, chunks = std::move(forwarded_chunks)] { Forwarded(chunks); });
  }
  return refused;
}

// A forward's gradients that are views of the request's region (`tensors`: ps-async's push, the
// average of a one-worker ps-sync step) and travel as bytes are copied: the forwarder may send
// a forward again after it was acknowledged (a resend queued before the acknowledgement), when
// the worker has written its region again.
void DenseShard::OwnTheRegionsBytes(const std::vector<TensorData>& tensors,
                                    std::vector<TensorData>* gradients) {
  std::set<const uint8_t*> views;
  for (const TensorData& tensor : tensors) views.insert(tensor.bytes.data());
  for (TensorData& gradient : *gradients) {
    if (!gradient.bytes.empty() && views.count(gradient.bytes.data()) > 0) {
      gradient = TensorData::Floats(gradient.name, gradient.key, gradient.Read<float>());
    }
  }
}

// Grouped by where they go and whose push they were: one forward each (mostly one in all).
void DenseShard::SendOnward(std::vector<Onward> onward) {
  if (onward.empty()) return;
  std::map<std::tuple<std::string, int, int64_t, bool>,
           std::pair<ForwardedStep, std::vector<std::pair<Chunk*, int64_t>>>>
      forwards;
  for (Onward& update : onward) {
    auto& [step, chunks] =
        forwards[{update.chain, update.rank, update.step, update.in_region}];
    step.step = update.step;
    step.pushed_by = update.rank;
    step.in_region = update.in_region;
    if (update.in_region) update.gradient.bytes = Payload();  // named, not carried
    step.gradients.push_back(std::move(update.gradient));
    step.updates.push_back(update.update);
    chunks.emplace_back(update.chunk, update.update);
  }
  for (auto& [where, forward] : forwards) {
    forwarder_(std::get<0>(where), std::move(forward.first),
               [this, chunks = std::move(forward.second)] { Forwarded(chunks); });
  }
}

void DenseShard::Forwarded(const std::vector<std::pair<Chunk*, int64_t>>& updates) {
  for (const auto& [chunk, update] : updates) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(chunk->mu);
      chunk->log.Acknowledged(update);
      ReleaseReady(chunk, &ready);
    }
    Send(ready);
  }
}

Status DenseShard::ApplyForwarded(const ForwardedStep& forwarded, std::function<void()> taken) {
  const int64_t step = forwarded.step;
  const bool dropped = forwarded.dropped_by >= 0;
  if (step < 1) {
    return InvalidArgumentError("forwarded step " + std::to_string(step) + "; steps start at 1");
  }
  if (config_.consistency != PsConsistency::kSync) {
    return ApplyForwardedPush(forwarded, std::move(taken));
  }
  // A chunk named without bytes in a forward in the workers' regions: every worker's gradient
  // of it, averaged here (ForwardedStep::by_worker).
  const bool in_regions = forwarded.in_region && !dropped;
  if (in_regions && forwarded.by_worker.size() != forwarded.gradients.size()) {
    return InvalidArgumentError("forwarded step " + std::to_string(step) + " in the workers' "
                                "regions: " + std::to_string(forwarded.by_worker.size()) +
                                " chunks' gradients for " +
                                std::to_string(forwarded.gradients.size()) + " chunks");
  }
  auto averaged_here = [&](size_t i) { return in_regions && forwarded.gradients[i].bytes.empty(); };
  // (chunk, the index of its gradient) in key order.
  std::map<uint64_t, std::pair<Chunk*, size_t>> chunks;
  for (size_t i = 0; i < forwarded.gradients.size(); ++i) {
    const TensorData& tensor = forwarded.gradients[i];
    ASSIGN_OR_RETURN(Chunk * chunk,
                     ChunkFor(tensor, !dropped && !averaged_here(i), "forwarded step"));
    if (averaged_here(i)) {
      if (forwarded.by_worker[i].size() != static_cast<size_t>(config_.num_workers)) {
        return InvalidArgumentError("forwarded step " + std::to_string(step) + " of chunk " +
                                    std::to_string(chunk->where.index) + ": " +
                                    std::to_string(forwarded.by_worker[i].size()) +
                                    " workers' gradients, the job has " +
                                    std::to_string(config_.num_workers));
      }
      for (const TensorData& gradient : forwarded.by_worker[i]) {
        RETURN_IF_ERROR(ChunkFor(gradient, true, "forwarded step").status());
      }
    }
    chunks[chunk->where.key] = {chunk, i};
  }
  // Every chunk's lock, taken in key order (nothing else holds two), from the checks to the
  // last apply: the step is checked, acknowledged and applied whole, and the chunks' next
  // forwarded step (sent only once this one was acknowledged) finds it applied.
  std::vector<std::unique_lock<std::mutex>> locks;
  for (const auto& [key, entry] : chunks) locks.emplace_back(entry.first->mu);
  for (const auto& [key, entry] : chunks) {
    const Chunk* chunk = entry.first;
    if (chunk->policy.version() < step - 1) {
      return FailedPreconditionError(
          "forwarded step " + std::to_string(step) + " of chunk " +
          std::to_string(chunk->where.index) + ": this copy is at step " +
          std::to_string(chunk->policy.version()) + ", and a forwarded step applies to the one "
          "before it");
    }
  }
  // Held in memory here: acknowledged before it is applied, which takes the apply off the
  // step's wait. In the workers' regions: once applied (they are written again once the
  // replies the acknowledgement holds came).
  if (!forwarded.in_region) taken();
  Ready ready;
  for (auto& [key, entry] : chunks) {
    Chunk& chunk = *entry.first;
    // A copy of a forward taken already, or the workers' pushes of the step completed it here
    // first (they asked this copy after the primary failed): the same sums either way.
    if (chunk.policy.version() >= step) continue;
    if (dropped) {
      chunk.dropped_step = step;
      chunk.dropped_by = forwarded.dropped_by;
      metrics_->DenseUpdateSkipped();
    } else if (averaged_here(entry.second)) {
      ApplyAverage(step, forwarded.by_worker[entry.second], &chunk);
    } else {
      std::vector<float> scratch;
      ApplyGradient(step, FloatsOf(forwarded.gradients[entry.second], &scratch), &chunk);
    }
    chunk.policy.Advance(step);
    chunk.held.erase(step);  // pushes of it that came here: answered with its values
    if (forwarded.stopped_by >= 0 || forwarded.joining >= 0) {
      Chunk::StepNotes& notes = chunk.notes[step];
      if (forwarded.stopped_by >= 0) notes.stopped_by = forwarded.stopped_by;
      if (forwarded.joining >= 0) notes.joining = forwarded.joining;
    }
    ForgetOldStops(&chunk);
    ReleaseReady(&chunk, &ready);
  }
  if (forwarded.in_region) taken();
  locks.clear();
  Send(ready);
  return OkStatus();
}

Status DenseShard::ApplyForwardedPush(const ForwardedStep& forwarded, std::function<void()> taken) {
  const std::string what = "worker " + std::to_string(forwarded.pushed_by) + "'s push of step " +
                           std::to_string(forwarded.step) + ", forwarded";
  RETURN_IF_ERROR(
      ReplicationLogBase::CheckPushedBy(what, forwarded.pushed_by, config_.num_workers));
  if (forwarded.updates.size() != forwarded.gradients.size()) {
    return InvalidArgumentError(what + ": " + std::to_string(forwarded.gradients.size()) +
                                " chunks and " + std::to_string(forwarded.updates.size()) +
                                " update numbers");
  }
  std::vector<Chunk*> chunks;
  for (size_t i = 0; i < forwarded.gradients.size(); ++i) {
    ASSIGN_OR_RETURN(Chunk * chunk, ChunkFor(forwarded.gradients[i], true, "forwarded push"));
    if (forwarded.updates[i] < 1) {
      return InvalidArgumentError(what + ": update " + std::to_string(forwarded.updates[i]) +
                                  " of chunk " + std::to_string(chunk->where.index) +
                                  "; updates start at 1");
    }
    chunks.push_back(chunk);
  }
  // The last copy: held in memory here (parked until the updates before it came), so
  // acknowledged first. A middle copy of a chain acknowledges once the copies after it have
  // the update too (ChainAck), and forwards each update as it applies it; gradients in a
  // worker's region are acknowledged once applied (ChainAck with no copies after this one).
  const std::string& chain = forwarded.forward_to;
  std::shared_ptr<ChainAck> ack;
  if (chain.empty() && !forwarded.in_region) {
    taken();
  } else {
    ack = std::make_shared<ChainAck>();
    ack->taken = std::move(taken);
    ack->remaining.store(static_cast<int>(chunks.size()) + 1, std::memory_order_relaxed);
  }
  std::vector<Onward> onward;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& chunk = *chunks[i];
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(chunk.mu);
      const int64_t update = forwarded.updates[i];
      // A copy of a forward taken already is left alone (applied, or parked: the first is
      // kept); in a chain it is acknowledged as the first is.
      if (chunk.log.Park(update, chunk.policy,
                         {forwarded.pushed_by, forwarded.step,
                          {forwarded.gradients[i], forwarded.in_region, chain}})) {
        ApplyParked(&chunk, /*all=*/false, chain, ack != nullptr ? &onward : nullptr);
      }
      if (ack != nullptr) chunk.log.AwaitCopies(update, chain, ChainAck::ChunkDone(ack));
      ReleaseReady(&chunk, &ready);
    }
    Send(ready);
  }
  SendOnward(std::move(onward));
  if (ack != nullptr) {
    Ready served;
    served.acks.push_back(ChainAck::ChunkDone(std::move(ack)));
    Send(served);
  }
  return OkStatus();
}

// The parked forwards the chunk's log gives, in update order.
void DenseShard::ApplyParked(Chunk* chunk, bool all, const std::string& chain,
                             std::vector<Onward>* onward) {
  for (auto& [update, parked] : chunk->log.TakeNext(&chunk->policy, all)) {
    Chunk::ParkedGradient& carried = parked.payload;
    std::vector<float> scratch;
    ApplyGradient(update, FloatsOf(carried.gradient, &scratch), chunk);
    if (onward == nullptr || chain.empty()) continue;
    // Its replies here, and the acknowledgement of its forward, wait for the next copies.
    chunk->log.Sent(update);
    // Named again to the copies its worker named (they mapped its region); to others (a
    // joined server) with a copy of the bytes, which the worker writes again once answered.
    const bool named = carried.in_region && carried.chain == chain;
    TensorData gradient = std::move(carried.gradient);
    if (carried.in_region && !named) {
      gradient = TensorData::Floats(gradient.name, gradient.key, gradient.Read<float>());
    }
    onward->push_back(
        Onward{chunk, chain, update, parked.rank, parked.step, std::move(gradient), named});
  }
}

std::string DenseShard::OwnerMessage(uint64_t key) const {
  const int self = placement_.server_rank;
  for (int s = 0; s < placement_.num_servers; ++s) {
    auto [begin, end] = ServerKeyRange(placement_.key_space, placement_.num_servers, s);
    if (key >= begin && key < end && s != self) {
      return "key " + std::to_string(key) + " belongs to server " + std::to_string(s) +
             ", not server " + std::to_string(self);
    }
  }
  return "key " + std::to_string(key) + " is not a chunk of this job on server " +
         std::to_string(self) + " (" + std::to_string(chunks_.size()) + " chunks here)";
}

// ps-sync: every worker's gradient of `step` is here: summed in rank order and averaged. One
// worker's gradient is the average as it came (the sum and the scaling by 1 would not change
// a bit): its frame.
TensorData DenseShard::AverageHeld(int64_t step, Chunk* chunk) {
  auto held = chunk->held.find(step);
  std::vector<TensorData> slots = Pushed(std::move(held->second.by_rank), chunk->where.size);
  chunk->held.erase(held);
  const std::string name = "chunk" + std::to_string(chunk->where.index);
  if (slots.size() == 1) {
    TensorData average = std::move(slots[0]);
    average.name = name;
    return average;
  }
  std::vector<std::vector<float>> scratch;
  const std::vector<const float*> by_rank = FloatsByRank(slots, &scratch);
  const size_t n = chunk->where.size;
  // Not zeroed first: every float is written.
  std::shared_ptr<float[]> sum(new float[n]);
  AverageInRankOrder(by_rank.data(), by_rank.size(), n, sum.get());
  return TensorData::Floats(name, chunk->where.key, sum.get(), n, sum);
}

void DenseShard::ApplyHeld(int64_t step, Chunk* chunk) {
  auto held = chunk->held.find(step);
  std::vector<TensorData> slots = Pushed(std::move(held->second.by_rank), chunk->where.size);
  chunk->held.erase(held);
  ApplyAverage(step, slots, chunk);
}

void DenseShard::ApplyAverage(int64_t update, const std::vector<TensorData>& by_rank,
                              Chunk* chunk) {
  std::vector<std::vector<float>> scratch;
  const std::vector<const float*> gradients = FloatsByRank(by_rank, &scratch);
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, update - 1);
  DenseUpdateOfAverage(config_.optimizer, lr, update, Writable(chunk), gradients.data(),
                       gradients.size(), chunk->where.size, chunk->state.data());
  metrics_->DenseUpdate();
}

void DenseShard::ForgetOldStops(Chunk* chunk) {
  const int64_t oldest = chunk->policy.version() - kStopMemorySteps;
  chunk->notes.erase(chunk->notes.begin(), chunk->notes.lower_bound(oldest));
}

void DenseShard::ApplyGradient(int64_t update, const float* grad, Chunk* chunk) {
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, update - 1);
  DenseUpdate(config_.optimizer, lr, update, Writable(chunk), grad, chunk->where.size,
              chunk->state.data());
  metrics_->DenseUpdate();
}

float* DenseShard::Writable(Chunk* chunk) {
  // The acquire pairs with a lease's release: a reply's transport is done reading before
  // these values are written.
  if (chunk->values->readers.load(std::memory_order_acquire) != 0) {
    chunk->values = std::make_shared<Values>(chunk->values->floats);
    metrics_->DenseValuesCopied();
  }
  return chunk->values->floats.data();
}

// Fills the part of every waiter the policy releases now; replies whose last part that was go
// to `ready`, to be sent once the lock is released.
void DenseShard::ReleaseReady(Chunk* chunk, Ready* ready) {
  if (config_.consistency == PsConsistency::kSsp) metrics_->SetStaleness(chunk->policy.Spread());
  std::vector<Waiter> keep;
  for (Waiter& waiter : chunk->waiters) {
    // A reply with the values of a step the backup has not acknowledged waits for it.
    const bool unforwarded = !chunk->log.AcknowledgedThrough(waiter.rule.min_version);
    if (unforwarded || !chunk->policy.MayRelease(waiter.rule)) {
      keep.push_back(std::move(waiter));
      continue;
    }
    if (waiter.rule.min_clock >= 0) metrics_->RecordReleasedLead(chunk->policy.Lead(waiter.rule));
    // ps-sync releases a push of step t when the version becomes t (the next step needs this
    // worker's push again): the step just dropped, if it was.
    if (waiter.reply->push && chunk->dropped_step > 0 &&
        waiter.rule.min_version == chunk->dropped_step) {
      waiter.reply->skipped_by.store(chunk->dropped_by, std::memory_order_relaxed);
    }
    // ps-sync: whether the workers stop after the step whose values this reply carries, and
    // which server joins then.
    if (!chunk->notes.empty()) {
      auto notes = chunk->notes.find(waiter.rule.min_version);
      if (notes != chunk->notes.end()) {
        if (notes->second.stopped_by >= 0) {
          StoreLowestRank(&waiter.reply->stopped_by, notes->second.stopped_by);
        }
        if (notes->second.joining >= 0) {
          StoreLowestRank(&waiter.reply->joining, notes->second.joining);
        }
      }
    }
    // A lease on the current values: the reply sends them as they are, without a copy.
    std::shared_ptr<Values> values = chunk->values;
    values->readers.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<const void> lease(values->floats.data(), [values](const void*) {
      values->readers.fetch_sub(1, std::memory_order_release);
    });
    waiter.reply->parts[waiter.part] =
        TensorData::Floats(waiter.reply->names[waiter.part], waiter.reply->keys[waiter.part],
                           values->floats.data(), values->floats.size(), std::move(lease));
    if (--waiter.reply->remaining == 0) ready->replies.push_back(waiter.reply);
  }
  metrics_->AddWaiting(-static_cast<int64_t>(chunk->waiters.size() - keep.size()));
  chunk->waiters.swap(keep);
  // A chain's forwards whose update here is applied and at every copy after this one.
  chunk->log.TakeDue(chunk->policy.version(), &ready->acks);
}

void DenseShard::Send(const Ready& ready) {
  for (const ReplicationLogBase::Ack& ack : ready.acks) ack();
  for (const std::shared_ptr<PendingReply>& pending : ready.replies) {
    PsPushPullReply reply;
    reply.tensors = std::move(pending->parts);
    reply.skipped_by = pending->skipped_by.load(std::memory_order_relaxed);
    reply.stopped_by = pending->stopped_by.load(std::memory_order_relaxed);
    reply.joining = pending->joining.load(std::memory_order_relaxed);
    reply.copied_to = pending->copied_to;
    pending->send(std::move(reply));
  }
}

std::string DenseShard::FirstBehind(int64_t step) const {
  for (const auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    if (chunk->policy.version() < step) return "chunk " + std::to_string(chunk->where.index);
  }
  return "";
}

std::string DenseShard::FirstAhead(int64_t step) const {
  for (const auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    if (chunk->policy.version() > step) {
      return "chunk " + std::to_string(chunk->where.index) + " (at step " +
             std::to_string(chunk->policy.version()) + ")";
    }
  }
  return "";
}

std::map<uint64_t, ChunkState> DenseShard::Snapshot() const {
  std::map<uint64_t, ChunkState> saved;
  for (const auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    saved[chunk->where.index] = {chunk->values->floats, chunk->state};
  }
  return saved;
}

int64_t DenseShard::AppliedUpdates() const {
  int64_t updates = 0;
  for (const auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    updates += chunk->policy.version();
  }
  return updates;
}

std::vector<std::string> DenseShard::DescribeLongWaits(std::chrono::milliseconds limit) {
  const SteadyClock::time_point now = SteadyClock::now();
  std::vector<std::string> described;
  for (auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    const Waiter* oldest = nullptr;
    int others = 0;
    for (Waiter& waiter : chunk->waiters) {
      if (waiter.described || now - waiter.since < limit) continue;
      waiter.described = true;
      if (oldest != nullptr) ++others;
      if (oldest == nullptr || waiter.since < oldest->since) oldest = &waiter;
    }
    if (oldest == nullptr) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest->since);
    const PendingReply& reply = *oldest->reply;
    std::string line = "chunk " + std::to_string(chunk->where.index) + ": worker " +
                       std::to_string(reply.rank) + "'s " + (reply.push ? "push" : "pull") +
                       " of step " + std::to_string(reply.step) + " has waited " +
                       std::to_string(waited.count() / 1000) + "." +
                       std::to_string(waited.count() % 1000 / 100) + " s";
    if (others > 0) {
      line += " (and " + std::to_string(others) + " more " + (others == 1 ? "reply" : "replies") +
              " here)";
    }
    described.push_back(line + ": " + DescribeWait(*chunk, *oldest));
  }
  return described;
}

std::string DenseShard::DescribeWait(const Chunk& chunk, const Waiter& waiter) const {
  const ConsistencyPolicy& policy = chunk.policy;
  const ReleaseRule& rule = waiter.rule;
  const bool sync = config_.consistency == PsConsistency::kSync;
  if (!chunk.log.AcknowledgedThrough(rule.min_version)) {
    return "it carries " + std::string(sync ? "step " : "update ") +
           std::to_string(chunk.log.first_unacknowledged()) +
           ", which the range's backup has not acknowledged (" +
           std::to_string(chunk.log.unacknowledged()) + " forwarded and unacknowledged here)";
  }
  if (rule.min_version >= 0 && policy.version() < rule.min_version) {
    if (sync) {
      std::string why = "it waits for step " + std::to_string(rule.min_version) +
                        " to be applied; the chunk is at step " +
                        std::to_string(policy.version());
      const std::vector<int> missing = policy.NotPushed(policy.version() + 1);
      if (!missing.empty()) {
        why += std::string(missing.size() == 1 ? ", and worker " : ", and workers ") +
               AndList(missing) + (missing.size() == 1 ? " has" : " have") +
               " not pushed step " + std::to_string(policy.version() + 1) + " here";
      }
      return why;
    }
    return "it waits for update " + std::to_string(rule.min_version) +
           "; the chunk has applied " + std::to_string(policy.version());
  }
  if (rule.min_clock >= 0) {
    const std::vector<int64_t>& clocks = policy.clocks();
    std::string behind;  // "worker 1 at step 2, worker 2 at step 1"
    for (size_t rank = 0; rank < clocks.size(); ++rank) {
      if (clocks[rank] >= rule.min_clock) continue;
      behind += std::string(behind.empty() ? "" : ", ") + "worker " + std::to_string(rank) +
                " at step " + std::to_string(clocks[rank]);
    }
    if (!behind.empty()) {
      return "ps-ssp holds it until every worker reached step " +
             std::to_string(rule.min_clock) + " (--staleness " +
             std::to_string(policy.staleness()) + "); behind it here: " + behind;
    }
  }
  return "nothing holds it any more, yet it was not sent (a bug: please report it)";
}

std::map<uint64_t, ChunkState> DenseShard::CopyTo(const std::string& backup) {
  std::map<uint64_t, ChunkState> saved;
  for (auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    saved[chunk->where.index] = {chunk->values->floats, chunk->state, chunk->policy.version(),
                                 chunk->policy.clocks()};
    chunk->log.CopiedTo(backup);
  }
  return saved;
}

void DenseShard::Restore(std::map<uint64_t, ChunkState> saved, int64_t step) {
  for (auto& [key, chunk] : chunks_) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(chunk->mu);
      ChunkState& mine = saved.at(chunk->where.index);
      chunk->values = std::make_shared<Values>(std::move(mine.values));
      chunk->state = std::move(mine.state);
      if (mine.clocks.empty()) {
        chunk->policy.Restore(step);
      } else {
        chunk->policy.Restore(mine.version, std::move(mine.clocks));
      }
      chunk->held.clear();
      chunk->dropped_step = 0;
      chunk->dropped_by = -1;
      chunk->notes.clear();
      // A chain's forwards taken before: the restored state replaces them.
      chunk->log.Clear(&ready.acks);
      ReleaseReady(chunk.get(), &ready);
    }
    Send(ready);
  }
}

void DenseShard::RemoveWorker(int rank) {
  for (auto& [key, chunk] : chunks_) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(chunk->mu);
      for (const PushDecision& decision : chunk->policy.Leave(rank)) {
        if (decision.action == PushAction::kApplyHeld) {
          ApplyHeld(decision.update, chunk.get());
        } else {  // kDropHeld: a worker that stayed skipped the step
          chunk->held.erase(decision.update);
          chunk->dropped_step = decision.update;
          chunk->dropped_by = decision.skipped_by;
          metrics_->DenseUpdateSkipped();
        }
        ForgetOldStops(chunk.get());
      }
      ReleaseReady(chunk.get(), &ready);
    }
    Send(ready);
  }
}

Status DenseShard::AddWorker(int rank, int64_t first_step) {
  for (auto& [key, chunk] : chunks_) {
    std::lock_guard<std::mutex> lock(chunk->mu);
    Status joined = chunk->policy.Join(rank, first_step);
    if (!joined.ok()) {
      return Status(joined.code(),
                    "chunk " + std::to_string(chunk->where.index) + ": " + joined.message());
    }
  }
  return OkStatus();
}

}  // namespace tessera::server
