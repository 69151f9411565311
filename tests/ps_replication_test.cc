// Replicated key ranges (issue 16, items 1 and 2): tessera-launch --replicas 2 with 3 servers
// and 3 workers, and a server SIGKILLed mid-training. The workers share memory with every copy
// of the ranges (all on one host), and some seeds run over the sockets instead.
//
// What must happen: every range has a second copy on the next server, every push reaches both,
// so when one server dies its ranges' other replicas answer for it, the workers carry on, and
// the job ends with bitwise the parameters of an undisturbed run (ps-sync, SGD with momentum,
// the dense mlp and the ctr model with embedding tables). In ps-async the job completes and no
// acknowledged update is lost: the surviving servers' update counters hold every push of every
// worker to every range they hold. When both replicas of a range die, the job stops at once,
// naming the range.
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/messages/fleet_view.h"
#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 180000;
constexpr int kSteps = 400;
constexpr int kWorkers = 3;
constexpr int kServers = 3;
// The join tests' jobs: long enough that the second kill lands mid-job (ExpectMidJob).
constexpr int kJoinSteps = 300;

// 3 workers x 16 samples, SGD with momentum, many short steps (the kill lands mid-job, under
// the sanitizers too). Dense chunks of 100 floats, so every server holds several.
std::vector<std::string> TrainingFlags(const std::string& model, int steps = kSteps) {
  std::vector<std::string> flags = {"--optimizer", "momentum", "--lr", "0.1", "--device", "cpu",
                                    "--train-samples", "1920", "--batch-size", "16",
                                    "--ps-chunk-elements", "100", "--seed", "3", "--log-every",
                                    "10", "--steps", std::to_string(steps)};
  if (model == "mlp") {
    flags.insert(flags.end(), {"--hidden", "32,16", "--input-dim", "16", "--classes", "4"});
  } else {
    flags.insert(flags.end(), {"--model", "ctr", "--dataset", "synthetic-ctr", "--hidden", "16",
                               "--embedding-dim", "4"});
  }
  return flags;
}

std::vector<std::string> Fleet(const std::string& mode, int replicas,
                               const std::vector<std::string>& more = {}) {
  std::vector<std::string> fleet = {"--servers", std::to_string(kServers), "--workers",
                                    std::to_string(kWorkers), "--mode", mode, "--replicas",
                                    std::to_string(replicas)};
  fleet.insert(fleet.end(), more.begin(), more.end());
  fleet.push_back("--");
  return fleet;
}

// The pid the launcher announced for `role` `rank` ("[launch] server 1 pid=123 metrics=..."),
// or -1.
int AnnouncedPid(const std::string& output, const std::string& role, int rank) {
  std::smatch match;
  const std::regex line("\\[launch\\] " + role + " " + std::to_string(rank) + " pid=(\\d+)");
  return std::regex_search(output, match, line) ? std::stoi(match[1]) : -1;
}

// Starts the launcher with `args` and waits until worker 0 logged step `step`.
StatusOr<int> StartAndReach(FleetHarness& harness, const std::string& label,
                            const std::vector<std::string>& args, int step) {
  StatusOr<int> launcher = harness.Start(label, "tools/tessera-launch", args);
  if (!launcher.ok()) return launcher;
  Status reached = harness.WaitForLine(*launcher, "worker 0 | step " + std::to_string(step) + "/",
                                       Deadline::AfterMillis(kRunMs));
  if (!reached.ok()) return reached.WithContext(harness.Output(*launcher));
  return launcher;
}

// SIGKILLs server `server` of the fleet `launcher` runs.
void KillServer(FleetHarness& harness, int launcher, int server) {
  const int pid = AnnouncedPid(harness.Output(launcher), "server", server);
  ASSERT_GT(pid, 0) << harness.Output(launcher);
  ASSERT_EQ(kill(pid, SIGKILL), 0) << "server " << server << " (pid " << pid << ")";
}

// Which server a seed kills, and after which step of worker 0's log.
struct Kill {
  int server = 0;
  int step = 0;
};

Kill KillOf(int seed) {
  std::mt19937 random(static_cast<uint32_t>(seed));
  Kill kill;
  kill.server = static_cast<int>(random() % kServers);
  kill.step = 10 * (2 + static_cast<int>(random() % 19));  // 20..200 of 400
  return kill;
}

// Runs the job with `flags`, kills the seed's server mid-training, and expects the job to
// complete without it; the launcher's output.
std::string RunWithAKill(FleetHarness& harness, const std::string& mode,
                         const std::vector<std::string>& flags, int seed,
                         const std::vector<std::string>& fleet_flags = {}) {
  const Kill kill = KillOf(seed);
  std::cout << "seed " << seed << ": SIGKILL of server " << kill.server << " after step "
            << kill.step << std::endl;
  StatusOr<int> launcher = StartAndReach(harness, "seed " + std::to_string(seed),
                                         Concat(Fleet(mode, 2, fleet_flags), flags), kill.step);
  EXPECT_TRUE(launcher.ok()) << launcher.status();
  if (!launcher.ok()) return "";
  KillServer(harness, *launcher, kill.server);
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  const std::string output = harness.Output(*launcher);
  EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << output;
  EXPECT_TRUE(exit.ok() && exit->success()) << "seed " << seed << "\n" << output;
  const std::string server = "server " + std::to_string(kill.server);
  EXPECT_NE(output.find(server + " (pid "), std::string::npos) << output;
  EXPECT_NE(output.find("killed by signal 9 (SIGKILL): its key ranges go on with their other "
                        "replicas (--replicas 2)"),
            std::string::npos)
      << output;
  // The workers carried on without it, mid-job (they said so before they finished).
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_NE(output.find("worker " + std::to_string(w) + " | " + server +
                          " failed (its process"),
              std::string::npos)
        << "worker " << w << "\n" << output;
  }
  return output;
}

