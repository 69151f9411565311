// DenseShard: this server's dense chunks of one ps-* job (common/training/ps_job.h
// placement): each chunk's values, optimizer state and ConsistencyPolicy under the chunk's own
// lock, ps-sync's held gradients, and the push-pull replies waiting for the policy.
//
//   ASSIGN_OR_RETURN(auto shard, DenseShard::Create(config, placement, init.tensors, metrics));
//   RETURN_IF_ERROR(shard->PushPull(rank, step, request.tensors, request.has_gradients,
//                                   [](PsPushPullReply reply) { ...send it... }));
//
// Requests for different chunks proceed in parallel, and a request for several chunks takes
// their locks one after the other (its reply goes once the last chunk released its part). Only
// a forwarded step (ApplyForwarded) holds several chunks' locks at once, taken in key order.
//
// Forwarded updates (two copies of each key range): the range's primary is given the address
// of its backup with the workers' pushes (`forward_to`); each update it applies goes to the
// backup through the Forwarder, and the replies with its values wait until the backup has it
// (ApplyForwarded: it acknowledges an update it took, then applies it: held in its memory, the
// update is on both live copies). The backup applies the same gradients in the same order with
// the same optimizer code: bitwise the primary's values and state. In ps-sync an update is a
// step (or its drop): the averaged gradients and the step's notes. In ps-async and ps-ssp it is
// one worker's push with each chunk's update number on the primary; the backup applies a
// chunk's forwards in that order, parking one that overtook the one before it (two requests'
// forwards may leave in either order).
//
// Chains (ps-async and ps-ssp with 3 or more copies): the push names every live backup in
// order, "b1,b2"; the primary forwards to b1 naming "b2", and b1 forwards each update to b2
// as it applies it, numbered as applied there, and acknowledges the primary's forward only
// once b2 has it. So each copy holds a prefix of the one before it: when the primary fails, b1
// (the next primary) holds every update b2 holds, applies the forwards it parked (their gaps
// will not fill) and passes them on; when b1 fails, the primary's forwards go on to b2
// (StepForwarder), which skips the ones b1 passed on.
//
// In the workers' regions (worker_regions.h: a worker on this host sends in its region only
// while every live copy of the range mapped it): a forward to the copies the worker named
// names the chunks instead of carrying them (ForwardedStep::in_region), a middle copy passes
// the names on, and each copy acknowledges only once it applied them. Bytes still travel to a
// copy the worker did not name (a joined server it has not taken in yet): copies of them, as a
// resend may leave after the worker wrote its region again.
//
// Thread-safety: thread-safe. A reply callback runs on the thread of the request that released
// its last part (the request's own, or a later one's), after the chunk's lock is released.
#ifndef TESSERA_SERVER_PS_DENSE_SHARD_H_
#define TESSERA_SERVER_PS_DENSE_SHARD_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/messages/ps_messages.h"
#include "common/training/ps_job.h"
#include "server/ps/consistency_policy.h"
#include "server/ps/ps_metrics.h"

namespace tessera::server {

// Where this server sits among the job's servers.
struct ServerPlacement {
  int server_rank = 0;
  int num_servers = 1;
  uint64_t key_space = 0;
};

// A chunk's values and optimizer state, as a checkpoint holds them; a copy for a joined
// server (ps-async, ps-ssp: DenseShard::CopyTo) also holds its version and the workers' clocks.
struct ChunkState {
  std::vector<float> values;
  std::vector<float> state;
  int64_t version = 0;
  std::vector<int64_t> clocks = {};  // by rank; empty: restart at the restore's step
};

class DenseShard {
 public:
  using ReplyCallback = std::function<void(PsPushPullReply reply)>;

