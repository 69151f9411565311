// tessera-server: one parameter-server shard.
//
// Joins the fleet through the coordinator, serves pushes and pulls for the keys the fleet view
// gives this rank (server/ps/ps_service.h), and runs until it is told to stop:
//   - SIGTERM/SIGINT (the launcher ending the job): says goodbye to the coordinator, exit 0;
//   - losing the coordinator (heartbeats unanswered or rejected): exit 1 with that error,
//     since without it nobody can tell this server about the fleet any more.
// A failure notice about a worker (or another server) is logged and serving goes on: servers
// hold state that outlives any one worker, and a job's workers decide themselves what a peer's
// failure means for them.
// With --join it takes the place of a failed server of a running fleet: it heartbeats once it
// serves, and the workers copy that rank's key ranges to it (worker/engines/ps_engine.h).
#include <memory>
#include <mutex>
#include <optional>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/messages/fleet_view.h"
#include "common/process/process_runtime.h"
#include "common/rendezvous/rendezvous_client.h"
#include "server/ps/ps_service.h"

namespace tessera::server {
namespace {

// How often the serving loop wakes up to look at the stop flag; a stop request wakes it at
// once, so this only bounds each wait.
constexpr int64_t kServeWakeMs = 1000;

// The first fatal error, set from the rendezvous client's thread, read by the serving loop.
// Thread-safe.
class FatalError {
 public:
  void Set(const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = status;
  }
  Status Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  mutable std::mutex mu_;
  Status status_;  // guarded by mu_
};

Status Serve(ProcessRuntime& runtime, bool join) {
  RpcEndpoint& endpoint = runtime.endpoint();
  // Declared before the client, so it is destroyed after: the client's handlers use it.
  std::unique_ptr<PsService> service;
  RendezvousOptions options = RendezvousOptionsFrom(runtime.config());
  options.metrics_address = runtime.metrics_url();
  options.stop_requested = [&runtime] { return runtime.StopRequested(); };
  options.peer_failures_are_fatal = false;  // so every failure the client reports is fatal
  options.join = join;
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                   RendezvousClient::Join(&endpoint, options, &runtime.metrics()));
  const int rank = client->rank();
  SetLogIdentity("server", rank);

  // Only losing the coordinator reaches this callback (peer failures are logged by the client).
  auto fatal = std::make_shared<FatalError>();
  client->SetFailureCallback([&runtime, fatal, rank](const Status& status) {
    fatal->Set(status.WithContext("server " + std::to_string(rank)));
    runtime.RequestStop();
  });

  const MemberInfo* self = client->view().Find(Role::kServer, rank);
  TLOG(INFO) << "serving keys [" << self->key_begin << ", " << self->key_end << ") of "
             << client->view().key_space << " for " << client->view().num_workers << " workers";
  // The ps-* training modes; idle until a job's worker rank 0 initialises it.
  PsServiceOptions ps_options;
  ps_options.server_rank = rank;
  ps_options.num_servers = client->view().num_servers;
  ps_options.key_space = client->view().key_space;
  // Twice the workers' own wait (--request-timeout-ms, set fleet-wide): a request parked for
  // its job's init longer than that has no worker waiting for it any more.
  ps_options.park_limit_ms = 2 * runtime.config().request_timeout_ms;
  ps_options.long_wait_ms = runtime.config().request_timeout_ms / 3;
  StatusOr<std::unique_ptr<PsService>> ps =
      PsService::Start(ps_options, &endpoint, &runtime.metrics());
  if (!ps.ok()) {
    client->LeaveWithError(ps.status());  // the workers stop now, quoting it
    return ps.status();
  }
  service = std::move(ps).value();
  // A failed server no longer gets the steps this one forwards to it (--replicas 2).
  client->SetPeerLossHandler([service = service.get()](const FailureNotice& notice) {
    if (notice.role == Role::kServer && !notice.address.empty()) {
      service->PeerLost(notice.address, MemberName(notice.role, notice.rank) + " (" +
                                            notice.address + ") failed: " + notice.reason);
    }
    return OkStatus();
  });
  // Elastic jobs (issue 47): a worker that left stops counting here at once, so the others'
  // step completes without it.
  client->SetMembershipHandler([service = service.get()](const FailureNotice& notice) {
    if (notice.role == Role::kWorker && !notice.joined) {
      service->WorkerLeft(notice.rank, notice.reason);
    }
  });
  runtime.AnnounceReady(rank);
  if (join) {
    // Serving now: the coordinator makes this server alive at its first heartbeat and tells
    // the workers, whose rank 0 then copies this rank's key ranges here (ps-sync).
    client->StartHeartbeats();
    TLOG(INFO) << "joined in the place of the failed server " << rank
               << "; the workers copy its key ranges here at their next step; serving until "
                  "stopped";
  }

  // Workers begin with a barrier of the whole fleet, servers included. A failure here (a
  // worker died while starting) is the job's problem, not this server's: log and keep serving.
  // In a long-running fleet (no workers in the view) jobs come and go and their barriers are
  // their workers' alone.
  if (join) {
    // The fleet started long ago: no start barrier to enter.
  } else if (client->view().num_workers == 0) {
    TLOG(INFO) << "long-running fleet: jobs' workers attach, train and leave; serving until "
                  "stopped";
  } else if (Status start = client->Barrier("start", std::nullopt,
                                            runtime.config().rendezvous_timeout_ms);
             start.ok()) {
    TLOG(INFO) << "the fleet has started; serving until stopped";
  } else if (!runtime.StopRequested()) {
    TLOG(WARNING) << "barrier 'start': " << start << "; this server keeps serving";
  }

  while (!runtime.WaitForStop(Deadline::AfterMillis(kServeWakeMs))) {
  }
  Status failed = fatal->Get();
  if (!failed.ok() && client->coordinator_stopped_cleanly()) {
    // The fleet is over (its launcher stops the coordinator last): not a fault of this server,
    // which may have joined from elsewhere (--join, tessera-launch --add-servers).
    TLOG(INFO) << "the coordinator stopped: the fleet is over; exiting";
    return OkStatus();
  }
  if (!failed.ok()) return failed;  // no goodbye: the coordinator is gone
  TLOG(INFO) << "stopping: leaving the fleet";
  // Said as a stop: the coordinator tells the workers, whose requests to this server would
  // otherwise wait out their timeout.
  client->LeaveStopped(runtime.StopReason());
  return OkStatus();
}

}  // namespace
}  // namespace tessera::server

int main(int argc, char** argv) {
  tessera::CommandLine command_line(
      "tessera-server: one parameter-server shard. Joins the fleet at --coordinator, serves "
      "pushes and pulls for its key range, and runs until SIGTERM.");
  bool join = false;
  command_line.AddFlag(
      "--join", &join,
      "Join a running fleet in the place of a failed server (--rank R, or the lowest "
      "failed rank): with --replicas 2 or more the workers copy that rank's key ranges "
      "here at a ps-sync step boundary, restoring every range's copies "
      "(docs/parameter-server.md)");
  return tessera::RunProcess(
      tessera::Role::kServer, argc, argv, command_line.app(),
      [&join](tessera::ProcessRuntime& runtime) { return tessera::server::Serve(runtime, join); });
}
