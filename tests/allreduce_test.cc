// --mode allreduce end to end: real workers on loopback under tessera-launch (or started one
// by one where a test needs different flags per rank), compared against --mode local.
//
// Tolerance of the comparisons with --mode local: |allreduce - local| <= 1e-6 + 1e-5 |local|
// per parameter, for the same reason as in ps_test.cc: the same samples and optimizer, but the
// mean gradient is summed in another order (W per-rank means averaged by the ring vs one GEMM
// over the global batch), and Adam magnifies the last bits of small gradients.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

// 3 workers x 16 = the local batch of 48; 25 steps stay inside the first epoch of 1920.
std::vector<std::string> Flags(const std::string& optimizer) {
  return {"--steps", "25", "--optimizer", optimizer, "--lr", optimizer == "adam" ? "0.01" : "0.1",
          "--device", "cpu", "--log-every", "5", "--train-samples", "1920", "--hidden", "64,32",
          "--input-dim", "16", "--classes", "4", "--seed", "5"};
}

void RunToSuccess(FleetHarness& harness, const std::string& label, const std::string& binary,
                  const std::vector<std::string>& args) {
  Status ran = harness.RunToSuccess(label, binary, args, kRunMs);
  ASSERT_TRUE(ran.ok()) << ran;
}

std::vector<float> Load(const std::string& path) {
  auto loaded = worker::LoadParams(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? loaded->values : std::vector<float>();
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (d > 1e-6 + 1e-5 * std::fabs(b[i])) ++bad;
    worst = std::max(worst, d);
  }
  EXPECT_EQ(bad, 0u) << "of " << a.size() << "; largest difference " << worst;
}

class AllReduceMatchesLocal : public ::testing::TestWithParam<std::string> {};

// Small buckets (many all-reduces per step), overlapped with backward and not: both equal
// local training within the tolerance, and each other bitwise (the same reductions, only
// started at other times).
TEST_P(AllReduceMatchesLocal, ThreeWorkersWithAndWithoutOverlap) {
  const std::string optimizer = GetParam();
  FleetHarness harness;
  const std::string local = TempPath("local_" + optimizer + ".bin");
  const std::string overlapped = TempPath("overlap_" + optimizer + ".bin");
  const std::string sequential = TempPath("sequential_" + optimizer + ".bin");
  RunToSuccess(harness, "local", "worker/tessera-worker",
               Concat(Flags(optimizer), {"--mode", "local", "--batch-size", "48",
                                         "--save-params", local}));
  const std::vector<std::string> fleet = {"--workers", "3", "--mode", "allreduce", "--"};
  // 2 KiB buckets: the 64x16, 64, 32x64, 32, 4x32, 4 parameters make several buckets.
  RunToSuccess(harness, "overlap", "tools/tessera-launch",
               Concat(fleet, Concat(Flags(optimizer), {"--batch-size", "16", "--bucket-mb",
                                                       "0.002", "--save-params", overlapped})));
  RunToSuccess(harness, "no overlap", "tools/tessera-launch",
               Concat(fleet, Concat(Flags(optimizer),
                                    {"--batch-size", "16", "--bucket-mb", "0.002", "--no-overlap",
                                     "--save-params", sequential})));
  ExpectClose(Load(overlapped), Load(local));
  EXPECT_EQ(Load(overlapped), Load(sequential));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AllReduceMatchesLocal, ::testing::Values("sgd", "adam"));

// Two workers, two micro-batches of 12 each per step = the local batch of 48.
TEST(AllReduceTest, GradientAccumulationMatchesTheLargerLocalBatch) {
  FleetHarness harness;
  const std::string local = TempPath("accumulate_local.bin");
  const std::string accumulated = TempPath("accumulate_allreduce.bin");
  RunToSuccess(harness, "local", "worker/tessera-worker",
               Concat(Flags("adam"), {"--mode", "local", "--batch-size", "48",
                                      "--save-params", local}));
  RunToSuccess(harness, "allreduce", "tools/tessera-launch",
               Concat({"--workers", "2", "--mode", "allreduce", "--"},
                      Concat(Flags("adam"), {"--batch-size", "12", "--grad-accumulation", "2",
                                             "--save-params", accumulated})));
  ExpectClose(Load(accumulated), Load(local));
}

