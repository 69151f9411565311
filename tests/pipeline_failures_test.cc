// Failures of a native pipeline in words (issue 46, item 4): workers of a 3-stage mlp pipeline
// on loopback, each its own tessera-worker under one coordinator, and
//   - a stage killed mid-training: every other rank fails within the heartbeat timeout (1 s
//     here) plus a step, naming the worker that died;
//   - a stage hung (SIGSTOP: alive to the kernel, silent to the coordinator): named by the
//     heartbeat, every other rank fails naming it;
//   - stages built from different models (one rank's --hidden differs): the activation's
//     receiver fails naming the stage pair, the micro-batch, the shape it takes and both
//     sizes, and every other rank fails quoting it, without waiting for any deadline.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;
constexpr int kStages = 3;

std::vector<std::string> Flags(const std::string& coordinator, int rank,
                               const std::string& steps = "1000000") {
  return {"--coordinator", coordinator, "--num-workers", std::to_string(kStages),
          "--heartbeat-interval-ms", "100", "--heartbeat-timeout-ms", "1000",
          "--request-timeout-ms", "10000", "--rank", std::to_string(rank), "--mode",
          "allreduce", "--pipeline-stages", std::to_string(kStages), "--micro-batches", "4",
          "--pipeline-schedule", "1f1b", "--steps", steps, "--optimizer", "sgd", "--lr", "0.05",
          "--device", "cpu", "--log-every", "10", "--train-samples", "512", "--hidden",
          "32,32,32,32", "--input-dim", "16", "--classes", "4", "--seed", "3", "--batch-size",
          "16"};
}

class PipelineFailuresTest : public ::testing::Test {
 protected:
  void StartStages(const std::vector<std::string>& hidden_of_rank = {}) {
    auto coordinator = harness_.StartCoordinator(
        {"--num-workers", std::to_string(kStages), "--heartbeat-interval-ms", "100",
         "--heartbeat-timeout-ms", "1000"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    for (int r = 0; r < kStages; ++r) {
      std::vector<std::string> flags = Flags(*coordinator, r);
      if (!hidden_of_rank.empty()) {
        *(std::find(flags.begin(), flags.end(), "--hidden") + 1) = hidden_of_rank[r];
      }
      auto id = harness_.Start("worker " + std::to_string(r), "worker/tessera-worker", flags);
      ASSERT_TRUE(id.ok()) << id.status();
      workers_.push_back(*id);
    }
  }

  // Every worker but `victim` exits failing within `bound_ms`, its output naming `words`.
  void ExpectOthersFailNaming(int victim, const std::regex& words, int64_t bound_ms) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kStages; ++r) {
      if (r == victim) continue;
      auto exit = harness_.WaitExit(workers_[r], Deadline::AfterMillis(bound_ms));
      ASSERT_TRUE(exit.ok()) << "worker " << r << " did not end within " << bound_ms << " ms\n"
                             << harness_.Output(workers_[r]);
      EXPECT_FALSE(exit->success());
      EXPECT_TRUE(std::regex_search(harness_.Output(workers_[r]), words))
          << "worker " << r << ":\n" << harness_.Output(workers_[r]);
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    EXPECT_LE(took.count(), bound_ms);
  }

  FleetHarness harness_;
  std::vector<int> workers_;
};

TEST_F(PipelineFailuresTest, AKilledStageFailsEveryOtherRankNamingIt) {
  StartStages();
  ASSERT_TRUE(harness_.WaitForLine(workers_[0], "step 20/", Deadline::AfterMillis(kRunMs)).ok())
      << harness_.Output(workers_[0]);
  ASSERT_TRUE(harness_.Signal(workers_[1], SIGKILL).ok());
  // The coordinator sees the process gone at once (its socket closes); 5 s leaves room for a
  // loaded machine and the ranks' own exit.
  ExpectOthersFailNaming(1, std::regex("worker 1"), 5000);
  harness_.StopAll();
}

TEST_F(PipelineFailuresTest, AHungStageIsNamedByTheHeartbeat) {
  StartStages();
  ASSERT_TRUE(harness_.WaitForLine(workers_[0], "step 20/", Deadline::AfterMillis(kRunMs)).ok())
      << harness_.Output(workers_[0]);
  ASSERT_TRUE(harness_.Signal(workers_[2], SIGSTOP).ok());
  // Silent for the heartbeat timeout (1 s), then declared failed: the others end naming it.
  ExpectOthersFailNaming(2, std::regex("worker 2"), 8000);
  EXPECT_TRUE(harness_.Signal(workers_[2], SIGCONT).ok());
  harness_.StopAll();
}

TEST_F(PipelineFailuresTest, StagesOfDifferentModelsFailNamingTheStagePairAndBothSizes) {
  // Rank 1 builds 32-33-... where the others build 32-32-...: stage 0's output (its last
  // layer's width) is not what stage 1 takes.
  StartStages({"32,32,32,32", "32,33,32,32", "32,32,32,32"});
  // Stage 1 takes 33 features from stage 0, which gives 32 (micro-batches of 4 rows).
  const std::regex words(
      "activation of stage 0 micro-batch 0 for stage 1 \\(\\[4, 33\\] float32 here\\): "
      "rank 0 \\(worker 0\\) sent 512 bytes; this rank expects 528");
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kStages; ++r) {
    auto exit = harness_.WaitExit(workers_[r], Deadline::AfterMillis(30000));
    ASSERT_TRUE(exit.ok()) << "worker " << r << " hangs\n" << harness_.Output(workers_[r]);
    EXPECT_FALSE(exit->success()) << harness_.Output(workers_[r]);
  }
  // From the start of the processes: the fleet's rendezvous, the first step's messages.
  EXPECT_LE(std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start).count(), 10000);
  for (int r = 0; r < kStages; ++r) {
    EXPECT_TRUE(std::regex_search(harness_.Output(workers_[r]), words))
        << "worker " << r << ":\n" << harness_.Output(workers_[r]);
  }
}

}  // namespace
}  // namespace tessera::testing
