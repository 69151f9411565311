// Elastic parameter-server jobs (issue 47, items 1, 2 and 6): tessera-launch --min-workers with
// real servers and workers on loopback. One of 4 workers goes after a seeded step (the hidden
// worker flag --test-exit RANK:STEP[:leave] kills it, or makes it leave cleanly, right after
// that step, so the change falls on a step boundary); the other 3 finish, and nobody restarts.
//
// The ps-sync reference is the same job in which that worker says goodbye instead of dying:
// from the next step on, both have the servers average the gradients of the same 3 workers in
// the same rank order, whichever way they learnt the fourth was gone (its death, seen by the
// coordinator and told to the servers, completing the step the others wait in; or its goodbye,
// before anyone pushed the step). So the final parameters must be bitwise equal.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/messages/membership.h"
#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

// Small and fast: 4 workers x 16 samples of the mlp, 20 steps, SGD.
std::vector<std::string> TrainingFlags() {
  return {"--steps", "20", "--optimizer", "sgd", "--lr", "0.1", "--device", "cpu",
          "--log-every", "1", "--train-samples", "1920", "--batch-size", "16",
          "--ps-chunk-elements", "100", "--seed", "3", "--hidden", "32,16", "--input-dim", "16",
          "--classes", "4"};
}

std::vector<std::string> Fleet(const std::string& mode, int workers, int min_workers,
                               const std::string& membership_log) {
  return {"--servers", "2", "--workers", std::to_string(workers), "--mode", mode,
          "--min-workers", std::to_string(min_workers), "--membership-log", membership_log,
          "--"};
}

std::vector<MembershipChange> ReadLog(const std::string& path) {
  std::vector<MembershipChange> changes;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    StatusOr<MembershipChange> change = ParseMembershipJsonLine(line);
    EXPECT_TRUE(change.ok()) << change.status();
    if (change.ok()) changes.push_back(*change);
  }
  return changes;
}

// The log must hold worker `rank` leaving after `step` (`kind`); every other line is a
// worker's goodbye (an exit: the survivors' at the end of the job, and in ps-async a fast
// worker may finish before a slow one is killed). Epochs count the lines; each is a leave, so
// the world size after epoch e of a 4-worker job is 4 - e. Returns the leave's epoch.
uint64_t ExpectLeave(const std::string& log, int rank, int64_t step, MembershipKind kind) {
  const std::vector<MembershipChange> changes = ReadLog(log);
  uint64_t found = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    const MembershipChange& change = changes[i];
    EXPECT_EQ(change.epoch, i + 1);
    EXPECT_EQ(change.world_size, 4 - static_cast<int>(change.epoch));
    EXPECT_GT(change.unix_time_s, 1.6e9);
    if (change.rank == rank && change.kind == kind) {
      found = change.epoch;
      EXPECT_EQ(change.step, step);
    } else {
      EXPECT_EQ(change.kind, MembershipKind::kExit) << change.reason;
    }
  }
  EXPECT_NE(found, 0u) << "no " << MembershipKindName(kind) << " of worker " << rank << " in "
                       << log;
  return found;
}

TEST(ElasticPsTest, PsSyncKilledWorkerEqualsACleanLeaveAtTheSameStep) {
  FleetHarness harness;
  const std::string killed = TempPath("elastic_killed.bin");
  const std::string left = TempPath("elastic_left.bin");
  const std::string killed_log = TempPath("elastic_killed.jsonl");
  const std::string left_log = TempPath("elastic_left.jsonl");
  StatusOr<int> run = harness.Start(
      "killed", "tools/tessera-launch",
      Concat(Fleet("ps-sync", 4, 2, killed_log),
             Concat(TrainingFlags(), {"--test-exit", "2:6", "--save-params", killed})));
  ASSERT_TRUE(run.ok()) << run.status();
  StatusOr<tools::ChildExit> exit = harness.WaitExit(*run, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*run);
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_NE(output.find("the other workers go on"), std::string::npos) << output;
  // Every survivor trained to the end: none restarted, none stopped early.
  for (int rank : {0, 1, 3}) {
    EXPECT_NE(output.find("[worker " + std::to_string(rank) + "]"), std::string::npos);
  }
  // The killed worker trained no step after its sixth.
  EXPECT_FALSE(std::regex_search(output, std::regex("\\[worker 2\\][^\\n]*step 7/20")));
  Status clean = harness.RunToSuccess(
      "left", "tools/tessera-launch",
      Concat(Fleet("ps-sync", 4, 2, left_log),
             Concat(TrainingFlags(), {"--test-exit", "2:6:leave", "--save-params", left})),
      kRunMs);
  ASSERT_TRUE(clean.ok()) << clean;
  auto a = worker::LoadParams(killed);
  auto b = worker::LoadParams(left);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->values.size(), b->values.size());
  size_t differ = 0;
  for (size_t i = 0; i < a->values.size(); ++i) differ += a->values[i] != b->values[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "of " << a->values.size() << " parameters differ bitwise";
  // ps-sync runs in lockstep: the leave is the first change in both.
  EXPECT_EQ(ExpectLeave(killed_log, 2, 6, MembershipKind::kKilled), 1u);
  EXPECT_EQ(ExpectLeave(left_log, 2, 6, MembershipKind::kExit), 1u);
}