class ZeroMatchesAllReduce : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// ZeRO stage 1 reduces the same gradient buckets with the same ring and applies the same
// per-element optimizer math to the owned slices: bitwise the parameters of --mode allreduce,
// for any world size (the slices of 2 KiB buckets are rarely divisible by it). Stages 2 and 3
// reduce-scatter per tensor instead of per bucket (another summation order for some elements),
// so they match --mode allreduce and --mode local on the same global batch within the
// tolerance above.
TEST_P(ZeroMatchesAllReduce, AllStages) {
  const auto& [workers, optimizer] = GetParam();
  FleetHarness harness;
  std::map<std::string, std::vector<float>> params;
  const std::string suffix = "_" + std::to_string(workers) + optimizer + ".bin";
  RunToSuccess(harness, "local", "worker/tessera-worker",
               Concat(Flags(optimizer), {"--mode", "local", "--batch-size",
                                         std::to_string(16 * workers), "--save-params",
                                         TempPath("local" + suffix)}));
  params["local"] = Load(TempPath("local" + suffix));
  for (const std::string mode : {"allreduce", "zero1", "zero2", "zero3"}) {
    const std::string path = TempPath(mode + suffix);
    RunToSuccess(harness, mode, "tools/tessera-launch",
                 Concat({"--workers", std::to_string(workers), "--mode", mode, "--"},
                        Concat(Flags(optimizer), {"--batch-size", "16", "--bucket-mb", "0.002",
                                                  "--save-params", path})));
    params[mode] = Load(path);
  }
  EXPECT_EQ(params["zero1"], params["allreduce"]);
  for (const std::string mode : {"zero2", "zero3"}) {
    SCOPED_TRACE(mode);
    ExpectClose(params[mode], params["allreduce"]);
    ExpectClose(params[mode], params["local"]);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ZeroMatchesAllReduce,
                         ::testing::Values(std::make_tuple(2, "adam"), std::make_tuple(3, "sgd"),
                                           std::make_tuple(3, "adam"), std::make_tuple(4, "adam")));

class ZeroAccumulationMatchesAllReduce
    : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// --grad-accumulation 2 with micro-batches of 8: zero1 is bitwise --mode allreduce with the same
// accumulation (the trainer sums the micro-batches for both); zero2 and zero3 reduce-scatter
// every micro-batch's gradients and add them into the shard, then divide by 2 (another order of
// the same sums), so they match allreduce and --mode local on the same global batch (16 per
// rank) within the tolerance above.
TEST_P(ZeroAccumulationMatchesAllReduce, TwoMicroBatches) {
  const auto& [workers, optimizer] = GetParam();
  FleetHarness harness;
  std::map<std::string, std::vector<float>> params;
  const std::string suffix = "_accumulate_" + std::to_string(workers) + optimizer + ".bin";
  RunToSuccess(harness, "local", "worker/tessera-worker",
               Concat(Flags(optimizer), {"--mode", "local", "--batch-size",
                                         std::to_string(16 * workers), "--save-params",
                                         TempPath("local" + suffix)}));
  params["local"] = Load(TempPath("local" + suffix));
  for (const std::string mode : {"allreduce", "zero1", "zero2", "zero3"}) {
    const std::string path = TempPath(mode + suffix);
    RunToSuccess(harness, mode, "tools/tessera-launch",
                 Concat({"--workers", std::to_string(workers), "--mode", mode, "--"},
                        Concat(Flags(optimizer), {"--batch-size", "8", "--grad-accumulation", "2",
                                                  "--bucket-mb", "0.002", "--save-params",
                                                  path})));
    params[mode] = Load(path);
  }
  ExpectClose(params["allreduce"], params["local"]);
  EXPECT_EQ(params["zero1"], params["allreduce"]);
  for (const std::string mode : {"zero2", "zero3"}) {
    SCOPED_TRACE(mode);
    ExpectClose(params[mode], params["allreduce"]);
    ExpectClose(params[mode], params["local"]);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ZeroAccumulationMatchesAllReduce,
                         ::testing::Values(std::make_tuple(2, "adam"), std::make_tuple(3, "sgd")));

// A metric's value in a /metrics exposition (-1 when absent).
double MetricValue(const std::string& exposition, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(exposition, match, std::regex("\\n" + name + " ([0-9.eE+-]+)"))) {
    return -1;
  }
  return std::stod(match[1]);
}

struct MemoryCase {
  std::string mode;
  int workers;
};

class ZeroMemory : public ::testing::TestWithParam<MemoryCase> {};

// The memory gauges against ZeRO's formulas with Adam (Ψ parameters, N ranks, bytes):
//   stage 1: parameters 4Ψ, gradients 4Ψ, optimizer state 8Ψ/N
//   stage 2: parameters 4Ψ, gradients 4Ψ/N, optimizer state 8Ψ/N
//   stage 3: parameters 4Ψ/N, gradients 4Ψ/N, optimizer state 8Ψ/N
// within 10% (each tensor's slices differ by at most one element), and the peak during a step
// at least what is held between steps; for stages 2 and 3 at most that plus, for parameters
// (stage 3), the current and the prefetched block, and for gradients the two gradient blocks
// backward may hold (the one it writes and one awaiting its reduce-scatter): the two largest
// layers' parameters each. The model has five layers, so that bound is below the whole model.
TEST_P(ZeroMemory, GaugesMatchTheFormulas) {
  const MemoryCase c = GetParam();
  FleetHarness harness;
  std::vector<std::string> flags = Flags("adam");
  std::replace(flags.begin(), flags.end(), std::string("64,32"), std::string("64,32,32,32"));
  auto launcher = harness.Start(
      "launcher", "tools/tessera-launch",
      Concat({"--workers", std::to_string(c.workers), "--mode", c.mode, "--"},
             Concat(flags, {"--batch-size", "16", "--bucket-mb", "0.002", "--linger", "60"})));
  ASSERT_TRUE(launcher.ok());
  for (int w = 0; w < c.workers; ++w) {
    ASSERT_TRUE(harness.WaitForLine(*launcher, "worker " + std::to_string(w) + " | finished; "
                                    "lingering", Deadline::AfterMillis(kRunMs))
                    .ok())
        << harness.Output(*launcher);
  }
  // The model's layers: 16-64-32-32-32-4.
  const double layers[5] = {16 * 64 + 64, 64 * 32 + 32, 32 * 32 + 32, 32 * 32 + 32, 32 * 4 + 4};
  const double psi = layers[0] + layers[1] + layers[2] + layers[3] + layers[4];
  const double two_largest = layers[1] + layers[0];
  ASSERT_LT(two_largest, psi);
  const double n = c.workers;
  const int stage = c.mode.back() - '0';
  const double want[3] = {stage == 3 ? 4 * psi / n : 4 * psi, stage >= 2 ? 4 * psi / n : 4 * psi,
                          8 * psi / n};
  const char* kinds[3] = {"parameters", "gradients", "optimizer_state"};
  std::smatch match;
  std::string rest = harness.Output(*launcher);
  int workers = 0;
  while (std::regex_search(rest, match, std::regex(R"(\[launch\] worker \d+ pid=\d+ metrics=(\S+))"))) {
    auto metrics = HttpGet(match[1], 10000);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(kinds[k]);
      const std::string label = std::string("\\{kind=\"") + kinds[k] + "\"\\}";
      const double held = MetricValue(metrics->body, "tessera_model_state_bytes" + label);
      const double peak = MetricValue(metrics->body, "tessera_model_state_peak_bytes" + label);
      EXPECT_NEAR(held, want[k], 0.1 * want[k]) << metrics->body;
      EXPECT_GE(peak, held) << metrics->body;
      if ((stage == 3 && k == 0) || (stage >= 2 && k == 1)) {
        EXPECT_LE(peak, held + 4 * two_largest) << metrics->body;
      } else {
        EXPECT_EQ(peak, held) << metrics->body;
      }
    }
    ++workers;
    rest = match.suffix();
  }
  EXPECT_EQ(workers, c.workers);
  harness.StopAll();
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroMemory,
                         ::testing::Values(MemoryCase{"zero1", 2}, MemoryCase{"zero2", 2},
                                           MemoryCase{"zero3", 3}),
                         [](const auto& info) {
                           return info.param.mode + "_" + std::to_string(info.param.workers);
                         });

