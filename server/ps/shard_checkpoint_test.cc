#include "server/ps/shard_checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "common/metrics/metrics.h"

namespace tessera::server {
namespace {

using Floats = std::vector<float>;

std::string TempRoot(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Server 0 of 1: 6 floats in chunks of 4 (chunk 0: 4, chunk 1: 2), one table of 10 rows of 2;
// momentum, so chunks carry optimizer state.
class ShardCheckpointTest : public ::testing::Test {
 protected:
  void Create(PsConsistency consistency, bool with_table = true) {
    auto metrics = PsMetrics::Register(&registry_);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(metrics).value();
    config_.consistency = consistency;
    config_.num_workers = 1;
    config_.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
    config_.optimizer.lr = 0.5f;
    config_.dense_elements = 6;
    config_.chunk_elements = 4;
    config_.layout_fingerprint = 1234;
    if (with_table) config_.tables = {{"emb.0", 10, 2, 7}};
    auto dense = DenseShard::Create(config_, {0, 1, 100},
                                    {TensorData::Floats("chunk0", 0, Floats(4, 1)),
                                     TensorData::Floats("chunk1", 1, Floats(2, 2))},
                                    metrics_.get());
    ASSERT_TRUE(dense.ok()) << dense.status();
    dense_ = std::move(dense).value();
    tables_ = std::make_unique<SparseTables>(config_, 0, 1, metrics_.get());
    parts_ = {&config_, 0, 1, dense_.get(), tables_.get()};
  }

  // One step of the single worker: chunk 0 and row 3 get gradients of `g`, chunk 1 none.
  void Step(int64_t step, float g) {
    ASSERT_TRUE(tables_->Push("emb.0", 0, step, TensorData::Int64s("row_ids", {3}),
                              TensorData::Floats("values", 0, {g, g}))
                    .ok());
    ASSERT_TRUE(dense_->PushPull(0, step,
                                 {TensorData::Floats("chunk0", 0, Floats(4, g)),
                                  TensorData::Floats("chunk1", 1, Floats(2, 0))},
                                 true, [](PsPushPullReply) {})
                    .ok());
  }

  // Another server's parts of the same job (every chunk's values 9), to load a copy into.
  struct OtherParts {
    std::unique_ptr<DenseShard> dense;
    std::unique_ptr<SparseTables> tables;
    ShardParts parts;
  };
  OtherParts CreateOther() {
    OtherParts other;
    auto dense = DenseShard::Create(config_, {0, 1, 100},
                                    {TensorData::Floats("chunk0", 0, Floats(4, 9)),
                                     TensorData::Floats("chunk1", 1, Floats(2, 9))},
                                    metrics_.get());
    EXPECT_TRUE(dense.ok()) << dense.status();
    if (dense.ok()) other.dense = std::move(dense).value();
    other.tables = std::make_unique<SparseTables>(config_, 0, 1, metrics_.get());
    other.parts = {&config_, 0, 1, other.dense.get(), other.tables.get()};
    return other;
  }

  CheckpointManifest Manifest(int64_t step, const ShardFileInfo& file) {
    CheckpointManifest manifest;
    manifest.step = step;
    manifest.mode = std::string(PsModeName(config_.consistency));
    manifest.layout_fingerprint = config_.layout_fingerprint;
    manifest.dense_elements = config_.dense_elements;
    manifest.num_servers = 1;
    manifest.chunk_elements = config_.chunk_elements;
    manifest.files = {file};
    return manifest;
  }

  MetricsRegistry registry_;
  std::unique_ptr<PsMetrics> metrics_;
  PsJobConfig config_;
  std::unique_ptr<DenseShard> dense_;
  std::unique_ptr<SparseTables> tables_;
  ShardParts parts_;
};

TEST_F(ShardCheckpointTest, RestoreBringsBackValuesStateAndRowsOfTheStep) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kSync));
  Step(1, 1);
  Step(2, 2);
  const std::string root = TempRoot("round_trip");
  auto saved = SaveShard(parts_, root, 2);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->file, "server-0.ckpt");
  ASSERT_TRUE(CommitCheckpoint(root, Manifest(2, *saved)).ok());
  const auto dense_at_2 = dense_->Snapshot();
  const auto rows_at_2 = tables_->Snapshot();
  EXPECT_EQ(dense_at_2.at(0).state.size(), 4u);  // momentum buffers
  Step(3, 5);
  ASSERT_NE(dense_->Snapshot().at(0).values, dense_at_2.at(0).values);

  auto restored = RestoreShard(parts_, root, 2);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->checksum, saved->checksum);
  EXPECT_EQ(dense_->Snapshot().at(0).values, dense_at_2.at(0).values);
  EXPECT_EQ(dense_->Snapshot().at(0).state, dense_at_2.at(0).state);
  EXPECT_EQ(tables_->Snapshot().at("emb.0").values, rows_at_2.at("emb.0").values);
  EXPECT_EQ(tables_->Snapshot().at("emb.0").state, rows_at_2.at("emb.0").state);
  EXPECT_EQ(dense_->FirstBehind(2), "");
  EXPECT_EQ(dense_->FirstBehind(3), "chunk 0");
  Step(3, 5);  // step 3 again, from step 2's state
}

