// Smoke test of `tessera-bench allreduce`: two real workers, one small size, no peers; checks
// the shape of the --json report (not its figures: benchmarks are not tests).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

TEST(AllReduceBenchTest, TwoWorkersOneSizeJsonShape) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench allreduce",
      {*bench, "allreduce", "--np", "2", "--sizes", "4096", "--iters", "5", "--no-mpi",
       "--no-gloo", "--json"},
      /*timeout_ms=*/50'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::string text;
  for (const std::string& line : output->stdout_lines) text += line + "\n";
  nlohmann::json report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << text;
  EXPECT_EQ(report.value("benchmark", ""), "allreduce");
  EXPECT_EQ(report.value("np", 0), 2);
  EXPECT_EQ(report["skipped"].value("mpi", ""), "--no-mpi");
  EXPECT_EQ(report["skipped"].value("mpi_shm", ""), "--no-mpi");
  // auto picks shared memory for two workers on one host, and the report says so.
  EXPECT_EQ(report.value("ring_transport", ""), "auto");
  EXPECT_EQ(report.value("ring_channel", "").rfind("shm (", 0), 0u) << text;
  EXPECT_EQ(report["skipped"].value("gloo", ""), "--no-gloo");
  ASSERT_EQ(report["rows"].size(), 1u) << text;
  const nlohmann::json& row = report["rows"][0];
  EXPECT_EQ(row.value("bytes", 0), 4096);
  ASSERT_TRUE(row.contains("tessera")) << text;
  EXPECT_GT(row["tessera"].value("time_s", 0.0), 0.0);
  EXPECT_GT(row["tessera"].value("busbw_bytes_per_second", 0.0), 0.0);
  EXPECT_EQ(row["tessera"].value("iters", 0), 5);
  EXPECT_FALSE(row.contains("mpi"));
  EXPECT_FALSE(row.contains("mpi_shm"));
  EXPECT_FALSE(row.contains("gloo"));
}

}  // namespace
}  // namespace tessera::tools
