// Preemption of a parameter-server job (issue 16, item 5): Ctrl-C of tessera-launch, i.e.
// SIGTERM to the launcher, during a ps-sync job run with --checkpoint-on-sigterm.
//
// What must happen: the launcher sends SIGTERM to the workers first; their pushes of each step
// say whether they were asked to stop, and the servers answer every worker alike, so all of
// them stop after the same step (none waits in the next step for one that left); worker rank 0
// has every server write its shard of that step and commits the checkpoint; only then do the
// servers, and then the coordinator, get SIGTERM. Everything exits within --grace, nothing is
// killed, and a new fleet resuming from the checkpoint ends bitwise where an uninterrupted run
// ends (the servers' chunks, momentum and embedding rows, and the workers' data order). The
// same when only one worker is signalled (a preempted machine): every worker stops after the
// step that worker's pushes announced the stop in.
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 180000;
constexpr int kGraceSeconds = 5;
constexpr int kSteps = 600;

// 3 workers x 16 samples of the ctr model (dense layers and an embedding table on the
// servers), SGD with momentum. Many short steps, so that the job is still running when the
// test sends SIGTERM after the first log lines, under the sanitizers too.
std::vector<std::string> TrainingFlags() {
  return {"--model", "ctr", "--dataset", "synthetic-ctr", "--hidden", "16", "--embedding-dim",
          "4", "--optimizer", "momentum", "--lr", "0.1", "--device", "cpu", "--train-samples",
          "1920", "--batch-size", "16", "--ps-chunk-elements", "100", "--seed", "3",
          "--log-every", "10", "--steps", std::to_string(kSteps)};
}

std::vector<std::string> Fleet() {
  return {"--servers", "3", "--workers", "3", "--mode", "ps-sync", "--grace",
          std::to_string(kGraceSeconds), "--"};
}

void RunToSuccess(FleetHarness& harness, const std::string& label,
                  const std::vector<std::string>& args) {
  Status ran = harness.RunToSuccess(label, "tools/tessera-launch", args, kRunMs);
  ASSERT_TRUE(ran.ok()) << ran;
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// The step after which every worker of the 3 says it stopped ("" unless all say the same).
std::string CommonStopStep(const std::string& output) {
  std::set<std::string> steps;
  for (int w = 0; w < 3; ++w) {
    std::smatch match;
    const std::regex stopped("\\[worker " + std::to_string(w) +
                             "\\][^\\n]*stopped after step ([0-9]+) [(,]");
    if (!std::regex_search(output, match, stopped)) return "";
    steps.insert(match[1]);
  }
  return steps.size() == 1 ? *steps.begin() : "";
}

// Resumes a new fleet with `flags` (their --checkpoint-dir holds the checkpoint of `step`) and
// expects it to end with the parameters in `whole` (the uninterrupted run's), bitwise.
void ExpectResumeEndsLikeTheUninterruptedRun(FleetHarness& harness,
                                             const std::vector<std::string>& flags,
                                             const std::string& step, const std::string& whole,
                                             const std::string& resumed) {
  auto again =
      harness.Start("resumed", "tools/tessera-launch",
                    Concat(Fleet(), Concat(flags, {"--resume", "--save-params", resumed})));
  ASSERT_TRUE(again.ok()) << again.status();
  auto finished = harness.WaitExit(*again, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_TRUE(finished->success()) << finished->Describe() << "\n" << harness.Output(*again);
  EXPECT_NE(harness.Output(*again).find("resumed from the checkpoint of step " + step),
            std::string::npos)
      << harness.Output(*again);
  auto a = worker::LoadParams(whole);
  auto b = worker::LoadParams(resumed);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->values.size(), b->values.size());
  EXPECT_TRUE(a->values == b->values)
      << "the resumed run ends elsewhere than the uninterrupted one";
}

// Both tests compare with one uninterrupted run.
class PsPreemptionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    FleetHarness harness;
    RunToSuccess(harness, "uninterrupted",
                 Concat(Fleet(), Concat(TrainingFlags(), {"--save-params", Whole()})));
  }
  static std::string Whole() { return TempPath("ps_preempt_whole.bin"); }
};

// The pids the launcher announced ("[launch] server 1 pid=123 metrics=...").
std::vector<int> AnnouncedPids(const std::string& output) {
  std::vector<int> pids;
  const std::regex line(R"(\[launch\] (coordinator|server|worker) \d+ pid=(\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(std::stoi((*it)[2]));
  }
  return pids;
}

// Starts the fleet's launcher with `flags` and waits until worker 2 logged step 20: its id,
// or the error (with the launcher's output).
StatusOr<int> StartAndReachStep20(FleetHarness& harness, const std::vector<std::string>& flags) {
  StatusOr<int> launcher =
      harness.Start("preempted", "tools/tessera-launch", Concat(Fleet(), flags));
  if (!launcher.ok()) return launcher;
  Status reached =
      harness.WaitForLine(*launcher, "worker 2 | step 20/", Deadline::AfterMillis(kRunMs));
  if (!reached.ok()) return reached.WithContext(harness.Output(*launcher));
  return launcher;
}

