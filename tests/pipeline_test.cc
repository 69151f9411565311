// Pipeline parallelism of the native mlp end to end (issue 46, item 2): workers on loopback
// under tessera-launch, each schedule against one process (--mode local) training on the same
// global batch with SGD and momentum; the peak of micro-batches each stage holds against the
// schedule's bound; and the refusals of shapes a pipeline cannot run.
//
// Tolerance (the issue's): every parameter within 1e-5 of its tensor's scale,
// |pipeline - local| <= 1e-5 max |local tensor|. The pipeline sums the micro-batches'
// gradients in another order than one batch's GEMM does.
//
// The model, 16-32-32-32-32-4 with ReLU, has 9 layers, enough for 4 ranks x 2 virtual stages;
// runs are 4 steps of 16 samples, so each takes about a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tests/fleet_harness.h"
#include "tests/params_match.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

std::vector<std::string> Flags() {
  return {"--steps", "4", "--optimizer", "sgd", "--lr", "0.1", "--optimizer-params",
          "momentum=0.9", "--device", "cpu", "--log-every", "2", "--train-samples", "256",
          "--hidden", "32,32,32,32", "--input-dim", "16", "--classes", "4", "--seed", "7",
          "--batch-size", "16", "--eval-samples", "32", "--json"};
}

// The parameters of one process on the 16-sample batch, made once for the suite.
const std::string& Reference() {
  static const std::string path = [] {
    const std::string out = TempPath("pipeline_reference.bin");
    FleetHarness harness;
    Status ran = harness.RunToSuccess(
        "reference", "tools/tessera-launch",
        Concat({"--workers", "1", "--mode", "local", "--"}, Concat(Flags(), {"--save-params",
                                                                             out})),
        kRunMs);
    EXPECT_TRUE(ran.ok()) << ran;
    return out;
  }();
  return path;
}

// The "parallel" object of each worker's JSON summary in `output`.
std::vector<nlohmann::json> ParallelSummaries(const std::string& output) {
  std::vector<nlohmann::json> summaries;
  size_t at = 0;
  while ((at = output.find("{\"batch_size\"", at)) != std::string::npos) {
    const size_t end = output.find('\n', at);
    auto summary = nlohmann::json::parse(output.substr(at, end - at), nullptr, false);
    if (!summary.is_discarded() && summary.contains("parallel")) {
      summaries.push_back(summary["parallel"]);
    }
    at = end;
  }
  return summaries;
}

// (schedule, P, M, V)
using Shape = std::tuple<std::string, int, int, int>;

class PipelineMatchesOneProcess : public ::testing::TestWithParam<Shape> {};

TEST_P(PipelineMatchesOneProcess, SgdWithMomentum) {
  const auto& [schedule, ranks, micro, virtual_stages] = GetParam();
  const std::string label = schedule + "_p" + std::to_string(ranks) + "_m" +
                            std::to_string(micro) + "_v" + std::to_string(virtual_stages);
  const std::string out = TempPath("pipeline_" + label + ".bin");
  FleetHarness harness;
  auto id = harness.Start(
      label, "tools/tessera-launch",
      Concat({"--workers", std::to_string(ranks), "--mode", "allreduce", "--"},
             Concat(Flags(), {"--save-params", out, "--pipeline-stages", std::to_string(ranks),
                              "--micro-batches", std::to_string(micro), "--pipeline-schedule",
                              schedule, "--pipeline-virtual-stages",
                              std::to_string(virtual_stages)})));
  ASSERT_TRUE(id.ok()) << id.status();
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok() && exit->success()) << harness.Output(*id);
  ExpectParamsMatch(out, Reference());
  // Each stage held at most what the schedule says, and reached it.
  const std::vector<nlohmann::json> summaries = ParallelSummaries(harness.Output(*id));
  ASSERT_EQ(summaries.size(), static_cast<size_t>(ranks)) << harness.Output(*id);
  for (const nlohmann::json& s : summaries) {
    EXPECT_EQ(s["peak_held"], s["schedule_peak_held"]) << s.dump();
    EXPECT_EQ(s["schedule"], schedule);
  }
}