std::vector<std::string> Join(const std::string& coordinator, int workers) {
  return {"--coordinator", coordinator, "--num-workers", std::to_string(workers),
          "--heartbeat-interval-ms", "100", "--heartbeat-timeout-ms", "1000",
          "--request-timeout-ms", "10000"};
}

// Rank 1 builds another model: every rank fails before the first all-reduce, naming rank 1 and
// the tensor, instead of hanging or summing mismatched buffers.
TEST(AllReduceTest, ShapeMismatchFailsEveryRankNamingRankAndTensor) {
  FleetHarness harness;
  auto coordinator = harness.StartCoordinator({"--num-workers", "3"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<int> workers;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> flags = Concat(Join(*coordinator, 3), Flags("sgd"));
    if (r == 1) std::replace(flags.begin(), flags.end(), std::string("64,32"), std::string("64,33"));
    auto id = harness.Start("worker " + std::to_string(r), "worker/tessera-worker",
                            Concat(flags, {"--mode", "allreduce", "--rank", std::to_string(r)}));
    ASSERT_TRUE(id.ok());
    workers.push_back(*id);
  }
  for (int r = 0; r < 3; ++r) {
    auto exit = harness.WaitExit(workers[r], Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok()) << "worker " << r << " hangs\n" << harness.Output(workers[r]);
    EXPECT_FALSE(exit->success()) << harness.Output(workers[r]);
    const std::string output = harness.Output(workers[r]);
    EXPECT_TRUE(std::regex_search(output, std::regex("rank [0-9]'s tensor #[0-9]+ differs from "
                                                     "rank [0-9]'s 'mlp\\.[0-9]\\.(weight|bias)'")))
        << "worker " << r << ":\n" << output;
  }
}

// A rank killed mid-training: the others fail within the heartbeat timeout, naming it.
TEST(AllReduceTest, KilledRankFailsTheOthersNamingIt) {
  FleetHarness harness;
  auto coordinator = harness.StartCoordinator({"--num-workers", "3", "--heartbeat-interval-ms",
                                               "100", "--heartbeat-timeout-ms", "1000"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<int> workers;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> flags = Concat(Join(*coordinator, 3), Flags("sgd"));
    flags[std::find(flags.begin(), flags.end(), "--steps") - flags.begin() + 1] = "1000000";
    flags = Concat(flags, {"--mode", "allreduce", "--rank", std::to_string(r)});
    auto id = harness.Start("worker " + std::to_string(r), "worker/tessera-worker", flags);
    ASSERT_TRUE(id.ok());
    workers.push_back(*id);
  }
  ASSERT_TRUE(harness.WaitForLine(workers[0], "step 50/", Deadline::AfterMillis(kRunMs)).ok())
      << harness.Output(workers[0]);
  ASSERT_TRUE(harness.Signal(workers[2], SIGKILL).ok());
  for (int r : {0, 1}) {
    auto exit = harness.WaitExit(workers[r], Deadline::AfterMillis(20000));
    ASSERT_TRUE(exit.ok()) << "worker " << r << " did not end\n" << harness.Output(workers[r]);
    EXPECT_FALSE(exit->success());
    EXPECT_TRUE(std::regex_search(harness.Output(workers[r]), std::regex("worker 2")))
        << harness.Output(workers[r]);
  }
  harness.StopAll();
}

}  // namespace
}  // namespace tessera::testing