TEST_F(PsPreemptionTest, SigtermToTheLauncherCheckpointsEveryServerAtOneStepAndResumesBitwise) {
  FleetHarness harness;
  const std::string dir = TempPath("ps_preempt_ckpt");
  const std::vector<std::string> flags =
      Concat(TrainingFlags(), {"--checkpoint-dir", dir, "--checkpoint-on-sigterm"});
  StatusOr<int> launcher = StartAndReachStep20(harness, flags);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  const SteadyClock::time_point signalled = SteadyClock::now();
  ASSERT_TRUE(harness.Signal(*launcher, SIGTERM).ok());
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(*launcher);
  const int64_t exit_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              *harness.ExitTime(*launcher) - signalled)
                              .count();
  const std::string output = harness.Output(*launcher);
  std::cout << "launcher exited " << exit_ms << " ms after its SIGTERM (--grace "
            << kGraceSeconds << " s)" << std::endl;
  ::testing::Test::RecordProperty("exit_ms", static_cast<int>(exit_ms));

  // Stopped, within the grace, and nothing had to be killed.
  EXPECT_EQ(exit->status, 128 + SIGTERM) << exit->Describe() << "\n" << output;
  EXPECT_LT(exit_ms, kGraceSeconds * 1000) << output;
  EXPECT_EQ(output.find("sent SIGKILL"), std::string::npos) << output;
  EXPECT_EQ(output.find("stopped while waiting"), std::string::npos) << output;
  // No process is left behind.
  const std::vector<int> pids = AnnouncedPids(output);
  EXPECT_EQ(pids.size(), 7u) << output;
  for (int pid : pids) {
    EXPECT_TRUE(kill(pid, 0) == -1 && errno == ESRCH) << "pid " << pid << " still exists";
  }

  // Every worker stopped after the same step, checkpointed.
  std::set<std::string> steps;
  size_t last_worker_line = 0;
  for (int w = 0; w < 3; ++w) {
    std::smatch match;
    const std::regex stopped("\\[worker " + std::to_string(w) +
                             "\\][^\\n]*stopped after step ([0-9]+) \\(checkpointed in ");
    ASSERT_TRUE(std::regex_search(output, match, stopped)) << output;
    steps.insert(match[1]);
    last_worker_line = std::max(last_worker_line, static_cast<size_t>(match.position(0)));
  }
  ASSERT_EQ(steps.size(), 1u) << output;
  const std::string step = *steps.begin();
  EXPECT_LT(std::stoi(step), kSteps) << "the job ended before the signal\n" << output;
  // The workers were stopped before the servers: every worker had stopped (checkpoint
  // included) when the first server was asked to.
  const std::regex server_stop(R"(\[server \d+\][^\n]*received SIGTERM)");
  std::smatch first_server_stop;
  ASSERT_TRUE(std::regex_search(output, first_server_stop, server_stop)) << output;
  EXPECT_GT(static_cast<size_t>(first_server_stop.position(0)), last_worker_line) << output;

  // The checkpoint is complete: committed (LATEST names it) with the shard of every server.
  std::ifstream latest(dir + "/LATEST");
  std::string latest_step;
  latest >> latest_step;
  EXPECT_EQ(latest_step, step);
  char step_dir[64];
  std::snprintf(step_dir, sizeof(step_dir), "/step-%012d", std::stoi(step));
  for (const std::string file : {"MANIFEST.json", "server-0.ckpt", "server-1.ckpt",
                                 "server-2.ckpt"}) {
    EXPECT_TRUE(Exists(dir + step_dir + "/" + file)) << dir + step_dir + "/" + file;
  }
  EXPECT_NE(output.find("checkpoint of step " + step + " committed"), std::string::npos) << output;

  // A new fleet resumes from it and ends bitwise where the uninterrupted run ends.
  ExpectResumeEndsLikeTheUninterruptedRun(harness, flags, step, Whole(),
                                          TempPath("ps_preempt_resumed.bin"));
}

// Preemption of one worker: only worker 1 gets SIGTERM. Its next step's pushes say so, and
// every worker, told by the servers, stops after that same step; rank 0 checkpoints it (the
// launcher, stopping the fleet for worker 1's exit, stops the servers only after the workers).
// The resumed job ends bitwise like the uninterrupted one.
TEST_F(PsPreemptionTest, OneWorkerSignalledStopsEveryWorkerAfterTheSameStep) {
  FleetHarness harness;
  const std::string dir = TempPath("ps_preempt_one_ckpt");
  const std::vector<std::string> flags =
      Concat(TrainingFlags(), {"--checkpoint-dir", dir, "--checkpoint-on-sigterm"});
  StatusOr<int> launcher = StartAndReachStep20(harness, flags);
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  std::smatch match;
  const std::string started = harness.Output(*launcher);
  ASSERT_TRUE(std::regex_search(started, match, std::regex(R"(\[launch\] worker 1 pid=(\d+))")))
      << started;
  ASSERT_EQ(kill(std::stoi(match[1]), SIGTERM), 0);
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*launcher);
  const std::string step = CommonStopStep(output);
  ASSERT_FALSE(step.empty()) << output;
  EXPECT_LT(std::stoi(step), kSteps) << "the job ended before the signal\n" << output;
  EXPECT_NE(output.find("worker 1 was asked to stop: every worker stops after step " + step),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("checkpoint of step " + step + " committed"), std::string::npos) << output;
  EXPECT_EQ(output.find("sent SIGKILL"), std::string::npos) << output;
  std::ifstream latest(dir + "/LATEST");
  std::string latest_step;
  latest >> latest_step;
  EXPECT_EQ(latest_step, step);
  ExpectResumeEndsLikeTheUninterruptedRun(harness, flags, step, Whole(),
                                          TempPath("ps_preempt_one_resumed.bin"));
}

}  // namespace
}  // namespace tessera::testing