void ExpectSameParams(const std::string& expected, const std::string& actual,
                      const std::string& what) {
  auto a = worker::LoadParams(expected);
  auto b = worker::LoadParams(actual);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->values.size(), b->values.size());
  EXPECT_TRUE(a->values == b->values) << what << " ends elsewhere than the undisturbed run";
}

void RunToSuccess(FleetHarness& harness, const std::string& label,
                  const std::vector<std::string>& args) {
  Status ran = harness.RunToSuccess(label, "tools/tessera-launch", args, kRunMs);
  ASSERT_TRUE(ran.ok()) << ran;
}

// ps-sync with one copy of each range and nobody killed: what every killed run must end with.
std::string Undisturbed(const std::string& model, int steps = kSteps) {
  const std::string path = TempPath("ps_replication_undisturbed_" + model + "_" +
                                    std::to_string(steps) + ".bin");
  FleetHarness harness;
  RunToSuccess(harness, "undisturbed " + model,
               Concat(Fleet("ps-sync", 1),
                      Concat(TrainingFlags(model, steps), {"--save-params", path})));
  return path;
}

// The chunks' path in `output`: every worker on this host shares a region with every copy of
// every range (the default), or, with `--ps-shared-memory false` among the worker flags,
// none does and the chunks cross the sockets (as they do between hosts).
void ExpectChunksPath(const std::string& output, const std::vector<std::string>& flags,
                      int replicas = 2) {
  const bool sockets =
      std::find(flags.begin(), flags.end(), "--ps-shared-memory=false") != flags.end();
  const std::string copies = std::to_string(kServers * replicas);
  for (int w = 0; w < kWorkers; ++w) {
    const std::string shared = "worker " + std::to_string(w) + " | " + copies + " of " + copies +
                               " copies of the key ranges share memory with this worker";
    EXPECT_EQ(output.find(shared) == std::string::npos, sockets)
        << (sockets ? "over the sockets" : "in shared memory") << ", worker " << w << "\n"
        << output;
  }
}

// The seeds a test runs: `seeds` (the chunks in shared memory) and `sockets_seeds`; under a
// sanitizer only the first of `seeds` and the sockets seeds (each kill point is the same code
// path; the default configuration runs them all).
std::vector<int> SeedsToRun(const std::vector<int>& seeds, const std::vector<int>& sockets_seeds) {
  std::vector<int> run = seeds;
  if (UnderSanitizer() && run.size() > 1) run.resize(1);
  run.insert(run.end(), sockets_seeds.begin(), sockets_seeds.end());
  return run;
}

// ps-sync with `model`: for each seed a server killed at a random step, and the job ends with
// the parameters of the undisturbed run, bitwise. The chunks pass through shared memory, or
// for `sockets_seeds` over the sockets (the backup then gets the forwarded steps' bytes).
void ExpectKillsChangeNothing(const std::string& model, const std::vector<int>& seeds,
                              const std::vector<int>& sockets_seeds = {}) {
  const std::string undisturbed = Undisturbed(model);
  for (int seed : SeedsToRun(seeds, sockets_seeds)) {
    FleetHarness harness;
    const std::string params =
        TempPath("ps_replication_" + model + "_" + std::to_string(seed) + ".bin");
    std::vector<std::string> flags = Concat(TrainingFlags(model), {"--save-params", params});
    if (std::find(sockets_seeds.begin(), sockets_seeds.end(), seed) != sockets_seeds.end()) {
      flags.push_back("--ps-shared-memory=false");
    }
    ExpectChunksPath(RunWithAKill(harness, "ps-sync", flags, seed), flags);
    ExpectSameParams(undisturbed, params, model + ", seed " + std::to_string(seed));
  }
}

TEST(PsReplicationTest, SyncMlpLosesNothingWhenAServerIsKilledAtARandomStep) {
  ExpectKillsChangeNothing("mlp", {1, 2}, /*sockets_seeds=*/{3});
}

TEST(PsReplicationTest, SyncCtrWithEmbeddingTablesLosesNothingWhenAServerIsKilled) {
  TESSERA_ONLY_UNDER_SANITIZER("asan");
  ExpectKillsChangeNothing("ctr", {4, 5});
}

