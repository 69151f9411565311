// PsEngine: the worker side of the parameter-server modes (ps-sync, ps-async, ps-ssp).
//
// Initialize: rank 0 sends each server the job (PsJobConfig) and the initial values of the
// dense chunks it owns (common/training/ps_job.h); then every rank pulls the initial
// parameters, so all start from rank 0's values. Each worker's first pull carries its model's
// description, which the servers check against rank 0's: a worker that built another model
// fails naming the first differing parameter or table on both sides. Step: the dense gradients
// go out chunk by chunk, straight from the trainer's gradient buffer when it has an owner
// (SetGradientOwner; else each chunk is copied once), several requests in flight per server;
// each reply carries the chunks' values after the step (the server decides when, by the
// consistency model: see server/ps/ps_service.h), copied once into the parameters as it
// arrives. With a server on the same host, the chunks it owns travel through a region both
// map (OfferRegions): the request names them, gradients and values are in the region.
// Embedding rows: LookupRows pulls only the rows a batch touches from their owners;
// Step pushes only those rows' gradients.
//
// A server or peer worker that fails makes the pending calls fail with the coordinator's
// failure notice (RendezvousClient fails the endpoint), naming the lost process; otherwise a
// call fails after --request-timeout-ms naming the server and the request.
//
// Replicated ranges (FleetView::replicas R > 1, the coordinator's --replicas): key range r (the
// chunks and embedding rows server r holds with R = 1) lives on servers r, r + 1, ...,
// r + R - 1 (mod S), its primary the first live one. With R = 2 a dense push (and in ps-async
// and ps-ssp a row push) goes to the primary alone, naming the live backup (forward_to): the
// primary forwards each update it applies there (ps-sync: each step) and answers once the
// backup has it (server/ps/ps_service.h, "Forwarded updates"). ps-async and ps-ssp with R > 2
// name every live backup in order, a chain each copy passes the updates on along
// (server/ps/dense_shard.h). Otherwise (ps-sync with R > 2, and ps-sync's row pushes) every
// request for a range goes to each live replica: gradients and row pushes to all (in ps-sync every
// replica applies the same sums in the same order, so all hold bitwise the same values and
// optimizer state), the values from the primary (the others answer with an ack). Row pulls and
// checkpoint writes go to the primary only. A step completes when every live replica has it,
// so an acknowledged update is on every live replica. When a server fails (ServerLost, from
// the coordinator's notice) its pending calls fail, its ranges' next replicas become their
// primaries, and what only it was to answer is asked again of them: a forwarded push as it is
// (the new primary took it already, and answers it with its values, or applies it: in ps-sync
// once every worker asked again), else the values of a push as a pull, a row pull, a
// checkpoint write; nothing is applied twice.
// Shared memory with copies on this host: the worker offers each live copy of a range the
// range's region, with a values half of its own (OfferRegions), and sends in it while every
// live copy maps it; the primary's forwards then name the chunks, which the backup reads in the
// same region (server/ps/dense_shard.h). A copy's answer is read from its half. A server taken
// in later gets a fresh region of its ranges, offered to all their copies (RenewRegions).
//
// Re-replication (ps-sync): a server started with --join in a failed one's place reaches every
// worker as a newer fleet view (FleetChanged). Each worker's pushes of its next step name it
// (PsPushPullRequest::join, read once per step), and every reply of that step says the same
// (PsPushPullReply::joining), so all workers agree on the step after which it holds its ranges.
// At the end of that step rank 0 copies each of its ranges from the range's primary
// (CheckpointRequest::copy) to it (PsInitRequest::copy), and every worker sends it that
// range's requests from the next step on (the server parks those that arrive before the copy).
// Every range then has its R copies again.
// ps-async and ps-ssp have no common step: after its next step rank 0 asks each
// of the joined server's ranges' primary for a copy that forwards every later update to it
// (CheckpointRequest::forward_to: each chunk's and table's copy and the updates after it are
// one cut, server/ps/dense_shard.h CopyTo), and hands the copy over (PsInitRequest::copy).
// Every worker takes the server in for a range once a reply to its dense push there, or to its
// row pull, says its updates went to it (PsPushPullReply::copied_to,
// SparsePullReply::copied_to: it acknowledged, so it has the copy). It
// sorts last among the range's replicas: the primaries stay where they are (the workers cannot
// agree on a moment to move one), and it is the backup the pushes name (the chain's last).
//
// Thread-safety: the training thread only.
#ifndef TESSERA_WORKER_ENGINES_PS_ENGINE_H_
#define TESSERA_WORKER_ENGINES_PS_ENGINE_H_

