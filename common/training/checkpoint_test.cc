#include "common/training/checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/base/atomic_file.h"

namespace tessera {
namespace {

std::string Root(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(CheckpointTest, ShardsRoundTripAndLatestMovesOnlyOnCommit) {
  const std::string root = Root("ckpt_roundtrip");
  EXPECT_EQ(LatestCheckpointStep(root).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(PrepareCheckpointStep(root, 7).ok());
  CheckpointShard shard;
  shard.floats["chunk0.values"] = {1.5f, -2, 3e-30f};
  shard.floats["empty"] = {};
  shard.ints["emb.0.ids"] = {5, 1LL << 40};
  auto info = WriteCheckpointShard(CheckpointStepDirectory(root, 7) + "/server-0.ckpt", shard);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->file, "server-0.ckpt");
  // Written but not committed: not visible.
  EXPECT_FALSE(LatestCheckpointStep(root).ok());
  CheckpointManifest manifest;
  manifest.step = 7;
  manifest.mode = "ps-sync";
  manifest.layout_fingerprint = 99;
  manifest.num_servers = 1;
  manifest.files = {*info};
  ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
  EXPECT_EQ(*LatestCheckpointStep(root), 7);
  auto read = ReadCheckpointManifest(root, 7);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->files[0].checksum, info->checksum);
  EXPECT_EQ(read->world_size, 0);  // optional fields, absent
  EXPECT_TRUE(read->optimizer.empty());
  EXPECT_TRUE(read->tensors.empty());
  auto back = ReadCheckpointShard(CheckpointStepDirectory(root, 7) + "/server-0.ckpt",
                                  read->files[0]);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->floats, shard.floats);
  EXPECT_EQ(back->ints, shard.ints);
}

TEST(CheckpointTest, TruncatedCorruptedAndMissingFilesAreNamed) {
  const std::string root = Root("ckpt_bad");
  ASSERT_TRUE(PrepareCheckpointStep(root, 1).ok());
  const std::string path = CheckpointStepDirectory(root, 1) + "/local.ckpt";
  CheckpointShard shard;
  shard.floats["params"] = std::vector<float>(100, 0.5f);
  auto info = WriteCheckpointShard(path, shard);
  ASSERT_TRUE(info.ok());
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(60);
    file.put('\x7f');  // one flipped byte
  }
  auto corrupted = ReadCheckpointShard(path, *info);
  EXPECT_EQ(corrupted.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(corrupted.status().message().find(path + " does not match"), std::string::npos)
      << corrupted.status();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "TSRCKPT1";
  auto truncated = ReadCheckpointShard(path, *info);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos) << truncated.status();
  EXPECT_EQ(ReadCheckpointShard(path + ".gone", *info).status().code(), StatusCode::kNotFound);
  std::ofstream(root + "/LATEST", std::ios::trunc) << "soon";
  EXPECT_EQ(LatestCheckpointStep(root).status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(ReadCheckpointManifest(root, 3).ok());
}

TEST(CheckpointTest, OptionalManifestFieldsRoundTrip) {
  const std::string root = Root("ckpt_optional");
  ASSERT_TRUE(PrepareCheckpointStep(root, 3).ok());
  CheckpointManifest manifest;
  manifest.step = 3;
  manifest.mode = "zero2";
  manifest.world_size = 4;
  manifest.optimizer = "adam";
  manifest.tensors = {{"mlp.0.weight", {64, 16}}, {"mlp.0.bias", {64}}};
  ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
  auto read = ReadCheckpointManifest(root, 3);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->world_size, 4);
  EXPECT_EQ(read->optimizer, "adam");
  EXPECT_EQ(read->tensors, manifest.tensors);
}

// A number out of its field's range makes the manifest corrupt, naming the file and the field
// (reading it was undefined behaviour: checkpoint_reader_fuzzer found 1e37 as dense_elements).
TEST(CheckpointTest, ManifestNumbersOutOfRangeAreDataLoss) {
  const std::string root = Root("ckpt_out_of_range");
  ASSERT_TRUE(PrepareCheckpointStep(root, 3).ok());
  CheckpointManifest manifest;
  manifest.step = 3;
  manifest.mode = "zero2";
  manifest.dense_elements = 10;
  manifest.tensors = {{"w", {2, 5}}};
  manifest.files = {{"rank-0.ckpt", 12, 34}};
  ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
  const std::string path = CheckpointStepDirectory(root, 3) + "/MANIFEST.json";
  std::ifstream in(path);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [from, to, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"dense_elements\": 10", "\"dense_elements\": 1e37", "dense_elements is 1e+37"},
           {"\"bytes\": 12", "\"bytes\": -12", "bytes is -12, not an integer"},
           {"5\n", "5.5\n", "a dimension of w is 5.5, not an integer"}}) {
    SCOPED_TRACE(to);
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, from.size(), to);
    ASSERT_TRUE(WriteFileAtomically(path, text.data(), text.size()).ok());
    auto read = ReadCheckpointManifest(root, 3);
    EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(read.status().message().find(path + ": " + message), std::string::npos)
        << read.status();
  }
}

// The steps under a root, newest first (other names ignored), each checked whole by
// VerifyCheckpoint, and the advice that names the newest one that verifies.
TEST(CheckpointTest, StepsVerifyAndTheAdviceNamesTheNewestGoodOne) {
  const std::string root = Root("ckpt_steps");
  for (int64_t step : {3, 12, 7}) {
    ASSERT_TRUE(PrepareCheckpointStep(root, step).ok());
    CheckpointShard shard;
    shard.floats["params"] = std::vector<float>(50, static_cast<float>(step));
    auto info = WriteCheckpointShard(CheckpointStepDirectory(root, step) + "/local.ckpt", shard);
    ASSERT_TRUE(info.ok()) << info.status();
    CheckpointManifest manifest;
    manifest.step = step;
    manifest.mode = "local";
    manifest.files = {*info};
    ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
  }
  ASSERT_TRUE(MakeDirectories(root + "/step-5").ok());        // not a checkpoint's name
  ASSERT_TRUE(MakeDirectories(root + "/step-00000000000x").ok());
  EXPECT_EQ(CheckpointSteps(root), (std::vector<int64_t>{12, 7, 3}));
  EXPECT_TRUE(CheckpointSteps(root + "/none").empty());
  for (int64_t step : {12, 7, 3}) EXPECT_TRUE(VerifyCheckpoint(root, step).ok()) << step;

  {  // step 7's file loses a byte in the middle
    std::fstream file(CheckpointStepDirectory(root, 7) + "/local.ckpt",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(80);
    file.put('\x01');
  }
  Status bad = VerifyCheckpoint(root, 7);
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find("step-000000000007/local.ckpt"), std::string::npos) << bad;
  EXPECT_EQ(ResumeAdvice(root, 12),
            "; the newest checkpoint before step 12 that verifies is step 3: resume from it "
            "with --resume-step 3");
  EXPECT_EQ(ResumeAdvice(root, std::nullopt),
            "; the newest checkpoint that verifies is step 12: resume from it with "
            "--resume-step 12");
  EXPECT_EQ(ResumeAdvice(root, 3), "; no checkpoint before step 3 in " + root + " verifies");
}

}  // namespace
}  // namespace tessera
