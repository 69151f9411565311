// Smoke test of `tessera-bench train --mode zero2`: two real workers of --mode allreduce and two
// of --mode zero2, a few steps each; checks the shape of the --json report (not its figures:
// benchmarks are not tests).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

TEST(TrainBenchTest, Zero2TwoWorkersJsonShape) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench train --mode zero2",
      {*bench, "train", "--mode", "zero2", "--np", "2", "--steps", "3", "--warmup-steps", "1",
       "--repeats", "1", "--threads", "1", "--json"},
      /*timeout_ms=*/50'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::string text;
  for (const std::string& line : output->stdout_lines) text += line + "\n";
  nlohmann::json report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << text;
  EXPECT_EQ(report.value("benchmark", ""), "train");
  EXPECT_EQ(report.value("mode", ""), "zero2");
  EXPECT_EQ(report.value("np", 0), 2);
  EXPECT_EQ(report.value("steps", 0), 3);
  ASSERT_EQ(report["rows"].size(), 1u) << text;
  const nlohmann::json& row = report["rows"][0];
  EXPECT_EQ(row.value("batch_size", 0), 64);
  EXPECT_EQ(row.value("optimizer", ""), "adam");  // the default in the ZeRO modes
  for (const char* mode : {"allreduce", "zero2"}) {
    ASSERT_TRUE(row.contains(mode)) << text;
    const nlohmann::json& side = row[mode];
    EXPECT_GT(side.value("ms_per_step", 0.0), 0.0) << mode;
    EXPECT_GT(side.value("samples_per_second", 0.0), 0.0) << mode;
    EXPECT_EQ(side["runs_ms_per_step"].size(), 1u) << mode;
    for (const char* when : {"held", "peak"}) {
      const nlohmann::json& bytes = side["model_state_bytes"][when];
      EXPECT_GT(bytes.value("total", 0.0), 0.0) << mode << " " << when;
      EXPECT_GT(bytes.value("optimizer_state", 0.0), 0.0) << mode << " " << when;
    }
  }
  EXPECT_GT(row.value("step_time_ratio", 0.0), 0.0);
  EXPECT_GT(row.value("held_bytes_ratio", 0.0), 0.0);
  EXPECT_LT(row.value("held_bytes_ratio", 1.0), 1.0);  // stage 2 holds less than allreduce
  EXPECT_GT(row.value("peak_bytes_ratio", 0.0), 0.0);
  EXPECT_DOUBLE_EQ(row.value("goal_step_time_ratio", 0.0), 1.10);
  EXPECT_TRUE(row.contains("goal_met") && row["goal_met"].is_boolean()) << text;
  EXPECT_FALSE(row.contains("torch_samples_per_second"));
}

}  // namespace
}  // namespace tessera::tools