  // Updates the primary applied, for the range's backup: in ps-sync a step (or its drop), in
  // ps-async and ps-ssp one worker's push.
  struct ForwardedStep {
    int64_t step = 0;
    // ps-sync: the chunks' averaged gradients (name "chunk<i>", key); no bytes when the step
    // was dropped. ps-async, ps-ssp: the push's gradients.
    std::vector<TensorData> gradients;
    int dropped_by = -1;  // ps-sync: the worker that skipped the step (nothing applied); -1: none
    int stopped_by = -1;  // ps-sync: the step's notes (see PushPull's stop and join)
    int joining = -1;
    int pushed_by = -1;            // ps-async, ps-ssp: the worker whose push of `step` it is
    std::vector<int64_t> updates;  // ps-async, ps-ssp: each gradient's update number here
    // As received, ps-async, ps-ssp, a chain: the copies after this one (see above; the sender
    // gives the Forwarder the whole chain instead).
    std::string forward_to;
    // The gradients without bytes are in shared regions (worker_regions.h) the next copy
    // mapped too: ps-async and ps-ssp, all of them, in worker pushed_by's; ps-sync, the chunks
    // whose step every worker pushed in its region. The forward names those chunks, and that
    // copy takes their gradients there (ps-sync: `by_worker`, averaged as the primary did) and
    // acknowledges only once it applied them: a worker writes its region again once its reply
    // came, and the reply waits for this.
    bool in_region = false;
    // ps-sync with in_region, the receiving copy's: for each of `gradients`, every worker's
    // gradient of the chunk by rank (views of their regions) when it carries no bytes, else
    // none (a step some worker pushed in frames travels as its average).
    std::vector<std::vector<TensorData>> by_worker;
  };
  // Sends `forwarded` along `chain` (the backup, or in a chain every copy after this one, in
  // order: StepForwarder), and calls `done` once, later and from another thread, when they have
  // it or are gone (the range then lives on this server alone).
  using Forwarder = std::function<void(const std::string& chain, ForwardedStep forwarded,
                                       std::function<void()> done)>;

  // The chunks the job's plan gives this server, starting from `initial` (one float32 tensor
  // per chunk, by key: PsInitRequest.tensors). InvalidArgument naming a chunk that is missing
  // or of the wrong size, or when tensors for other chunks came too; InvalidArgument from the
  // plan. `metrics` must outlive the shard. `forwarder` (null: none) sends the steps of pushes
  // naming a backup (ps-sync; see above).
  static StatusOr<std::unique_ptr<DenseShard>> Create(const PsJobConfig& config,
                                                      const ServerPlacement& placement,
                                                      const std::vector<TensorData>& initial,
                                                      PsMetrics* metrics,
                                                      Forwarder forwarder = nullptr);
  // Replies still waiting are dropped (their workers time out, or were told the job ended).
  ~DenseShard();

  // Worker `rank`'s request of step `step` for the chunks `tensors` names (by key), with their
  // gradients when `push`. `reply` is called once with the chunks' values, in the request's
  // order, when the policy released each chunk (possibly before this returns). Errors, before
  // anything changed: InvalidArgument for a push of a step below 1 or a gradient that does not
  // fit its chunk ("chunk 1 has 4 floats; ..."); NotFound naming a key's owner ("key 3
  // belongs to server 0, not server 1"). A refusal by the policy (ps-sync's "worker 0 pushed
  // step 3 twice") comes after the chunks before it in the request took their gradient.
  // REQUIRES: 0 <= rank < the job's workers.
  //
  // `stop` (with `push`): worker `rank` was asked to stop, and says so with every push of the
  // step. ps-sync records the lowest such rank of each step, and every reply carrying the
  // values after step t (a push of t, a pull of t + 1) names it in
  // PsPushPullReply::stopped_by: every chunk, on every server, gives each worker the same
  // answer, so all stop after the same step. Ignored in ps-async and ps-ssp.
  // `join` (with `push`, -1: none): the lowest server rank worker `rank` knows joined the fleet
  // in a failed server's place; recorded and answered (PsPushPullReply::joining) as `stop` is,
  // so every worker starts using that server after the same step.
  // `forward_to` (with `push`; empty: none): the address of the range's backup (a chain: its
  // backups' addresses in order, comma-separated; see above); the updates
  // this push applies (ps-sync: the step it completes) go there before the replies with their
  // values (see above). In ps-async and ps-ssp, values of updates the backup has not
  // acknowledged may go in other replies (a pull's, another worker's): such an update is
  // either acknowledged later or asked again of the backup by its worker, so none is lost.
  // `in_region`: the gradients are views of worker `rank`'s shared region, which every copy
  // `forward_to` names mapped too (the worker sends in its region only then): in ps-async and
  // ps-ssp a forward to the backup alone names them instead of carrying them
  // (ForwardedStep::in_region). A forward to a joined server or along a chain carries them.
  Status PushPull(int rank, int64_t step, const std::vector<TensorData>& tensors, bool push,
                  ReplyCallback reply, bool stop = false, int join = -1,
                  const std::string& forward_to = std::string(), bool in_region = false);
  // Worker `rank` skips step `step` (its gradients held a NaN or Inf, --on-nonfinite skip):
  // as a push of the chunks `tensors` names (their bytes are not read) that gives no
  // gradient. ps-sync drops the step on these chunks for every worker, and each reply to a
  // push of it says who skipped it (PsPushPullReply::skipped_by); ps-async and ps-ssp apply
  // nothing of this worker's. Errors as PushPull's.
  Status Skip(int rank, int64_t step, const std::vector<TensorData>& tensors,
              ReplyCallback reply, bool stop = false, int join = -1,
              const std::string& forward_to = std::string());
  // The backup's side: takes `forwarded` (the primary's update), calls `taken` (its
  // acknowledgement), then applies it as the primary did. A chain's middle copy (`forwarded`
  // names copies after it) calls `taken` later, from another thread, once they have it too,
  // and so does a copy given a forward in a worker's region (ForwardedStep::in_region), once
  // it applied it.
  // ps-sync: to each chunk it names whose version is the step before it; a chunk at the step
  // or later took it already (a copy) and is left alone. Pushes of the step held here (workers
  // that asked this copy after the primary failed) are answered with its values. The chunks'
  // next forwarded step (sent only once this one was acknowledged) waits until this one is
  // applied. ps-async and ps-ssp: each chunk's update once the chunk's version is the one
  // before it (parked until then); a chunk past it, or a worker's push it has, is left alone.
  // A worker's request here applies every parked update first (the primary is gone).
  // Errors, before anything changed and without `taken`: NotFound for a chunk not here,
  // InvalidArgument for a gradient that does not fit its chunk (or a push without a worker or
  // update numbers), FailedPrecondition naming a chunk more than a step behind (ps-sync).
  Status ApplyForwarded(const ForwardedStep& forwarded, std::function<void()> taken);

