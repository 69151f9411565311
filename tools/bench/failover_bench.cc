#include "tools/bench/failover_bench.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/child_timeline.h"

namespace tessera::tools {
namespace {

struct FailoverBenchOptions {
  int rounds = 10;
  int servers = 3;
  int workers = 3;
  int replicas = 2;
  bool no_hang = false;
  int timeout_s = 300;
  bool json = false;
};

constexpr double kKillGoalMs = 1000;
constexpr double kHangGoalMs = 5000;
constexpr int kStepsBeforeDeath = 50;  // worker 0's steps before the death

double MillisBetween(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

struct Death {
  const char* name;  // "kill", "kill-remote", "hang"
  int signal;
  double goal_ms;
  const char* what;
  // The server is of "another host": it runs with a host name of its own (a UTS namespace;
  // needs root), so the coordinator cannot check its pid and has only its closed connection
  // (Transport::Watch). The fleet is started process by process then.
  bool remote = false;
};

const Death kDeaths[] = {
    {"kill", SIGKILL, kKillGoalMs, "SIGKILL (the process is gone)"},
    {"kill-remote", SIGKILL, kKillGoalMs, "SIGKILL on another host (closed connection)", true},
    {"hang", SIGSTOP, kHangGoalMs, "SIGSTOP (silent: the heartbeat timeout)"},
};

// The job of every round: a small dense model, many short steps, each logged, so the first
// step after the failover is seen within a step.
const std::vector<std::string> kTraining = {
    "--hidden", "32,16", "--input-dim", "16", "--classes", "4", "--train-samples", "1920",
    "--batch-size", "16", "--ps-chunk-elements", "100", "--steps", "1000000", "--log-every",
    "1", "--optimizer", "momentum"};

// A running fleet: what to watch for worker 0's lines (and their prefix), and the pid of the
// server that is to die.
struct RunningFleet {
  std::vector<int> children;  // the launcher, or every process
  int worker0 = -1;           // the child whose output has worker 0's lines
  std::string prefix;         // before worker 0's lines there
  int pid = -1;
};

// tessera-launch with the fleet.
StatusOr<RunningFleet> Launch(const FailoverBenchOptions& o, const std::string& launcher,
                              int server, Timeline& timeline) {
  std::vector<std::string> argv = {launcher, "--servers", std::to_string(o.servers),
                                   "--workers", std::to_string(o.workers), "--replicas",
                                   std::to_string(o.replicas), "--mode", "ps-sync",
                                   "--log-level", "info", "--"};
  argv.insert(argv.end(), kTraining.begin(), kTraining.end());
  RunningFleet fleet;
  ASSIGN_OR_RETURN(fleet.worker0, timeline.Spawn("tessera-launch", argv));
  fleet.children = {fleet.worker0};
  fleet.prefix = "worker 0 | ";
  ASSIGN_OR_RETURN(Timeline::Line announced,
                   timeline.WaitForLine(fleet.worker0, "[launch] server " +
                                                           std::to_string(server) + " pid="));
  fleet.pid = std::stoi(announced.text.substr(announced.text.find(" pid=") + 5));
  return fleet;
}

// The pid=N of a child's TESSERA_READY line, and its address=.
StatusOr<std::pair<int, std::string>> Ready(Timeline& timeline, int child) {
  ASSIGN_OR_RETURN(Timeline::Line ready, timeline.WaitForLine(child, "TESSERA_READY "));
  const std::string pid = ReadyField(ready.text, "pid");
  const std::string address = ReadyField(ready.text, "address");
  if (pid.empty() || address.empty()) {
    return InternalError("a TESSERA_READY line without pid= or address=: " + ready.text);
  }
  return std::make_pair(std::stoi(pid), address);
}

// The fleet process by process (as tessera-launch would start it; the job key is in the
// environment), server `server` in a UTS namespace with a host name of its own.
StatusOr<RunningFleet> StartByHand(const FailoverBenchOptions& o, int server, Timeline& timeline) {
  ASSIGN_OR_RETURN(std::string coordinator_binary,
                   FindRunfile("coordinator/tessera-coordinator"));
  ASSIGN_OR_RETURN(std::string server_binary, FindRunfile("server/ps/tessera-server"));
  ASSIGN_OR_RETURN(std::string worker_binary, FindRunfile("worker/tessera-worker"));
  const std::vector<std::string> fleet_flags = {"--num-servers", std::to_string(o.servers),
                                                "--num-workers", std::to_string(o.workers)};
  auto command = [&](const std::vector<std::string>& prefix, const std::string& binary,
                     const std::vector<std::string>& args) {
    std::vector<std::string> argv = prefix;
    argv.push_back(binary);
    argv.insert(argv.end(), fleet_flags.begin(), fleet_flags.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
  RunningFleet fleet;
  ASSIGN_OR_RETURN(
      int coordinator,
      timeline.Spawn("coordinator", command({}, coordinator_binary,
                                            {"--coordinator", "127.0.0.1:0", "--replicas",
                                             std::to_string(o.replicas)})));
  fleet.children.push_back(coordinator);
  ASSIGN_OR_RETURN(auto coordinator_ready, Ready(timeline, coordinator));
  const std::string address = coordinator_ready.second.substr(std::string("tcp://").size());
  const std::vector<std::string> remote = {
      "/usr/bin/unshare", "--uts", "/bin/sh", "-c",
      "hostname tessera-bench-other-host && exec \"$@\"", "sh"};
  for (int s = 0; s < o.servers; ++s) {
    ASSIGN_OR_RETURN(
        int child,
        timeline.Spawn("server " + std::to_string(s),
                       command(s == server ? remote : std::vector<std::string>{}, server_binary,
                               {"--coordinator", address, "--rank", std::to_string(s)})));
    fleet.children.push_back(child);
    if (s == server) fleet.pid = child;  // the child's id until it is ready, below
  }
  for (int w = 0; w < o.workers; ++w) {
    std::vector<std::string> args = {"--mode", "ps-sync",         "--coordinator", address,
                                     "--rank", std::to_string(w), "--log-level",   "info"};
    args.insert(args.end(), kTraining.begin(), kTraining.end());
    ASSIGN_OR_RETURN(
        int child, timeline.Spawn("worker " + std::to_string(w), command({}, worker_binary, args)));
    fleet.children.push_back(child);
    if (w == 0) fleet.worker0 = child;
  }
  // A server is ready (and says its pid) once the whole fleet has registered.
  ASSIGN_OR_RETURN(auto ready, Ready(timeline, fleet.pid));
  fleet.pid = ready.first;
  return fleet;
}

// One round's figures in milliseconds: detected, first_step, step_before.
using Round = std::map<std::string, double>;

// Runs a fleet, lets `server` die by `death` once worker 0 logged kStepsBeforeDeath steps, and
// times the failover.
Status MeasureRound(const FailoverBenchOptions& o, const std::string& launcher,
                    const Death& death, int server, Round* round) {
  Timeline timeline(int64_t{o.timeout_s} * 1000);
  ASSIGN_OR_RETURN(RunningFleet running, death.remote ? StartByHand(o, server, timeline)
                                                      : Launch(o, launcher, server, timeline));
  const int fleet = running.worker0;
  const int pid = running.pid;
  const std::string step_line = running.prefix + "step ";
  ASSIGN_OR_RETURN(auto before,
                   timeline.WaitForLineFrom(
                       fleet, step_line + std::to_string(kStepsBeforeDeath) + "/", 0));
  ASSIGN_OR_RETURN(auto earlier,
                   timeline.WaitForLineFrom(
                       fleet, step_line + std::to_string(kStepsBeforeDeath - 20) + "/", 0));
  (*round)["step_before_ms"] = MillisBetween(earlier.second.when, before.second.when) / 20;
  const size_t from = timeline.LineCount(fleet);
  const Clock::time_point died = Clock::now();
  if (kill(pid, death.signal) != 0) {
    return InternalError("could not signal server " + std::to_string(server) + " (pid " +
                         std::to_string(pid) + ")");
  }
  ASSIGN_OR_RETURN(auto noticed,
                   timeline.WaitForLineFrom(
                       fleet, running.prefix + "server " + std::to_string(server) + " failed (",
                       from));
  ASSIGN_OR_RETURN(auto stepped, timeline.WaitForLineFrom(fleet, step_line, noticed.first + 1));
  (*round)["detected_ms"] = MillisBetween(died, noticed.second.when);
  (*round)["first_step_ms"] = MillisBetween(died, stepped.second.when);
  // A stopped server takes no SIGTERM: it goes now, then the fleet.
  if (death.signal == SIGSTOP) kill(pid, SIGKILL);
  for (int child : running.children) RETURN_IF_ERROR(timeline.Signal(child, SIGTERM));
  for (int child : running.children) {
    (void)timeline.WaitForExit(child);  // 128 + SIGTERM (or the killed server): as asked
  }
  return OkStatus();
}

double Max(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

int RunFailoverBench(const FailoverBenchOptions& o) {
  if (o.replicas < 2 || o.replicas > o.servers) {
    std::cerr << "tessera-bench failover: --replicas must be in [2, --servers]\n";
    return 1;
  }
  StatusOr<std::string> launcher = FindRunfile("tools/tessera-launch");
  if (!launcher.ok()) {
    std::cerr << "tessera-bench failover: " << launcher.status() << "\n";
    return 1;
  }
  // The fleets started by hand share a key, as the launcher's children do.
  StatusOr<std::unique_ptr<ScratchDirectory>> scratch = ScratchDirectory::Create();
  Status shared = scratch.ok() ? ShareNewJobKey((*scratch)->path()) : scratch.status();
  if (!shared.ok()) {
    std::cerr << "tessera-bench failover: " << shared << "\n";
    return 1;
  }
  nlohmann::json report = {{"bench", "failover"},     {"rounds", o.rounds},
                           {"servers", o.servers},    {"workers", o.workers},
                           {"replicas", o.replicas},  {"deaths", nlohmann::json::array()}};
  for (const Death& death : kDeaths) {
    if (death.signal == SIGSTOP && o.no_hang) continue;
    std::map<std::string, std::vector<double>> samples;
    for (int r = 0; r < o.rounds; ++r) {
      Round round;
      const int server = r % o.servers;
      Status status = MeasureRound(o, *launcher, death, server, &round);
      if (!status.ok()) {
        std::cerr << "tessera-bench failover: " << death.name << " round " << r + 1
                  << " (server " << server << "): " << status << "\n";
        return 1;
      }
      for (const auto& [name, ms] : round) samples[name].push_back(ms);
      if (!o.json) {
        std::fprintf(stderr, "%s %d/%d: server %d, first step after %.0f ms\n", death.name,
                     r + 1, o.rounds, server, round["first_step_ms"]);
      }
    }
    const double p50 = Median(samples["first_step_ms"]);
    const double max = Max(samples["first_step_ms"]);
    report["deaths"].push_back({{"death", death.name},
                                {"what", death.what},
                                {"first_step_p50_ms", p50},
                                {"first_step_max_ms", max},
                                {"detected_p50_ms", Median(samples["detected_ms"])},
                                {"detected_max_ms", Max(samples["detected_ms"])},
                                {"step_before_p50_ms", Median(samples["step_before_ms"])},
                                {"goal_ms", death.goal_ms},
                                {"p50_to_goal", p50 / death.goal_ms},
                                {"max_to_goal", max / death.goal_ms},
                                {"met", max < death.goal_ms},
                                {"samples_ms", samples["first_step_ms"]}});
  }
  if (o.json) {
    std::cout << report.dump() << std::endl;
    return 0;
  }
  std::printf("failover: ps-sync, %d servers x %d workers, --replicas %d; from a server's death "
              "to worker 0's first step after it, %d deaths each (servers in turn)\n",
              o.servers, o.workers, o.replicas, o.rounds);
  std::printf("%-42s %9s %9s %11s %11s %9s %7s %7s\n", "death", "p50 ms", "max ms",
              "noticed p50", "noticed max", "step ms", "goal ms", "max/goal");
  for (const nlohmann::json& d : report["deaths"]) {
    std::printf("%-42s %9.0f %9.0f %11.0f %11.0f %9.2f %7.0f %7.2f\n",
                d["what"].get<std::string>().c_str(), d["first_step_p50_ms"].get<double>(),
                d["first_step_max_ms"].get<double>(), d["detected_p50_ms"].get<double>(),
                d["detected_max_ms"].get<double>(), d["step_before_p50_ms"].get<double>(),
                d["goal_ms"].get<double>(), d["max_to_goal"].get<double>());
  }
  std::printf("goals: a death seen at once (its closed connection) under 1 s, one seen by the "
              "default heartbeat timeout under 5 s (max/goal < 1 meets it)\n");
  return 0;
}

}  // namespace

BenchCommand AddFailoverBench(CLI::App* parent) {
  auto o = std::make_shared<FailoverBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "failover", "How long a replicated ps-sync job stops when a server dies (SIGKILL on this "
                  "host, SIGKILL on another host (a host name of its own: needs root) seen as a "
                  "closed connection, and SIGSTOP found by the heartbeat timeout): p50 and max "
                  "to the next step");
  app->add_option("--rounds", o->rounds, "Deaths of each kind, each in a fresh fleet")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--servers", o->servers, "Servers of each fleet")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app->add_option("--workers", o->workers, "Workers of each fleet")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_option("--replicas", o->replicas, "Copies of each key range (2 to --servers)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app->add_flag("--no-hang", o->no_hang,
                "Skip the SIGSTOP deaths (each waits out the heartbeat timeout)");
  app->add_option("--timeout-s", o->timeout_s, "Bound on each round")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app->add_flag("--json", o->json, "One JSON object instead of the table");
  return BenchCommand{app, [o] { return RunFailoverBench(*o); }};
}

}  // namespace tessera::tools
