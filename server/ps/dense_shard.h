// DenseShard: this server's dense chunks of one ps-* job (common/training/ps_job.h
// placement): each chunk's values, optimizer state and ConsistencyPolicy under the chunk's own
// lock, ps-sync's held gradients, and the push-pull replies waiting for the policy.
//
//   ASSIGN_OR_RETURN(auto shard, DenseShard::Create(config, placement, init.tensors, metrics));
//   RETURN_IF_ERROR(shard->PushPull(rank, step, request.tensors, request.has_gradients,
//                                   [](PsPushPullReply reply) { ...send it... }));
//
// No lock spans two chunks: requests for different chunks proceed in parallel, and a request
// for several chunks takes their locks one after the other (its reply goes once the last chunk
// released its part).
//
// Thread-safety: thread-safe. A reply callback runs on the thread of the request that released
// its last part (the request's own, or a later one's), after the chunk's lock is released.
#ifndef TESSERA_SERVER_PS_DENSE_SHARD_H_
#define TESSERA_SERVER_PS_DENSE_SHARD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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

// A chunk's values and optimizer state, as a checkpoint holds them.
struct ChunkState {
  std::vector<float> values;
  std::vector<float> state;
};

class DenseShard {
 public:
  using ReplyCallback = std::function<void(PsPushPullReply reply)>;

  // The chunks the job's plan gives this server, starting from `initial` (one float32 tensor
  // per chunk, by key: PsInitRequest.tensors). InvalidArgument naming a chunk that is missing
  // or of the wrong size, or when tensors for other chunks came too; InvalidArgument from the
  // plan. `metrics` must outlive the shard.
  static StatusOr<std::unique_ptr<DenseShard>> Create(const PsJobConfig& config,
                                                      const ServerPlacement& placement,
                                                      const std::vector<TensorData>& initial,
                                                      PsMetrics* metrics);
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
  Status PushPull(int rank, int64_t step, const std::vector<TensorData>& tensors, bool push,
                  ReplyCallback reply, bool stop = false, int join = -1);
  // Worker `rank` skips step `step` (its gradients held a NaN or Inf, --on-nonfinite skip):
  // as a push of the chunks `tensors` names (their bytes are not read) that gives no
  // gradient. ps-sync drops the step on these chunks for every worker, and each reply to a
  // push of it says who skipped it (PsPushPullReply::skipped_by); ps-async and ps-ssp apply
  // nothing of this worker's. Errors as PushPull's.
  Status Skip(int rank, int64_t step, const std::vector<TensorData>& tensors,
              ReplyCallback reply, bool stop = false, int join = -1);

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
  // Replaces every chunk's values and state (by chunk index), then restarts every chunk's
  // policy at `step` (ConsistencyPolicy::Restore) and drops held gradients; waiting replies
  // the restored version allows go. REQUIRES: `saved` has every chunk, with chunk.size values
  // and state_per_element() * chunk.size state floats.
  void Restore(std::map<uint64_t, ChunkState> saved, int64_t step);

 private:
  struct Values;
  struct PendingReply;
  struct Waiter;
  struct Chunk;
  using Ready = std::vector<std::shared_ptr<PendingReply>>;

  enum class Gradients { kNone, kGiven, kSkipped };

  DenseShard(const PsJobConfig& config, const ServerPlacement& placement, PsMetrics* metrics);
  Status Serve(int rank, int64_t step, const std::vector<TensorData>& tensors,
               Gradients gradients, ReplyCallback reply, bool stop, int join);
  std::string OwnerMessage(uint64_t key) const;
  // REQUIRES: chunk->mu held.
  void ApplyHeld(int64_t step, Chunk* chunk);
  // ps-sync: forgets the stop requests (and joins) of steps long applied. REQUIRES: chunk->mu held.
  static void ForgetOldStops(Chunk* chunk);
  void ApplyOne(int64_t update, const float* grad, Chunk* chunk);
  // The chunk's values, ready to be updated in place: a fresh copy when a reply still holds
  // the current ones.
  float* Writable(Chunk* chunk);
  void ReleaseReady(Chunk* chunk, Ready* ready);
  static void Send(const Ready& ready);

  const PsJobConfig config_;
  const ServerPlacement placement_;
  PsMetrics* const metrics_;
  size_t state_per_element_ = 0;
  std::vector<DenseChunk> layout_;                  // fixed after Create
  std::map<uint64_t, std::unique_ptr<Chunk>> chunks_;  // by key; the map is fixed after Create
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_DENSE_SHARD_H_
