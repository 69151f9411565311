// Coordinator: the rendezvous point of a job, its only fixed address.
//
// Servers and workers register (role, listen address, /metrics address). Once every expected
// process has registered, each gets the FleetView: everyone's rank and address, and for
// servers their key ranges. After that the coordinator
//   - answers heartbeats, and declares a member failed when it has been silent for
//     heartbeat_timeout, or at once when its process is gone: the coordinator keeps a
//     connection to every member's listen address, and when it closes and a reconnection is
//     refused (the process's kernel closed its sockets: Transport::Watch), a member of another
//     host is declared failed, and one of the coordinator's own host is checked by its pid
//     (as it also is every kLocalCheckMs, and once more when the coordinator stops, so that a
//     fleet shut down because one of its processes died still tells the others which); every
//     other live member then gets a FailureNotice naming it;
//   - runs barriers over all members or one role, releasing them when every live participant
//     has arrived, or failing them naming who is missing (timeout) or who failed;
//   - takes a server started with --join into a complete fleet in the place of a failed one:
//     it gets the view at once, and once it heartbeats (it serves) it is alive and every other
//     live member gets the new view (request id 0, the epoch one higher), from which the
//     workers copy its key ranges to it (worker/engines/ps_engine.h);
//   - records departures (Goodbye): a clean one is not a failure; one that carries an error
//     (the member is stopping because of it) declares the member failed at once, and the
//     FailureNotice the others get quotes that error.
// Elastic jobs (min_workers > 0, issue 47): a worker that leaves or fails after the rendezvous
// is a membership change (common/messages/membership.h), not the job's failure, while at
// least min_workers remain: the coordinator logs it, exports it (tessera_membership_epoch,
// tessera_membership_changes_total{kind}), marks the worker left and sends every live member
// a FailureNotice carrying the epoch, the step (the leaver's last, from its heartbeats) and
// the world size, which they survive (servers stop counting the worker). A loss that takes the
// job below min_workers is a failure as without elasticity, its notice naming the change.
// If the fleet is not complete within rendezvous_timeout, every registered process gets an
// error naming the roles and ranks that never arrived, and Run() returns that error.
//
// A long-running fleet (num_workers == 0): the servers (if any) rendezvous once and stay; jobs'
// workers then attach one job at a time. A job's size is the num_workers its workers register
// with (their --num-workers / WORLD_SIZE); its workers get the FleetView (the servers plus that
// job's workers) once all of them have registered, and an unscoped barrier is a barrier of the
// job's workers only (servers are not part of any one job). When every worker of the job has
// left or failed, the job is over: its workers are forgotten, its ranks free, and the next
// job's workers may register. A job that does not assemble within rendezvous_timeout is turned
// away (its workers get the error naming the missing ranks) and the fleet keeps running. A
// worker's departure is never a failure for the servers; a worker's failure is reported to
// everyone as usual (servers log it and keep serving).
//
// Thread-safety: Run() owns all state on the calling thread; message handlers only queue.
// Snapshot() may be called from any thread.
#ifndef TESSERA_COORDINATOR_COORDINATOR_H_
#define TESSERA_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/messages/membership.h"
#include "common/metrics/metrics.h"
#include "common/transport/envelope_queue.h"
#include "common/transport/rpc_endpoint.h"

namespace tessera::coordinator {

struct CoordinatorOptions {
  std::string job = "tessera";
  int num_servers = 0;
  int num_workers = 1;  // 0: a long-running fleet (see above)
  // Run() returns once no worker is alive after a complete rendezvous: OK when every worker
  // said goodbye, else ABORTED naming the ones that failed. Node 0 of a multi-node launch keeps
  // the coordinator until the other nodes' workers are done. Not with num_workers == 0.
  bool exit_when_workers_leave = false;
  uint64_t key_space = uint64_t{1} << 20;  // keys [0, key_space), split over the servers
  // Copies of each key range, in the fleet view (FleetView::replicas); 1 to num_servers.
  int replicas = 1;
  int64_t rendezvous_timeout_ms = 60000;
  int64_t heartbeat_timeout_ms = 4000;
  // Elastic jobs (see above): 0, the default, is a job in which any worker's loss stops it.
  // REQUIRES (Create checks): 1 <= min_workers <= num_workers <= max_workers, num_workers > 0.
  int min_workers = 0;
  int max_workers = 0;  // 0: num_workers
  // Called on the Run thread with each membership change of an elastic job (after it was
  // logged and sent); must be quick. May be empty. (tessera-launch --membership-log.)
  std::function<void(const MembershipChange&)> on_membership_change;
  // Called with the new membership whenever it changes (a process registers, the fleet
  // completes, a member fails or leaves), and once from Create(). Runs on the Run() thread (or
  // Create()'s), so it must be quick and must not call back into the Coordinator. May be empty.
  std::function<void(const FleetView&)> on_fleet_change;
};

class Coordinator {
 public:
  // `endpoint` (listening at the job's coordinator address) and `metrics` must outlive this.
  static StatusOr<std::unique_ptr<Coordinator>> Create(RpcEndpoint* endpoint,
                                                       const CoordinatorOptions& options,
                                                       MetricsRegistry* metrics);
  // Stops serving (as Run does when it returns) if Run never ran.
  ~Coordinator();