// Checkpoints of a replicated job are one file per range, written by the range's primary
// (after the failover, range 1's by server 2), and loaded onto every replica: a job killed in
// a server and checkpointed every 50 steps resumes from step 200, with two copies or one, and
// ends with bitwise the parameters of the undisturbed run.
TEST(PsReplicationTest, CheckpointsWrittenAfterAFailoverResumeBitwise) {
  TESSERA_ONLY_UNDER_SANITIZER("asan");
  const std::string undisturbed = Undisturbed("mlp");
  const std::string dir = TempPath("ps_replication_checkpoints");
  const std::vector<std::string> flags =
      Concat(TrainingFlags("mlp"), {"--checkpoint-dir", dir, "--checkpoint-every", "50"});
  {
    FleetHarness harness;
    StatusOr<int> launcher =
        StartAndReach(harness, "checkpointed", Concat(Fleet("ps-sync", 2), flags), /*step=*/20);
    ASSERT_TRUE(launcher.ok()) << launcher.status();
    KillServer(harness, *launcher, 1);
    auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok() && exit->success()) << harness.Output(*launcher);
    const std::string output = harness.Output(*launcher);
    EXPECT_NE(output.find("its key ranges go on with their other replicas"), std::string::npos)
        << output;
    ASSERT_NE(output.find("checkpoint of step 200 committed"), std::string::npos) << output;
  }
  for (int replicas : {2, 1}) {
    FleetHarness harness;
    const std::string params =
        TempPath("ps_replication_resumed_" + std::to_string(replicas) + ".bin");
    auto resumed = harness.Start(
        "resumed", "tools/tessera-launch",
        Concat(Fleet("ps-sync", replicas),
               Concat(flags, {"--resume-step", "200", "--save-params", params})));
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    auto exit = harness.WaitExit(*resumed, Deadline::AfterMillis(kRunMs));
    const std::string output = harness.Output(*resumed);
    ASSERT_TRUE(exit.ok() && exit->success()) << output;
    EXPECT_NE(output.find("resumed from the checkpoint of step 200"), std::string::npos) << output;
    ExpectSameParams(undisturbed, params, "resumed with --replicas " + std::to_string(replicas));
  }
}

// What the launcher announced for `role` `rank` ("[launch] server 1 pid=123 metrics=URL"): URL.
std::string AnnouncedMetrics(const std::string& output, const std::string& role, int rank) {
  std::smatch match;
  const std::regex line("\\[launch\\] " + role + " " + std::to_string(rank) +
                        " pid=\\d+ metrics=(\\S+)");
  return std::regex_search(output, match, line) ? std::string(match[1]) : "";
}

// Whether every worker renewed its shared regions after a server joined (the line "ranges ...:
// M of N copies, a server taken in among them, share a fresh region with this worker"), and
// every copy it offered was mapped but those a renewal straddling server `killed`'s failure
// left out. Those the worker names one by one ("range R's copy on server S shares no region
// with this worker: the server failed meanwhile"), after it heard of the failure; each must be
// on server `killed`, which must hold a copy of range R by the layout (RangeReplicaServer with
// `replicas` copies), and together they must be exactly the N - M copies missing. A copy on
// any other server going unmapped, or one missing without its line, fails. (With 3 servers and
// 3 copies the killed server holds a copy of every range, so up to 3 of 9 may be left out.)
::testing::AssertionResult RegionsRenewedAsTheLayoutAllows(const std::string& output,
                                                           int replicas, int killed) {
  for (int w = 0; w < kWorkers; ++w) {
    const std::string worker = "worker " + std::to_string(w) + " | ";
    const std::string worker_re = "worker " + std::to_string(w) + R"( \| )";
    const std::regex renewed(worker_re +
                             R"(ranges? [^\n]*: (\d+) of (\d+) copies, a server taken in )"
                             R"(among them, share a fresh region with this worker)");
    std::smatch match;
    if (!std::regex_search(output, match, renewed)) {
      return ::testing::AssertionFailure() << worker << "renewed no shared region";
    }
    const int mapped = std::stoi(match[1]);
    const int offered = std::stoi(match[2]);
    const auto renewal = output.begin() + match.position(0);
    const size_t heard = output.find(worker + "server " + std::to_string(killed) + " failed");
    const std::regex left_out(worker_re +
                              R"(range (\d+)'s copy on server (\d+) shares no region with )"
                              R"(this worker: the server failed meanwhile)");
    int named = 0;
    for (auto it = std::sregex_iterator(output.begin(), renewal, left_out);
         it != std::sregex_iterator(); ++it) {
      const int range = std::stoi((*it)[1]);
      const int server = std::stoi((*it)[2]);
      if (server != killed) {
        return ::testing::AssertionFailure()
               << worker << "range " << range << "'s copy on server " << server
               << " was left out of the renewal, but only server " << killed << " failed";
      }
      bool holds = false;
      for (int k = 0; k < replicas; ++k) holds |= RangeReplicaServer(range, k, kServers) == killed;
      if (!holds) {
        return ::testing::AssertionFailure()
               << worker << "server " << killed << " holds no copy of range " << range
               << " with " << replicas << " copies of " << kServers << " ranges";
      }
      if (heard == std::string::npos || static_cast<ptrdiff_t>(heard) > it->position(0)) {
        return ::testing::AssertionFailure()
               << worker << "left range " << range << "'s copy out before it heard that server "
               << killed << " failed";
      }
      ++named;
    }
    if (offered - mapped != named) {
      return ::testing::AssertionFailure()
             << worker << mapped << " of " << offered << " copies mapped, but " << named
             << " named as lost with server " << killed;
    }
  }
  return ::testing::AssertionSuccess();
}

void ExpectRegionsRenewed(const std::string& output, int replicas) {
  EXPECT_TRUE(RegionsRenewedAsTheLayoutAllows(output, replicas, /*killed=*/2)) << output;
}