// A range copied to a server that joined: the shard of the step as tensors, loaded into another
// job of the same config, holds the same values, state and rows and goes on alike.
TEST_F(ShardCheckpointTest, CopyLoadsIntoAnotherJobAsTheStepWas) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kSync));
  Step(1, 1);
  Step(2, 2);
  auto copy = CopyShard(parts_, 2);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const auto dense_at_2 = dense_->Snapshot();
  const auto rows_at_2 = tables_->Snapshot();

  OtherParts other = CreateOther();
  ASSERT_NE(other.dense, nullptr);
  // A copy missing an entry, or with one of the wrong type, changes nothing.
  std::vector<TensorData> short_copy(copy->begin() + 1, copy->end());
  Status refused = LoadShardCopy(other.parts, short_copy, 2, "copy from server 1");
  EXPECT_EQ(refused.code(), StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("copy from server 1: entry '"), std::string::npos) << refused;
  std::vector<TensorData> odd = *copy;
  odd[0].dtype = DataType::kUInt8;
  EXPECT_EQ(LoadShardCopy(other.parts, odd, 2, "copy").code(), StatusCode::kDataLoss);
  EXPECT_EQ(other.dense->Snapshot().at(0).values, Floats(4, 9));

  ASSERT_TRUE(LoadShardCopy(other.parts, *copy, 2, "copy from server 1").ok());
  EXPECT_EQ(other.dense->Snapshot().at(0).values, dense_at_2.at(0).values);
  EXPECT_EQ(other.dense->Snapshot().at(0).state, dense_at_2.at(0).state);
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").ids, rows_at_2.at("emb.0").ids);
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").state, rows_at_2.at("emb.0").state);
  // Step 3 on both: bitwise the same.
  Step(3, 5);
  ASSERT_TRUE(other.tables
                  ->Push("emb.0", 0, 3, TensorData::Int64s("row_ids", {3}),
                         TensorData::Floats("values", 0, {5, 5}))
                  .ok());
  ASSERT_TRUE(other.dense
                  ->PushPull(0, 3,
                             {TensorData::Floats("chunk0", 0, Floats(4, 5)),
                              TensorData::Floats("chunk1", 1, Floats(2, 0))},
                             true, [](PsPushPullReply) {})
                  .ok());
  EXPECT_EQ(other.dense->Snapshot().at(0).values, dense_->Snapshot().at(0).values);
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").values, tables_->Snapshot().at("emb.0").values);
}

TEST_F(ShardCheckpointTest, SyncSaveWaitsForTheStepToBeAppliedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kSync));
  Step(1, 1);
  auto behind = SaveShard(parts_, TempRoot("behind"), 2, /*wait_ms=*/50);
  EXPECT_EQ(behind.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(behind.status().message(),
            "checkpoint of step 2: chunk 0 has not applied that step after 50 ms");
  // The table is behind alone: named too.
  ASSERT_TRUE(dense_->PushPull(0, 2,
                               {TensorData::Floats("chunk0", 0, Floats(4, 1)),
                                TensorData::Floats("chunk1", 1, Floats(2, 1))},
                               true, [](PsPushPullReply) {})
                  .ok());
  auto table_behind = SaveShard(parts_, TempRoot("behind"), 2, /*wait_ms=*/20);
  EXPECT_NE(table_behind.status().message().find("table 'emb.0'"), std::string::npos)
      << table_behind.status();
  // A save waiting while the step completes on another thread.
  std::thread pusher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(tables_->Push("emb.0", 0, 2, TensorData::Int64s("row_ids", {}),
                              TensorData::Floats("values", 0, {}))
                    .ok());
  });
  auto waited = SaveShard(parts_, TempRoot("waited"), 2, /*wait_ms=*/10000);
  pusher.join();
  EXPECT_TRUE(waited.ok()) << waited.status();
}

