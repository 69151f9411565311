// tessera-launch as a user runs it: real coordinator, servers and workers underneath.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 90000;

int CountLines(const std::string& text, const std::regex& pattern) {
  int count = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, pattern)) ++count;
  }
  return count;
}

TEST(LaunchTest, StartsTheFleetAnnouncesEveryChildAndSucceeds) {
  FleetHarness harness;
  auto launcher = harness.Start("launcher", "tools/tessera-launch", {"--servers", "2", "--workers", "2", "--mode", "smoke"});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  std::string output = harness.Output(*launcher);
  EXPECT_TRUE(exit->success()) << exit->Describe() << "\n" << output;
  // One line per child: coordinator, 2 servers, 2 workers.
  std::regex announce(R"(^\[launch\] (coordinator|server|worker) \d+ pid=\d+ metrics=http://127\.0\.0\.1:\d+/metrics$)");
  EXPECT_EQ(CountLines(output, announce), 5) << output;
  EXPECT_EQ(CountLines(output, std::regex(R"(^\[worker 1\] )")) > 0, true) << output;
  EXPECT_NE(output.find("all 2 workers finished"), std::string::npos) << output;
}

TEST(LaunchTest, FailingWorkerStopsTheFleetAndIsNamed) {
  FleetHarness harness;
  // --rounds 0 is rejected by the worker's flag parser: every worker exits with status 2.
  auto launcher = harness.Start("launcher", "tools/tessera-launch",
                                {"--servers", "1", "--workers", "2", "--mode", "smoke", "--", "--rounds",
                                 "0"});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  std::string output = harness.Output(*launcher);
  EXPECT_FALSE(exit->success()) << output;
  EXPECT_TRUE(std::regex_search(output, std::regex(R"(\[launch\] worker \d \(pid \d+\) exited with status 2)")))
      << output;
  EXPECT_NE(output.find("--rounds"), std::string::npos) << output;  // the worker's own reason
}

TEST(LaunchTest, InterruptStopsEveryProcessWithinSeconds) {
  FleetHarness harness;
  auto launcher = harness.Start("launcher", "tools/tessera-launch",
                                {"--servers", "1", "--workers", "2", "--mode", "smoke", "--grace", "5", "--",
                                 "--rounds", "100000", "--round-interval-ms", "20"});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  ASSERT_TRUE(harness.WaitForLine(*launcher, "all-reduce round 10 of", Deadline::AfterMillis(kRunMs)).ok())
      << harness.Output(*launcher);
  std::string output = harness.Output(*launcher);
  std::vector<int> pids;
  std::smatch match;
  std::regex pid_pattern(R"(\[launch\] \w+ \d+ pid=(\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pid_pattern);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  ASSERT_EQ(pids.size(), 4u) << output;

  auto interrupted_at = SteadyClock::now();
  ASSERT_TRUE(harness.Signal(*launcher, SIGINT).ok());
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(20000));
  ASSERT_TRUE(exit.ok()) << exit.status();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - interrupted_at);
  EXPECT_EQ(exit->status, 130) << exit->Describe() << "\n" << harness.Output(*launcher);
  EXPECT_LT(took.count(), 15000);
  for (int pid : pids) {
    EXPECT_NE(kill(pid, 0), 0) << "pid " << pid << " outlived the launcher";
  }
}

// The single-process trainer under the launcher: `tessera-launch --workers 1 --mode local`
// forwards the training flags and the worker's JSON summary reaches the launcher's output.
TEST(LaunchTest, LocalModeTrainsOneWorkerAndReportsJson) {
  FleetHarness harness;
  auto launcher = harness.Start("launcher", "tools/tessera-launch",
                                {"--workers", "1", "--mode", "local", "--", "--steps", "30",
                                 "--hidden", "32", "--train-samples", "2000", "--input-dim", "16",
                                 "--classes", "4", "--optimizer", "adam", "--lr", "0.01",
                                 "--device", "cpu", "--json"});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  std::string output = harness.Output(*launcher);
  EXPECT_TRUE(exit->success()) << exit->Describe() << "\n" << output;
  EXPECT_TRUE(std::regex_search(output, std::regex(R"(\[worker 0\] \{"batch_size":64,.*"mode":"local".*"steps":30)")))
      << output;
  EXPECT_NE(output.find("step 30/30 loss"), std::string::npos) << output;
}

