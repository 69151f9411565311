// Smoke test of `tessera-bench torch`: two real Python ranks holding a gloo and a tessera
// group, one small all_reduce and a few mlp steps; checks the shape of the --json report (one
// object per line), not its figures: benchmarks are not tests. Skipped when /usr/bin/python3
// cannot import torch (the bench says so) and under the sanitizer configurations (the
// extension in the bench's runfiles is instrumented, the interpreter is not).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

// The --json lines by their "kind"; a line that is not a torch bench object fails the test.
std::map<std::string, std::vector<nlohmann::json>> ByKind(const std::vector<std::string>& lines) {
  std::map<std::string, std::vector<nlohmann::json>> by_kind;
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object()) << "not a JSON object: " << line;
    if (!j.is_object()) continue;
    EXPECT_EQ(j.value("benchmark", ""), "torch") << line;
    by_kind[j.value("kind", "")].push_back(j);
  }
  return by_kind;
}

TEST(TorchBenchTest, TwoRanksJsonShape) {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");  // set by .bazelrc's configs
  if (sanitizer != nullptr && *sanitizer != '\0') {
    GTEST_SKIP() << "not run under " << sanitizer << ": /usr/bin/python3 is not instrumented";
  }
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench torch",
      {*bench, "torch", "--np", "2", "--ops", "all_reduce,broadcast", "--sizes", "4K",
       "--iters", "5", "--models", "mlp", "--steps", "2", "--warmup-steps", "1", "--repeats",
       "1", "--json"},
      /*timeout_ms=*/240'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, std::vector<nlohmann::json>> by_kind = ByKind(output->stdout_lines);
  if (!by_kind["skipped"].empty()) {
    GTEST_SKIP() << by_kind["skipped"][0].value("skipped", "");
  }
  ASSERT_EQ(by_kind["config"].size(), 1u);
  const nlohmann::json& config = by_kind["config"][0];
  EXPECT_EQ(config.value("threads_per_rank", 0), 1);
  EXPECT_EQ(config.value("tessera_channel", "").rfind("shm (", 0), 0u) << config.dump();
  // The package came from the bench's runfiles, not from an installed copy.
  EXPECT_NE(config.value("tessera_package", "").find(".runfiles/"), std::string::npos)
      << config.dump();

  ASSERT_EQ(by_kind["collective"].size(), 2u);
  for (const nlohmann::json& row : by_kind["collective"]) {
    EXPECT_EQ(row.value("bytes", 0), 4096) << row.dump();
    EXPECT_EQ(row.value("np", 0), 2) << row.dump();
    for (const char* backend : {"gloo", "tessera"}) {
      EXPECT_EQ(row[backend].value("iters", 0), 5) << row.dump();
      EXPECT_GT(row[backend].value("median_s", 0.0), 0.0) << row.dump();
    }
    EXPECT_DOUBLE_EQ(row.value("tessera_speedup", 0.0),
                     row.value("gloo_s", 0.0) / row.value("tessera_s", 1.0));
  }
  EXPECT_EQ(by_kind["collective"][0].value("op", ""), "all_reduce");
  EXPECT_EQ(by_kind["collective"][1].value("op", ""), "broadcast");

  ASSERT_EQ(by_kind["train"].size(), 1u);
  const nlohmann::json& train = by_kind["train"][0];
  EXPECT_EQ(train.value("model", ""), "mlp");
  EXPECT_EQ(train.value("np", 0), 2);
  for (const char* side : {"gloo", "tessera", "single"}) {
    EXPECT_GT(train[side].value("samples_per_second", 0.0), 0.0) << train.dump();
    EXPECT_EQ(train[side].value("parameters", 0), 1863690) << train.dump();
  }
  EXPECT_GT(train.value("tessera_scaling", 0.0), 0.0) << train.dump();

  // all_reduce at 4 KiB, and DDP mlp at 2 processes; no 1 MiB size, so no goal from it.
  ASSERT_EQ(by_kind["goal"].size(), 2u);
  for (const nlohmann::json& goal : by_kind["goal"]) {
    EXPECT_TRUE(goal.contains("met")) << goal.dump();
    EXPECT_FALSE(goal.value("detail", "").empty()) << goal.dump();
  }
}