// ps-sync: a shard is of one step; a part that has applied a later step is named instead.
TEST_F(ShardCheckpointTest, SyncSaveRefusesAStepAlreadyPassed) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kSync));
  Step(1, 1);
  Step(2, 1);
  auto passed = SaveShard(parts_, TempRoot("passed"), 1, /*wait_ms=*/50);
  EXPECT_EQ(passed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(passed.status().message(),
            "checkpoint of step 1: chunk 0 (at step 2) has applied a later step; a ps-sync "
            "checkpoint holds one step on every server");
  // Only the table ahead (the dense chunks of step 3 not pushed yet).
  ASSERT_TRUE(tables_->Push("emb.0", 0, 3, TensorData::Int64s("row_ids", {}),
                            TensorData::Floats("values", 0, {}))
                  .ok());
  auto table_ahead = SaveShard(parts_, TempRoot("passed"), 2, /*wait_ms=*/50);
  EXPECT_NE(table_ahead.status().message().find("table 'emb.0' (at step 3)"), std::string::npos)
      << table_ahead.status();
  EXPECT_TRUE(SaveShard(parts_, TempRoot("passed"), 3, /*wait_ms=*/0).status().code() ==
              StatusCode::kDeadlineExceeded);
}

TEST_F(ShardCheckpointTest, EveryCheckComesBeforeAnythingChanges) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kAsync));
  Step(1, 1);
  const auto before_dense = dense_->Snapshot();
  const auto before_rows = tables_->Snapshot();
  auto unchanged = [&] {
    EXPECT_EQ(dense_->Snapshot().at(0).values, before_dense.at(0).values);
    EXPECT_EQ(dense_->Snapshot().at(1).values, before_dense.at(1).values);
    EXPECT_EQ(tables_->Snapshot().at("emb.0").values, before_rows.at("emb.0").values);
  };
  // A good dense part with broken table rows: refused, dense untouched.
  const std::string root = TempRoot("checks");
  ASSERT_TRUE(PrepareCheckpointStep(root, 4).ok());
  CheckpointShard shard;
  shard.floats["chunk0.values"] = Floats(4, 9);
  shard.floats["chunk0.state"] = Floats(4, 0);
  shard.floats["chunk1.values"] = Floats(2, 9);
  shard.floats["chunk1.state"] = Floats(2, 0);
  shard.ints["emb.0.ids"] = {3};
  shard.floats["emb.0.values"] = {1};  // a row of 2 needs 2
  shard.floats["emb.0.state"] = {0, 0};
  auto file = WriteCheckpointShard(CheckpointStepDirectory(root, 4) + "/server-0.ckpt", shard);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(CommitCheckpoint(root, Manifest(4, *file)).ok());
  auto rows = RestoreShard(parts_, root, 4);
  EXPECT_EQ(rows.status().code(), StatusCode::kInvalidArgument) << rows.status();
  EXPECT_NE(rows.status().message().find("server-0.ckpt"), std::string::npos) << rows.status();
  unchanged();

  // A missing entry.
  shard.floats["emb.0.values"] = {1, 1};
  shard.floats.erase("chunk1.state");
  ASSERT_TRUE(PrepareCheckpointStep(root, 5).ok());
  file = WriteCheckpointShard(CheckpointStepDirectory(root, 5) + "/server-0.ckpt", shard);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(CommitCheckpoint(root, Manifest(5, *file)).ok());
  auto entry = RestoreShard(parts_, root, 5);
  EXPECT_EQ(entry.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(entry.status().message().find("entry 'chunk1.state' is missing or has the wrong size"),
            std::string::npos)
      << entry.status();
  unchanged();

  // Another placement, and a manifest without this server's file.
  CheckpointManifest other = Manifest(5, *file);
  other.layout_fingerprint = 1;
  ASSERT_TRUE(PrepareCheckpointStep(root, 6).ok());
  other.step = 6;
  ASSERT_TRUE(CommitCheckpoint(root, other).ok());
  EXPECT_EQ(RestoreShard(parts_, root, 6).status().code(), StatusCode::kFailedPrecondition);
  CheckpointManifest none = Manifest(7, *file);
  none.files.clear();
  ASSERT_TRUE(PrepareCheckpointStep(root, 7).ok());
  ASSERT_TRUE(CommitCheckpoint(root, none).ok());
  auto missing = RestoreShard(parts_, root, 7);
  EXPECT_EQ(missing.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(missing.status().message().find("lists no server-0.ckpt"), std::string::npos);
  unchanged();
}

TEST_F(ShardCheckpointTest, SavesWhilePushesRunOnOtherThreads) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kAsync));
  std::thread pusher([&] {
    for (int64_t step = 1; step <= 300; ++step) Step(step, 1);
  });
  for (int i = 0; i < 20; ++i) {
    auto saved = SaveShard(parts_, TempRoot("live"), 0);
    EXPECT_TRUE(saved.ok()) << saved.status();
  }
  pusher.join();
}