std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (int ranks : {2, 3, 4}) {
    for (int micro : {1, 4, 8}) {
      shapes.emplace_back("gpipe", ranks, micro, 1);
      if (micro >= ranks) {  // 1f1b and zb-h1 need M >= P
        shapes.emplace_back("1f1b", ranks, micro, 1);
        shapes.emplace_back("zb-h1", ranks, micro, 1);
      }
      if (micro % ranks == 0) shapes.emplace_back("interleaved", ranks, micro, 2);
    }
  }
  return shapes;
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  const auto& [schedule, ranks, micro, virtual_stages] = info.param;
  std::string name = schedule == "zb-h1" ? "zbh1" : schedule == "1f1b" ? "OneFOneB" : schedule;
  return name + "_P" + std::to_string(ranks) + "_M" + std::to_string(micro) + "_V" +
         std::to_string(virtual_stages);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineMatchesOneProcess, ::testing::ValuesIn(Shapes()),
                         ShapeName);

// Runs a launcher that must fail; returns its output.
std::string RunToFailure(const std::string& label, const std::vector<std::string>& args) {
  FleetHarness harness;
  auto id = harness.Start(label, "tools/tessera-launch", args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok() && !exit->success()) << label << "\n" << harness.Output(*id);
  return harness.Output(*id);
}

TEST(PipelineRefusalTest, FewerMicroBatchesThanRanksFor1F1BAndZbH1) {
  for (const std::string schedule : {"1f1b", "zb-h1"}) {
    const std::string output = RunToFailure(
        schedule, Concat({"--workers", "2", "--mode", "allreduce", "--"},
                         Concat(Flags(), {"--pipeline-stages", "2", "--micro-batches", "1",
                                          "--pipeline-schedule", schedule})));
    EXPECT_NE(output.find("needs at least as many micro-batches as ranks (1 < 2"),
              std::string::npos)
        << output;
  }
}

TEST(PipelineRefusalTest, FewerLayersThanStages) {
  // 4 ranks x 2 virtual stages over the 5 layers of 16-32-32-4.
  std::vector<std::string> flags = Flags();
  *(std::find(flags.begin(), flags.end(), std::string("--hidden")) + 1) = "32,32";
  const std::string output = RunToFailure(
      "layers", Concat({"--workers", "4", "--mode", "allreduce", "--"},
                       Concat(flags, {"--pipeline-stages", "4", "--micro-batches", "4",
                                      "--pipeline-schedule", "interleaved",
                                      "--pipeline-virtual-stages", "2"})));
  EXPECT_NE(output.find("the model has 5 layers, fewer than the 8 stages"), std::string::npos)
      << output;
}

TEST(PipelineRefusalTest, AWorldNotAMultipleOfStagesTimesTensorParallel) {
  const std::string output = RunToFailure(
      "world", Concat({"--workers", "3", "--mode", "allreduce", "--"},
                      Concat(Flags(), {"--pipeline-stages", "2"})));
  EXPECT_NE(output.find("the world of 3 workers is not a multiple of --pipeline-stages 2 "
                        "--tensor-parallel 1"),
            std::string::npos)
      << output;
}

TEST(PipelineRefusalTest, ModesOtherThanAllReduceAndZero1) {
  const std::string output = RunToFailure(
      "mode", Concat({"--workers", "2", "--mode", "zero3", "--"},
                     Concat(Flags(), {"--pipeline-stages", "2"})));
  EXPECT_NE(output.find("run with --mode allreduce or zero1 across the data-parallel groups, "
                        "not --mode zero3"),
            std::string::npos)
      << output;
}

TEST(PipelineRefusalTest, ABatchNotDivisibleIntoTheMicroBatches) {
  const std::string output = RunToFailure(
      "batch", Concat({"--workers", "2", "--mode", "allreduce", "--"},
                      Concat(Flags(), {"--pipeline-stages", "2", "--micro-batches", "3"})));
  EXPECT_NE(output.find("--batch-size 16 (per data-parallel replica) is not divisible by "
                        "--micro-batches 3"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace tessera::testing
