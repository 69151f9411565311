// tessera-coordinator: the rendezvous point of one job (see server/coordinator.h).
#include <CLI/CLI.hpp>

#include "common/process_runtime.h"
#include "server/coordinator.h"

int main(int argc, char** argv) {
  using namespace tessera;
  CLI::App app(
      "tessera-coordinator: the rendezvous point of a Tessera job. Servers and workers register "
      "here, get their ranks and the fleet view, heartbeat, and run barriers; when one stops "
      "heartbeating every other process is told which one failed.\n\n"
      "Example: tessera-coordinator --coordinator 127.0.0.1:29500 --num-servers 2 --num-workers 4",
      "tessera-coordinator");
  uint64_t key_space = uint64_t{1} << 20;
  app.add_option("--key-space", key_space,
                 "Number of parameter keys [0, N), split into contiguous ranges over the "
                 "servers (default 1048576)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 62));
  return RunProcess(Role::kCoordinator, argc, argv, &app, [&](ProcessRuntime& runtime) -> Status {
    const ProcessConfig& config = runtime.config();
    server::CoordinatorOptions options;
    options.job = config.job;
    options.num_servers = config.num_servers;
    options.num_workers = config.num_workers;
    options.key_space = key_space;
    options.rendezvous_timeout_ms = config.rendezvous_timeout_ms;
    options.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
    ASSIGN_OR_RETURN(auto coordinator, server::Coordinator::Create(&runtime.endpoint(), options,
                                                                   &runtime.metrics()));
    runtime.AnnounceReady(0);
    return coordinator->Run([&] { return runtime.StopRequested(); });
  });
}