// The check above, on the lines three workers would log: a renewal that straddled server 2's
// death may leave out exactly the copies server 2 holds, each named; nothing else.
TEST(PsReplicationTest, ARenewalMayLeaveOutOnlyTheKilledServersCopies) {
  auto fleet = [](const std::string& worker0) {
    std::string output;
    for (int w = 1; w < kWorkers; ++w) {
      output += "[worker " + std::to_string(w) + "] I worker " + std::to_string(w) +
                " | ranges 0, 1 and 2: 9 of 9 copies, a server taken in among them, share a "
                "fresh region with this worker\n";
    }
    return output + worker0;
  };
  const std::string heard = "[worker 0] I worker 0 | server 2 failed (its process exited)\n";
  auto left_out = [](int range, int server) {
    return "[worker 0] I worker 0 | range " + std::to_string(range) + "'s copy on server " +
           std::to_string(server) +
           " shares no region with this worker: the server failed meanwhile\n";
  };
  auto renewal = [](int mapped) {
    return "[worker 0] I worker 0 | ranges 0, 1 and 2: " + std::to_string(mapped) +
           " of 9 copies, a server taken in among them, share a fresh region with this worker\n";
  };
  // Three copies: server 2 holds one of every range, so all three may be left out.
  EXPECT_TRUE(RegionsRenewedAsTheLayoutAllows(fleet(renewal(9)), 3, 2));
  EXPECT_TRUE(RegionsRenewedAsTheLayoutAllows(
      fleet(heard + left_out(0, 2) + left_out(1, 2) + left_out(2, 2) + renewal(6)), 3, 2));
  // A copy on a server that did not fail, a copy missing without its line, a line before the
  // failure was heard of: each fails.
  EXPECT_FALSE(RegionsRenewedAsTheLayoutAllows(fleet(heard + left_out(0, 0) + renewal(8)), 3, 2));
  EXPECT_FALSE(RegionsRenewedAsTheLayoutAllows(fleet(heard + left_out(0, 2) + renewal(7)), 3, 2));
  EXPECT_FALSE(RegionsRenewedAsTheLayoutAllows(fleet(left_out(0, 2) + heard + renewal(8)), 3, 2));
  // Two copies: server 2 holds ranges 1 and 2 (copies (r + k) % 3), never range 0.
  EXPECT_TRUE(RegionsRenewedAsTheLayoutAllows(fleet(heard + left_out(2, 2) + renewal(8)), 2, 2));
  EXPECT_FALSE(RegionsRenewedAsTheLayoutAllows(fleet(heard + left_out(0, 2) + renewal(8)), 2, 2));
  // A worker that renewed nothing.
  EXPECT_FALSE(RegionsRenewedAsTheLayoutAllows(renewal(9), 3, 2));
}

double Scrape(const std::string& url, const std::string& sample);
int LastLoggedStep(const std::string& output, int worker, const std::string& before);

// The workers, paused before the join tests' second kill, have steps left to run after it:
// worker 0's last logged step in `output` is well short of the job's end.
void ExpectMidJob(const std::string& output) {
  const int step = LastLoggedStep(output, /*worker=*/0, /*before=*/"");
  std::cout << "worker 0 had logged step " << step << " of " << kJoinSteps
            << " before the second kill" << std::endl;
  EXPECT_LT(step, kJoinSteps - 100) << output;
}

// Stops (SIGSTOP) or continues (SIGCONT) the fleet's workers, so the test's steps land between
// two of their training steps whatever the machine's speed.
void SignalWorkers(FleetHarness& harness, int launcher, int signal) {
  for (int w = 0; w < kWorkers; ++w) {
    const int pid = AnnouncedPid(harness.Output(launcher), "worker", w);
    ASSERT_GT(pid, 0) << harness.Output(launcher);
    ASSERT_EQ(kill(pid, signal), 0) << "worker " << w;
  }
}

// The coordinator address the launcher gives its children, from its output; empty if none.
std::string CoordinatorOf(const std::string& output) {
  std::smatch match;
  return std::regex_search(output, match, std::regex("children get --coordinator (\\S+)\\)"))
             ? match[1].str()
             : std::string();
}

// SIGKILLs server `server` and waits until the launcher reports its death.
void KillAndWait(FleetHarness& harness, int launcher, int server) {
  const int pid = AnnouncedPid(harness.Output(launcher), "server", server);
  ASSERT_NO_FATAL_FAILURE(KillServer(harness, launcher, server));
  ASSERT_TRUE(harness
                  .WaitForLine(launcher, "failed: its process (pid " + std::to_string(pid),
                               Deadline::AfterMillis(kRunMs))
                  .ok())
      << harness.Output(launcher);
}

// Starts tessera-launch --add-servers 1 attached to `coordinator`, and waits until the fleet's
// launcher says server 1 joined.
StatusOr<int> AddServer(FleetHarness& harness, int launcher, const std::string& coordinator) {
  StatusOr<int> added = harness.Start(
      "add-servers", "tools/tessera-launch",
      {"--attach", coordinator, "--add-servers", "1", "--heartbeat-timeout-ms", "120000"});
  if (!added.ok()) return added;
  Status joined = harness.WaitForLine(launcher, "[launch] server 1 joined the fleet",
                                      Deadline::AfterMillis(kRunMs));
  if (!joined.ok()) {
    return joined.WithContext(harness.Output(launcher) + harness.Output(*added));
  }
  return added;
}

