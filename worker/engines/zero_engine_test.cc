// ZeroEngine on one rank, driven the way Sequential drives its storage, with collectives that
// copy (world size 1) and count the all-gathers per tensor: what stage 3 gathers in each pass,
// the bound on transient memory, and gradient accumulation over micro-batches.
#include "worker/engines/zero_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>

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
