// ZeroEngine on one rank, driven the way Sequential drives its storage, with collectives that
// copy (world size 1) and count the all-gathers per tensor: what stage 3 gathers in each pass,
// the bound on transient memory, and gradient accumulation over micro-batches. And on two
// ranks of a real ring in this process: a skip one rank's check asks for is every rank's. And
// HSDP's replicate path on four ranks in two pairs of rings.
#include "worker/engines/zero_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

// World size 1: every collective leaves the data as it is (or copies it to the output).
class CopyCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status AllReduce(void*, size_t, DataType, ReduceOp, const std::string&, uint64_t) override {
    return OkStatus();
  }
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp,
                       const std::string&, uint64_t) override {
    if (input != output) std::memmove(output, input, count * DataTypeSize(dtype));
    return OkStatus();
  }
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t) override {
    if (input != output) std::memmove(output, input, count * DataTypeSize(dtype));
    std::lock_guard<std::mutex> lock(mu_);
    ++gathers_[tensor];
    return OkStatus();
  }
  Status Broadcast(void*, size_t, DataType, int, const std::string&, uint64_t) override {
    return OkStatus();
  }
  Status Barrier(uint64_t) override { return OkStatus(); }

  // All-gathers per tensor since the last call.
  std::map<std::string, int> TakeGathers() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(gathers_);
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> gathers_;  // guarded by mu_
};

// Three layers of 16, 10 and 9 parameters (weight and bias each).
ParameterLayout ThreeLayers() {
  ParameterLayout layout;
  EXPECT_TRUE(layout.Add("l0.w", {4, 3}).ok());
  EXPECT_TRUE(layout.Add("l0.b", {4}).ok());
  EXPECT_TRUE(layout.Add("l1.w", {2, 4}).ok());
  EXPECT_TRUE(layout.Add("l1.b", {2}).ok());
  EXPECT_TRUE(layout.Add("l2.w", {3, 2}).ok());
  EXPECT_TRUE(layout.Add("l2.b", {3}).ok());
  return layout;
}
const ParameterBlock kBlocks[3] = {{0, 16}, {16, 10}, {26, 9}};

class ZeroEngineTest : public ::testing::Test {
 protected:
  void Create(int stage) {
    ZeroEngineOptions options;
    options.stage = stage;
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.lr = 0.5f;
    auto engine = ZeroEngine::Create(options, &collectives_, &metrics_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    std::vector<float> params(35, 1.0f);
    ASSERT_TRUE(engine_->Initialize(ThreeLayers(), {}, params.data()).ok());
    collectives_.TakeGathers();  // Initialize's fingerprint
  }

  // One forward and backward as Sequential runs them; every gradient is `gradient`.
  void ForwardBackward(float gradient) {
    ParameterStorage* storage = engine_->parameter_storage();
    for (const ParameterBlock& block : kBlocks) {
      ASSERT_TRUE(storage->Acquire(block, Pass::kForward).ok());
      storage->Release(block);
    }
    for (int i = 2; i >= 0; --i) {
      ASSERT_TRUE(storage->Acquire(kBlocks[i], Pass::kBackward).ok());
      StatusOr<float*> grads = storage->GradientBlock(kBlocks[i]);
      ASSERT_TRUE(grads.ok()) << grads.status();
      std::fill(*grads, *grads + kBlocks[i].size, gradient);
      storage->Release(kBlocks[i]);
      ASSERT_TRUE(storage->GradientsDone(kBlocks[i]).ok());
    }
  }

  CopyCollectives collectives_;
  MetricsRegistry metrics_;
  std::unique_ptr<ZeroEngine> engine_;
};

TEST_F(ZeroEngineTest, Stage3KeepsTheLastForwardBlockForBackward) {
  Create(3);
  // Step 1 knows no order yet: every block is gathered for the forward and for the backward.
  engine_->OnBackwardStart(1, nullptr);
  ForwardBackward(0.0f);
  ASSERT_TRUE(engine_->Step(1, nullptr, nullptr, {}).ok());
  const std::map<std::string, int> twice = {{"l0.w", 2}, {"l0.b", 2}, {"l1.w", 2},
                                            {"l1.b", 2}, {"l2.w", 2}, {"l2.b", 2}};
  EXPECT_EQ(collectives_.TakeGathers(), twice);
  // From step 2 on, the forward's last block (l2) stays gathered for the backward.
  engine_->OnBackwardStart(2, nullptr);
  ForwardBackward(0.0f);
  // The step's peak so far (Step publishes it and starts the next step's from what is held).
  const ZeroEngine::Bytes held = engine_->held(), peak = engine_->peak();
  ASSERT_TRUE(engine_->Step(2, nullptr, nullptr, {}).ok());
  const std::map<std::string, int> l2_once = {{"l0.w", 2}, {"l0.b", 2}, {"l1.w", 2},
                                              {"l1.b", 2}, {"l2.w", 1}, {"l2.b", 1}};
  EXPECT_EQ(collectives_.TakeGathers(), l2_once);
  // At most two gathered blocks and two gradient blocks at once (the two largest: 16 + 10).
  EXPECT_LE(peak.parameters, held.parameters + (16 + 10) * sizeof(float));
  EXPECT_LE(peak.gradients, held.gradients + (16 + 10) * sizeof(float));
  EXPECT_GT(peak.parameters, held.parameters);
  // An evaluation (a forward outside a step) keeps nothing gathered.
  ParameterStorage* storage = engine_->parameter_storage();
  for (const ParameterBlock& block : kBlocks) {
    ASSERT_TRUE(storage->Acquire(block, Pass::kForward).ok());
    storage->Release(block);
  }
  const std::map<std::string, int> once = {{"l0.w", 1}, {"l0.b", 1}, {"l1.w", 1},
                                           {"l1.b", 1}, {"l2.w", 1}, {"l2.b", 1}};
  EXPECT_EQ(collectives_.TakeGathers(), once);
}

// Two micro-batches with gradients 1 and 3: SGD steps with their mean, 2.
TEST_F(ZeroEngineTest, AccumulatesMicroBatchesIntoTheShard) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE(stage);
    Create(stage);
    engine_->OnBackwardStart(1, nullptr);
    ForwardBackward(1.0f);
    ForwardBackward(3.0f);
    ASSERT_TRUE(engine_->Step(1, nullptr, nullptr, {}).ok());
    std::vector<float> params(35);
    ASSERT_TRUE(engine_->GatherParameters(params.data()).ok());
    EXPECT_EQ(params, std::vector<float>(35, 1.0f - 0.5f * 2.0f));
  }
}

