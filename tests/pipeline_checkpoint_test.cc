// Checkpoints across layouts, natively (issue 46, item 5): a job split with one (D, P, T)
// writes the full model's checkpoint (each rank its part), which a job with another split, or
// none, resumes; each resumed run ends where the uninterrupted one does, every tensor within
// 1e-5 of its scale (the splits sum in other orders). D x --batch-size stays 16 samples, so
// every run trains on the same global batches.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/fleet_harness.h"
#include "tests/params_match.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

std::vector<std::string> Flags(int batch_size, int steps) {
  return {"--steps", std::to_string(steps), "--optimizer", "sgd", "--lr", "0.1",
          "--optimizer-params", "momentum=0.9", "--device", "cpu", "--log-every", "4",
          "--train-samples", "256", "--hidden", "32,32,32", "--input-dim", "16", "--classes",
          "4", "--seed", "13", "--batch-size", std::to_string(batch_size)};
}

// 1 x 2 x 2: two stages (layers 0-3 and 4-6), each a tensor-parallel pair on two ranks.
const std::vector<std::string> kPipelineByTensor = {
    "--pipeline-stages", "2", "--micro-batches", "2", "--tensor-parallel", "2",
    "--pipeline-split", "4"};

// Runs a launcher to success; its output.
std::string RunToSuccess(FleetHarness& harness, const std::string& label,
                         const std::vector<std::string>& args) {
  auto id = harness.Start(label, "tools/tessera-launch", args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok() && exit->success()) << label << "\n" << harness.Output(*id);
  return harness.Output(*id);
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

TEST(PipelineCheckpointTest, APipelineOfTensorParallelStagesResumesWithOtherSplitsAndNone) {
  FleetHarness harness;
  const std::string dir = TempPath("pp_tp_ckpt"), whole = TempPath("pp_tp_whole.bin");
  RunToSuccess(harness, "uninterrupted",
               Concat({"--workers", "4", "--mode", "allreduce", "--"},
                      Concat(Flags(16, 8), Concat(kPipelineByTensor,
                                                  {"--save-params", whole}))));
  RunToSuccess(harness, "first part",
               Concat({"--workers", "4", "--mode", "allreduce", "--"},
                      Concat(Flags(16, 4), Concat(kPipelineByTensor,
                                                  {"--checkpoint-dir", dir,
                                                   "--checkpoint-every", "4"}))));
  EXPECT_TRUE(Exists(dir + "/step-000000000004/MANIFEST.json"));
  // (1, 1, 1): one process, no split.
  const std::string alone = TempPath("pp_tp_alone.bin");
  const std::string output = RunToSuccess(
      harness, "resumed alone",
      Concat({"--workers", "1", "--mode", "allreduce", "--"},
             Concat(Flags(16, 8), {"--checkpoint-dir", dir, "--resume", "--save-params",
                                   alone})));
  EXPECT_NE(output.find("resumed from the checkpoint of step 4"), std::string::npos) << output;
  ExpectParamsMatch(alone, whole);
  // (2, 1, 2) in zero1: two replicas of 8 samples, each split across 2 tensor-parallel ranks.
  const std::string split = TempPath("pp_tp_2x1x2.bin");
  RunToSuccess(harness, "resumed as 2 x 1 x 2",
               Concat({"--workers", "4", "--mode", "zero1", "--"},
                      Concat(Flags(8, 8), {"--tensor-parallel", "2", "--checkpoint-dir", dir,
                                           "--resume", "--resume-step", "4", "--save-params",
                                           split})));
  ExpectParamsMatch(split, whole);
}

// The other way: a plain zero1 job's checkpoint resumed by a 1f1b pipeline of 2 stages.
TEST(PipelineCheckpointTest, APlainCheckpointResumesInAPipeline) {
  FleetHarness harness;
  const std::string dir = TempPath("plain_ckpt"), whole = TempPath("plain_whole.bin"),
                    resumed = TempPath("plain_resumed_in_pipeline.bin");
  RunToSuccess(harness, "uninterrupted",
               Concat({"--workers", "2", "--mode", "zero1", "--"},
                      Concat(Flags(8, 8), {"--save-params", whole})));
  RunToSuccess(harness, "first part",
               Concat({"--workers", "2", "--mode", "zero1", "--"},
                      Concat(Flags(8, 4), {"--checkpoint-dir", dir, "--checkpoint-every", "4"})));
  const std::string output = RunToSuccess(
      harness, "resumed in a pipeline",
      Concat({"--workers", "2", "--mode", "allreduce", "--"},
             Concat(Flags(16, 8), {"--pipeline-stages", "2", "--micro-batches", "4",
                                   "--pipeline-schedule", "1f1b", "--checkpoint-dir", dir,
                                   "--resume", "--save-params", resumed})));
  EXPECT_NE(output.find("resumed from the checkpoint of step 4"), std::string::npos) << output;
  ExpectParamsMatch(resumed, whole);
}

}  // namespace
}  // namespace tessera::testing
