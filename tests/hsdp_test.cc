// --mode hsdp end to end (issue 44, item 4): workers on loopback under tessera-launch, ZeRO-3
// within shard groups and replicated across them, compared against --mode allreduce and zero3
// on the same world, seed and data; its checkpoints; and its refusal of a bad group size.
//
// Tolerance: that of allreduce_test.cc's ZeRO comparisons, |hsdp - allreduce| <= 1e-6 +
// 1e-5 |allreduce| per parameter: hsdp reduce-scatters per tensor within a group and then
// averages the groups' means, another summation order than the ring's per bucket.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <tuple>

#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

std::vector<std::string> Flags(const std::string& steps = "25") {
  return {"--steps", steps, "--optimizer", "sgd", "--lr", "0.1", "--device", "cpu",
          "--log-every", "5", "--train-samples", "1920", "--hidden", "64,32", "--input-dim",
          "16", "--classes", "4", "--seed", "5", "--batch-size", "16", "--bucket-mb", "0.002"};
}

std::vector<float> Load(const std::string& path) {
  auto loaded = worker::LoadParams(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? loaded->values : std::vector<float>();
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (d > 1e-6 + 1e-5 * std::fabs(b[i])) ++bad;
    worst = std::max(worst, d);
  }
  EXPECT_EQ(bad, 0u) << "of " << a.size() << "; largest difference " << worst;
}

// (workers, --shard-group-size; 0: the host's workers, all of them on loopback)
class HsdpMatchesAllReduce : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(HsdpMatchesAllReduce, Sgd) {
  const auto& [workers, shard_group_size] = GetParam();
  FleetHarness harness;
  const std::string suffix =
      "_" + std::to_string(workers) + "_" + std::to_string(shard_group_size) + ".bin";
  for (const std::string mode : {"allreduce", "hsdp"}) {
    std::vector<std::string> args = Concat(
        {"--workers", std::to_string(workers), "--mode", mode, "--"},
        Concat(Flags(), {"--save-params", TempPath(mode + suffix)}));
    if (mode == "hsdp") {
      args = Concat(args, {"--shard-group-size", std::to_string(shard_group_size)});
    }
    Status ran = harness.RunToSuccess(mode, "tools/tessera-launch", args, kRunMs);
    ASSERT_TRUE(ran.ok()) << ran;
  }
  ExpectClose(Load(TempPath("hsdp" + suffix)), Load(TempPath("allreduce" + suffix)));
}

INSTANTIATE_TEST_SUITE_P(Groups, HsdpMatchesAllReduce,
                         ::testing::Values(std::make_tuple(4, 2), std::make_tuple(2, 1),
                                           std::make_tuple(2, 0)));

// Runs a launcher that must fail; returns its output.
std::string RunToFailure(FleetHarness& harness, const std::string& label,
                         const std::vector<std::string>& args) {
  auto id = harness.Start(label, "tools/tessera-launch", args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(*id);
  EXPECT_TRUE(exit.ok() && !exit->success()) << label << "\n" << harness.Output(*id);
  return harness.Output(*id);
}

TEST(HsdpTest, AShardGroupSizeThatDoesNotDivideTheWorldFailsNamingBoth) {
  FleetHarness harness;
  const std::string output = RunToFailure(
      harness, "hsdp", Concat({"--workers", "4", "--mode", "hsdp", "--"},
                              Concat(Flags(), {"--shard-group-size", "3"})));
  EXPECT_NE(output.find("--shard-group-size 3 does not divide the world of 4 workers"),
            std::string::npos)
      << output;
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// 4 workers in shard groups of 2: the first group writes the checkpoint of step 10 (two
// shards); resuming it in hsdp ends bitwise where the uninterrupted run does, and resuming it
// in zero3 on 2 workers (the same global batch) within the tolerance.
TEST(HsdpTest, CheckpointsResumeInHsdpAndAtAnotherWorldSizeInZero3) {
  FleetHarness harness;
  const std::string dir = TempPath("hsdp_ckpt");
  const std::string whole = TempPath("hsdp_whole.bin"), resumed = TempPath("hsdp_resumed.bin"),
                    zero3 = TempPath("hsdp_zero3.bin");
  const std::vector<std::string> hsdp = {"--workers", "4", "--mode", "hsdp", "--"};
  // Runs a launcher to success; its output.
  auto run = [&](const std::string& label, const std::vector<std::string>& args) {
    auto id = harness.Start(label, "tools/tessera-launch", args);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return std::string();
    auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
    EXPECT_TRUE(exit.ok() && exit->success()) << label << "\n" << harness.Output(*id);
    return harness.Output(*id);
  };
  run("uninterrupted", Concat(hsdp, Concat(Flags("20"), {"--shard-group-size", "2",
                                                         "--save-params", whole})));
  run("first part", Concat(hsdp, Concat(Flags("10"), {"--shard-group-size", "2",
                                                      "--checkpoint-dir", dir,
                                                      "--checkpoint-every", "10"})));
  const std::string step10 = dir + "/step-000000000010";
  EXPECT_TRUE(Exists(step10 + "/MANIFEST.json"));
  EXPECT_TRUE(Exists(step10 + "/rank-0.ckpt"));
  EXPECT_TRUE(Exists(step10 + "/rank-1.ckpt"));
  EXPECT_FALSE(Exists(step10 + "/rank-2.ckpt")) << "the second replica wrote a shard";
  const std::string output =
      run("resumed", Concat(hsdp, Concat(Flags("20"), {"--shard-group-size", "2",
                                                      "--checkpoint-dir", dir, "--resume",
                                                      "--save-params", resumed})));
  EXPECT_NE(output.find("resumed from the checkpoint of step 10"), std::string::npos) << output;
  EXPECT_TRUE(Load(resumed) == Load(whole))
      << "the resumed run ends elsewhere than the uninterrupted one";
  std::vector<std::string> in_zero3 = Concat({"--workers", "2", "--mode", "zero3", "--"},
                                             Concat(Flags("20"), {"--checkpoint-dir", dir,
                                                                  "--resume", "--resume-step",
                                                                  "10", "--save-params",
                                                                  zero3}));
  *(std::find(in_zero3.begin(), in_zero3.end(), std::string("--batch-size")) + 1) = "32";
  const std::string zero3_output = run("resumed in zero3", in_zero3);
  EXPECT_NE(zero3_output.find("resumed from the checkpoint of step 10"), std::string::npos)
      << zero3_output;
  ExpectClose(Load(zero3), Load(whole));
}

}  // namespace
}  // namespace tessera::testing
