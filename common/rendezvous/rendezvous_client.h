// RendezvousClient: a server's or worker's link to the coordinator.
//
// Join() registers this process (role, listen address, /metrics address) and waits until the
// coordinator has heard from the whole fleet; it returns the FleetView and this process's
// rank. From then on a heartbeat thread tells the coordinator we are alive, and the
// coordinator tells us when another process failed (a FailureNotice) or when a server joined
// in a failed one's place (a newer FleetView, SetFleetChangeHandler). Either way the first
// failure becomes health() and fails every pending and later call on the endpoint, so a
// process waiting on a dead peer gets an error naming it instead of hanging.
//
// Thread-safety: all methods are thread-safe.
#ifndef TESSERA_COMMON_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
#define TESSERA_COMMON_RENDEZVOUS_RENDEZVOUS_CLIENT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/messages/fleet_view.h"
#include "common/messages/rendezvous_messages.h"
#include "common/metrics/metrics.h"
#include "common/transport/rpc_endpoint.h"

namespace tessera {

struct RendezvousOptions {
  std::string coordinator_address;  // tcp://HOST:PORT
  Role role = Role::kWorker;
  int requested_rank = -1;          // -1: the coordinator assigns one
  // Workers: the job's number of workers, which a long-running fleet's coordinator learns
  // from the registrations; 0 for servers.
  int num_workers = 0;
  std::string metrics_address;      // http://HOST:PORT/metrics
  std::string host;                 // empty: this machine's name (LocalHostName)
  int64_t rendezvous_timeout_ms = 60000;
  int64_t heartbeat_interval_ms = 1000;
  int64_t heartbeat_timeout_ms = 4000;
  int64_t request_timeout_ms = 30000;
  // When another member fails: true, that becomes this process's failure (workers: their job
  // cannot go on); false, it is logged and this process carries on (servers outlive jobs).
  // Losing the coordinator is always a failure.
  bool peer_failures_are_fatal = true;
  // With fatal peer failures: this process installs a peer-loss handler after Join, once it
  // has built what the handler asks (a worker's parameter-server engine, after its model).
  // Failure notices and newer fleet views that arrive before then are held and handed to the
  // handlers as they are set, instead of failing the process (or being dropped) in between.
  bool handlers_follow = false;
  // A server taking a failed server's place in a running fleet (tessera-server --join): Join
  // returns with the view at once and the process heartbeats only from StartHeartbeats() on
  // (once it serves: the coordinator makes it alive, and tells the others, at its first).
  bool join = false;
  // Elastic jobs: whether a membership change (a worker left; FailureNotice::membership_epoch)
  // fails this process as a plain failure notice would. A worker of a mode without servers
  // cannot go on without a peer (its ring would wait for it) until issue 47's ring re-forming.
  bool membership_changes_are_fatal = false;
  // True once this process was asked to stop (SIGTERM, SIGINT): Join and Barrier then give up
  // waiting within kStopCheckMs with Cancelled, instead of waiting out their timeouts. Null:
  // never.
  std::function<bool()> stop_requested;
};


// Fills the options that come straight from a ProcessConfig.
RendezvousOptions RendezvousOptionsFrom(const ProcessConfig& config);

class RendezvousClient {
 public:
  // Registers and waits for the complete fleet. Fails with the coordinator's explanation
  // (e.g. which processes never arrived) or, if the coordinator does not answer, with a
  // timeout naming it; Cancelled when a stop is requested meanwhile. `endpoint` and `metrics`
  // (may be null) must outlive the client.
  static StatusOr<std::unique_ptr<RendezvousClient>> Join(RpcEndpoint* endpoint,
                                                          const RendezvousOptions& options,
                                                          MetricsRegistry* metrics);
  ~RendezvousClient();

  int rank() const { return rank_; }
  Role role() const { return options_.role; }
  const FleetView& view() const { return view_; }

  // Waits until every live member in `scope` (all servers and workers when nullopt) has
  // called Barrier(name). Calls with the same name are numbered (generations), so a barrier
  // can be reused. Fails naming the members that did not arrive within `timeout_ms`, or the
  // member that failed meanwhile; Cancelled when a stop is requested meanwhile.
  Status Barrier(const std::string& name, std::optional<Role> scope, int64_t timeout_ms);