// Item 3: server 1 is killed, a server started with tessera-launch --add-servers joins in its
// place, and the workers copy its two ranges to it at a step they agree on: every range has
// its 2 copies again (the dashboard's view of the ranges, the new server's
// tessera_ps_key_ranges, worker 0's tessera_ps_client_range_copies_total). Then server 2 (range
// 1's other copy, and range 2's) is killed too, and nothing is lost: the job ends bitwise as
// the undisturbed run. The workers are paused (SIGSTOP) around each kill and the join, so that
// each lands mid-job on a fast machine and a slow (sanitized) one alike; the heartbeat timeout
// is longer than any pause.
TEST(PsReplicationTest, AJoiningServerRestoresTheCopiesAndALaterKillLosesNothing) {
  const std::string undisturbed = Undisturbed("mlp", kJoinSteps);
  FleetHarness harness;
  const std::string params = TempPath("ps_replication_joined.bin");
  StatusOr<int> launcher = StartAndReach(
      harness, "joined",
      Concat(Fleet("ps-sync", 2, {"--heartbeat-timeout-ms", "120000"}),
             Concat(TrainingFlags("mlp", kJoinSteps),
                                         {"--save-params", params})),
      /*step=*/20);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  const std::string started = harness.Output(*launcher);
  const std::string coordinator = CoordinatorOf(started);
  ASSERT_FALSE(coordinator.empty()) << started;
  const std::string data_url =
      std::regex_replace(AnnouncedMetrics(started, "coordinator", 0), std::regex("/metrics$"),
                         "/dashboard/data");

  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGSTOP));
  ASSERT_NO_FATAL_FAILURE(KillAndWait(harness, *launcher, 1));
  StatusOr<int> added = AddServer(harness, *launcher, coordinator);
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGCONT));
  ASSERT_TRUE(harness
                  .WaitForLine(*launcher, "worker 0 | server 1 (", Deadline::AfterMillis(kRunMs))
                  .ok())
      << harness.Output(*launcher);
  // Worker 0 copied both ranges (read before the pause: a stopped process serves no page).
  const std::string worker0 = AnnouncedMetrics(harness.Output(*launcher), "worker", 0);
  EXPECT_EQ(Scrape(worker0, "tessera_ps_client_range_copies_total"), 2);
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGSTOP));
  const std::string joined = harness.Output(*launcher);
  EXPECT_NE(joined.find("holds its ranges again after step"), std::string::npos) << joined;
  EXPECT_NE(joined.find("range 0 from server 0, range 1 from server 2"), std::string::npos)
      << joined;
  const std::string joined_metrics = AnnouncedMetrics(harness.Output(*added), "server", 1);
  ASSERT_FALSE(joined_metrics.empty()) << harness.Output(*added);
  EXPECT_EQ(Scrape(joined_metrics, "tessera_ps_key_ranges"), 2);
  // The coordinator's view: both copies of every range alive again.
  StatusOr<HttpResult> data = HttpGet(data_url, 10000);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::regex alive_copies(
      R"re("copies":\[\{"server":\d,"state":"alive"\},\{"server":\d,"state":"alive"\}\])re");
  const auto copies = std::distance(
      std::sregex_iterator(data->body.begin(), data->body.end(), alive_copies),
      std::sregex_iterator());
  EXPECT_EQ(copies, kServers) << data->body;

  // Server 2, an original, holds range 1's other copy: its death loses nothing now.
  ExpectMidJob(joined);
  ASSERT_NO_FATAL_FAILURE(KillAndWait(harness, *launcher, 2));
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGCONT));
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  const std::string output = harness.Output(*launcher);
  ASSERT_TRUE(exit.ok() && exit->success()) << output;
  EXPECT_EQ(output.find("was lost with its replicas"), std::string::npos) << output;
  ExpectRegionsRenewed(output, /*replicas=*/2);
  ExpectSameParams(undisturbed, params, "killed, joined, killed again");
  // The added server leaves with the fleet, cleanly.
  auto added_exit = harness.WaitExit(*added, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(added_exit.ok()) << added_exit.status();
  EXPECT_TRUE(added_exit->success()) << harness.Output(*added);
  EXPECT_NE(harness.Output(*added).find("have left; done"), std::string::npos)
      << harness.Output(*added);
}

// The value of `sample` ("name{labels}") on the page at `url`, or -1.
double Scrape(const std::string& url, const std::string& sample) {
  StatusOr<HttpResult> page = HttpGet(url, 10000);
  if (!page.ok()) return -1;
  for (size_t at = page->body.find(sample + " "); at != std::string::npos;
       at = page->body.find(sample + " ", at + 1)) {
    if (at == 0 || page->body[at - 1] == '\n') return std::stod(page->body.substr(at + sample.size()));
  }
  return -1;
}

// Dense chunks by server and range, from the servers' job lines in `output` ("[server 2] ...
// ps-async job for 3 workers, range 1: 4 dense chunks"; a server's own range has no "range").
std::map<int, std::map<int, int>> AsyncJobChunks(const std::string& output) {
  std::map<int, std::map<int, int>> chunks;  // server -> range -> chunks
  const std::regex job_line(
      R"(\[server (\d+)\][^\n]*ps-(?:async|ssp) job for 3 workers(, range (\d+))?: (\d+) dense chunks)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), job_line);
       it != std::sregex_iterator(); ++it) {
    const int server = std::stoi((*it)[1]);
    const int range = (*it)[3].matched ? std::stoi((*it)[3]) : server;
    chunks[server][range] = std::stoi((*it)[4]);
  }
  return chunks;
}

// Waits until the launcher's workers all finished and the fleet lingers (--linger).
void WaitUntilLingering(FleetHarness& harness, int launcher) {
  ASSERT_TRUE(harness
                  .WaitForLine(launcher, "all 3 workers finished; lingering",
                               Deadline::AfterMillis(kRunMs))
                  .ok())
      << harness.Output(launcher);
}