// ps-async: a copy for a joined server (forwarding its later updates there) carries each
// chunk's version and the workers' clocks, and the server that loads it takes a push it holds
// as a copy and goes on bitwise alike; ps-sync and jobs with tables are refused.
TEST_F(ShardCheckpointTest, AsyncCopyForAJoinedServerCarriesEachChunksVersionAndClocks) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kAsync, /*with_table=*/false));
  auto push = [](DenseShard& dense, int64_t step, float g) {
    Floats values;
    EXPECT_TRUE(dense
                    .PushPull(0, step, {TensorData::Floats("chunk0", 0, Floats(4, g))}, true,
                              [&values](PsPushPullReply reply) {
                                values = reply.tensors.at(0).Read<float>();
                              })
                    .ok());
    return values;
  };
  push(*dense_, 1, 1);
  push(*dense_, 2, 2);
  auto copy = CopyShard(parts_, 2, "tcp://10.0.0.3:7000", 2);
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::map<std::string, TensorData> entries;
  for (const TensorData& entry : *copy) entries.emplace(entry.name, entry);
  ASSERT_EQ(entries.count("chunk0.clocks"), 1u);
  EXPECT_EQ(entries.at("chunk0.clocks").Read<int64_t>(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(entries.at("chunk1.clocks").Read<int64_t>(), (std::vector<int64_t>{0, 0}));

  OtherParts other = CreateOther();
  ASSERT_NE(other.dense, nullptr);
  std::vector<TensorData> odd = *copy;
  for (TensorData& entry : odd) {
    if (entry.name == "chunk0.clocks") entry = TensorData::Int64s("chunk0.clocks", {2});
  }
  EXPECT_EQ(LoadShardCopy(other.parts, odd, 2, "copy from server 1").message(),
            "copy from server 1: entry 'chunk0.clocks' holds 1 numbers; a version and 1 clocks "
            "expected");
  ASSERT_TRUE(LoadShardCopy(other.parts, *copy, 2, "copy from server 1").ok());
  const Floats held = other.dense->Snapshot().at(0).values;
  EXPECT_EQ(held, dense_->Snapshot().at(0).values);
  EXPECT_EQ(push(*other.dense, 2, 7), held);  // step 2 is in the copy: nothing applied
  EXPECT_EQ(push(*other.dense, 3, 5), push(*dense_, 3, 5));
  EXPECT_EQ(other.dense->Snapshot().at(0).state, dense_->Snapshot().at(0).state);

  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kSync, /*with_table=*/false));
  EXPECT_EQ(CopyShard(parts_, 0, "tcp://10.0.0.3:7000", 2).status().message(),
            "a copy that forwards its later updates to server 2 is for ps-async and ps-ssp "
            "(ps-sync copies at a step every worker agreed on)");
}

// The same with an embedding table: its copy carries the table's version and clocks, and the
// server that loads it takes a row push it holds as a copy and goes on bitwise alike.
TEST_F(ShardCheckpointTest, AsyncCopyCarriesEachTablesVersionAndClocks) {
  ASSERT_NO_FATAL_FAILURE(Create(PsConsistency::kAsync));
  Step(1, 1);
  Step(2, 2);
  auto copy = CopyShard(parts_, 2, "tcp://10.0.0.3:7000", 2);
  ASSERT_TRUE(copy.ok()) << copy.status();
  bool found = false;
  for (const TensorData& entry : *copy) {
    if (entry.name != "emb.0.clocks") continue;
    found = true;
    EXPECT_EQ(entry.Read<int64_t>(), (std::vector<int64_t>{2, 2}));
  }
  EXPECT_TRUE(found);
  OtherParts other = CreateOther();
  ASSERT_NE(other.dense, nullptr);
  ASSERT_TRUE(LoadShardCopy(other.parts, *copy, 2, "copy from server 1").ok());
  // Step 2's rows are in the copy: taken as a copy, nothing applied.
  ASSERT_TRUE(other.tables
                  ->Push("emb.0", 0, 2, TensorData::Int64s("row_ids", {3}),
                         TensorData::Floats("values", 0, {7, 7}))
                  .ok());
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").values, tables_->Snapshot().at("emb.0").values);
  for (SparseTables* tables : {tables_.get(), other.tables.get()}) {
    ASSERT_TRUE(tables
                    ->Push("emb.0", 0, 3, TensorData::Int64s("row_ids", {3}),
                           TensorData::Floats("values", 0, {5, 5}))
                    .ok());
  }
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").values, tables_->Snapshot().at("emb.0").values);
  EXPECT_EQ(other.tables->Snapshot().at("emb.0").state, tables_->Snapshot().at("emb.0").state);
}

}  // namespace
}  // namespace tessera::server