// torchrun-style recovery: a worker killed mid-training makes the launcher stop the fleet and
// start it again (--max-restarts 1); the workers resume from the last checkpoint and end with
// bitwise the parameters of a run that was never interrupted.
TEST(LaunchTest, KilledWorkerIsRestartedFromTheCheckpointAndEndsLikeAnUninterruptedRun) {
  FleetHarness harness;
  // Small steps (about 1 ms in -c opt, 10-20 ms under TSan), many of them: the kill after the
  // checkpoint of step 100 lands with 400 steps still to go, and a run stays well inside kRunMs
  // under the sanitizers.
  const std::vector<std::string> training = {
      "--hidden", "128,128", "--input-dim", "64", "--steps", "500", "--batch-size", "32",
      "--optimizer", "adam", "--lr", "0.001", "--device", "cpu", "--log-every", "100",
      "--train-samples", "4000"};
  const std::string whole = TempPath("uninterrupted.bin"), restarted = TempPath("restarted.bin");
  std::vector<std::string> args = {"--servers", "1", "--workers", "2", "--mode", "ps-sync", "--"};
  args.insert(args.end(), training.begin(), training.end());
  std::vector<std::string> first = args;
  first.insert(first.end(), {"--save-params", whole});
  auto reference = harness.Start("uninterrupted", "tools/tessera-launch", first);
  ASSERT_TRUE(reference.ok());
  auto reference_exit = harness.WaitExit(*reference, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(reference_exit.ok() && reference_exit->success()) << harness.Output(*reference);

  std::vector<std::string> second = args;
  second.insert(second.begin(), {"--max-restarts", "1"});
  second.insert(second.end(), {"--checkpoint-dir", TempPath("restart_ckpt"), "--checkpoint-every",
                               "50", "--save-params", restarted});
  auto launcher = harness.Start("restarted", "tools/tessera-launch", second);
  ASSERT_TRUE(launcher.ok());
  ASSERT_TRUE(harness.WaitForLine(*launcher, "checkpoint of step 100 committed",
                                  Deadline::AfterMillis(kRunMs))
                  .ok())
      << harness.Output(*launcher);
  std::smatch match;
  const std::string output = harness.Output(*launcher);
  ASSERT_TRUE(std::regex_search(output, match, std::regex(R"(\[launch\] worker 1 pid=(\d+))")));
  ASSERT_EQ(kill(static_cast<pid_t>(std::stol(match[1])), SIGKILL), 0);
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string all = harness.Output(*launcher);
  EXPECT_TRUE(exit->success()) << all;
  EXPECT_NE(all.find("restart 1 of 1"), std::string::npos) << all;
  EXPECT_NE(all.find("resumed from the checkpoint of step"), std::string::npos) << all;
  const std::string a = ReadWholeFile(whole), b = ReadWholeFile(restarted);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the restarted run's parameters differ from the uninterrupted run's";
}

// ---------------------------------------------------------------------------------------------
// Multi-node launches (two launchers on loopback acting as nodes 0 and 1) and the long-running
// fleet that successive jobs attach to.

namespace multi {

const std::vector<std::string> kSmallJob = {
    "--steps", "20", "--batch-size", "16", "--optimizer", "adam", "--lr", "0.01", "--device",
    "cpu", "--log-every", "10", "--train-samples", "1280", "--hidden", "32", "--input-dim", "16",
    "--classes", "4", "--seed", "3"};

// HOST:PORT from the launcher's "[launch] coordinator address tcp://HOST:PORT" line.
std::string CoordinatorAddress(FleetHarness& harness, int launcher) {
  EXPECT_TRUE(
      harness.WaitForLine(launcher, "[launch] coordinator address", Deadline::AfterMillis(30000))
          .ok())
      << harness.Output(launcher);
  std::smatch match;
  const std::string output = harness.Output(launcher);
  if (!std::regex_search(output, match,
                         std::regex(R"(\[launch\] coordinator address tcp://(\S+):(\d+))"))) {
    return "";
  }
  return std::string(match[1]) + ":" + std::string(match[2]);
}

void ExpectSuccess(FleetHarness& harness, int id) {
  auto exit = harness.WaitExit(id, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(id);
  EXPECT_TRUE(exit->success()) << exit->Describe() << "\n" << harness.Output(id);
}

}  // namespace multi

// Node 0 hosts the coordinator (port 0: it prints the address for node 1); each node starts 2
// workers with global ranks 2R, 2R+1 and local ranks 0, 1. The 4-worker job ends with bitwise
// the parameters of the same job on one node.
TEST(LaunchTest, TwoNodesTrainOneAllReduceJob) {
  using namespace multi;
  FleetHarness harness;
  const std::string single = TempPath("one_node.bin"), nodes = TempPath("two_nodes.bin");
  auto reference = harness.Start(
      "one node", "tools/tessera-launch",
      Concat({"--workers", "4", "--mode", "allreduce", "--"},
             Concat(kSmallJob, {"--save-params", single})));
  ASSERT_TRUE(reference.ok());
  ExpectSuccess(harness, *reference);

  const std::vector<std::string> node = {"--nnodes", "2", "--nproc-per-node", "2", "--mode",
                                         "allreduce"};
  auto node0 = harness.Start(
      "node 0", "tools/tessera-launch",
      Concat(node, Concat({"--node-rank", "0", "--coordinator", "127.0.0.1:0", "--"},
                          Concat(kSmallJob, {"--save-params", nodes}))));
  ASSERT_TRUE(node0.ok());
  const std::string address = CoordinatorAddress(harness, *node0);
  ASSERT_FALSE(address.empty()) << harness.Output(*node0);
  auto node1 = harness.Start(
      "node 1", "tools/tessera-launch",
      Concat(node, Concat({"--node-rank", "1", "--coordinator", address, "--"}, kSmallJob)));
  ASSERT_TRUE(node1.ok());
  ExpectSuccess(harness, *node1);
  ExpectSuccess(harness, *node0);
  const std::string out0 = harness.Output(*node0), out1 = harness.Output(*node1);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& out = rank < 2 ? out0 : out1;
    const std::string prefix = "[worker " + std::to_string(rank) + "] ";
    EXPECT_NE(out.find("worker " + std::to_string(rank) + " of 4"), std::string::npos) << out;
    EXPECT_TRUE(std::regex_search(
        out, std::regex("\\[worker " + std::to_string(rank) + "\\] .*config: .*--local-rank=" +
                        std::to_string(rank % 2) + " .*\\(flags\\)")))
        << out;
  }
  EXPECT_EQ(out1.find("[coordinator"), std::string::npos) << "node 1 started a coordinator";
  EXPECT_NE(out0.find("every node's workers have left"), std::string::npos) << out0;
  const std::string a = ReadWholeFile(single), b = ReadWholeFile(nodes);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "two nodes' parameters differ from one node's";
}

// Worker 3 (node 1) is killed mid-training: node 1's launcher names it; the coordinator tells
// node 0's workers, which fail naming worker 3, and node 0's launcher fails too.
TEST(LaunchTest, AWorkerFailingOnOneNodeFailsBothLaunchersNamingIt) {
  using namespace multi;
  FleetHarness harness;
  const std::vector<std::string> node = {"--nnodes", "2", "--nproc-per-node", "2", "--mode",
                                         "allreduce", "--grace", "2"};
  const std::vector<std::string> training = {
      "--", "--steps", "1000000", "--batch-size", "16", "--device", "cpu", "--log-every", "50",
      "--train-samples", "1280", "--hidden", "32", "--input-dim", "16", "--classes", "4"};
  auto node0 = harness.Start(
      "node 0", "tools/tessera-launch",
      Concat(node, Concat({"--node-rank", "0", "--coordinator", "127.0.0.1:0"}, training)));
  ASSERT_TRUE(node0.ok());
  const std::string address = CoordinatorAddress(harness, *node0);
  ASSERT_FALSE(address.empty()) << harness.Output(*node0);
  auto node1 = harness.Start(
      "node 1", "tools/tessera-launch",
      Concat(node, Concat({"--node-rank", "1", "--coordinator", address}, training)));
  ASSERT_TRUE(node1.ok());
  ASSERT_TRUE(harness.WaitForLine(*node1, "step 100/", Deadline::AfterMillis(kRunMs)).ok())
      << harness.Output(*node1);
  std::smatch match;
  const std::string started = harness.Output(*node1);
  ASSERT_TRUE(std::regex_search(started, match, std::regex(R"(\[launch\] worker 3 pid=(\d+))")))
      << started;
  ASSERT_EQ(kill(static_cast<pid_t>(std::stol(match[1])), SIGKILL), 0);

  auto exit1 = harness.WaitExit(*node1, Deadline::AfterMillis(30000));
  ASSERT_TRUE(exit1.ok()) << exit1.status();
  EXPECT_EQ(exit1->status, 1) << exit1->Describe();
  const std::string out1 = harness.Output(*node1);
  EXPECT_TRUE(std::regex_search(
      out1, std::regex(R"(\[launch\] worker 3 \(pid \d+\) killed by signal 9 \(SIGKILL\); stopped)")))
      << out1;
  // The coordinator notices the silence within its heartbeat timeout (10 s).
  auto exit0 = harness.WaitExit(*node0, Deadline::AfterMillis(40000));
  ASSERT_TRUE(exit0.ok()) << exit0.status() << "\n" << harness.Output(*node0);
  EXPECT_EQ(exit0->status, 1) << exit0->Describe();
  const std::string out0 = harness.Output(*node0);
  EXPECT_TRUE(std::regex_search(out0, std::regex(R"(\[launch\] (worker [01]|coordinator) \(pid \d+\) exited with status 1)")))
      << out0;
  // Node 0's workers name worker 3: from the coordinator's failure notice ("worker 3 ...
  // failed"), or sooner from their ring link to it ("failed: ... ring link from worker 3 ...").
  EXPECT_TRUE(std::regex_search(
      out0, std::regex(R"(\[worker [01]\] .*(worker 3 .*failed|failed: .*worker 3))")))
      << out0;
}

// Two launchers whose workers build different models (issue 19's first finding): in every
// mode each worker names the first differing tensor or quotes the rank that did, and every
// process exits within 2 s of the first error, not a heartbeat timeout (10 s) later.
TEST(LaunchTest, AModelMismatchAcrossLaunchersStopsEveryoneAtOnceNamingIt) {
  using namespace multi;
  constexpr int64_t kStopBoundMs = 2000;
  for (const std::string mode : {"ps-sync", "ps-async", "allreduce", "zero2"}) {
    SCOPED_TRACE(mode);
    FleetHarness harness;
    const bool ps = mode.rfind("ps-", 0) == 0;
    const std::vector<std::string> node = {"--nnodes", "2", "--nproc-per-node", "1", "--mode",
                                           mode};
    // Steps enough that no worker can finish first: in ps-async worker 0 trains without
    // waiting for worker 1, and 20 steps (18 ms) once ended before worker 1's first pull, which
    // left worker 0 nothing to be told. Every mode stops at the mismatch.
    const std::vector<std::string> training = {
        "--", "--steps", "100000", "--batch-size", "16", "--device", "cpu", "--train-samples",
        "320", "--input-dim", "16", "--classes", "4", "--hidden"};
    auto node0 = harness.Start(
        "node 0", "tools/tessera-launch",
        Concat(node, Concat(ps ? std::vector<std::string>{"--servers", "1"}
                               : std::vector<std::string>{},
                            Concat({"--node-rank", "0", "--coordinator", "127.0.0.1:0"},
                                   Concat(training, {"32,32"})))));
    ASSERT_TRUE(node0.ok());
    const std::string address = CoordinatorAddress(harness, *node0);
    ASSERT_FALSE(address.empty()) << harness.Output(*node0);
    auto node1 = harness.Start(
        "node 1", "tools/tessera-launch",
        Concat(node, Concat({"--node-rank", "1", "--coordinator", address},
                            Concat(training, {"64,32"}))));
    ASSERT_TRUE(node1.ok());
    for (int id : {*node0, *node1}) {
      auto exit = harness.WaitExit(id, Deadline::AfterMillis(kRunMs));
      ASSERT_TRUE(exit.ok()) << exit.status();
      EXPECT_EQ(exit->status, 1) << exit->Describe() << "\n" << harness.Output(id);
    }
    const std::string out = harness.Output(*node0) + "\n" + harness.Output(*node1);
    for (int rank = 0; rank < 2; ++rank) {
      // Its own finding ("... differs ... 'mlp.0.weight' [32, 16] ...") or the other's, quoted.
      EXPECT_TRUE(std::regex_search(
          out, std::regex("\\[worker " + std::to_string(rank) +
                          "\\] .* E .*differs.*mlp\\.0\\.weight.*\\[(32|64), 16\\]")))
          << out;
    }
    EXPECT_EQ(out.find("no heartbeat"), std::string::npos) << out;
    std::optional<SteadyClock::time_point> first_error;
    for (int id : {*node0, *node1}) {
      auto at = harness.LineTime(id, " E ");
      if (at.ok() && (!first_error || *at < *first_error)) first_error = *at;
    }
    ASSERT_TRUE(first_error.has_value()) << out;
    for (int id : {*node0, *node1}) {
      EXPECT_LT(*harness.ExitTime(id) - *first_error, std::chrono::milliseconds(kStopBoundMs))
          << harness.Output(id);
    }
  }
}

// A long-running fleet (2 servers, --workers 0) serves two jobs one after the other: the first
// attaches with tessera-launch --attach, the second is two plain tessera-worker processes
// reusing ranks 0 and 1. Both end with bitwise the parameters of the same job on a fleet of
// its own (each job starts afresh: a new job token), and the fleet never saw a failure.
TEST(LaunchTest, LongRunningFleetServesSuccessiveJobs) {
  using namespace multi;
  FleetHarness harness;
  const std::string own = TempPath("own_fleet.bin"), first = TempPath("first_job.bin"),
                    second = TempPath("second_job.bin");
  auto reference = harness.Start(
      "own fleet", "tools/tessera-launch",
      Concat({"--servers", "2", "--workers", "2", "--mode", "ps-sync", "--"},
             Concat(kSmallJob, {"--save-params", own})));
  ASSERT_TRUE(reference.ok());
  ExpectSuccess(harness, *reference);

  auto fleet = harness.Start("fleet", "tools/tessera-launch", {"--servers", "2", "--workers", "0"});
  ASSERT_TRUE(fleet.ok());
  const std::string address = CoordinatorAddress(harness, *fleet);
  ASSERT_FALSE(address.empty()) << harness.Output(*fleet);
  // Attach once both servers are ready, so that this test is about successive jobs. (A job
  // attaching earlier waits for servers that registered but do not serve yet:
  // ps_server_starting_test.)
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(harness.WaitForLine(*fleet, "[launch] server " + std::to_string(s) + " pid=",
                                    Deadline::AfterMillis(30000))
                    .ok())
        << harness.Output(*fleet);
  }

  auto job1 = harness.Start(
      "job 1", "tools/tessera-launch",
      Concat({"--attach", address, "--workers", "2", "--mode", "ps-sync", "--"},
             Concat(kSmallJob, {"--save-params", first})));
  ASSERT_TRUE(job1.ok());
  ExpectSuccess(harness, *job1);
  ASSERT_TRUE(harness.WaitForLine(*fleet, "job 1 is over (2 workers left, 0 failed)",
                                  Deadline::AfterMillis(30000))
                  .ok())
      << harness.Output(*fleet);

  std::vector<int> workers;
  for (int rank = 0; rank < 2; ++rank) {
    auto id = harness.Start(
        "job 2 worker " + std::to_string(rank), "worker/tessera-worker",
        Concat({"--coordinator", address, "--rank", std::to_string(rank), "--num-workers", "2",
                "--mode", "ps-sync", "--save-params", second},
               kSmallJob));
    ASSERT_TRUE(id.ok());
    workers.push_back(*id);
  }
  for (int id : workers) ExpectSuccess(harness, id);
  ASSERT_TRUE(harness.WaitForLine(*fleet, "job 2 is over (2 workers left, 0 failed)",
                                  Deadline::AfterMillis(30000))
                  .ok())
      << harness.Output(*fleet);

  ASSERT_TRUE(harness.Signal(*fleet, SIGINT).ok());
  auto exit = harness.WaitExit(*fleet, Deadline::AfterMillis(30000));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->status, 130) << exit->Describe();
  const std::string fleet_output = harness.Output(*fleet);
  EXPECT_EQ(fleet_output.find("failed:"), std::string::npos) << fleet_output;
  EXPECT_EQ(CountLines(fleet_output, std::regex(R"(^\[server \d\] .*a new job replaces the previous one)")), 2)
      << fleet_output;
  const std::string expected = ReadWholeFile(own);
  EXPECT_FALSE(expected.empty());
  EXPECT_TRUE(ReadWholeFile(first) == expected) << "the first attached job differs";
  EXPECT_TRUE(ReadWholeFile(second) == expected) << "the second attached job differs";
}

