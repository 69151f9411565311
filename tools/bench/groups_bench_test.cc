// Smoke test of `tessera-bench groups` in a quick mode: two Python ranks per backend making two
// groups each, two concurrent all-reduces per group, and the three point-to-point pairs with
// few round trips; checks the shape of the --json report (one object per line), not its
// figures: benchmarks are not tests. When /usr/bin/python3 cannot import torch the report must
// say the torch parts were skipped, and point-to-point still runs. Not run under the
// sanitizers (the interpreter is not instrumented; tessera-bench is not built there).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

TEST(GroupsBenchTest, QuickRunJsonShape) {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");  // set by .bazelrc's configs
  if (sanitizer != nullptr && *sanitizer != '\0') {
    GTEST_SKIP() << "not run under " << sanitizer << ": /usr/bin/python3 is not instrumented";
  }
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench groups",
      {*bench, "groups", "--np", "2", "--groups", "2", "--concurrent-bytes", "64K",
       "--concurrent-iters", "2", "--repeats", "1", "--latency-iters", "50",
       "--bandwidth-bytes", "1M", "--bandwidth-iters", "2", "--timeout-s", "120", "--json"},
      /*timeout_ms=*/240'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, std::vector<nlohmann::json>> by_kind;
  for (const std::string& line : output->stdout_lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_EQ(j.value("benchmark", ""), "groups") << line;
    by_kind[j.value("kind", "")].push_back(j);
  }
  ASSERT_EQ(by_kind["config"].size(), 1u);
  EXPECT_EQ(by_kind["config"][0].value("groups", 0), 2);

  const bool skipped = !by_kind["skipped"].empty();
  if (skipped) {
    EXPECT_TRUE(by_kind["new_group"].empty());
    EXPECT_TRUE(by_kind["concurrent"].empty());
  } else {
    ASSERT_EQ(by_kind["new_group"].size(), 1u);
    const nlohmann::json& row = by_kind["new_group"][0];
    EXPECT_EQ(row.value("np", 0), 2) << row.dump();
    for (const char* backend : {"gloo", "tessera"}) {
      const nlohmann::json& f = row[backend];
      EXPECT_GT(f.value("new_group_ms_median", 0.0), 0.0) << row.dump();
      EXPECT_GE(f.value("new_group_ms_max", 0.0), f.value("new_group_ms_median", 0.0));
      for (const char* key : {"sockets_per_group", "threads_per_group", "rss_kib_per_group",
                              "sockets_before", "sockets_after", "threads_before",
                              "threads_after", "rss_kib_before", "rss_kib_after"}) {
        EXPECT_TRUE(f.contains(key) && f[key].is_number()) << key << " in " << row.dump();
      }
      EXPECT_GT(f.value("threads_before", 0), 0) << row.dump();
    }
    for (const char* key : {"new_group_ms_median", "sockets_per_group", "threads_per_group",
                            "rss_kib_per_group"}) {
      // A number, or null where Gloo added none of it (no ratio to state).
      EXPECT_TRUE(row["tessera_over_gloo"].contains(key)) << key << " in " << row.dump();
    }
    EXPECT_TRUE(row["tessera_over_gloo"]["new_group_ms_median"].is_number()) << row.dump();

    ASSERT_EQ(by_kind["concurrent"].size(), 1u);
    const nlohmann::json& concurrent = by_kind["concurrent"][0];
    EXPECT_EQ(concurrent.value("bytes", 0), 65536) << concurrent.dump();
    EXPECT_EQ(concurrent.value("iters_per_group", 0), 2) << concurrent.dump();
    for (const char* backend : {"gloo", "tessera"}) {
      const nlohmann::json& f = concurrent[backend];
      EXPECT_GT(f.value("concurrent_s", 0.0), 0.0) << concurrent.dump();
      EXPECT_GT(f.value("single_s", 0.0), 0.0) << concurrent.dump();
      EXPECT_DOUBLE_EQ(f.value("concurrent_over_single", 0.0),
                       f.value("concurrent_s", 0.0) / f.value("single_s", 1.0));
    }
  }

  ASSERT_EQ(by_kind["p2p_latency"].size(), 1u);
  const nlohmann::json& latency = by_kind["p2p_latency"][0];
  EXPECT_EQ(latency.value("bytes", 0), 8);
  for (const char* key : {"tessera_s", "zmq_s", "shm_s"}) {
    EXPECT_GT(latency.value(key, 0.0), 0.0) << key << " in " << latency.dump();
  }
  EXPECT_DOUBLE_EQ(latency.value("tessera_over_zmq", 0.0),
                   latency.value("tessera_s", 0.0) / latency.value("zmq_s", 1.0));
  ASSERT_EQ(by_kind["p2p_bandwidth"].size(), 1u);
  const nlohmann::json& bandwidth = by_kind["p2p_bandwidth"][0];
  EXPECT_EQ(bandwidth.value("bytes", 0), 1 << 20);
  for (const char* key :
       {"tessera_bytes_per_second", "zmq_bytes_per_second", "memcpy_bytes_per_second"}) {
    EXPECT_GT(bandwidth.value(key, 0.0), 0.0) << key << " in " << bandwidth.dump();
  }
  EXPECT_DOUBLE_EQ(bandwidth.value("tessera_over_memcpy", 0.0),
                   bandwidth.value("tessera_bytes_per_second", 0.0) /
                       bandwidth.value("memcpy_bytes_per_second", 1.0));
}

TEST(GroupsBenchTest, RejectsBadFlagsNamingThem) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--np", "1"}, std::vector<std::string>{"--bandwidth-bytes", "6"},
        std::vector<std::string>{"--concurrent-bytes", "1X"},
        std::vector<std::string>{"--groups", "1"}, std::vector<std::string>{"--no-torch",
                                                                           "--no-p2p"}}) {
    std::vector<std::string> argv = {*bench, "groups"};
    argv.insert(argv.end(), args.begin(), args.end());
    StatusOr<ChildOutput> output = RunToCompletion("tessera-bench groups " + args[0], argv,
                                                   30'000);
    ASSERT_FALSE(output.ok()) << args[0] << " " << args[1] << " was accepted";
    EXPECT_NE(output.status().message().find(args[0]), std::string::npos) << output.status();
  }
}

}  // namespace
}  // namespace tessera::tools
