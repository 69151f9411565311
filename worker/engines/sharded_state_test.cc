#include "worker/engines/sharded_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/base/atomic_file.h"

namespace tessera::worker {
namespace {

// The modes whose checkpoints are in this format, as the mode registry lists them
// (worker/modes/mode_registry.h, above the engines).
const std::vector<std::string> kShardedModes = {"allreduce", "zero1", "zero2", "zero3"};

using ::testing::HasSubstr;

std::string Root(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// N ranks as threads of this process: every collective is an exchange of each rank's part.
class ThreadWorld {
 public:
  explicit ThreadWorld(int world) : world_(world) {}
  int world() const { return world_; }

  std::vector<std::vector<float>> Exchange(uint64_t tag, int rank, std::vector<float> mine) {
    std::unique_lock<std::mutex> lock(mu_);
    Round& round = rounds_[tag];
    round.parts.resize(static_cast<size_t>(world_));
    round.parts[static_cast<size_t>(rank)] = std::move(mine);
    if (++round.arrived == world_) cv_.notify_all();
    cv_.wait(lock, [&] { return round.arrived == world_; });
    return round.parts;
  }

 private:
  struct Round {
    std::vector<std::vector<float>> parts;
    int arrived = 0;
  };
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Round> rounds_;  // guarded by mu_; never erased (a test makes few)
};

class ThreadCollectives final : public Collectives {
 public:
  ThreadCollectives(ThreadWorld* world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_->world(); }
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t tag) override {
    const Partition p = PartitionOf(count, world_size(), rank_);
    const float* in = static_cast<const float*>(input);
    auto parts = world_->Exchange(tag, rank_, std::vector<float>(in, in + p.size));
    for (int q = 0; q < world_size(); ++q) {
      std::copy(parts[q].begin(), parts[q].end(),
                static_cast<float*>(output) + PartitionOf(count, world_size(), q).offset);
    }
    return OkStatus();
  }
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& tensor,
                   uint64_t tag) override {
    float* values = static_cast<float*>(data);
    auto parts = world_->Exchange(tag, rank_, std::vector<float>(values, values + count));
    std::copy(parts[root].begin(), parts[root].end(), values);
    return OkStatus();
  }
  Status AllReduce(void*, size_t, DataType, ReduceOp, const std::string&, uint64_t) override {
    return UnimplementedError("not in this test");
  }
  Status ReduceScatter(const void*, void*, size_t, DataType, ReduceOp, const std::string&,
                       uint64_t) override {
    return UnimplementedError("not in this test");
  }
  Status Barrier(uint64_t) override { return UnimplementedError("not in this test"); }

