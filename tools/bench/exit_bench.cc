#include "tools/bench/exit_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "tools/bench/child_timeline.h"

namespace tessera::tools {
namespace {

struct ExitBenchOptions {
  int rounds = 3;
  std::string bin_dir;  // empty: this build's runfiles
  int timeout_s = 120;
  bool json = false;
};

// The goals of issue 22.
constexpr double kExitGoalMs = 100;
constexpr double kLocalRunGoalMs = 500;
constexpr double kLauncherRunGoalMs = 2000;

double MillisSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

struct Binaries {
  std::string worker, coordinator, server, launcher;
};

StatusOr<Binaries> FindBinaries(const std::string& bin_dir) {
  auto find = [&](const std::string& path) -> StatusOr<std::string> {
    if (bin_dir.empty()) return FindRunfile(path);
    const std::string full = bin_dir + "/" + path;
    if (access(full.c_str(), X_OK) != 0) return NotFoundError("--bin-dir: no " + full);
    return full;
  };
  Binaries binaries;
  ASSIGN_OR_RETURN(binaries.worker, find("worker/tessera-worker"));
  ASSIGN_OR_RETURN(binaries.coordinator, find("coordinator/tessera-coordinator"));
  ASSIGN_OR_RETURN(binaries.server, find("server/ps/tessera-server"));
  ASSIGN_OR_RETURN(binaries.launcher, find("tools/tessera-launch"));
  return binaries;
}

// One round's figures, in milliseconds, by name.
using Round = std::map<std::string, double>;

// The floor: /bin/true, spawned and reaped as the binaries are.
Status MeasureFloor(int64_t timeout_ms, Round* round) {
  Timeline timeline(timeout_ms);
  ASSIGN_OR_RETURN(int id, timeline.Spawn("/bin/true", {"/bin/true"}));
  ASSIGN_OR_RETURN(Clock::time_point exited, timeline.WaitForExit(id));
  (*round)["floor_run_ms"] = MillisSince(timeline.started(id), exited);
  return OkStatus();
}

Status MeasureLocalWorker(const Binaries& bin, int64_t timeout_ms, Round* round) {
  Timeline timeline(timeout_ms);
  ASSIGN_OR_RETURN(int id, timeline.Spawn("worker", {bin.worker, "--mode", "local", "--steps",
                                                     "5"}));
  // The summary: "worker 0 of 1: trained ..." (before issue 22 it began with "trained").
  ASSIGN_OR_RETURN(Timeline::Line trained, timeline.WaitForLine(id, "trained "));
  ASSIGN_OR_RETURN(Clock::time_point exited, timeline.WaitForExit(id));
  (*round)["worker_local_run_ms"] = MillisSince(timeline.started(id), exited);
  (*round)["worker_local_exit_ms"] = MillisSince(trained.when, exited);
  return OkStatus();
}

// A long-running fleet's coordinator and one server: SIGTERM to the server once it is ready,
// then to the coordinator.
Status MeasureCoordinatorAndServer(const Binaries& bin, int64_t timeout_ms, Round* round) {
  Timeline timeline(timeout_ms);
  ASSIGN_OR_RETURN(int coordinator,
                   timeline.Spawn("coordinator", {bin.coordinator, "--num-servers", "1",
                                                  "--num-workers", "0"}));
  ASSIGN_OR_RETURN(Timeline::Line ready, timeline.WaitForLine(coordinator, "TESSERA_READY"));
  const std::string address = ReadyField(ready.text, "address");  // tcp://HOST:PORT
  if (address.rfind("tcp://", 0) != 0) {
    return InternalError("the coordinator's TESSERA_READY line has no address: " + ready.text);
  }
  ASSIGN_OR_RETURN(int server,
                   timeline.Spawn("server", {bin.server, "--coordinator", address.substr(6),
                                             "--num-servers", "1", "--num-workers", "0"}));
  RETURN_IF_ERROR(timeline.WaitForLine(server, "TESSERA_READY").status());
  // Registered: the coordinator logs the server's arrival before the server is told it may go on.
  RETURN_IF_ERROR(timeline.WaitForLine(coordinator, "server 0 registered").status());
  for (const auto& [id, name] : {std::pair{server, "server_exit_ms"},
                                 std::pair{coordinator, "coordinator_exit_ms"}}) {
    const Clock::time_point signalled = Clock::now();
    RETURN_IF_ERROR(timeline.Signal(id, SIGTERM));
    ASSIGN_OR_RETURN(Clock::time_point exited, timeline.WaitForExit(id));
    (*round)[name] = MillisSince(signalled, exited);
  }
  return OkStatus();
}

// The 2 x 2 ps-sync job of 5 steps under the launcher.
Status MeasureLauncher(const Binaries& bin, int64_t timeout_ms, Round* round) {
  Timeline timeline(timeout_ms);
  ASSIGN_OR_RETURN(int id, timeline.Spawn("launch", {bin.launcher, "--servers", "2", "--workers",
                                                     "2", "--mode", "ps-sync", "--", "--steps",
                                                     "5"}));
  ASSIGN_OR_RETURN(Clock::time_point exited, timeline.WaitForExit(id));
  Clock::time_point last_worker{};
  for (const char* worker : {"[launch] worker 0 (pid ", "[launch] worker 1 (pid "}) {
    ASSIGN_OR_RETURN(Timeline::Line line, timeline.WaitForLine(id, worker));
    last_worker = std::max(last_worker, line.when);
  }
  (*round)["launch_2x2_run_ms"] = MillisSince(timeline.started(id), exited);
  (*round)["launch_2x2_exit_ms"] = MillisSince(last_worker, exited);
  return OkStatus();
}

struct Figure {
  const char* name;      // key in Round and in the JSON
  const char* what;      // for the table
  double goal_ms;        // 0: the floor, no goal
};

const Figure kFigures[] = {
    {"floor_run_ms", "/bin/true, spawned and reaped (the floor)", 0},
    {"worker_local_run_ms", "tessera-worker --mode local --steps 5: whole run", kLocalRunGoalMs},
    {"worker_local_exit_ms", "  from its summary line to its exit", kExitGoalMs},
    {"server_exit_ms", "tessera-server: SIGTERM to exit", kExitGoalMs},
    {"coordinator_exit_ms", "tessera-coordinator: SIGTERM to exit", kExitGoalMs},
    {"launch_2x2_run_ms", "tessera-launch 2x2 ps-sync 5 steps: whole run", kLauncherRunGoalMs},
    {"launch_2x2_exit_ms", "  from its last worker's exit to its own", kExitGoalMs},
};

int RunExitBench(const ExitBenchOptions& options) {
  StatusOr<Binaries> binaries = FindBinaries(options.bin_dir);
  if (!binaries.ok()) {
    std::cerr << "tessera-bench exit: " << binaries.status() << "\n";
    return 1;
  }
  // The coordinator and server started by hand need the job key tessera-launch would give.
  StatusOr<std::unique_ptr<ScratchDirectory>> scratch = ScratchDirectory::Create();
  Status shared = scratch.ok() ? ShareNewJobKey((*scratch)->path()) : scratch.status();
  if (!shared.ok()) {
    std::cerr << "tessera-bench exit: " << shared << "\n";
    return 1;
  }
  const int64_t timeout_ms = int64_t{options.timeout_s} * 1000;
  std::map<std::string, std::vector<double>> samples;
  for (int r = 0; r < options.rounds; ++r) {
    Round round;
    for (const auto& measure : {MeasureFloor}) {
      if (Status s = measure(timeout_ms, &round); !s.ok()) {
        std::cerr << "tessera-bench exit: " << s << "\n";
        return 1;
      }
    }
    for (const auto& measure : {MeasureLocalWorker, MeasureCoordinatorAndServer,
                                MeasureLauncher}) {
      if (Status s = measure(*binaries, timeout_ms, &round); !s.ok()) {
        std::cerr << "tessera-bench exit: round " << r + 1 << ": " << s << "\n";
        return 1;
      }
    }
    for (const auto& [name, ms] : round) samples[name].push_back(ms);
  }
  nlohmann::json report = {{"bench", "exit"},
                           {"rounds", options.rounds},
                           {"bin_dir", options.bin_dir.empty() ? "(this build)" : options.bin_dir},
                           {"figures", nlohmann::json::array()}};
  for (const Figure& figure : kFigures) {
    const double median = Median(samples.at(figure.name));
    nlohmann::json entry = {{"name", figure.name}, {"median_ms", median}};
    if (figure.goal_ms > 0) {
      entry["goal_ms"] = figure.goal_ms;
      entry["ratio_to_goal"] = median / figure.goal_ms;
    }
    report["figures"].push_back(entry);
  }
  if (options.json) {
    std::cout << report.dump() << std::endl;
    return 0;
  }
  std::printf("exit times, median of %d rounds (%s); ratio = measured / goal, < 1 meets it\n",
              options.rounds, options.bin_dir.empty() ? "this build" : options.bin_dir.c_str());
  std::printf("%-52s %10s %9s %7s\n", "", "ms", "goal ms", "ratio");
  for (const Figure& figure : kFigures) {
    const double median = Median(samples.at(figure.name));
    if (figure.goal_ms > 0) {
      std::printf("%-52s %10.1f %9.0f %7.2f\n", figure.what, median, figure.goal_ms,
                  median / figure.goal_ms);
    } else {
      std::printf("%-52s %10.1f %9s %7s\n", figure.what, median, "", "");
    }
  }
  return 0;
}

}  // namespace

BenchCommand AddExitBench(CLI::App* parent) {
  auto options = std::make_shared<ExitBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "exit", "How long each binary takes to leave once its work is done, against the goals "
              "of issue 22 and beside /bin/true's floor");
  app->add_option("--rounds", options->rounds, "Runs of each measurement; the median is shown")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app->add_option("--bin-dir", options->bin_dir,
                  "Time the binaries under this directory (e.g. another checkout's bazel-bin: "
                  "DIR/worker/tessera-worker, ...) instead of this build's");
  app->add_option("--timeout-s", options->timeout_s, "Bound on each measurement")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app->add_flag("--json", options->json, "One JSON object instead of the table");
  return BenchCommand{app, [options] { return RunExitBench(*options); }};
}

}  // namespace tessera::tools
