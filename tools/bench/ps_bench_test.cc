// Smoke test of `tessera-bench ps`: 1x1 and 2x2 fleets (real servers and workers under
// tessera-launch), the raw ZeroMQ processes and, where /usr/bin/python3 has torch and no
// sanitizer is on, the Python path; checks the shape of the --json report, not its figures:
// benchmarks are not tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

TEST(PsBenchTest, JsonShape) {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");  // set by .bazelrc's configs
  const bool python = sanitizer == nullptr || *sanitizer == '\0';
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  std::vector<std::string> argv = {*bench,  "ps",         "--configs",      "1x1,2x2",
                                   "--sizes", "4K,64K",   "--iters",        "5",
                                   "--warmup", "1",       "--python-bytes", "64K",
                                   "--mlp-steps", "2",    "--json"};
  if (!python) argv.push_back("--no-python");  // the interpreter is not instrumented
  StatusOr<ChildOutput> output = RunToCompletion("tessera-bench ps", argv, 240'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, std::vector<nlohmann::json>> by_kind;
  for (const std::string& line : output->stdout_lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_EQ(j.value("benchmark", ""), "ps") << line;
    by_kind[j.value("kind", "")].push_back(j);
  }
  ASSERT_EQ(by_kind["config"].size(), 1u);
  // tessera (sockets), shm (shared memory) and zmq, two configurations, two sizes.
  ASSERT_EQ(by_kind["row"].size(), 12u);
  std::map<std::string, int> rows_of;
  for (const nlohmann::json& row : by_kind["row"]) ++rows_of[row.value("system", "")];
  EXPECT_EQ(rows_of, (std::map<std::string, int>{{"shm", 4}, {"tessera", 4}, {"zmq", 4}}));
  for (const nlohmann::json& row : by_kind["row"]) {
    const int workers = row.value("workers", 0);
    EXPECT_EQ(row.value("servers", 0), workers) << row.dump();
    EXPECT_EQ(row["workers_lines"].size(), static_cast<size_t>(workers)) << row.dump();
    for (const nlohmann::json& line : row["workers_lines"]) {
      EXPECT_EQ(line.value("iters", 0), 5) << row.dump();
    }
    EXPECT_GT(row.value("worker_gbps", 0.0), 0.0) << row.dump();
    EXPECT_NEAR(row.value("aggregate_gbps", 0.0), workers * row.value("worker_gbps", 0.0),
                1e-9 * workers)
        << row.dump();
    EXPECT_GT(row.value("requests_per_s", 0.0), 0.0) << row.dump();
  }
  EXPECT_EQ(by_kind["goal"].size(), 4u);
  if (python && by_kind["python_skipped"].empty()) {
    ASSERT_EQ(by_kind["python"].size(), 1u);
    EXPECT_GT(by_kind["python"][0].value("gbps", 0.0), 0.0);
    EXPECT_EQ(by_kind["python"][0]["figures"].value("bytes", 0), 65536);
    ASSERT_EQ(by_kind["mlp"].size(), 1u);
    EXPECT_GT(by_kind["mlp"][0]["figures"].value("alone_s", 0.0), 0.0);
    EXPECT_GT(by_kind["mlp"][0]["figures"].value("ps_sync_s", 0.0), 0.0);
  }
}

// --replicas: on each path (shared memory and the sockets) one copy and two, in alternated
// pairs of runs in --replica-mode (ps-sync by default), beside the ps-async rows; each
// replicated row carries each pair's ratio of push+pull times and their median. Timed by
// --seconds, the ps-sync workers agree when to stop: each times the same steps.
TEST(PsBenchTest, ReplicasComeInPairsOfRuns) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  const std::vector<std::string> argv = {*bench,     "ps",       "--configs", "2x2",
                                         "--sizes",  "64K",      "--seconds", "0.1",
                                         "--warmup", "1",        "--replicas", "2",
                                         "--replica-pairs", "2", "--no-python", "--no-zmq",
                                         "--json"};
  StatusOr<ChildOutput> output = RunToCompletion("tessera-bench ps --replicas 2", argv, 240'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, nlohmann::json> row_of;
  for (const std::string& line : output->stdout_lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    if (j.value("kind", "") == "row") row_of[j.value("system", "")] = j;
  }
  ASSERT_EQ(row_of.size(), 6u)
      << "tessera, tessera ps-sync, replicated, shm, shm ps-sync and replicated shm";
  for (const std::string system : {"replicated", "replicated shm"}) {
    const nlohmann::json& replicated = row_of[system];
    ASSERT_TRUE(replicated.contains("time_ratio_pairs")) << replicated.dump();
    ASSERT_EQ(replicated["time_ratio_pairs"].size(), 2u) << replicated.dump();
    for (const nlohmann::json& ratio : replicated["time_ratio_pairs"]) {
      EXPECT_GT(ratio.get<double>(), 0.0) << replicated.dump();
    }
    const double low = std::min(replicated["time_ratio_pairs"][0].get<double>(),
                                replicated["time_ratio_pairs"][1].get<double>());
    const double high = std::max(replicated["time_ratio_pairs"][0].get<double>(),
                                 replicated["time_ratio_pairs"][1].get<double>());
    EXPECT_GE(replicated.value("time_ratio", 0.0), low);
    EXPECT_LE(replicated.value("time_ratio", 0.0), high);
  }
  for (const std::string system : {"tessera", "tessera ps-sync", "shm", "shm ps-sync"}) {
    EXPECT_FALSE(row_of[system].contains("time_ratio")) << row_of[system].dump();
  }
  for (const std::string system :
       {"tessera ps-sync", "replicated", "shm ps-sync", "replicated shm"}) {
    const nlohmann::json& lines = row_of[system]["workers_lines"];
    ASSERT_EQ(lines.size(), 2u) << row_of[system].dump();
    EXPECT_EQ(lines[0].value("mode", ""), "ps-sync") << row_of[system].dump();
    EXPECT_GE(lines[0].value("iters", 0), 5) << row_of[system].dump();
    EXPECT_EQ(lines[0].value("iters", 0), lines[1].value("iters", -1)) << row_of[system].dump();
  }
}

// ps-ssp's workers do not agree when to stop: timing their own numbers of steps, the first to
// stop would hold the others' pushes forever. Refused at once without a fixed count.
TEST(PsBenchTest, PsSspNeedsAFixedStepCount) {
  StatusOr<std::string> launch = FindRunfile("tools/tessera-launch");
  ASSERT_TRUE(launch.ok()) << launch.status();
  StatusOr<ChildOutput> refused = RunToCompletion(
      "ps-ssp bench", {*launch, "--servers", "1", "--workers", "2", "--mode", "bench-ps",
                       "--log-level", "warning", "--", "--bench-sizes=65536",
                       "--bench-ps-mode=ps-ssp"},
      120'000);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--bench-ps-mode=ps-ssp needs --bench-iters N"),
            std::string::npos)
      << refused.status();
  StatusOr<ChildOutput> counted = RunToCompletion(
      "ps-ssp bench", {*launch, "--servers", "1", "--workers", "2", "--mode", "bench-ps", "--",
                       "--bench-sizes=65536", "--bench-ps-mode=ps-ssp", "--bench-warmup=1",
                       "--bench-iters=5"},
      120'000);
  ASSERT_TRUE(counted.ok()) << counted.status();
}

}  // namespace
}  // namespace tessera::tools