#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/messages/fleet_view.h"
#include "common/messages/rendezvous_messages.h"
#include "common/metrics/metrics.h"
#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/shm/shared_region.h"
#include "worker/engines/training_engine.h"

namespace tessera::worker {

struct PsEngineOptions {
  PsConsistency consistency = PsConsistency::kSync;
  int64_t staleness = 0;
  uint64_t chunk_elements = 1 << 16;
  int chunks_per_request = 4;  // a server's chunks travel in requests of at most this many
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  int64_t request_timeout_ms = 30000;
  // A request unanswered this long is sent again (RpcEndpoint::CallAsync; a server applies a
  // request once, server/ps/request_ledger.h); 0: never.
  int64_t request_resend_ms = 2000;
  // Offer each server a shared region (common/transport/shm/shared_region.h) for its chunks:
  // a server on this host maps it, and then gradients and values pass through memory instead
  // of the sockets (the kernel's copies out and back on both sides); other servers refuse and
  // get frames.
  bool shared_memory = true;
  // True once the process was asked to stop. Each step's pushes say whether it was (read
  // once per step), and in ps-sync the servers answer every worker alike whether any was
  // (AgreeToStop). Requests in flight get kStopGraceMs more to be answered once a stop is
  // seen (so a healthy fleet finishes its step); after that the wait fails with Cancelled
  // naming what it waited for, e.g. when a peer's death holds a ps-sync step forever. Null:
  // never.
  std::function<bool()> stop_requested;
  // Whether a stop cuts waits short after kStopGraceMs (above). False with
  // --checkpoint-on-sigterm, whose steps up to the agreed one and whose checkpoint must not be
  // lost to a step slower than the grace: a hung peer is then left to the heartbeat and the
  // request timeout (as the ring modes do).
  bool stop_grace = true;
  // RestoreCheckpoint: the modes whose checkpoints (the servers' shards) this engine restores,
  // as the mode registry (worker/modes/mode_registry.h) lists them.
  std::vector<std::string> restores_checkpoints_of;
};

// See PsEngineOptions::stop_requested.
inline constexpr int64_t kStopGraceMs = 1000;

class PsEngine final : public TrainingEngine {
 public:
  // `view` is the fleet (servers with their addresses and key ranges); `rank` this worker's.
  static StatusOr<std::unique_ptr<PsEngine>> Create(const PsEngineOptions& options,
                                                    RpcEndpoint* endpoint, const FleetView& view,
                                                    int rank, MetricsRegistry* metrics);

