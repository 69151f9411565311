// Smoke test of `tessera-bench pipeline`: a tiny model, one process, then two real Python
// ranks running DDP and every schedule at M = 2 and 4 for one step, then the tensor-parallel
// part at d = 16 (one process, DDP and TP T = 2); checks the --json report's keys and that its
// figures are sane (fractions in [0, 1], GPipe's and 1F1B's formula (P-1)/(M+P-1), the
// micro-batches held as the library says, TP's loss DDP's), not their values: benchmarks are
// not tests. Skipped when /usr/bin/python3 cannot import torch (the bench says so) and
// under the sanitizer configurations (the interpreter is not instrumented).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

// The --json lines by their "kind"; a line that is not a pipeline bench object fails the test.
std::map<std::string, std::vector<nlohmann::json>> ByKind(const std::vector<std::string>& lines) {
  std::map<std::string, std::vector<nlohmann::json>> by_kind;
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object()) << "not a JSON object: " << line;
    if (!j.is_object()) continue;
    EXPECT_EQ(j.value("benchmark", ""), "pipeline") << line;
    by_kind[j.value("kind", "")].push_back(j);
  }
  return by_kind;
}

bool IsFraction(const nlohmann::json& value) {
  return value.is_number() && value.get<double>() >= 0.0 && value.get<double>() <= 1.0;
}