  // OK while the fleet is healthy, else the first failure seen.
  Status health() const;
  // Whether the first failure was the coordinator saying it stopped without an error (the
  // fleet's end, not a fault).
  bool coordinator_stopped_cleanly() const { return coordinator_stopped_cleanly_; }
  // Runs once with the first failure (on an internal thread; must not block).
  void SetFailureCallback(std::function<void(const Status&)> callback);
  // Asked about each failed peer (not the coordinator) while peer failures are fatal: OK when
  // this process carries on without it (a server whose key ranges have other live replicas;
  // the handler logs how); else why not, which the failure then says (when not empty). When
  // they are not fatal, only told (its answer is ignored). Runs on the endpoint's handler
  // thread and must not block. Null: every loss is fatal (or, not fatal, only logged).
  // Notices held until now (RendezvousOptions::handlers_follow) go to it at once, on the
  // caller's thread.
  void SetPeerLossHandler(std::function<Status(const FailureNotice&)> handler);

  // Called with each newer fleet view the coordinator sends (a server joined in a failed
  // one's place), on the endpoint's handler thread; must not block. Null: ignored. A newer
  // view held until now (RendezvousOptions::handlers_follow) goes to it at once.
  void SetFleetChangeHandler(std::function<void(const FleetView&)> handler);
  // Elastic jobs (issue 47): called with each membership change the coordinator sends (a
  // FailureNotice whose membership_epoch is not 0: a worker left or joined), on the endpoint's
  // handler thread; must not block. Such a notice is never this process's failure, whether or
  // not a handler is set. (A server stops counting the worker: PsService::WorkerLeft.)
  void SetMembershipHandler(std::function<void(const FailureNotice&)> handler);
  // The last step this process completed, which its heartbeats carry from now on: the step a
  // membership change names when this process goes.
  void SetStep(int64_t step) { last_step_.store(step, std::memory_order_relaxed); }
  // SetStep, then a heartbeat at once, returning once the coordinator acknowledged it (or the
  // error naming why not, within the heartbeat timeout): for a process about to leave, so the
  // change names its exact step rather than the one of its last periodic heartbeat.
  Status SendStep(int64_t step);

  // RendezvousOptions::join: starts heartbeating (the first one at once). Once only.
  void StartHeartbeats();

  // Says goodbye to the coordinator (a clean exit, not a failure) and stops heartbeating.
  void Leave(const std::string& reason);
  // Tells the coordinator this process is stopping because of `error`, which it relays to
  // every other process at once, and stops heartbeating. Sends nothing when the fleet has
  // already failed: `error` is then a consequence, and the coordinator knows the cause.
  void LeaveWithError(const Status& error);
  // Tells the coordinator this process is stopping because it was asked to (`why`: "stopped
  // by SIGTERM"), so that it and the other processes report a stop, not a crash.
  void LeaveStopped(const std::string& why);

 private:
  RendezvousClient(RpcEndpoint* endpoint, const RendezvousOptions& options);
  void SendGoodbye(Goodbye goodbye);
  // The reply to `call`, or Cancelled naming `what` once a stop is requested.
  StatusOr<Envelope> AwaitReply(const std::shared_future<StatusOr<Envelope>>& call,
                                const std::string& what) const;
  void HeartbeatLoop();
  void Fail(const Status& status);
  // What a failure notice about another member means here: the peer-loss handler's answer
  // (or its absence) fails this process, or it carries on.
  void PeerFailed(const FailureNotice& notice);
  void StopHeartbeats();

  RpcEndpoint* const endpoint_;
  const RendezvousOptions options_;
  int rank_ = -1;
  FleetView view_;
  Histogram* barrier_wait_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;                              // guarded by mu_
  Status health_;                                      // guarded by mu_
  std::function<void(const Status&)> on_failure_;      // guarded by mu_
  std::function<Status(const FailureNotice&)> on_peer_loss_;  // guarded by mu_
  std::function<void(const FleetView&)> on_fleet_change_;      // guarded by mu_
  std::function<void(const FailureNotice&)> on_membership_;    // guarded by mu_
  std::atomic<int64_t> last_step_{-1};
  uint64_t newest_epoch_ = 0;                                  // guarded by mu_
  // RendezvousOptions::handlers_follow: what arrived before the handlers were set.
  std::vector<FailureNotice> held_losses_;        // guarded by mu_
  std::optional<FleetView> held_view_;            // guarded by mu_
  std::atomic<bool> coordinator_stopped_cleanly_{false};
  std::map<std::string, uint64_t> barrier_generation_;  // guarded by mu_
  std::thread heartbeat_thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RENDEZVOUS_RENDEZVOUS_CLIENT_H_