  std::string_view name() const override { return PsModeName(options_.consistency); }
  Status Initialize(const ParameterLayout& layout, const std::vector<EmbeddingTableSpec>& tables,
                    float* params) override;
  Status LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) override;
  // Overlap: once every element of a dense chunk was reported ready during the backward pass
  // of `step`, its gradient goes to its server at once (a request of its own), so the servers
  // apply it while backward goes on; Step sends the rest and waits for every reply.
  void OnBackwardStart(int64_t step, float* grads) override;
  // With an owner, dense gradients are pushed straight from the caller's buffer (borrowed
  // frames); without one, each chunk is copied once into its request.
  void SetGradientOwner(std::shared_ptr<const void> owner) override {
    grads_owner_ = std::move(owner);
  }
  void OnGradientsReady(uint64_t offset, uint64_t size) override;
  Status Step(int64_t step, float* params, float* grads,
              const std::vector<SparseRows>& sparse) override;
  // ps-sync: whether the replies of `step` said that a worker was asked to stop in it (every
  // worker hears the same from every server, so all stop after the same step: no worker waits
  // in the next step for one that left, and rank 0's checkpoint holds every server's shard of
  // that step). `stop` (this worker's own answer now) counts from the next step: its pushes
  // of this one did not say so. ps-async and ps-ssp have no common step: `stop`.
  StatusOr<bool> AgreeToStop(int64_t step, bool stop) override;
  // Server `server` failed (`reason`, the coordinator's): OK when every key range still has a
  // live replica (the failover is logged and counted), else FailedPrecondition naming a range
  // that was lost with its replicas (with --replicas 1, the server's own). Thread-safe; quick.
  Status ServerLost(int server, const std::string& reason);
  // For RendezvousClient::SetPeerLossHandler: ServerLost for a server; an error for a worker.
  Status PeerLost(const FailureNotice& notice);
  // For RendezvousClient::SetFleetChangeHandler: a failed server alive again at a new address
  // (it joined in its place) is taken in at the next agreed step (see above). Thread-safe;
  // quick.
  void FleetChanged(const FleetView& view);
  // Rank 0 asks every server to write its shard (ps-sync: once the step is applied
  // everywhere, so the checkpoint is exactly the state after `step`; ps-async/ssp: a snapshot
  // of whatever each server holds) and commits the manifest; other ranks do nothing.
  Status SaveCheckpoint(const std::string& root, int64_t step, const float* params) override;
  // Rank 0 has every server load its shard (same server count, chunking and model, or a clear
  // error); then every rank pulls the restored parameters.
  Status RestoreCheckpoint(const std::string& root, int64_t step, float* params) override;

 private:
  struct Op;  // per-operation metrics
  // Who gets a range's request: its primary, or every live replica (kValues: the primary's
  // reply carries the values, the others' only name the chunks, PsPushPullRequest::ack_only).
  enum class Fanout { kPrimary, kAll, kValues };
  // A request to a key range: its copies (server, reply), the primary's first, and what to
  // ask the range's next primary when the first copy's server fails before answering (none:
  // any copy's answer will do).
  struct Reply {
    int range = 0;
    std::vector<std::pair<int, std::shared_future<StatusOr<Envelope>>>> copies;
    std::optional<MessageBody> ask_again;
    int64_t ask_again_step = 0;
  };