  // "chunk 3" for the first chunk whose version is below `step`; empty when none is.
  std::string FirstBehind(int64_t step) const;
  // "chunk 3 (at step 8)" for the first chunk whose version is above `step`; empty when none is.
  std::string FirstAhead(int64_t step) const;

  // The chunks (index, size, key) in key order; fixed at creation.
  const std::vector<DenseChunk>& chunks() const { return layout_; }
  // Floats of optimizer state per chunk element.
  size_t state_per_element() const { return state_per_element_; }

  // Every chunk's values and state by chunk index, each copied under its chunk's lock.
  std::map<uint64_t, ChunkState> Snapshot() const;
  // The sum of the chunks' versions: outside ps-sync, the updates they applied.
  int64_t AppliedUpdates() const;
  // The replies held longer than `limit`, each described once, a line per chunk: whose
  // request, for how long, and what holds it: the step or update it waits for and who has not
  // pushed it, ps-ssp's staleness bound and the workers behind it, or the backup's
  // acknowledgement. E.g. "chunk 3: worker 2's push of step 57 has waited 10.0 s: ps-ssp
  // holds it until every worker reached step 53 (--staleness 4); behind it here: worker 0 at
  // step 40". A worker sees only its deadline; this is what the server's log says of it.
  std::vector<std::string> DescribeLongWaits(std::chrono::milliseconds limit);
  // ps-async, ps-ssp: Snapshot for the server at `backup`, which joined in a failed one's
  // place, with each chunk's version and clocks; under the same lock the chunk starts
  // forwarding every later update there, last in the chain whatever backups a push names
  // (none, the others, or a stale one: the range's failed former backup), so each chunk's copy
  // and the updates after it are one cut. Replies to pushes whose updates went there name it
  // (PsPushPullReply::copied_to): it acknowledged, so it has the copy. REQUIRES: a forwarder
  // (Create).
  std::map<uint64_t, ChunkState> CopyTo(const std::string& backup);
  // Replaces every chunk's values and state (by chunk index), then restarts every chunk's
  // policy at `step` (ConsistencyPolicy::Restore), or at its own version and clocks when the
  // state has them (a copy, CopyTo), and drops held gradients; waiting replies the restored
  // version allows go. REQUIRES: `saved` has every chunk, with chunk.size values and
  // state_per_element() * chunk.size state floats (and as many clocks as workers, if any).
  void Restore(std::map<uint64_t, ChunkState> saved, int64_t step);