// Two ranks (a real ring over in-process transports): rank 1's gradients hold a NaN only in
// the last element of 'l2.b', which the reduce-scatter leaves in rank 1's shard. With a check
// that may skip, rank 1's check skips, rank 0 is told (naming rank 1 and where its shard
// failed), and neither applies the step; the next, finite step applies on both.
TEST(ZeroEngineTwoRanksTest, ASkipOfOneRankIsEveryRanks) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE(stage);
    TestRingOptions ring_options;
    ring_options.in_process = true;
    TestRing ring(2, ring_options);
    ASSERT_TRUE(ring.ok());
    const ParameterLayout layout = ThreeLayers();
    MetricsRegistry metrics[2];
    std::unique_ptr<ZeroEngine> engines[2];
    struct Told {
      int64_t step;
      int rank;
      std::optional<uint64_t> offset;
    };
    std::vector<Told> told[2];
    std::vector<int64_t> skipped[2];  // steps each rank's own check skipped
    for (int rank = 0; rank < 2; ++rank) {
      ZeroEngineOptions options;
      options.stage = stage;
      options.optimizer.kind = OptimizerKind::kSgd;
      options.optimizer.lr = 0.5f;
      auto engine = ZeroEngine::Create(options, &ring.at(rank), &metrics[rank]);
      ASSERT_TRUE(engine.ok()) << engine.status();
      engines[rank] = std::move(*engine);
      GradientCheck check;
      check.may_skip = true;
      check.scan = [&skipped, rank](int64_t step, const float* grads, uint64_t,
                                    uint64_t size) -> StatusOr<bool> {
        for (uint64_t i = 0; i < size; ++i) {
          if (!std::isfinite(grads[i])) {
            skipped[rank].push_back(step);
            return false;
          }
        }
        return true;
      };
      check.skipped_by_peer = [&told, rank](int64_t step, int by,
                                            std::optional<uint64_t> offset) {
        told[rank].push_back({step, by, offset});
      };
      engines[rank]->SetGradientCheck(std::move(check));
    }
    std::vector<float> params[2] = {std::vector<float>(35, 1.0f), std::vector<float>(35, 1.0f)};
    auto step = [&](int64_t number, float gradient, bool nan_on_rank1) {
      return ring.RunAll([&](int rank) -> Status {
        ZeroEngine& engine = *engines[rank];
        if (number == 1) RETURN_IF_ERROR(engine.Initialize(layout, {}, params[rank].data()));
        engine.OnBackwardStart(number, nullptr);
        ParameterStorage* storage = engine.parameter_storage();
        for (const ParameterBlock& block : kBlocks) {
          RETURN_IF_ERROR(storage->Acquire(block, Pass::kForward).status());
          storage->Release(block);
        }
        for (int i = 2; i >= 0; --i) {
          RETURN_IF_ERROR(storage->Acquire(kBlocks[i], Pass::kBackward).status());
          ASSIGN_OR_RETURN(float* grads, storage->GradientBlock(kBlocks[i]));
          std::fill(grads, grads + kBlocks[i].size, gradient);
          if (i == 2 && rank == 1 && nan_on_rank1) grads[kBlocks[i].size - 1] = std::nanf("");
          storage->Release(kBlocks[i]);
          RETURN_IF_ERROR(storage->GradientsDone(kBlocks[i]));
        }
        RETURN_IF_ERROR(engine.Step(number, nullptr, nullptr, {}));
        return engine.GatherParameters(params[rank].data());
      });
    };
    for (const Status& status : step(1, 1.0f, /*nan_on_rank1=*/true)) ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(skipped[0].empty());
    EXPECT_EQ(skipped[1], std::vector<int64_t>{1});
    ASSERT_EQ(told[0].size(), 1u);
    EXPECT_EQ(told[0][0].step, 1);
    EXPECT_EQ(told[0][0].rank, 1);
    // Rank 1's slice of 'l2.b' (3 floats at 32): its last 1 (PartitionOf gives rank 0 two).
    EXPECT_EQ(told[0][0].offset, std::optional<uint64_t>(34));
    EXPECT_TRUE(told[1].empty());
    for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(params[rank], std::vector<float>(35, 1.0f));
    for (const Status& status : step(2, 1.0f, /*nan_on_rank1=*/false)) ASSERT_TRUE(status.ok()) << status;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(params[rank], std::vector<float>(35, 0.5f));
  }
}

