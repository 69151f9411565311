// tessera-coordinator: the rendezvous point of one job (see coordinator/coordinator.h).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include "common/base/logging.h"
#include "common/config/config.h"
#include "common/messages/membership.h"
#include "common/process/process_runtime.h"
#include "coordinator/coordinator.h"
#include "coordinator/dashboard.h"
#include "coordinator/service_discovery.h"

int main(int argc, char** argv) {
  using namespace tessera;
  CommandLine command_line(
      "tessera-coordinator: the rendezvous point of a Tessera job. Servers and workers register "
      "here, get their ranks and the fleet view, heartbeat, and run barriers; when one stops "
      "heartbeating every other process is told which one failed.\n\n"
      "Example: tessera-coordinator --coordinator 127.0.0.1:29500 --num-servers 2 --num-workers 4\n"
      "A long-running fleet (--num-workers 0): the servers register once and stay; jobs' "
      "workers (each job's size from their --num-workers) then attach, train and leave, one "
      "job at a time, and the next job reuses the ranks.",
      "tessera-coordinator");
  uint64_t key_space = uint64_t{1} << 20;
  command_line.AddOption("--key-space", &key_space,
                         "Number of parameter keys [0, N), split into contiguous ranges over "
                         "the servers (default 1048576)",
                         uint64_t{1}, uint64_t{1} << 62, /*show_default=*/false);
  int replicas = 1;
  command_line.AddOption("--replicas", &replicas,
                         "Copies of each parameter-server key range, on consecutive servers (in "
                         "the fleet view: the workers replicate every push, and a job outlives a "
                         "server's death while every range has a live copy; "
                         "docs/parameter-server.md)",
                         1, 64, /*show_default=*/true);
  std::string file_sd;
  command_line.AddOption("--file-sd", &file_sd,
                         "Keep a Prometheus file_sd targets file (JSON) here listing every live "
                         "process's /metrics, rewritten atomically whenever the fleet changes; "
                         "the same list is always served at GET /sd on the metrics port "
                         "(http_sd)");
  bool exit_when_workers_leave = false;
  command_line.AddFlag("--exit-when-workers-leave", &exit_when_workers_leave,
                       "Exit 0 once every worker has said goodbye after a complete rendezvous "
                       "(node 0 of a multi-node tessera-launch uses it to outlive the other "
                       "nodes' workers). Not with --num-workers 0, the long-running fleet that "
                       "successive jobs attach to");
  // Elastic jobs (issue 47; coordinator/coordinator.h). The coordinator alone decides whether
  // a worker's loss is a membership change or the job's failure; the others follow its notice.
  int min_workers = 0;
  command_line.AddOption("--min-workers", &min_workers,
                         "Elastic job: keep training while at least this many workers remain; "
                         "a worker that leaves or dies is a membership change the others "
                         "survive (0, the default: any worker's loss stops the job)",
                         0, 1 << 20, /*show_default=*/false);
  int max_workers = 0;
  command_line.AddOption("--max-workers", &max_workers,
                         "Elastic job: the most workers it may have (default --num-workers)",
                         0, 1 << 20, /*show_default=*/false);
  std::string membership_log;
  command_line.AddOption("--membership-log", &membership_log,
                         "Elastic job: write each membership change here as a line of JSON "
                         "(epoch, step, kind, rank, reason, world_size, time); the file is "
                         "replaced at start");
  bool dashboard_enabled = true;
  command_line.AddFlag("--dashboard,!--no-dashboard", &dashboard_enabled,
                       "Serve the live dashboard at /dashboard on the metrics port (default on): "
                       "fleet health, loss and throughput, communication, stragglers, memory; "
                       "the coordinator scrapes every member's /metrics once a second for it");
  CLI::App* app = command_line.app();
  return RunProcess(Role::kCoordinator, argc, argv, app, [&](ProcessRuntime& runtime) -> Status {
    const ProcessConfig& config = runtime.config();
    coordinator::CoordinatorOptions options;
    options.job = config.job;
    options.num_servers = config.num_servers;
    options.num_workers = config.num_workers;
    options.exit_when_workers_leave = exit_when_workers_leave;
    options.min_workers = min_workers;
    options.max_workers = max_workers;
    // Shared with the callback, which runs on the Run thread while this function waits in Run.
    auto log = std::make_shared<std::ofstream>();
    if (!membership_log.empty()) {
      log->open(membership_log, std::ios::out | std::ios::trunc);
      if (!*log) {
        return InvalidArgumentError("--membership-log=" + membership_log +
                                    ": cannot open it for writing: " + std::strerror(errno));
      }
      options.on_membership_change = [log, membership_log](const MembershipChange& change) {
        // Flushed per line, so the history is on disk even if this process is killed next.
        *log << MembershipJsonLine(change) << std::endl;
        if (!*log) TLOG(WARNING) << "--membership-log=" << membership_log << ": write failed";
      };
    }
    options.key_space = key_space;
    options.replicas = replicas;
    options.rendezvous_timeout_ms = config.rendezvous_timeout_ms;
    options.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
    // Service discovery: shared with the /sd handler, which may outlive this function.
    coordinator::ServiceDiscoveryOptions sd_options;
    sd_options.job = config.job;
    sd_options.coordinator_metrics_url = runtime.metrics_url();
    sd_options.file_sd_path = file_sd;
    ASSIGN_OR_RETURN(std::shared_ptr<coordinator::ServiceDiscovery> discovery,
                     coordinator::ServiceDiscovery::Create(sd_options));
    FleetView empty;
    empty.job = config.job;
    RETURN_IF_ERROR(discovery->Update(empty));  // a bad --file-sd fails here, at start
    RETURN_IF_ERROR(runtime.http().AddHandler(
        "/sd", [discovery](const HttpRequest& request) { return discovery->Serve(request); }));
    TLOG(INFO) << "service discovery: http_sd at "
               << runtime.metrics_url().substr(0, runtime.metrics_url().rfind('/')) << "/sd"
               << (file_sd.empty() ? std::string() : ", file_sd targets in " + file_sd);
    // The dashboard: shared with its handlers too; its scraping thread reads the coordinator's
    // heartbeat times and is stopped below before the coordinator goes away.
    std::shared_ptr<coordinator::Dashboard> dashboard;
    if (dashboard_enabled) {
      coordinator::DashboardOptions dashboard_options;
      dashboard_options.job = config.job;
      dashboard_options.coordinator_address = runtime.endpoint().address();
      dashboard_options.coordinator_metrics_url = runtime.metrics_url();
      dashboard_options.coordinator_pid = getpid();
      dashboard_options.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
      ASSIGN_OR_RETURN(dashboard, coordinator::Dashboard::Create(dashboard_options));
      RETURN_IF_ERROR(coordinator::AddDashboardHandlers(dashboard, &runtime.http()));
      TLOG(INFO) << "dashboard at "
                 << runtime.metrics_url().substr(0, runtime.metrics_url().rfind('/'))
                 << "/dashboard";
    }
    // Servers that failed: one alive again joined in its place (--join), which a launcher
    // learns from a line on stdout (it counts the copies of each range; tools/launch.cc).
    auto failed_servers = std::make_shared<std::set<int>>();
    options.on_fleet_change = [discovery, dashboard, failed_servers](const FleetView& view) {
      Status updated = discovery->Update(view);
      if (!updated.ok()) TLOG(WARNING) << "service discovery: " << updated;
      if (dashboard) dashboard->UpdateFleet(view);
      for (const MemberInfo& member : view.members) {
        if (member.role != Role::kServer) continue;
        if (member.state == MemberState::kFailed) failed_servers->insert(member.rank);
        if (member.state == MemberState::kAlive && failed_servers->erase(member.rank) > 0) {
          std::printf("TESSERA_JOINED role=server rank=%d address=%s pid=%lld\n", member.rank,
                      member.address.c_str(), static_cast<long long>(member.pid));
          std::fflush(stdout);
        }
      }
    };
    ASSIGN_OR_RETURN(auto coordinator,
                     coordinator::Coordinator::Create(&runtime.endpoint(), options,
                                                      &runtime.metrics()));
    struct StopDashboard {  // on every return: the thread must not outlive `coordinator`
      coordinator::Dashboard* dashboard;
      ~StopDashboard() {
        if (dashboard != nullptr) dashboard->Stop();
      }
    } stop_dashboard{dashboard.get()};
    if (dashboard) {
      dashboard->Start([c = coordinator.get()] { return c->MillisSinceHeard(); });
    }
    runtime.AnnounceReady(0);
    return coordinator->Run([&] { return runtime.StopRequested(); });
  });
}