// `torch --fsdp` on a tiny GPT-like model: DDP on both backends and two FSDP strategies at 2
// ranks, one run of processes each (about 15 s here).
TEST(TorchBenchTest, FsdpJsonShape) {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");
  if (sanitizer != nullptr && *sanitizer != '\0') {
    GTEST_SKIP() << "not run under " << sanitizer << ": /usr/bin/python3 is not instrumented";
  }
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench torch --fsdp",
      {*bench, "torch", "--fsdp", "--fsdp-np", "2", "--strategies", "FULL_SHARD,SHARD_GRAD_OP",
       "--fsdp-dim", "32", "--fsdp-layers", "2", "--fsdp-heads", "2", "--fsdp-vocab", "64",
       "--fsdp-seq", "8", "--steps", "2", "--warmup-steps", "1", "--timeout-s", "120",
       "--json"},
      /*timeout_ms=*/240'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, std::vector<nlohmann::json>> by_kind = ByKind(output->stdout_lines);
  if (!by_kind["skipped"].empty()) {
    GTEST_SKIP() << by_kind["skipped"][0].value("skipped", "");
  }
  ASSERT_EQ(by_kind["config"].size(), 1u);
  EXPECT_EQ(by_kind["config"][0].value("mode", ""), "fsdp");
  EXPECT_EQ(by_kind["config"][0].value("steps", 0), 2);

  ASSERT_EQ(by_kind["fsdp"].size(), 4u);
  std::vector<std::string> configs, strategies;
  for (const nlohmann::json& row : by_kind["fsdp"]) {
    configs.push_back(row.value("config", ""));
    strategies.push_back(row.value("strategy", ""));
    EXPECT_EQ(row.value("np", 0), 2) << row.dump();
    EXPECT_GT(row.value("step_s", 0.0), 0.0) << row.dump();
    EXPECT_GT(row.value("step_time_over_ddp", 0.0), 0.0) << row.dump();
    EXPECT_GT(row.value("step_time_over_gloo_ddp", 0.0), 0.0) << row.dump();
    EXPECT_GT(row.value("peak_bytes", 0.0), 0.0) << row.dump();
    EXPECT_TRUE(row.contains("activation_bytes")) << row.dump();
    EXPECT_EQ(row.value("parameters", 0), by_kind["fsdp"][0].value("parameters", -1))
        << row.dump();
    // Same seeds and batches: the same first loss under every configuration.
    ASSERT_FALSE(row.value("rank0_losses", std::vector<double>{}).empty()) << row.dump();
  }
  EXPECT_EQ(configs, (std::vector<std::string>{"ddp-tessera", "ddp-gloo", "FULL_SHARD",
                                               "SHARD_GRAD_OP"}));
  EXPECT_EQ(strategies, (std::vector<std::string>{"DDP", "DDP", "FULL_SHARD", "SHARD_GRAD_OP"}));
  EXPECT_DOUBLE_EQ(by_kind["fsdp"][0].value("step_time_over_ddp", 0.0), 1.0);
  EXPECT_GT(by_kind["fsdp"][2].value("expected_state_bytes", 0.0), 0.0);
  const double first_loss = by_kind["fsdp"][0]["rank0_losses"][0].get<double>();
  for (const nlohmann::json& row : by_kind["fsdp"]) {
    EXPECT_NEAR(row["rank0_losses"][0].get<double>(), first_loss, 1e-4) << row.dump();
  }

  // SHARD_GRAD_OP's and FULL_SHARD's step time, FULL_SHARD's memory; no search, no hybrid.
  ASSERT_EQ(by_kind["goal"].size(), 3u);
  for (const nlohmann::json& goal : by_kind["goal"]) {
    EXPECT_TRUE(goal.contains("met")) << goal.dump();
    EXPECT_FALSE(goal.value("detail", "").empty()) << goal.dump();
  }
}

TEST(TorchBenchTest, RejectsBadFlagsNamingThem) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--sizes", "4K,6"}, std::vector<std::string>{"--ops", "reduce"},
        std::vector<std::string>{"--np", "1"}, std::vector<std::string>{"--models", "rnn"},
        std::vector<std::string>{"--strategies", "ZERO3", "--fsdp"},
        std::vector<std::string>{"--fsdp-np", "1", "--fsdp"},
        std::vector<std::string>{"--memory-limit", "12X", "--fsdp"}}) {
    std::vector<std::string> argv = {*bench, "torch"};
    argv.insert(argv.end(), args.begin(), args.end());
    StatusOr<ChildOutput> output = RunToCompletion("tessera-bench torch " + args[0], argv, 30'000);
    ASSERT_FALSE(output.ok()) << args[0] << " " << args[1] << " was accepted";
    EXPECT_NE(output.status().message().find(args[0]), std::string::npos) << output.status();
  }
}

}  // namespace
}  // namespace tessera::tools