// ps-async has no common step to compare bitwise; what must hold is that nothing acknowledged
// was lost: each surviving server applied every worker's every push to every chunk it holds
// (tessera_ps_updates_total{kind="dense"}, read while the fleet lingers after the workers),
// once. Three kills: a server at a step of each seed.
// `sockets_seeds` as ExpectKillsChangeNothing's.
void ExpectAsyncKillsLoseNoDenseUpdate(const std::string& model, const std::vector<int>& seeds,
                                       const std::vector<int>& sockets_seeds = {}) {
  for (int seed : SeedsToRun(seeds, sockets_seeds)) {
    SCOPED_TRACE(model + ", seed " + std::to_string(seed));
    FleetHarness harness;
    const Kill kill = KillOf(seed);
    std::vector<std::string> flags = TrainingFlags(model);
    if (std::find(sockets_seeds.begin(), sockets_seeds.end(), seed) != sockets_seeds.end()) {
      flags.push_back("--ps-shared-memory=false");
    }
    StatusOr<int> launcher = StartAndReach(
        harness, "async", Concat(Fleet("ps-async", 2, {"--linger", "30"}), flags), kill.step);
    ASSERT_TRUE(launcher.ok()) << launcher.status();
    KillServer(harness, *launcher, kill.server);
    ASSERT_NO_FATAL_FAILURE(WaitUntilLingering(harness, *launcher));
    const std::string output = harness.Output(*launcher);
    ExpectChunksPath(output, flags);
    std::map<int, std::map<int, int>> chunks = AsyncJobChunks(output);
    for (int server = 0; server < kServers; ++server) {
      ASSERT_EQ(chunks[server].size(), 2u) << "server " << server << " holds two ranges\n"
                                           << output;
      if (server == kill.server) continue;
      int held = 0;
      for (const auto& [range, count] : chunks[server]) held += count;
      std::smatch match;
      const std::regex metrics_line("\\[launch\\] server " + std::to_string(server) +
                                    " pid=\\d+ metrics=(\\S+)");
      ASSERT_TRUE(std::regex_search(output, match, metrics_line)) << output;
      const double applied = Scrape(match[1], "tessera_ps_updates_total{kind=\"dense\"}");
      EXPECT_EQ(applied, static_cast<double>(held) * kWorkers * kSteps)
          << "server " << server << " (" << held << " chunks) applied " << applied
          << " dense updates; every push of every worker is " << held * kWorkers * kSteps << "\n"
          << output;
    }
    ASSERT_TRUE(harness.Signal(*launcher, SIGTERM).ok());
    auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok()) << exit.status();
  }
}

TEST(PsReplicationTest, AsyncCompletesAndTheSurvivorsAppliedEveryAcknowledgedPush) {
  ExpectAsyncKillsLoseNoDenseUpdate("mlp", {6, 7}, /*sockets_seeds=*/{8});
}

// The ctr model's embedding rows go to each range's primary, which forwards them to the backup
// (sparse_tables_test and ps_service_test check the two copies' rows bitwise): a kill changes
// nothing for the dense chunks either.
TEST(PsReplicationTest, AsyncCtrCompletesAndTheSurvivorsAppliedEveryAcknowledgedPush) {
  TESSERA_ONLY_UNDER_SANITIZER("asan");
  ExpectAsyncKillsLoseNoDenseUpdate("ctr", {9});
}

// The last step worker `worker` logged in `output` before the first `before` (empty: in all
// of it); 0 if none.
int LastLoggedStep(const std::string& output, int worker, const std::string& before) {
  const std::string head = before.empty() ? output : output.substr(0, output.find(before));
  const std::regex step_line("worker " + std::to_string(worker) + " \\| step (\\d+)/");
  int step = 0;
  for (auto it = std::sregex_iterator(head.begin(), head.end(), step_line);
       it != std::sregex_iterator(); ++it) {
    step = std::stoi((*it)[1]);
  }
  return step;
}

// --replicas 3 in ps-async and ps-ssp: each push goes along a chain (primary, middle, last),
// each copy passing on what it applied and acknowledging once the copies after it have it.
// Server 0 is range 0's primary, range 2's middle copy and range 1's last, so its SIGKILL
// takes each path (a new primary applying the forwards it parked and passing them on; a
// primary passing its unacknowledged forwards on past the failed middle); then server 1 is
// killed too, and server 2, the one left, applied every worker's every push to every chunk of
// the model, once. `sockets`: the chunks cross the sockets (as between hosts), forwards too.
void ExpectAChainLosesNothingAcrossTwoKills(const std::string& mode, bool sockets = false) {
  FleetHarness harness;
  std::vector<std::string> flags = TrainingFlags("mlp");
  if (sockets) flags.push_back("--ps-shared-memory=false");
  StatusOr<int> launcher = StartAndReach(
      harness, mode + " chain", Concat(Fleet(mode, 3, {"--linger", "30"}), flags), /*step=*/60);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  KillServer(harness, *launcher, 0);
  for (int w = 0; w < kWorkers; ++w) {
    const std::string line = "worker " + std::to_string(w) + " | server 0 failed (its process";
    ASSERT_TRUE(harness.WaitForLine(*launcher, line, Deadline::AfterMillis(kRunMs)).ok())
        << line << "\n"
        << harness.Output(*launcher);
  }
  ASSERT_TRUE(
      harness.WaitForLine(*launcher, "worker 0 | step 200/", Deadline::AfterMillis(kRunMs)).ok())
      << harness.Output(*launcher);
  KillServer(harness, *launcher, 1);
  ASSERT_NO_FATAL_FAILURE(WaitUntilLingering(harness, *launcher));
  const std::string output = harness.Output(*launcher);
  ExpectChunksPath(output, flags, /*replicas=*/3);
  EXPECT_NE(output.find("killed by signal 9 (SIGKILL): its key ranges go on with their other "
                        "replicas (--replicas 3)"),
            std::string::npos)
      << output;
  std::map<int, std::map<int, int>> chunks = AsyncJobChunks(output);
  ASSERT_EQ(chunks[2].size(), 3u) << "server 2 holds every range\n" << output;
  int held = 0;
  for (const auto& [range, count] : chunks[2]) held += count;
  const double applied =
      Scrape(AnnouncedMetrics(output, "server", 2), "tessera_ps_updates_total{kind=\"dense\"}");
  std::cout << mode << ": server 2 applied " << applied << " dense updates (" << held
            << " chunks x " << kWorkers * kSteps << " pushes); worker 0 had logged step "
            << LastLoggedStep(output, /*worker=*/0, /*before=*/"server 1 (pid ")
            << " when server 1 was killed" << std::endl;
  EXPECT_EQ(applied, static_cast<double>(held) * kWorkers * kSteps)
      << "server 2 (" << held << " chunks) applied " << applied << " dense updates; every push "
      << "of every worker is " << held * kWorkers * kSteps << "\n"
      << output;
  ASSERT_TRUE(harness.Signal(*launcher, SIGTERM).ok());
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
}