 private:
  ThreadWorld* const world_;
  const int rank_;
};

// Runs fn(rank, collectives) on `world` threads; returns their statuses.
std::vector<Status> RunRanks(int world,
                             const std::function<Status(int, Collectives*)>& fn) {
  ThreadWorld shared(world);
  std::vector<Status> statuses(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadCollectives collectives(&shared, r);
      statuses[static_cast<size_t>(r)] = fn(r, &collectives);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

ParameterLayout MakeLayout(int64_t bias = 4) {
  ParameterLayout layout;
  EXPECT_TRUE(layout.Add("w", {2, 3}).ok());
  EXPECT_TRUE(layout.Add("b", {bias}).ok());
  return layout;  // 10 elements when bias = 4
}

// ZeRO's slices: rank r owns PartitionOf of each bucket.
std::vector<Partition> ZeroSlices(const std::vector<Partition>& buckets, int world, int rank) {
  std::vector<Partition> slices;
  for (const Partition& b : buckets) {
    const Partition p = PartitionOf(b.size, world, rank);
    slices.push_back({b.offset + p.offset, p.size});
  }
  return slices;
}

// Element i's value is i + 0.5, its Adam state (2 floats) 100 + i and 200 + i.
void Gather(const std::vector<Partition>& slices, std::vector<float>* params,
            std::vector<float>* state) {
  for (const Partition& s : slices) {
    for (size_t e = s.offset; e < s.end(); ++e) {
      params->push_back(e + 0.5f);
      state->push_back(100.0f + e);
      state->push_back(200.0f + e);
    }
  }
}

TEST(SliceAssemblerTest, ShardsOfAnyPlanAssembleTheWholeBuffer) {
  const std::vector<Partition> buckets = {{6, 4}, {0, 6}};
  SliceAssembler assembler(10, 2);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> params, state;
    const auto slices = ZeroSlices(buckets, 3, r);
    Gather(slices, &params, &state);
    ASSERT_TRUE(assembler.Add("rank-" + std::to_string(r),
                              MakeSliceShard(slices, params.data(), state.data(), 2))
                    .ok());
  }
  ASSERT_TRUE(assembler.CheckComplete("M").ok());
  for (size_t e = 0; e < 10; ++e) {
    EXPECT_EQ(assembler.params()[e], e + 0.5f);
    EXPECT_EQ(assembler.state()[2 * e], 100.0f + e);
    EXPECT_EQ(assembler.state()[2 * e + 1], 200.0f + e);
  }
}

TEST(SliceAssemblerTest, OverlapsGapsAndMalformedShardsNameTheFile) {
  std::vector<float> params, state;
  Gather({{0, 6}}, &params, &state);
  SliceAssembler assembler(10, 2);
  ASSERT_TRUE(assembler.Add("first.ckpt", MakeSliceShard({{0, 6}}, params.data(), state.data(), 2)).ok());
  Status overlap = assembler.Add("second.ckpt", MakeSliceShard({{4, 6}}, params.data(), state.data(), 2));
  EXPECT_EQ(overlap.code(), StatusCode::kDataLoss);
  EXPECT_THAT(overlap.message(), HasSubstr("second.ckpt: slice [4, 10) overlaps element 4, which "
                                           "first.ckpt holds too"));
  Status gap = assembler.CheckComplete("D/MANIFEST.json");
  EXPECT_EQ(gap.code(), StatusCode::kDataLoss);
  EXPECT_THAT(gap.message(), HasSubstr("D/MANIFEST.json: elements [6, 10) of the 10 parameters"));

  SliceAssembler fresh(10, 2);
  CheckpointShard odd = MakeSliceShard({{0, 2}}, params.data(), state.data(), 2);
  odd.ints["slices"].push_back(7);
  EXPECT_THAT(fresh.Add("odd.ckpt", odd).message(), HasSubstr("odd.ckpt: 'slices' has 3 values"));
  CheckpointShard outside = MakeSliceShard({{8, 3}}, params.data(), state.data(), 2);
  EXPECT_THAT(fresh.Add("out.ckpt", outside).message(),
              HasSubstr("out.ckpt: slice 0 (offset 8, size 3) is not a non-empty range"));
  CheckpointShard short_state = MakeSliceShard({{0, 2}}, params.data(), state.data(), 1);
  EXPECT_THAT(fresh.Add("sgd.ckpt", short_state).message(),
              HasSubstr("sgd.ckpt: its slices hold 2 elements, but 'params' has 2 floats and "
                        "'state' 2 (expected 2 and 4)"));
  CheckpointShard missing = MakeSliceShard({{0, 2}}, params.data(), state.data(), 2);
  missing.floats.erase("state");
  EXPECT_THAT(fresh.Add("m.ckpt", missing).message(), HasSubstr("m.ckpt: no 'state' entry"));
  // Empty slices are left out of the shard.
  EXPECT_EQ(MakeSliceShard({{3, 0}, {0, 2}}, params.data(), state.data(), 2).ints["slices"],
            (std::vector<int64_t>{0, 2}));
}

// Saved by 3 ZeRO ranks with one bucket plan, restored by 2 ranks with another, and by a
// data-parallel rank (one slice, all of it): the same values.
TEST(ShardedCheckpointTest, RestoresAtAnotherWorldSizeAndBucketPlan) {
  const std::string root = Root("sharded_resize");
  const ParameterLayout layout = MakeLayout();
  const ShardedCheckpointSpec spec{"zero2", &layout, OptimizerKind::kAdam, kShardedModes};
  auto saved = RunRanks(3, [&](int rank, Collectives* c) {
    const auto slices = ZeroSlices({{6, 4}, {0, 6}}, 3, rank);
    std::vector<float> params, state;
    Gather(slices, &params, &state);
    return SaveShardedCheckpoint(root, 5, spec, slices, params.data(), state.data(), c, 100);
  });
  for (const Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  auto manifest = ReadCheckpointManifest(root, 5);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->mode, "zero2");
  EXPECT_EQ(manifest->world_size, 3);
  EXPECT_EQ(manifest->optimizer, "adam");
  ASSERT_EQ(manifest->files.size(), 3u);
  EXPECT_EQ(manifest->files[2].file, "rank-2.ckpt");
  EXPECT_EQ(*LatestCheckpointStep(root), 5);

  const ShardedCheckpointSpec zero1{"zero1", &layout, OptimizerKind::kAdam, kShardedModes};
  auto restored = RunRanks(2, [&](int rank, Collectives* c) -> Status {
    const auto slices = ZeroSlices({{0, 10}}, 2, rank);
    std::vector<float> expected_params, expected_state;
    Gather(slices, &expected_params, &expected_state);
    std::vector<float> params(5), state(10), full(10);
    RETURN_IF_ERROR(RestoreShardedCheckpoint(root, 5, zero1, slices, params.data(), state.data(),
                                             full.data(), c, 200));
    EXPECT_EQ(params, expected_params);
    EXPECT_EQ(state, expected_state);
    EXPECT_EQ(full[9], 9.5f);
    return OkStatus();
  });
  for (const Status& s : restored) EXPECT_TRUE(s.ok()) << s;
}

// Data parallel: rank 0 writes the one slice, the others nothing; the manifest lists one file.
TEST(ShardedCheckpointTest, ReplicasWriteOneShard) {
  const std::string root = Root("sharded_replicas");
  const ParameterLayout layout = MakeLayout();
  const ShardedCheckpointSpec spec{"allreduce", &layout, OptimizerKind::kAdam, kShardedModes};
  auto saved = RunRanks(2, [&](int rank, Collectives* c) {
    std::vector<Partition> slices;
    if (rank == 0) slices = {{0, 10}};
    std::vector<float> params, state;
    Gather(slices, &params, &state);
    return SaveShardedCheckpoint(root, 1, spec, slices, params.data(), state.data(), c, 100);
  });
  for (const Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  auto assembled = ReadShardedCheckpoint(root, 1, spec);
  ASSERT_TRUE(assembled.ok()) << assembled.status();
  ASSERT_EQ(assembled->manifest.files.size(), 1u);
  EXPECT_EQ(assembled->manifest.files[0].file, "rank-0.ckpt");
  EXPECT_EQ(assembled->state[19], 209.0f);
}

// A rank that cannot write its shard: nothing is committed, LATEST stays, every rank fails and
// the others name it.
TEST(ShardedCheckpointTest, AFailedShardCommitsNothing) {
  const std::string root = Root("sharded_fail");
  const ParameterLayout layout = MakeLayout();
  const ShardedCheckpointSpec spec{"zero1", &layout, OptimizerKind::kSgd, kShardedModes};
  std::vector<float> params(10, 1.0f);
  auto save = [&](int64_t step) {
    return RunRanks(2, [&](int rank, Collectives* c) {
      const std::vector<Partition> slices = {PartitionOf(10, 2, rank)};
      return SaveShardedCheckpoint(root, step, spec, slices, params.data() + slices[0].offset,
                                   nullptr, c, 100 + 2 * step);
    });
  };
  for (const Status& s : save(1)) ASSERT_TRUE(s.ok()) << s;
  // A directory where rank 1's shard goes: its rename fails.
  ASSERT_TRUE(MakeDirectories(CheckpointStepDirectory(root, 2) + "/rank-1.ckpt").ok());
  auto failed = save(2);
  EXPECT_FALSE(failed[1].ok());
  EXPECT_EQ(failed[0].code(), StatusCode::kAborted);
  EXPECT_THAT(failed[0].message(), HasSubstr("rank 1 could not write its shard"));
  EXPECT_EQ(*LatestCheckpointStep(root), 1);
  EXPECT_FALSE(ReadCheckpointManifest(root, 2).ok());
}

TEST(ShardedCheckpointTest, OtherModelOptimizerModeAndCorruptionAreNamed) {
  const std::string root = Root("sharded_mismatch");
  const ParameterLayout layout = MakeLayout();
  const ShardedCheckpointSpec spec{"zero2", &layout, OptimizerKind::kAdam, kShardedModes};
  auto saved = RunRanks(2, [&](int rank, Collectives* c) {
    const std::vector<Partition> slices = {PartitionOf(10, 2, rank)};
    std::vector<float> params, state;
    Gather(slices, &params, &state);
    return SaveShardedCheckpoint(root, 3, spec, slices, params.data(), state.data(), c, 100);
  });
  for (const Status& s : saved) ASSERT_TRUE(s.ok()) << s;
  const std::string directory = CheckpointStepDirectory(root, 3);

  const ParameterLayout other = MakeLayout(5);
  auto wrong_model =
      ReadShardedCheckpoint(root, 3, {"zero2", &other, OptimizerKind::kAdam, kShardedModes});
  EXPECT_EQ(wrong_model.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_model.status().message(),
              HasSubstr("checkpoint " + directory + " is of another model: tensor #1 is 'b' [4] "
                        "in the checkpoint and 'b' [5] in this model"));
  auto wrong_optimizer =
      ReadShardedCheckpoint(root, 3, {"zero2", &layout, OptimizerKind::kSgd, kShardedModes});
  EXPECT_THAT(wrong_optimizer.status().message(),
              HasSubstr("holds the optimizer state of adam; this run uses sgd"));

  // Into another mode of the family: fine.
  EXPECT_TRUE(
      ReadShardedCheckpoint(root, 3, {"allreduce", &layout, OptimizerKind::kAdam, kShardedModes})
          .ok());
  // Into a mode that does not restore the writer's checkpoints: refused, naming both.
  auto wrong_mode = ReadShardedCheckpoint(root, 3, {"zero1", &layout, OptimizerKind::kAdam,
                                                    {"allreduce", "zero1"}});
  EXPECT_EQ(wrong_mode.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_mode.status().message(),
              HasSubstr("checkpoint " + directory + " was written by --mode zero2; --mode zero1 "
                        "restores checkpoints of allreduce or zero1"));

  // A flipped byte in rank 1's shard.
  const std::string shard = directory + "/rank-1.ckpt";
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('\x7f');
  }
  auto corrupted = ReadShardedCheckpoint(root, 3, spec);
  EXPECT_EQ(corrupted.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(corrupted.status().message(), HasSubstr(shard));
  // Every rank of a restore fails, the healthy ones too (they all read every shard).
  auto restored = RunRanks(2, [&](int rank, Collectives* c) {
    std::vector<float> full(10);
    return RestoreShardedCheckpoint(root, 3, spec, {}, nullptr, nullptr, full.data(), c, 300);
  });
  for (const Status& s : restored) EXPECT_THAT(s.message(), HasSubstr("rank-1.ckpt"));
  // A missing shard.
  ASSERT_EQ(std::remove(shard.c_str()), 0);
  EXPECT_THAT(ReadShardedCheckpoint(root, 3, spec).status().message(), HasSubstr(shard));

  // A checkpoint of another family.
  CheckpointManifest local;
  local.step = 4;
  local.mode = "local";
  ASSERT_TRUE(PrepareCheckpointStep(root, 4).ok());
  ASSERT_TRUE(CommitCheckpoint(root, local).ok());
  EXPECT_THAT(ReadShardedCheckpoint(root, 4, spec).status().message(),
              HasSubstr("was written by --mode local; --mode zero2 restores checkpoints of "
                        "allreduce, zero1, zero2 or zero3"));
}

}  // namespace
}  // namespace tessera::worker
