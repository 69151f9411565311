// Smoke test of `tessera-bench memory`: one small run of stage 3 at N=2, one of hsdp, and a bad
// --stages.
// Checks the --json report's shape and that held bytes match the formula the benchmark states
// (the engines' exact accounting), not any timing.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

TEST(MemoryBenchTest, StageThreeTwoWorkersJsonShape) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench memory",
      {*bench, "memory", "--np", "2", "--stages", "3", "--hidden", "32", "--steps", "1", "--json"},
      /*timeout_ms=*/50'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::string text;
  for (const std::string& line : output->stdout_lines) text += line + "\n";
  nlohmann::json report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << text;
  EXPECT_EQ(report.value("bench", ""), "memory");
  ASSERT_EQ(report["rows"].size(), 1u) << text;
  const nlohmann::json& row = report["rows"][0];
  EXPECT_EQ(row.value("stage", -1), 3);
  EXPECT_EQ(row.value("np", 0), 2);
  const double psi = 784 * 32 + 32 + 32 * 10 + 10;  // mlp 784-32-10
  EXPECT_EQ(row.value("parameters", 0.0), psi);
  EXPECT_NEAR(row["held_bytes"].value("optimizer_state", 0.0), 8 * psi / 2, 8 * 4);
  EXPECT_TRUE(row.value("within_10_percent", false)) << text;
  EXPECT_GE(row["peak_bytes"].value("parameters", 0.0),
            row["held_bytes"].value("parameters", 1.0));
  EXPECT_TRUE(row.value("peak_within_bound", false)) << text;
}

// --stages hsdp with shard groups of 1 at N=2: every rank holds the whole state, as stage 3
// at N=1 would (issue 44, item 4).
TEST(MemoryBenchTest, HsdpIsStageThreeOverItsShardGroup) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench memory --stages hsdp",
      {*bench, "memory", "--np", "2", "--stages", "hsdp", "--shard-group-size", "1", "--hidden",
       "32", "--steps", "1", "--json"},
      /*timeout_ms=*/50'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::string text;
  for (const std::string& line : output->stdout_lines) text += line + "\n";
  nlohmann::json report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << text;
  ASSERT_EQ(report["rows"].size(), 1u) << text;
  const nlohmann::json& row = report["rows"][0];
  EXPECT_EQ(row.value("mode", ""), "hsdp");
  const double psi = 784 * 32 + 32 + 32 * 10 + 10;  // mlp 784-32-10
  EXPECT_EQ(row["held_bytes"].value("optimizer_state", 0.0), 8 * psi);
  EXPECT_TRUE(row.value("within_10_percent", false)) << text;
}

TEST(MemoryBenchTest, BadStageIsNamed) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench memory --stages 4", {*bench, "memory", "--stages", "0,4"}, 20'000);
  ASSERT_FALSE(output.ok());
  EXPECT_NE(output.status().message().find("'4' is not a ZeRO stage"), std::string::npos)
      << output.status();
}

}  // namespace
}  // namespace tessera::tools