  PsEngine(const PsEngineOptions& options, RpcEndpoint* endpoint, const FleetView& view, int rank)
      : options_(options), endpoint_(endpoint), view_(view), rank_(rank) {}
  // Sends one request per group of a server's chunks; with grads, they carry the gradients.
  // With `model` (the initial pull), each request carries the worker's model description,
  // which the servers check against rank 0's. Chunks pushed early (OnGradientsReady) of the
  // same step are not sent again; their replies are waited for with the others.
  Status PushPull(int64_t step, const float* grads, float* params,
                  const std::string& model = std::string());
  // The installed gradient check on each chunk of `group` (indices) before it is sent: false
  // when one of them says skip.
  StatusOr<bool> CheckChunks(int64_t step, const std::vector<size_t>& group,
                             const float* grads) const;
  // The request for `group` (chunk indices of one server) of `step`: its reply, what it is.
  // `skip`: a push that skips the step (no gradients travel).
  std::pair<Reply, std::string> SendChunks(int64_t step, const std::vector<size_t>& group,
                                           const float* grads, const std::string& model,
                                           bool skip, double* sent);
  // Offers every live copy of each of `ranges` a fresh shared region of the range's chunks
  // (options_.shared_memory): the range's requests go in the region from then on while every
  // live copy of it maps it (RegionFor); `renewal`: for RenewRegions (which it logs as such).
  // REQUIRES: no request of those ranges is out.
  Status OfferRegions(int64_t step, const std::vector<int>& ranges, bool renewal = false);
  // Between steps: OfferRegions for the ranges whose region a live copy has not mapped (a
  // server taken in since), so that they pass through memory again.
  Status RenewRegions(int64_t step);
  // `range`'s region when every live copy of the range mapped it, else null (its requests
  // carry their bytes: a copy on another host, or a joined server, which was not offered it).
  const SharedRegion* RegionFor(int range) const;
  // Sends a CheckpointRequest to every server; their shards' files in server order.
  StatusOr<std::vector<ShardFileInfo>> CheckpointServers(const std::string& root, int64_t step,
                                                         bool restore);
  // Sends `request` for key range `range` by `fanout` (see Fanout; with --replicas 1 the one
  // server); with kPrimary a push names the backups after the primary it goes to
  // (NameBackups). `ask_again`: for Reply::ask_again, else the request itself with kPrimary.
  Reply Send(int range, MessageBody request, int64_t step, const std::string& what,
             Fanout fanout = Fanout::kPrimary,
             std::optional<std::pair<MessageBody, int64_t>> ask_again = std::nullopt);
  // One copy of a request to `server`; failed at once when the server at its address was
  // declared failed (ServerLost). Sent under the lock ServerLost marks a server failed under
  // before it fails the calls to it: either this sees the server failed, or ServerLost fails
  // this call. (A request whose server was picked just before its failure notice came, and
  // sent just after, would otherwise wait out its whole deadline, quietly; in ps-ssp every
  // other worker's replies wait for this one meanwhile, and time out.)
  std::shared_future<StatusOr<Envelope>> SendTo(int server, MessageBody request, int64_t step,
                                                const std::string& what);
  // A push that the range's primary forwards (forwarding_: a dense push, and outside ps-sync a
  // row push) names the backups in `live` (a range's live replicas, its primary first) after
  // the primary: the chain, comma-separated, or empty with one live copy. Other requests are
  // left alone.
  void NameBackups(const std::vector<int>& live, MessageBody* request) const;
  // The servers holding `range` that have not failed, its primary first.
  std::vector<int> LiveReplicas(int range) const;
  bool IsLost(int server) const;
  // "range 1 (keys [a, b) and the rows hashing to it) was lost with its replicas, servers 1
  // and 2".
  std::string RangeLostMessage(int range) const;
  // Waits for `reply` (as AwaitReply) and returns the answer that counts: the first copy's
  // (the values) when it asks again, else any copy's. Copies whose servers failed meanwhile
  // are passed over; a first copy lost so is asked again of the next live replica.
  StatusOr<Envelope> Await(Reply* reply, const std::string& what,
                           std::optional<Deadline>* stop_grace);
  // Whether this worker's pushes of `step` say it was asked to stop: options_.stop_requested,
  // read at the step's first push and kept for the rest of them; and (ps-sync, read with it)
  // the lowest server rank that joined and is not taken in yet (-1: none).
  bool StopAskedIn(int64_t step);
  int JoinAskedIn(int64_t step);
  // The replies of `step` named `server` as joining: its address (from FleetChanged, waited
  // for when this worker has not heard yet), rank 0's copy of its ranges to it, and from the
  // next step on it holds them.
  Status TakeInJoined(int64_t step, int server, const float* params);
  // Rank 0: asks the primary of `ask`'s range for a copy (CheckpointRequest::copy) and
  // initialises the range on joined server `server` at `address` from it (PsInitRequest::copy),
  // adding the copy's bytes to `*bytes`: "range 0 from server 2", or empty (logged) when the
  // server failed meanwhile (ServerLost).
  StatusOr<std::string> CopyRange(CheckpointRequest ask, int server, const std::string& address,
                                  int64_t step, const float* params, double* bytes);
  // ps-async, ps-ssp: rank 0 copies each joined server's ranges to it (see above) after
  // `step`; the other ranks only forget joined servers that failed since.
  Status CopyToJoined(int64_t step, const float* params);
  // ps-async, ps-ssp: a reply of `range` said its updates went to the joined server at
  // `address` (copied_to): it holds the range from now on, last among its replicas.
  void TakeInCopy(int range, const std::string& address);
  // Whether `server` holds a copy of `range` (its replicas include it).
  bool IsReplicaOf(int server, int range) const {
    return (server - range + view_.num_servers) % view_.num_servers < replicas_;
  }
  // Waits until `reply` is ready; Cancelled naming `what` once a stop was seen
  // (options_.stop_requested) and `*stop_grace` (set then, shared by the waits of one call)
  // expired.
  Status AwaitReply(const std::shared_future<StatusOr<Envelope>>& reply, const std::string& what,
                    std::optional<Deadline>* stop_grace);
  // Waits for every reply and returns the first error (with its `what`); the results in order.
  Status WaitAll(std::vector<std::pair<Reply, std::string>>* replies,
                 std::vector<StatusOr<Envelope>>* results);