// The loss of a worker's progress lines: "step N/20 loss X".
std::vector<double> Losses(const std::string& output, int rank) {
  std::vector<double> losses;
  const std::regex line("\\[worker " + std::to_string(rank) +
                        "\\][^\\n]*step [0-9]+/20 loss ([0-9.]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  return losses;
}

TEST(ElasticPsTest, PsAsyncGoesOnWithoutAKilledWorkerAndLearns) {
  FleetHarness harness;
  const std::string log = TempPath("elastic_async.jsonl");
  StatusOr<int> run = harness.Start(
      "async", "tools/tessera-launch",
      Concat(Fleet("ps-async", 4, 3, log), Concat(TrainingFlags(), {"--test-exit", "1:5"})));
  ASSERT_TRUE(run.ok()) << run.status();
  StatusOr<tools::ChildExit> exit = harness.WaitExit(*run, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*run);
  ASSERT_TRUE(exit->success()) << output;
  const std::vector<double> losses = Losses(output, 0);
  ASSERT_EQ(losses.size(), 20u) << output;
  EXPECT_LT(losses.back(), losses.front()) << output;
  ExpectLeave(log, 1, 5, MembershipKind::kKilled);
}

// ps-ssp: the survivors' replies wait for the slowest worker's clock; a killed worker's clock
// would hold them for ever (until their deadline) if it still counted.
TEST(ElasticPsTest, PsSspGoesOnWithoutAKilledWorkersClock) {
  FleetHarness harness;
  const std::string log = TempPath("elastic_ssp.jsonl");
  StatusOr<int> run = harness.Start(
      "ssp", "tools/tessera-launch",
      Concat(Fleet("ps-ssp", 4, 3, log),
             Concat(TrainingFlags(), {"--staleness", "1", "--test-exit", "3:4"})));
  ASSERT_TRUE(run.ok()) << run.status();
  StatusOr<tools::ChildExit> exit = harness.WaitExit(*run, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*run);
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_EQ(Losses(output, 0).size(), 20u) << output;
  ExpectLeave(log, 3, 4, MembershipKind::kKilled);
}

TEST(ElasticPsTest, ALossBelowMinWorkersStopsTheJobNamingTheCause) {
  FleetHarness harness;
  const std::string log = TempPath("elastic_below.jsonl");
  StatusOr<int> run = harness.Start(
      "below", "tools/tessera-launch",
      Concat(Fleet("ps-sync", 2, 2, log), Concat(TrainingFlags(), {"--test-exit", "1:3"})));
  ASSERT_TRUE(run.ok()) << run.status();
  StatusOr<tools::ChildExit> exit = harness.WaitExit(*run, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*run);
  EXPECT_FALSE(exit->success()) << output;
  EXPECT_NE(output.find("the job has 1 worker, below --min-workers 2, since membership epoch 1: "
                        "worker 1 left after step 3 (killed: "),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("below --min-workers 2: the job stopped"), std::string::npos) << output;
  const std::vector<MembershipChange> changes = ReadLog(log);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].world_size, 1);
}

TEST(ElasticPsTest, ElasticFlagsAreValidatedNamingWhatIsWrong) {
  FleetHarness harness;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--workers", "2", "--mode", "allreduce", "--min-workers", "1"},
       "--min-workers=1 with --mode=allreduce: only the parameter-server modes"},
      {{"--servers", "1", "--workers", "2", "--mode", "ps-sync", "--max-workers", "3"},
       "give --min-workers too"},
  };
  for (const auto& [args, message] : cases) {
    auto id = harness.Start("launcher", "tools/tessera-launch", args);
    ASSERT_TRUE(id.ok());
    auto exit = harness.WaitExit(*id, Deadline::AfterMillis(10000));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(exit->status, 2) << harness.Output(*id);
    EXPECT_NE(harness.Output(*id).find(message), std::string::npos) << harness.Output(*id);
  }
  // What the coordinator checks: min <= workers <= max.
  auto id = harness.Start("launcher", "tools/tessera-launch",
                          {"--servers", "1", "--workers", "2", "--mode", "ps-sync",
                           "--min-workers", "3", "--", "--steps", "1", "--device", "cpu"});
  ASSERT_TRUE(id.ok());
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(30000));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_NE(exit->status, 0);
  EXPECT_NE(harness.Output(*id).find("--min-workers=3 --num-workers=2 --max-workers=0 must "
                                     "satisfy 1 <= min <= num <= max"),
            std::string::npos)
      << harness.Output(*id);
}

}  // namespace
}  // namespace tessera::testing
