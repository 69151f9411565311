// A NaN reaching one rank's gradients never reaches the model (issue 19, item 4). Workers run
// as separate processes on the loopback, one of them fed a NaN input at a chosen step (the
// hidden --inject-nonfinite-step): with --on-nonfinite error every process stops within 1 s
// naming the step, the rank and the tensor (in ps-sync the other worker learns it from the
// failing one's goodbye, item 1); with skip the step leaves no trace on any rank; in ps-sync
// without the worker's check (off) the server refuses the push naming the key.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 90000;

const std::vector<std::string> kJob = {"--batch-size", "8",       "--hidden",  "16",
                                       "--input-dim",  "8",       "--classes", "4",
                                       "--train-samples", "256", "--device",  "cpu",
                                       "--log-every",  "1",       "--seed",    "5"};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

struct Job {
  std::vector<int> workers;
  std::vector<int> servers;
};

// A coordinator, `servers` servers and two workers in `mode`, worker r with `extra[r]`.
Job StartJob(FleetHarness& harness, const std::string& mode, int servers,
             const std::vector<std::vector<std::string>>& extra) {
  Job job;
  const std::string n = std::to_string(servers);
  auto coordinator = harness.StartCoordinator({"--num-servers", n, "--num-workers", "2"});
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return job;
  for (int s = 0; s < servers; ++s) {
    auto id = harness.Start("server " + std::to_string(s), "server/ps/tessera-server",
                            {"--coordinator", *coordinator, "--num-servers", n, "--num-workers",
                             "2", "--rank", std::to_string(s)});
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) job.servers.push_back(*id);
  }
  for (int r = 0; r < 2; ++r) {
    auto id = harness.Start(
        "worker " + std::to_string(r), "worker/tessera-worker",
        Concat(Concat({"--mode", mode, "--coordinator", *coordinator, "--num-servers", n,
                       "--num-workers", "2", "--rank", std::to_string(r)},
                      kJob),
               extra[r]));
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) job.workers.push_back(*id);
  }
  return job;
}