TEST(PsReplicationTest, AsyncChainOfThreeCopiesLosesNothingAcrossTwoKills) {
  TESSERA_ONLY_UNDER_SANITIZER("tsan");
  ExpectAChainLosesNothingAcrossTwoKills("ps-async");
}

TEST(PsReplicationTest, SspChainOfThreeCopiesLosesNothingAcrossTwoKills) {
  ExpectAChainLosesNothingAcrossTwoKills("ps-ssp", /*sockets=*/true);
}

// Item 3 in ps-async and ps-ssp: server 1 is killed and a server joins in its place; rank 0 has
// each of its ranges' primaries copy the range to it and forward every later update there, and
// every worker takes it in as the ranges' backup. Then server 2 (range 1's other copy) is killed
// too, and nothing acknowledged is lost: the joined server's copies held each chunk's updates up to
// the copy (its log), and it applied every later one once (its update counter), so between
// them every worker's every push; server 0, alive throughout, applied each once too. Workers
// are paused around the kills and the join as in the ps-sync test above. With 3 copies every
// server holds every range: the joined server takes all three, and a copy passes each update
// on along the chain to it, last.
void ExpectAJoinedServerTakesCopies(const std::string& mode, const std::string& model = "mlp",
                                    int replicas = 2, bool sockets = false) {
  FleetHarness harness;
  std::vector<std::string> flags = TrainingFlags(model, kJoinSteps);
  if (sockets) flags.push_back("--ps-shared-memory=false");
  StatusOr<int> launcher = StartAndReach(
      harness, mode + " joined",
      Concat(Fleet(mode, replicas, {"--heartbeat-timeout-ms", "120000", "--linger", "30"}),
             flags),
      /*step=*/20);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  const std::string started = harness.Output(*launcher);
  const std::string coordinator = CoordinatorOf(started);
  ASSERT_FALSE(coordinator.empty()) << started;

  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGSTOP));
  ASSERT_NO_FATAL_FAILURE(KillAndWait(harness, *launcher, 1));
  StatusOr<int> added = AddServer(harness, *launcher, coordinator);
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGCONT));
  // Rank 0 copied both ranges; every other worker took the server in from its replies.
  for (const std::string line :
       {"worker 0 | server 1 (", "worker 1 | server 1 (", "worker 2 | server 1 ("}) {
    ASSERT_TRUE(harness.WaitForLine(*launcher, line, Deadline::AfterMillis(kRunMs)).ok())
        << line << "\n"
        << harness.Output(*launcher);
  }
  const std::string worker0 = AnnouncedMetrics(harness.Output(*launcher), "worker", 0);
  EXPECT_EQ(Scrape(worker0, "tessera_ps_client_range_copies_total"), replicas)
      << harness.Output(*launcher);
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGSTOP));
  const std::string joined = harness.Output(*launcher);
  EXPECT_NE(joined.find("holds copies of its ranges again, each forwarded every update from "
                        "its copy on: range 0 from server 0, range 1 from server 2" +
                        std::string(replicas == 3 ? ", range 2 from server 2" : "")),
            std::string::npos)
      << joined;
  const std::string joined_metrics = AnnouncedMetrics(harness.Output(*added), "server", 1);
  ASSERT_FALSE(joined_metrics.empty()) << harness.Output(*added);
  EXPECT_EQ(Scrape(joined_metrics, "tessera_ps_key_ranges"), replicas);

  ExpectMidJob(joined);
  ASSERT_NO_FATAL_FAILURE(KillAndWait(harness, *launcher, 2));
  ASSERT_NO_FATAL_FAILURE(SignalWorkers(harness, *launcher, SIGCONT));
  ASSERT_NO_FATAL_FAILURE(WaitUntilLingering(harness, *launcher));
  const std::string output = harness.Output(*launcher);
  const std::string added_output = harness.Output(*added);
  EXPECT_EQ(output.find("was lost with its replicas"), std::string::npos) << output;
  ExpectChunksPath(output, flags, replicas);
  if (!sockets) ExpectRegionsRenewed(output, replicas);
  const int64_t every_push = static_cast<int64_t>(kWorkers) * kJoinSteps;
  // Server 0, alive throughout: ranges 0 and 2 (and 1).
  const auto original = AsyncJobChunks(output);
  ASSERT_EQ(original.at(0).size(), static_cast<size_t>(replicas)) << output;
  int held0 = 0;
  for (const auto& [range, chunks] : original.at(0)) held0 += chunks;
  EXPECT_EQ(
      Scrape(AnnouncedMetrics(output, "server", 0), "tessera_ps_updates_total{kind=\"dense\"}"),
      static_cast<double>(held0 * every_push))
      << output;
  // The joined server: ranges 0 and 1 (and 2), their updates up to each copy and every one
  // after it.
  const auto taken = AsyncJobChunks(added_output);
  ASSERT_EQ(taken.count(1), 1u) << added_output;
  ASSERT_EQ(taken.at(1).size(), static_cast<size_t>(replicas)) << added_output;
  int held1 = 0;
  for (const auto& [range, chunks] : taken.at(1)) held1 += chunks;
  int64_t in_copies = 0;
  int copies = 0;
  const std::regex copy_line(R"(took the copy of [^\n]*its chunks had applied (\d+) updates)");
  for (auto it = std::sregex_iterator(added_output.begin(), added_output.end(), copy_line);
       it != std::sregex_iterator(); ++it) {
    in_copies += std::stoll((*it)[1]);
    ++copies;
  }
  EXPECT_EQ(copies, replicas) << added_output;
  const double applied = Scrape(joined_metrics, "tessera_ps_updates_total{kind=\"dense\"}");
  std::cout << mode << ", " << model << ": server 1 joined: its copies held " << in_copies
            << " updates, it applied " << applied << " after them; " << held1 << " chunks x "
            << every_push << " pushes" << std::endl;
  EXPECT_EQ(static_cast<double>(in_copies) + applied, static_cast<double>(held1 * every_push))
      << "the copies held " << in_copies << " updates and server 1 applied " << applied
      << " after them\n"
      << added_output;
  ASSERT_TRUE(harness.Signal(*launcher, SIGTERM).ok());
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  auto added_exit = harness.WaitExit(*added, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(added_exit.ok()) << added_exit.status();
}