// Bad multi-node flags are rejected with the flag's name.
TEST(LaunchTest, MultiNodeFlagsAreValidated) {
  FleetHarness harness;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nnodes", "2", "--nproc-per-node", "2"}, "needs --coordinator HOST:PORT"},
      {{"--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "--coordinator",
        "127.0.0.1:1"},
       "--node-rank must be in [0, --nnodes=2)"},
      {{"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--coordinator",
        "127.0.0.1:0"},
       "port 0 cannot be connected to"},
      {{"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--servers", "1",
        "--coordinator", "127.0.0.1:5"},
       "node 0 starts all the servers"},
      {{"--attach", "127.0.0.1:5", "--servers", "1"}, "drop --servers"},
      {{"--attach", "127.0.0.1:5", "--max-restarts", "1"}, "not with --nnodes > 1 or --attach"},
  };
  for (const auto& [args, message] : cases) {
    auto id = harness.Start("launcher", "tools/tessera-launch", args);
    ASSERT_TRUE(id.ok());
    auto exit = harness.WaitExit(*id, Deadline::AfterMillis(10000));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(exit->status, 2) << harness.Output(*id);
    EXPECT_NE(harness.Output(*id).find(message), std::string::npos) << harness.Output(*id);
  }
}

}  // namespace
}  // namespace tessera::testing