  // Serves until `stop_requested()` returns true (checked every few milliseconds): OK. Returns
  // the error if the rendezvous times out. Then stops serving: every request that reaches the
  // endpoint later (or was queued unanswered) is answered Unavailable, saying the coordinator
  // stopped and why, and every live member gets a FailureNotice of the coordinator saying so,
  // so a member learns that at once instead of waiting out its heartbeat limit.
  Status Run(const std::function<bool()>& stop_requested);

  // The current membership, from any thread.
  FleetView Snapshot() const;

  // Milliseconds since each member, by (role, rank), was last heard from: its registration,
  // the fleet's completion (when heartbeats start), or its latest heartbeat. From any thread.
  std::map<std::pair<Role, int>, int64_t> MillisSinceHeard() const;

 private:
  using MemberKey = std::pair<Role, int>;
  struct Member {
    MemberInfo info;
    Origin route;                    // where to send its replies and notices
    uint64_t register_request_id = 0;
    SteadyClock::time_point last_seen;
    // A server that registered with --join in a failed one's place: kJoining until its first
    // heartbeat (sent once it serves), then alive, and every other member gets the view.
    bool joining_late = false;
    int64_t last_step = -1;  // the latest step its heartbeats carried (-1: none yet)
  };
  struct Arrival {
    Origin route;
    uint64_t request_id = 0;
  };
  struct PendingBarrier {
    std::string name;
    uint64_t generation = 0;
    std::optional<Role> scope;
    int64_t timeout_ms = 0;
    SteadyClock::time_point deadline;
    std::map<MemberKey, Arrival> arrived;
  };

  Coordinator(RpcEndpoint* endpoint, const CoordinatorOptions& options);
  Status RegisterMetrics(MetricsRegistry* metrics);

  Status Serve(const std::function<bool()>& stop_requested);
  // Answers this coordinator's requests with Unavailable naming `why` from now on, and tells
  // the live members.
  void StopServing(const Status& why);
  void Handle(const Envelope& envelope);
  void HandleRegister(const Envelope& envelope);
  // A server's registration with --join: it takes the place of a failed server (the one it
  // asks for, or the lowest failed rank) and gets the view at once; see Member::joining_late.
  void HandleJoin(const Envelope& envelope);
  // The registration's address, host, pid and route into `member`, which is joining from now.
  void TakeRegistration(const Envelope& envelope, Member* member);
  // A joined server's first heartbeat: alive, the epoch moves, every live member gets the view.
  void PromoteJoined(Member& member);
  void HandleHeartbeat(const Envelope& envelope);
  void HandleBarrier(const Envelope& envelope);
  void HandleGoodbye(const Envelope& envelope);
  Status CheckTimers();
  // Declares failed every live member of this host whose process is gone.
  void CheckLocalProcesses();
  // Declares failed every live member of another host whose watched address is gone; checks
  // the pids of this host's at once.
  void CheckGoneAddresses();