TEST(PipelineBenchTest, TwoRanksJsonShape) {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");  // set by .bazelrc's configs
  if (sanitizer != nullptr && *sanitizer != '\0') {
    GTEST_SKIP() << "not run under " << sanitizer << ": /usr/bin/python3 is not instrumented";
  }
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  StatusOr<ChildOutput> output = RunToCompletion(
      "tessera-bench pipeline",
      {*bench, "pipeline", "--stages", "2", "--micro-batches", "2,4", "--dim", "16", "--layers",
       "4", "--batch-size", "8", "--steps", "1", "--warmup-steps", "0", "--timeout-s", "60",
       "--tp-dim", "16", "--tp-batch", "8", "--json"},
      /*timeout_ms=*/120'000);
  ASSERT_TRUE(output.ok()) << output.status();
  std::map<std::string, std::vector<nlohmann::json>> by_kind = ByKind(output->stdout_lines);
  if (!by_kind["skipped"].empty()) {
    GTEST_SKIP() << by_kind["skipped"][0].value("skipped", "");
  }
  ASSERT_EQ(by_kind["config"].size(), 1u);
  const nlohmann::json& config = by_kind["config"][0];
  EXPECT_EQ(config.value("parameters", 0), 4 * (16 * 16 + 16)) << config.dump();
  EXPECT_EQ(config.value("steps", 0), 1) << config.dump();
  // The package came from the bench's runfiles, not from an installed copy.
  EXPECT_NE(config.value("tessera_package", "").find(".runfiles/"), std::string::npos)
      << config.dump();

  ASSERT_EQ(by_kind["reference"].size(), 2u);  // one process, DDP at P = 2
  for (const nlohmann::json& reference : by_kind["reference"]) {
    EXPECT_GT(reference.value("samples_per_second", 0.0), 0.0) << reference.dump();
  }

  // Every schedule at every M, in the order of the flags.
  const std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved", "zb-h1"};
  ASSERT_EQ(by_kind["row"].size(), 8u);
  std::map<std::tuple<std::string, int>, nlohmann::json> rows;
  for (const nlohmann::json& row : by_kind["row"]) {
    SCOPED_TRACE(row.dump());
    for (const char* key : {"schedule", "stages", "micro_batches", "bubble_measured",
                            "bubble_formula", "throughput_over_one_process",
                            "throughput_over_ddp", "peak_activation_bytes"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    const std::string schedule = row.value("schedule", "");
    const int p = row.value("stages", 0), m = row.value("micro_batches", 0);
    EXPECT_EQ(p, 2);
    rows[{schedule, m}] = row;
    EXPECT_TRUE(IsFraction(row["bubble_measured"]));
    EXPECT_TRUE(IsFraction(row["bubble_formula"]));
    ASSERT_EQ(row["bubble_per_rank"].size(), 2u);
    for (const nlohmann::json& bubble : row["bubble_per_rank"]) EXPECT_TRUE(IsFraction(bubble));
    const double mean = (row["bubble_per_rank"][0].get<double>() +
                         row["bubble_per_rank"][1].get<double>()) / 2;
    EXPECT_NEAR(row.value("bubble_measured", -1.0), mean, 1e-12);
    if (schedule == "gpipe" || schedule == "1f1b") {
      const double textbook = (p - 1.0) / (m + p - 1.0);
      EXPECT_NEAR(row.value("bubble_formula", -1.0), textbook, 1e-9);
      EXPECT_NEAR(row.value("bubble_textbook", -1.0), textbook, 1e-9);
    } else {
      EXPECT_TRUE(row["bubble_textbook"].is_null());
      EXPECT_LT(row.value("bubble_formula", 1.0), (p - 1.0) / (m + p - 1.0));
    }
    EXPECT_EQ(row.value("stages_per_rank", 0), schedule == "interleaved" ? 2 : 1);
    EXPECT_GT(row.value("throughput_over_one_process", 0.0), 0.0);
    EXPECT_GT(row.value("throughput_over_ddp", 0.0), 0.0);
    EXPECT_GT(row.value("step_s", 0.0), 0.0);
    EXPECT_GT(row.value("peak_activation_bytes", 0), 0);
    // Everything autograd held was released by the step's end, and the schedule held as many
    // micro-batches at once as the library says.
    EXPECT_EQ(row["activation_bytes_left_after_step"], nlohmann::json::array({0, 0}));
    EXPECT_EQ(row["peak_held_per_rank"], row["expected_peak_held_per_rank"]);
    EXPECT_TRUE(row["oversubscribed"].is_boolean());
  }
  for (const std::string& schedule : schedules) {
    for (int m : {2, 4}) EXPECT_EQ(rows.count({schedule, m}), 1u) << schedule << " M=" << m;
  }
  // GPipe holds every micro-batch: at M = 4 rank 0 holds more activations than 1F1B's 2.
  const int64_t gpipe_peak = rows[{"gpipe", 4}]["peak_activation_bytes_per_rank"][0];
  const int64_t one_f_one_b_peak = rows[{"1f1b", 4}]["peak_activation_bytes_per_rank"][0];
  EXPECT_GT(gpipe_peak, one_f_one_b_peak);

  // The tensor-parallel row: TP T = 2 beside one process and DDP on the same batch; after the
  // same steps from the same weights its loss is DDP's (and the one process's).
  ASSERT_EQ(by_kind["tensor_parallel"].size(), 1u);
  const nlohmann::json& tp = by_kind["tensor_parallel"][0];
  {
    SCOPED_TRACE(tp.dump());
    EXPECT_EQ(tp.value("tp", 0), 2);
    EXPECT_EQ(tp.value("dim", 0), 16);
    EXPECT_EQ(tp.value("batch_size", 0), 8);
    EXPECT_EQ(tp.value("parameters", 0), 2 * (16 * 16 + 16));
    // Rank 0's shard: half of fc1's rows and bias, half of fc2's columns, fc2's whole bias.
    EXPECT_EQ(tp.value("shard_parameters", 0), 8 * 16 + 8 + 16 * 8 + 16);
    for (const char* key : {"step_s", "samples_per_second", "samples_per_second_ddp",
                            "samples_per_second_one_process", "throughput_over_ddp",
                            "throughput_over_one_process", "loss", "loss_ddp",
                            "loss_one_process"}) {
      EXPECT_GT(tp.value(key, 0.0), 0.0) << key;
    }
    EXPECT_NEAR(tp.value("throughput_over_ddp", 0.0),
                tp.value("samples_per_second", 0.0) / tp.value("samples_per_second_ddp", 1.0),
                1e-9);
    EXPECT_NEAR(tp.value("throughput_over_one_process", 0.0),
                tp.value("samples_per_second", 0.0) /
                    tp.value("samples_per_second_one_process", 1.0),
                1e-9);
    EXPECT_TRUE(tp.value("loss_matches_ddp", false));
    EXPECT_NEAR(tp.value("loss", 0.0), tp.value("loss_ddp", -1.0),
                1e-4 * tp.value("loss_ddp", 0.0));
    EXPECT_NEAR(tp.value("loss", 0.0), tp.value("loss_one_process", -1.0),
                1e-4 * tp.value("loss_one_process", 0.0));
    ASSERT_EQ(tp["loss_per_rank"].size(), 2u);
    EXPECT_EQ(tp["loss_per_rank"][0], tp["loss_per_rank"][1]);
    EXPECT_TRUE(tp["oversubscribed"].is_boolean());
  }

  // gpipe and 1f1b at M = 2 and 4, zb-h1 against 1f1b at both, then tensor parallelism.
  ASSERT_EQ(by_kind["goal"].size(), 7u);
  for (const nlohmann::json& goal : by_kind["goal"]) {
    EXPECT_TRUE(goal.contains("met")) << goal.dump();
    EXPECT_FALSE(goal.value("detail", "").empty()) << goal.dump();
  }
  const nlohmann::json& tp_goal = by_kind["goal"].back();
  EXPECT_EQ(tp_goal.value("goal", ""),
            "tensor parallel T=2 >= 0.8x DDP on the same 2 processes (d=16)");
  EXPECT_EQ(tp_goal.value("met", false), tp.value("throughput_over_ddp", 0.0) >= 0.8)
      << tp_goal.dump();
}

TEST(PipelineBenchTest, RejectsBadFlagsNamingThem) {
  StatusOr<std::string> bench = FindRunfile("tools/tessera-bench");
  ASSERT_TRUE(bench.ok()) << bench.status();
  // Each refused with the flag named first and the words that say why.
  const std::vector<std::tuple<std::vector<std::string>, std::string>> cases = {
      {{"--stages", "1"}, "is not in [2, 16]"},
      {{"--schedules", "gpipe,looped"}, "\"looped\" is not one of gpipe,1f1b,interleaved,zb-h1"},
      {{"--micro-batches", "4,x"}, "--micro-batches=\"4,x\""},
      {{"--micro-batches", "1"}, "1f1b needs at least as many micro-batches as ranks"},
      {{"--micro-batches", "6", "--stages", "4", "--layers", "16", "--batch-size", "24"},
       "interleaved needs a multiple of --stages 4"},
      {{"--layers", "6"}, "does not cut evenly into interleaved's 4 stages"},
      {{"--batch-size", "12"}, "does not cut into --micro-batches 8"},
      {{"--batch-size", "255", "--micro-batches", "3", "--schedules", "gpipe"},
       "does not split over --stages 2"},
      {{"--tp-dim", "4095"}, "is odd: tensor parallelism T = 2 halves the layers' rows"},
      {{"--tp-batch", "7"}, "is odd: it does not split over the 2 data-parallel ranks"},
      {{"--tp-dim", "0"}, "--tp-dim: Value 0 not in range 2 to 65536"},
  };
  for (const auto& [args, words] : cases) {
    std::vector<std::string> argv = {*bench, "pipeline"};
    argv.insert(argv.end(), args.begin(), args.end());
    StatusOr<ChildOutput> output =
        RunToCompletion("tessera-bench pipeline " + args[0], argv, 30'000);
    ASSERT_FALSE(output.ok()) << args[0] << " " << args[1] << " was accepted";
    EXPECT_NE(output.status().message().find(args[0]), std::string::npos) << output.status();
    EXPECT_NE(output.status().message().find(words), std::string::npos) << output.status();
  }
}

}  // namespace
}  // namespace tessera::tools