int ExitStatus(FleetHarness& harness, int id) {
  auto exit = harness.WaitExit(id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(id);
  return exit.ok() ? exit->status : -1;
}

TEST(NonFiniteTest, ErrorStopsEveryRankNamingTheStepRankAndTensor) {
  for (const std::string mode : {"allreduce", "zero2", "ps-sync"}) {
    SCOPED_TRACE(mode);
    FleetHarness harness;
    const int servers = mode == "ps-sync" ? 1 : 0;
    Job job = StartJob(harness, mode, servers,
                       {{"--steps", "6"}, {"--steps", "6", "--inject-nonfinite-step", "3"}});
    ASSERT_EQ(job.workers.size(), 2u);
    for (int id : job.workers) EXPECT_EQ(ExitStatus(harness, id), 1) << harness.Output(id);
    const std::string bad = harness.Output(job.workers[1]);
    // Its own finding: the step, the rank and the tensor (in allreduce and ZeRO every rank
    // finds it after the reduction; in ps-sync worker 1 before it pushes).
    EXPECT_NE(bad.find(" step 3: rank 1: the "), std::string::npos) << bad;
    EXPECT_NE(bad.find("gradient of 'mlp.0."), std::string::npos) << bad;
    EXPECT_NE(bad.find("is nan"), std::string::npos) << bad;
    const std::string other = harness.Output(job.workers[0]);
    EXPECT_NE(other.find("step 3"), std::string::npos) << other;
    EXPECT_EQ(other.find("step 4/"), std::string::npos) << other;  // nothing after it
    // Every process is gone within 1 s of the first error line (issue 19: the failing rank's
    // error reaches the others at once, not after the 10 s heartbeat limit).
    std::optional<SteadyClock::time_point> first_error;
    for (int id : job.workers) {
      auto at = harness.LineTime(id, " E ");
      if (at.ok() && (!first_error || *at < *first_error)) first_error = *at;
    }
    ASSERT_TRUE(first_error.has_value());
    for (int id : job.workers) {
      EXPECT_LT(*harness.ExitTime(id) - *first_error, std::chrono::seconds(1))
          << harness.Output(id);
    }
    if (mode == "ps-sync") {  // the servers never saw it
      EXPECT_EQ(harness.Output(job.servers[0]).find("non-finite"), std::string::npos);
    }
  }
}

// A skipped step leaves no trace: a NaN in rank 1's last batch gives, on every rank, the
// parameters of the same run one step shorter (SGD, constant lr: bitwise).
TEST(NonFiniteTest, SkipDropsTheStepOnEveryRank) {
  for (const std::string mode : {"allreduce", "zero1"}) {
    SCOPED_TRACE(mode);
    const std::string shorter = TempPath(mode + "_5_steps.bin");
    const std::string skipped = TempPath(mode + "_6th_skipped.bin");
    {
      FleetHarness harness;
      Job job = StartJob(harness, mode, 0,
                         {{"--steps", "5", "--save-params", shorter}, {"--steps", "5"}});
      ASSERT_EQ(job.workers.size(), 2u);
      for (int id : job.workers) ASSERT_EQ(ExitStatus(harness, id), 0) << harness.Output(id);
    }
    FleetHarness harness;
    Job job = StartJob(harness, mode, 0,
                       {{"--steps", "6", "--on-nonfinite", "skip", "--save-params", skipped},
                        {"--steps", "6", "--on-nonfinite", "skip", "--inject-nonfinite-step",
                         "6"}});
    ASSERT_EQ(job.workers.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const int id = job.workers[r];
      EXPECT_EQ(ExitStatus(harness, id), 0) << harness.Output(id);
      EXPECT_NE(harness.Output(id).find("step 6 skipped: rank " + std::to_string(r) +
                                        ": the reduced gradient of 'mlp.0."),
                std::string::npos)
          << harness.Output(id);
    }
    const std::string a = ReadFile(shorter), b = ReadFile(skipped);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "a skipped 6th step changed the parameters";
  }
}

// In ps-sync with the worker's own check off, the server is the last line: it refuses the
// push naming the chunk and key, applies nothing of it, and the job stops with that error.
TEST(NonFiniteTest, PsServerRefusesAPushWithNaNNamingTheKey) {
  FleetHarness harness;
  Job job = StartJob(harness, "ps-sync", 1,
                     {{"--steps", "6"},
                      {"--steps", "6", "--on-nonfinite", "off", "--inject-nonfinite-step", "3"}});
  ASSERT_EQ(job.workers.size(), 2u);
  for (int id : job.workers) EXPECT_EQ(ExitStatus(harness, id), 1) << harness.Output(id);
  const std::string bad = harness.Output(job.workers[1]);
  EXPECT_NE(bad.find("worker 1's push of step 3: the gradient of chunk 0 (key 0) holds nan at "
                     "element "),
            std::string::npos)
      << bad;
  EXPECT_NE(bad.find("refused, nothing of this push was applied"), std::string::npos) << bad;
}

// skip needs every rank to reach the same verdict: modes where they would not are refused.
TEST(NonFiniteTest, SkipIsRefusedWhereRanksSeeDifferentGradients) {
  FleetHarness harness;
  Job job = StartJob(harness, "ps-sync", 1,
                     {{"--steps", "2", "--on-nonfinite", "skip"},
                      {"--steps", "2", "--on-nonfinite", "skip"}});
  ASSERT_EQ(job.workers.size(), 2u);
  for (int id : job.workers) {
    EXPECT_EQ(ExitStatus(harness, id), 1);
    EXPECT_NE(harness.Output(id).find("--on-nonfinite skip needs every rank to see the same "
                                      "gradients (--mode local, allreduce or zero1); in --mode "
                                      "ps-sync use error"),
              std::string::npos)
        << harness.Output(id);
  }
}

}  // namespace
}  // namespace tessera::testing