// HSDP on four ranks: shard groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3},
// each a ring of its own in this process. World rank w's gradients are all w + 1: the shard
// groups' means, 1.5 and 3.5, averaged across the replicas are the world's mean 2.5, so one
// SGD step at lr 0.5 takes every parameter from 1 to -0.25 on every rank (exact in float).
// A stop asked for by one rank is every rank's, in both groups. The first replica writes the
// checkpoint (two shards, as a zero3 world of 2), from which every rank restores.
TEST(ZeroEngineHsdpTest, ReplicasAverageTheShardGroupsGradients) {
  TestRingOptions ring_options;
  ring_options.in_process = true;
  std::vector<std::unique_ptr<TestRing>> shard_rings, replicate_rings;
  for (int g = 0; g < 2; ++g) {
    shard_rings.push_back(std::make_unique<TestRing>(2, ring_options));
    replicate_rings.push_back(std::make_unique<TestRing>(2, ring_options));
    ASSERT_TRUE(shard_rings.back()->ok() && replicate_rings.back()->ok());
  }
  const ParameterLayout layout = ThreeLayers();
  MetricsRegistry metrics[4];
  std::unique_ptr<ZeroEngine> engines[4];
  for (int w = 0; w < 4; ++w) {
    const int group = w / 2, index = w % 2;
    ZeroEngineOptions options;
    options.stage = 3;
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.lr = 0.5f;
    options.replicate = &replicate_rings[index]->at(group);
    options.first_replica = group == 0;
    options.restores_checkpoints_of = {"zero3", "hsdp"};
    auto engine = ZeroEngine::Create(options, &shard_rings[group]->at(index), &metrics[w]);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->name(), "hsdp");
    engines[w] = std::move(*engine);
  }
  const std::string dir = ::testing::TempDir() + "/hsdp_engine_ckpt";
  std::vector<float> params[4], restored[4];
  Status statuses[4];
  bool stops[4] = {};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      statuses[w] = [&]() -> Status {
        ZeroEngine& engine = *engines[w];
        // Only world rank 0's initial parameters count.
        params[w].assign(35, w == 0 ? 1.0f : 7.0f);
        RETURN_IF_ERROR(engine.Initialize(layout, {}, params[w].data()));
        engine.OnBackwardStart(1, nullptr);
        ParameterStorage* storage = engine.parameter_storage();
        for (const ParameterBlock& block : kBlocks) {
          RETURN_IF_ERROR(storage->Acquire(block, Pass::kForward).status());
          storage->Release(block);
        }
        for (int i = 2; i >= 0; --i) {
          RETURN_IF_ERROR(storage->Acquire(kBlocks[i], Pass::kBackward).status());
          ASSIGN_OR_RETURN(float* grads, storage->GradientBlock(kBlocks[i]));
          std::fill(grads, grads + kBlocks[i].size, static_cast<float>(w + 1));
          storage->Release(kBlocks[i]);
          RETURN_IF_ERROR(storage->GradientsDone(kBlocks[i]));
        }
        RETURN_IF_ERROR(engine.Step(1, nullptr, nullptr, {}));
        RETURN_IF_ERROR(engine.GatherParameters(params[w].data()));
        ASSIGN_OR_RETURN(stops[w], engine.AgreeToStop(1, /*stop=*/w == 3));
        RETURN_IF_ERROR(engine.SaveCheckpoint(dir, 1, nullptr));
        restored[w].assign(35, 0.0f);
        return engine.RestoreCheckpoint(dir, 1, restored[w].data());
      }();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int w = 0; w < 4; ++w) {
    SCOPED_TRACE(w);
    ASSERT_TRUE(statuses[w].ok()) << statuses[w];
    EXPECT_EQ(params[w], std::vector<float>(35, -0.25f));
    EXPECT_TRUE(stops[w]);
    EXPECT_EQ(restored[w], params[w]);
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(std::ifstream(dir + "/step-000000000001/rank-" + std::to_string(r) + ".ckpt").good(),
              r < 2)
        << r;
  }
}

// A block whose gradients never arrived in a step is an error naming the tensor.
TEST_F(ZeroEngineTest, StepWithoutGradientsNamesTheTensor) {
  Create(2);
  engine_->OnBackwardStart(1, nullptr);
  Status status = engine_->Step(1, nullptr, nullptr, {});
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("no gradients of 'l0.w'"), std::string::npos) << status;
}

}  // namespace
}  // namespace tessera::worker
