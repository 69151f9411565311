// tessera-launch as a user runs it: real coordinator, servers and workers underneath.
#include <signal.h>

#include <gtest/gtest.h>

#include <fstream>
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

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// torchrun-style recovery: a worker killed mid-training makes the launcher stop the fleet and
// start it again (--max-restarts 1); the workers resume from the last checkpoint and end with
// bitwise the parameters of a run that was never interrupted.
TEST(LaunchTest, KilledWorkerIsRestartedFromTheCheckpointAndEndsLikeAnUninterruptedRun) {
  FleetHarness harness;
  const std::vector<std::string> training = {
      "--hidden", "256,256", "--steps", "300", "--batch-size", "32", "--optimizer", "adam",
      "--lr", "0.001", "--device", "cpu", "--log-every", "100", "--train-samples", "20000"};
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
  const std::string a = ReadFile(whole), b = ReadFile(restarted);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the restarted run's parameters differ from the uninterrupted run's";
}

}  // namespace
}  // namespace tessera::testing