TEST(PsReplicationTest, AsyncJoiningServerTakesCopiesAndALaterKillLosesNothing) {
  TESSERA_ONLY_UNDER_SANITIZER("tsan");
  ExpectAJoinedServerTakesCopies("ps-async");
}

// Over the sockets (the joined server then gets the forwards' bytes).
TEST(PsReplicationTest, SspJoiningServerTakesCopiesAndALaterKillLosesNothing) {
  ExpectAJoinedServerTakesCopies("ps-ssp", "mlp", /*replicas=*/2, /*sockets=*/true);
}

// The ctr model: each range's embedding rows are copied and forwarded the same way.
TEST(PsReplicationTest, AsyncCtrJoiningServerTakesCopiesAndALaterKillLosesNothing) {
  TESSERA_ONLY_UNDER_SANITIZER("asan");
  ExpectAJoinedServerTakesCopies("ps-async", "ctr");
}

// Three copies: the joined server is each chain's last copy.
TEST(PsReplicationTest, AsyncChainJoiningServerTakesCopiesAndALaterKillLosesNothing) {
  TESSERA_ONLY_UNDER_SANITIZER("tsan");
  ExpectAJoinedServerTakesCopies("ps-async", "mlp", /*replicas=*/3);
}

// Servers 1 and 2 hold both copies of range 1: losing both stops the job at once, naming it.
TEST(PsReplicationTest, LosingEveryReplicaOfARangeStopsTheJobNamingTheRange) {
  FleetHarness harness;
  StatusOr<int> launcher = StartAndReach(
      harness, "both", Concat(Fleet("ps-sync", 2), TrainingFlags("mlp")), /*step=*/20);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  KillServer(harness, *launcher, 1);
  KillServer(harness, *launcher, 2);
  const SteadyClock::time_point killed = SteadyClock::now();
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*launcher);
  const int64_t stopped_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 *harness.ExitTime(*launcher) - killed)
                                 .count();
  std::cout << "the launcher exited " << stopped_ms << " ms after the second kill" << std::endl;
  EXPECT_EQ(exit->status, 1) << exit->Describe() << "\n" << output;
  EXPECT_LT(stopped_ms, 10000) << output;
  // Named by the launcher (which reaps the servers first) or by the workers.
  EXPECT_TRUE(output.find("range 1 was lost with its replicas, servers 1 and 2") !=
                  std::string::npos ||
              output.find("its 2 replicas, servers 1 and 2, failed") != std::string::npos)
      << output;
  // No process is left behind.
  for (const char* role : {"coordinator", "server", "worker"}) {
    for (int rank = 0; rank < 3; ++rank) {
      const int pid = AnnouncedPid(output, role, rank);
      if (pid > 0) {
        EXPECT_TRUE(kill(pid, 0) == -1 && errno == ESRCH) << role << " " << rank;
      }
    }
  }
}

TEST(PsReplicationTest, MoreReplicasThanServersIsRefused) {
  FleetHarness harness;
  auto id = harness.Start("refused", "tools/tessera-launch",
                          {"--servers", "2", "--replicas", "3", "--workers", "1", "--mode",
                           "ps-sync"});
  ASSERT_TRUE(id.ok()) << id.status();
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_NE(exit->status, 0);
  EXPECT_NE(harness.Output(*id).find("--replicas must be at most --servers=2 (got 3)"),
            std::string::npos)
      << harness.Output(*id);
}

}  // namespace
}  // namespace tessera::testing