  const PsEngineOptions options_;
  RpcEndpoint* const endpoint_;
  const FleetView view_;
  const int rank_;
  // By server rank; an entry changes when a joined server is taken in. Guarded by lost_mu_ for
  // the other threads (ServerLost); the training thread, which alone writes it, reads it free.
  std::vector<std::string> server_addresses_;
  int replicas_ = 1;
  // Dense pushes (and in ps-async and ps-ssp row pushes) go to the range's primary, which
  // forwards each update to the backup, or along the chain of its live backups (ps-async and
  // ps-ssp with 3 or more copies; see above): --replicas 2, and 3 or more outside ps-sync.
  bool forwarding_ = false;
  mutable std::mutex lost_mu_;
  std::vector<bool> lost_;  // by server: failed (ServerLost); guarded by lost_mu_
  // The addresses of the servers declared failed, and why (SendTo); guarded by lost_mu_.
  std::map<std::string, Status> failed_addresses_;
  // Servers that joined in a failed one's place and are not taken in yet: rank -> address
  // (empty once it failed too).
  std::map<int, std::string> joined_;  // guarded by lost_mu_
  // ps-async, ps-ssp: joined servers taken in, and the ranges each holds a copy of; they sort
  // last among a range's live replicas (see above).
  std::map<int, std::set<int>> copied_;  // guarded by lost_mu_
  // The (range, address) pairs this step's replies named (copied_to): taken in after the step.
  std::set<std::pair<int, std::string>> copies_seen_;
  std::condition_variable joined_cv_;  // signalled when joined_ grows
  Counter* range_copies_ = nullptr;
  std::string config_json_;  // the job's PsJobConfig (rank 0's init; a joined server's too)
  Counter* failovers_ = nullptr;
  Counter* retargeted_ = nullptr;
  std::vector<DenseChunk> chunks_;
  std::vector<std::vector<size_t>> chunks_of_server_;  // by range: indices into chunks_
  // By range: the region its copies mapped (null: none did), the addresses of those that did,
  // and the floats of each half (the gradients, then a values half per copy); by chunk: its
  // offset in its range's halves.
  std::vector<std::shared_ptr<SharedRegion>> regions_;
  std::vector<std::set<std::string>> region_holders_;
  std::vector<uint64_t> region_floats_;
  std::vector<uint64_t> region_offset_;
  std::vector<EmbeddingTableSpec> tables_;
  uint64_t job_token_ = 0;    // PsInitRequest.job_token (see Create)
  uint64_t fingerprint_ = 0;  // of the layout
  uint64_t dense_elements_ = 0;
  std::shared_ptr<const void> grads_owner_;  // SetGradientOwner's
  int64_t last_step_ = 0;  // the last step whose values the engine has
  // StopAskedIn's answer and the step it is for.
  int64_t stop_read_step_ = 0;
  bool stop_asked_ = false;
  int join_asked_ = -1;
  // ps-sync: the lowest server rank the replies of step joining_step_ said joins (-1: none).
  int64_t joining_step_ = 0;
  int joining_ = -1;
  // ps-sync: the lowest rank the replies of step stopped_step_ said was asked to stop (-1: none).
  int64_t stopped_step_ = 0;
  int stopped_by_ = -1;
  // The backward pass being reported (OnBackwardStart): its step and gradients, the elements of
  // each chunk not reported ready yet, and the requests already sent with their chunks.
  int64_t early_step_ = 0;  // 0: none
  const float* early_grads_ = nullptr;
  std::vector<uint64_t> unready_;
  std::vector<bool> early_sent_;
  std::vector<std::pair<Reply, std::string>> early_replies_;
  std::vector<std::vector<size_t>> early_groups_;
  double early_bytes_ = 0;
  Status early_check_;  // the gradient check of this backward's early chunks: the first error
  Histogram* latency_[3] = {nullptr, nullptr, nullptr};  // push_pull, sparse_push, sparse_pull
  // Tensor bytes (row ids and values included) by op: push_pull, sparse_push, sparse_pull.
  Counter* bytes_sent_[3] = {nullptr, nullptr, nullptr};
  Counter* bytes_received_[3] = {nullptr, nullptr, nullptr};
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_PS_ENGINE_H_
