// Checkpoints of --mode allreduce and zero1-3 end to end (worker/engines/sharded_state.h): real
// workers under tessera-launch on loopback, and tessera-export-params.
//
// Same world size: stopping after a checkpoint and resuming ends bitwise where an
// uninterrupted run ends (the parameters, the optimizer state and the data order all continue
// exactly).
//
// Another world size: the DistributedSampler gives rank r of W the indices perm[r + W*i], so
// step s of W ranks x B samples reads perm[W*B*(s-1) .. W*B*s) in all: W=2 x 32 and W=4 x 16
// read the same 64 samples per step (1920 is divisible by both, so no padding, and the epochs
// wrap at the same step). What differs is how the mean gradient is summed (4 means of 16
// averaged vs 2 of 32), so the comparison with the uninterrupted W=2 run uses the tolerance of
// allreduce_test.cc: |resumed - uninterrupted| <= 1e-6 + 1e-5 |uninterrupted| per parameter.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>

#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

// 2 workers x 32 (or 4 x 16) = 64 samples per step; 20 steps stay inside the first epoch of
// 1920. 2 KiB buckets: several per step, so every rank owns slices of several.
std::vector<std::string> Flags(const std::string& steps, const std::string& optimizer = "adam") {
  return {"--steps", steps, "--optimizer", optimizer, "--lr", "0.01", "--device", "cpu",
          "--log-every", "5", "--train-samples", "1920", "--hidden", "64,32", "--input-dim",
          "16", "--classes", "4", "--seed", "5", "--bucket-mb", "0.002"};
}

std::vector<std::string> Fleet(int workers, const std::string& mode) {
  return {"--workers", std::to_string(workers), "--mode", mode, "--"};
}