  // Refuses a member whose advertised address the others cannot reach: an unspecified one, or
  // a loopback one from a member that connected from another host (`source`: its IP address).
  static Status CheckReachable(const RegisterRequest& request, const std::string& source);
  void CompleteRendezvous();
  bool IsFleet() const { return options_.num_workers == 0; }
  // Workers expected now: num_workers, or in a fleet the current job's size (0: no job).
  int ExpectedWorkers() const { return IsFleet() ? job_workers_ : options_.num_workers; }
  int CountRegistered(Role role) const;
  // Fleet only: sends the view to the current job's workers once they are all here.
  void MaybeCompleteJob();
  // Fleet only: ends the job when none of its workers is alive or joining any more.
  void MaybeEndJob();
  // Fleet only: turns away the job's registered workers with `status` and forgets the job.
  void AbandonJob(const Status& status);
  // Marks `member` failed and tells every other live member why. `stopped`: it was stopped
  // on purpose (a signal), which is logged and counted as a stop, not a failure.
  void DeclareFailed(Member& member, const std::string& reason, bool stopped = false);
  // A member that went without an error of its own (its process gone, silent, or stopped by a
  // signal): DeclareFailed, unless another member failed (or was stopped) already and this is
  // a worker, or a stop. Then every process was told of that, and this one's going is its
  // consequence (or the same stop reaching everyone): marked failed without a relay.
  // `unexplained` is appended to `reason` only when it is not such a consequence ("it crashed
  // or was killed" is a guess the coordinator makes only when nothing else explains it).
  void DeclareGone(Member& member, const std::string& reason, bool stopped = false,
                   const std::string& unexplained = "");
  // Elastic jobs: records worker `member`'s going as a membership change and tells everyone
  // (or, below min_workers, DeclareFailed naming the change). False, doing nothing, when the
  // job is not elastic, the rendezvous is not complete, or `member` is not a worker in it.
  bool ElasticLeave(Member& member, MembershipKind kind, const std::string& reason);
  void TryReleaseBarriers();
  bool IsParticipant(const Member& member, const std::optional<Role>& scope) const;
  // The live participants of `barrier` that have not arrived, by name.
  std::vector<std::string> Missing(const PendingBarrier& barrier) const;

  Member* FindLive(const MessageHeader& header);
  void ReplyError(const Origin& route, uint64_t request_id, const Status& status);
  void ReplyAck(const Origin& route, uint64_t request_id, const std::string& detail);
  FleetView BuildView() const;  // REQUIRES: called on the Run thread
  // After every membership change: updates Snapshot() and calls options_.on_fleet_change.
  void PublishSnapshot();
  void UpdateMemberGauges();

  RpcEndpoint* const endpoint_;
  const CoordinatorOptions options_;
  EnvelopeQueue inbox_;
  bool stopped_serving_ = false;  // Run thread (or the destructor's)
  bool job_over_ = false;         // every worker left (--exit-when-workers-leave): no notices

  // Run-thread state.
  std::map<MemberKey, Member> members_;
  std::map<std::pair<std::string, uint64_t>, PendingBarrier> barriers_;
  bool complete_ = false;  // every server (and, outside a fleet, worker) has registered
  uint64_t epoch_ = 0;
  // Fleet only: the current job. job_workers_ == 0: none.
  int job_workers_ = 0;
  bool job_complete_ = false;
  int jobs_done_ = 0;
  SteadyClock::time_point job_started_;
  SteadyClock::time_point started_ = SteadyClock::now();
  const std::string host_;  // LocalHostName(): members registered with it are checked by pid
  // The listen addresses of members that Transport::Watch reported gone: filled
  // on the transport's thread (which may outlive this, hence shared), drained by CheckTimers.
  struct GoneAddresses {
    std::mutex mu;
    std::vector<std::string> addresses;  // guarded by mu
  };
  std::shared_ptr<GoneAddresses> gone_ = std::make_shared<GoneAddresses>();
  std::set<std::string> watched_;  // the addresses watched now (Run thread)
  bool watch_limit_logged_ = false;
  SteadyClock::time_point next_local_check_;

  GaugeFamily* members_gauge_ = nullptr;
  Counter* heartbeats_ = nullptr;
  CounterFamily* failures_ = nullptr;
  Gauge* membership_epoch_ = nullptr;
  CounterFamily* membership_changes_ = nullptr;
  std::optional<MembershipHistory> membership_;  // elastic jobs only (Run thread)

  mutable std::mutex snapshot_mu_;
  FleetView snapshot_;  // guarded by snapshot_mu_
  std::map<MemberKey, SteadyClock::time_point> last_heard_;  // guarded by snapshot_mu_
};

}  // namespace tessera::coordinator

#endif  // TESSERA_COORDINATOR_COORDINATOR_H_