  // Elastic jobs (issue 47): worker `rank` left the job (ConsistencyPolicy::Leave on every
  // chunk). A ps-sync step it alone held up is applied at once, its gradient the average of
  // the pushes that came, and the replies waiting for it go. Not forwarded: an elastic job has
  // one copy of each key range (forwarding such a step is later work).
  void RemoveWorker(int rank);
  // Worker `rank` counts from step `first_step` on, on every chunk (ConsistencyPolicy::Join);
  // the first chunk's refusal, naming the chunk, if any (the chunks before it took the join).
  Status AddWorker(int rank, int64_t first_step);

 private:
  struct Values;
  struct PendingReply;
  struct Waiter;
  struct Chunk;
  struct ChainAck;
  struct Ready;
  struct Onward;

  enum class Gradients { kNone, kGiven, kSkipped };

  DenseShard(const PsJobConfig& config, const ServerPlacement& placement, PsMetrics* metrics,
             Forwarder forwarder);
  Status Serve(int rank, int64_t step, const std::vector<TensorData>& tensors,
               Gradients gradients, ReplyCallback reply, bool stop, int join,
               const std::string& forward_to, bool in_region);
  // The chunk `key` names and whether `tensor` fits it as a gradient (`given`), or the error.
  StatusOr<Chunk*> ChunkFor(const TensorData& tensor, bool given, const char* what) const;
  std::string OwnerMessage(uint64_t key) const;
  // ps-sync: the held gradients of `step`, summed in rank order and averaged, and no longer
  // held. REQUIRES: chunk->mu held.
  TensorData AverageHeld(int64_t step, Chunk* chunk);
  // ps-sync: applies the average of the held gradients of `step` (as AverageHeld's, without
  // making it: ApplyAverage), no longer held. REQUIRES: chunk->mu held.
  void ApplyHeld(int64_t step, Chunk* chunk);
  // Applies the average of `by_rank` (every worker's gradient of `chunk`, AverageInRankOrder)
  // as the optimizer's update `update`, slice by slice. REQUIRES: chunk->mu held.
  void ApplyAverage(int64_t update, const std::vector<TensorData>& by_rank, Chunk* chunk);
  // The backup acknowledged (or lost) `updates` (chunk, update): their replies go.
  void Forwarded(const std::vector<std::pair<Chunk*, int64_t>>& updates);
  // ApplyForwarded of ps-async and ps-ssp.
  Status ApplyForwardedPush(const ForwardedStep& forwarded, std::function<void()> taken);
  // Applies the chunk's parked forwards that are next in update order (`all`: every one, in
  // update order); with `onward` and a `chain`, each applied one is added there for the
  // copies after this one. REQUIRES: chunk->mu held.
  void ApplyParked(Chunk* chunk, bool all, const std::string& chain = std::string(),
                   std::vector<Onward>* onward = nullptr);
  // Replaces the `gradients` with bytes that are views of `tensors` (a request's, in its
  // worker's region) by copies.
  static void OwnTheRegionsBytes(const std::vector<TensorData>& tensors,
                                 std::vector<TensorData>* gradients);
  // Forwards `onward` (ApplyParked) along their chains. REQUIRES: no chunk's lock held.
  void SendOnward(std::vector<Onward> onward);
  // ps-sync: forgets the stop requests (and joins) of steps long applied. REQUIRES: chunk->mu held.
  static void ForgetOldStops(Chunk* chunk);
  // Applies `grad` as the optimizer's update `update`. REQUIRES: chunk->mu held.
  void ApplyGradient(int64_t update, const float* grad, Chunk* chunk);
  // The chunk's values, ready to be updated in place: a fresh copy when a reply still holds
  // the current ones.
  float* Writable(Chunk* chunk);
  void ReleaseReady(Chunk* chunk, Ready* ready);
  // What holds `waiter` (DescribeLongWaits). REQUIRES: chunk.mu held.
  std::string DescribeWait(const Chunk& chunk, const Waiter& waiter) const;
  static void Send(const Ready& ready);

  const PsJobConfig config_;
  const ServerPlacement placement_;
  PsMetrics* const metrics_;
  const Forwarder forwarder_;
  size_t state_per_element_ = 0;
  std::vector<DenseChunk> layout_;                  // fixed after Create
  std::map<uint64_t, std::unique_ptr<Chunk>> chunks_;  // by key; the map is fixed after Create
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_DENSE_SHARD_H_