// Runs a launcher to completion, failing the test unless it exits 0; returns its output.
std::string RunToSuccess(FleetHarness& harness, const std::string& label,
                         const std::vector<std::string>& args) {
  auto id = harness.Start(label, "tools/tessera-launch", args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(*id);
  EXPECT_TRUE(exit.ok() && exit->success())
      << label << ": " << (exit.ok() ? exit->Describe() : "") << "\n" << harness.Output(*id);
  return harness.Output(*id);
}

// Flags with --bucket-mb set to `mb`.
std::vector<std::string> WithBucketMb(std::vector<std::string> flags, const std::string& mb) {
  auto it = std::find(flags.begin(), flags.end(), std::string("--bucket-mb"));
  if (it != flags.end()) *(it + 1) = mb;
  return flags;
}

// Runs a launcher that must fail; returns its output (every worker's lines).
std::string RunToFailure(FleetHarness& harness, const std::string& label,
                         const std::vector<std::string>& args) {
  auto id = harness.Start(label, "tools/tessera-launch", args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << harness.Output(*id);
  EXPECT_FALSE(exit.ok() && exit->success()) << label << " succeeded\n" << harness.Output(*id);
  return harness.Output(*id);
}

std::vector<float> Load(const std::string& path) {
  auto loaded = worker::LoadParams(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? loaded->values : std::vector<float>();
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

class SameWorldSize : public ::testing::TestWithParam<std::string> {};

// Checkpoints at 6, 12 and 13 (the last step), then a new fleet resumes from 13 and finishes
// (checkpointing at 14 and 20); tessera-export-params turns the checkpoint of 20 into the same
// file as --save-params.
TEST_P(SameWorldSize, ResumeIsBitwiseLikeNeverStopping) {
  const std::string mode = GetParam();
  FleetHarness harness;
  const std::string dir = TempPath(mode + "_ckpt");
  const std::string whole = TempPath(mode + "_whole.bin"), resumed = TempPath(mode + "_resumed.bin");
  RunToSuccess(harness, "uninterrupted",
               Concat(Fleet(2, mode), Concat(Flags("20"), {"--batch-size", "32", "--save-params",
                                                           whole})));
  RunToSuccess(harness, "first part",
               Concat(Fleet(2, mode), Concat(Flags("13"), {"--batch-size", "32", "--checkpoint-dir",
                                                           dir, "--checkpoint-every", "6"})));
  const std::string step13 = dir + "/step-000000000013";
  EXPECT_TRUE(Exists(step13 + "/MANIFEST.json"));
  EXPECT_TRUE(Exists(step13 + "/rank-0.ckpt"));
  // Data parallel: the replicas are identical, rank 0 writes the one shard.
  EXPECT_EQ(Exists(step13 + "/rank-1.ckpt"), mode != "allreduce");
  RunToSuccess(harness, "resumed",
               Concat(Fleet(2, mode), Concat(Flags("20"), {"--batch-size", "32", "--checkpoint-dir",
                                                           dir, "--resume", "--save-params",
                                                           resumed, "--checkpoint-every", "7"})));
  const std::vector<float> a = Load(whole), b = Load(resumed);
  ASSERT_EQ(a.size(), 3300u);
  EXPECT_TRUE(a == b) << "the resumed run ends elsewhere than the uninterrupted one";

  // The consolidated export of the last checkpoint (step 20) is the --save-params file, bitwise.
  const std::string exported = TempPath(mode + "_exported.bin");
  auto id = harness.Start("export", "tools/tessera-export-params",
                          {"--checkpoint-dir", dir, "--out", exported});
  ASSERT_TRUE(id.ok()) << id.status();
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok() && exit->success()) << harness.Output(*id);
  EXPECT_NE(harness.Output(*id).find("step 20 of"), std::string::npos) << harness.Output(*id);
  auto original = worker::LoadParams(resumed);
  auto consolidated = worker::LoadParams(exported);
  ASSERT_TRUE(original.ok() && consolidated.ok()) << harness.Output(*id);
  EXPECT_EQ(consolidated->layout.Fingerprint(), original->layout.Fingerprint());
  EXPECT_TRUE(consolidated->values == original->values);
}

INSTANTIATE_TEST_SUITE_P(Modes, SameWorldSize,
                         ::testing::Values("allreduce", "zero1", "zero2", "zero3"));

// A zero3 checkpoint of 2 ranks resumed by 4 ranks in zero1 (AllReduceEngine, with another
// bucket plan and other slices: the universal form), and by 3 ranks
// in zero2: both end within the tolerance of the uninterrupted 2-rank run (4 x 16 is the same
// global batch; 3 ranks cannot split 64 evenly, so that run is checked only to finish and to
// have moved the parameters).
TEST(ZeroCheckpointTest, ResumesAtAnotherWorldSizeAndMode) {
  FleetHarness harness;
  const std::string dir = TempPath("resize_ckpt");
  const std::string whole = TempPath("resize_whole.bin"), four = TempPath("resize_four.bin"),
                    three = TempPath("resize_three.bin");
  RunToSuccess(harness, "uninterrupted",
               Concat(Fleet(2, "zero3"), Concat(Flags("20"), {"--batch-size", "32",
                                                              "--save-params", whole})));
  RunToSuccess(harness, "first part",
               Concat(Fleet(2, "zero3"), Concat(Flags("10"), {"--batch-size", "32",
                                                              "--checkpoint-dir", dir,
                                                              "--checkpoint-every", "10"})));
  std::vector<std::string> resume =
      Concat(WithBucketMb(Flags("20"), "0.004"), {"--checkpoint-dir", dir, "--resume"});
  const std::string output =
      RunToSuccess(harness, "resumed by 4",
                   Concat(Fleet(4, "zero1"), Concat(resume, {"--batch-size", "16",
                                                             "--save-params", four})));
  for (int w = 0; w < 4; ++w) {
    EXPECT_TRUE(std::regex_search(output, std::regex("\\[worker " + std::to_string(w) +
                                                     "\\].*resumed from the checkpoint of "
                                                     "step 10")))
        << output;
  }
  const std::vector<float> expected = Load(whole), got = Load(four);
  ASSERT_EQ(expected.size(), got.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - expected[i]);
    if (d > 1e-6 + 1e-5 * std::fabs(expected[i])) ++bad;
    worst = std::max(worst, d);
  }
  EXPECT_EQ(bad, 0u) << "of " << got.size() << "; largest difference " << worst;

  // 3 ranks of zero2 (the checkpoint of step 10 is still LATEST: the 4-rank run wrote none).
  EXPECT_NE(RunToSuccess(harness, "resumed by 3",
                         Concat(Fleet(3, "zero2"), Concat(resume, {"--batch-size", "21",
                                                                       "--save-params", three})))
                .find("resumed from the checkpoint of step 10"),
            std::string::npos);
  const std::vector<float> third = Load(three);
  ASSERT_EQ(third.size(), expected.size());
  EXPECT_NE(third, expected);  // another global batch (63 samples), so not the same numbers
  double moved = 0;
  for (size_t i = 0; i < third.size(); ++i) {
    moved = std::max(moved, std::fabs(static_cast<double>(third[i]) - expected[i]));
  }
  EXPECT_LT(moved, 0.1) << "the 3-rank run diverged from the 2-rank one";
}

class Preemption : public ::testing::TestWithParam<std::string> {};

// Preemption of one rank: only worker 1 gets SIGTERM (--checkpoint-on-sigterm). The ranks agree
// after every step whether any was asked to stop, so both stop after the same step and
// checkpoint it together (a collective), instead of worker 0 waiting in the next step's
// collective for a rank that is saving. Resuming from that checkpoint ends bitwise where an
// uninterrupted run ends. The default mlp (about 25 ms per step here) leaves time to signal
// mid-run.
TEST_P(Preemption, OneRankSignalledStopsEveryRankAfterTheSameStep) {
  const std::string mode = GetParam();
  FleetHarness harness;
  const std::string dir = TempPath(mode + "_preempt_ckpt");
  const std::string whole = TempPath(mode + "_preempt_whole.bin"),
                    resumed = TempPath(mode + "_preempt_resumed.bin");
  const std::vector<std::string> common = {
      "--steps", "30", "--optimizer", "adam", "--lr", "0.001", "--device", "cpu",
      "--log-every", "1", "--train-samples", "7680", "--seed", "5", "--batch-size", "32"};
  const std::vector<std::string> flags =
      Concat(common, {"--checkpoint-dir", dir, "--checkpoint-on-sigterm"});
  RunToSuccess(harness, "uninterrupted",
               Concat(Fleet(2, mode), Concat(common, {"--save-params", whole})));
  auto launcher = harness.Start("preempted", "tools/tessera-launch", Concat(Fleet(2, mode), flags));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  ASSERT_TRUE(harness.WaitForLine(*launcher, "worker 1 | step 3/30", Deadline::AfterMillis(kRunMs))
                  .ok())
      << harness.Output(*launcher);
  std::smatch match;
  const std::string started = harness.Output(*launcher);
  ASSERT_TRUE(std::regex_search(started, match, std::regex(R"(\[launch\] worker 1 pid=(\d+))")))
      << started;
  ASSERT_EQ(kill(std::stoi(match[1]), SIGTERM), 0);
  auto exit = harness.WaitExit(*launcher, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = harness.Output(*launcher);
  std::string stopped[2];
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(std::regex_search(output, match,
                                  std::regex("\\[worker " + std::to_string(w) +
                                             "\\].*stopped after step ([0-9]+) \\(checkpointed")))
        << output;
    stopped[w] = match[1];
  }
  EXPECT_EQ(stopped[0], stopped[1]) << output;
  std::ifstream latest(dir + "/LATEST");
  std::string step;
  latest >> step;
  EXPECT_EQ(step, stopped[0]);
  EXPECT_LT(std::stoi(stopped[0]), 30);

  RunToSuccess(harness, "resumed",
               Concat(Fleet(2, mode), Concat(flags, {"--resume", "--save-params", resumed})));
  EXPECT_TRUE(Load(whole) == Load(resumed)) << "the resumed run ends elsewhere";
}

INSTANTIATE_TEST_SUITE_P(Modes, Preemption, ::testing::Values("allreduce", "zero3"));

// A corrupted shard, a missing shard, another model and another optimizer: every worker fails
// before training, with an error naming the file or what differs.
TEST(ZeroCheckpointTest, BadCheckpointsFailNamingTheFileOrTheDifference) {
  FleetHarness harness;
  const std::string dir = TempPath("bad_ckpt");
  RunToSuccess(harness, "first part",
               Concat(Fleet(2, "zero2"), Concat(Flags("4"), {"--batch-size", "32",
                                                             "--checkpoint-dir", dir,
                                                             "--checkpoint-every", "4"})));
  const std::vector<std::string> resume =
      Concat(Fleet(2, "zero2"),
             Concat(Flags("8"), {"--batch-size", "32", "--checkpoint-dir", dir, "--resume"}));

  // Another model: the second hidden layer has 33 units instead of 32.
  std::vector<std::string> other_model = resume;
  std::replace(other_model.begin(), other_model.end(), std::string("64,32"), std::string("64,33"));
  std::string output = RunToFailure(harness, "other model", other_model);
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(std::regex_search(
        output, std::regex("\\[worker " + std::to_string(w) + "\\].*step-000000000004 is of "
                           "another model: tensor #2 is 'mlp\\.[0-9]\\.weight' \\[32, 64\\] in the "
                           "checkpoint and 'mlp\\.[0-9]\\.weight' \\[33, 64\\] in this model")))
        << output;
  }
  // Another optimizer.
  std::vector<std::string> other_optimizer = resume;
  std::replace(other_optimizer.begin(), other_optimizer.end(), std::string("adam"),
               std::string("momentum"));
  output = RunToFailure(harness, "other optimizer", other_optimizer);
  EXPECT_NE(output.find("holds the optimizer state of adam; this run uses momentum"),
            std::string::npos)
      << output;

  // One flipped byte in rank 1's shard: both workers name it (each reads every shard).
  const std::string shard1 = dir + "/step-000000000004/rank-1.ckpt";
  {
    std::fstream file(shard1, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.good()) << shard1;
    file.seekp(100);
    file.put('\x5a');
  }
  output = RunToFailure(harness, "corrupted", resume);
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(std::regex_search(output, std::regex("\\[worker " + std::to_string(w) +
                                                     "\\].*rank-1\\.ckpt does not match its "
                                                     "manifest's checksum")))
        << output;
  }
  // rank 0's shard gone.
  const std::string shard0 = dir + "/step-000000000004/rank-0.ckpt";
  ASSERT_EQ(std::remove(shard0.c_str()), 0);
  output = RunToFailure(harness, "missing", resume);
  EXPECT_NE(output.find(shard0), std::string::npos) << output;
}

}  // namespace
}  // namespace tessera::testing
