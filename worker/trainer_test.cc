#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>

#include "worker/data/synthetic_classification.h"
#include "worker/engines/local_engine.h"
#include "worker/nn/cpu/cpu_backend.h"
#include "worker/nn/mlp.h"

namespace tessera::worker {
namespace {

std::unique_ptr<data::SyntheticClassification> Synthetic(size_t samples, uint64_t seed) {
  data::SyntheticClassificationOptions options;
  options.num_samples = samples;
  options.feature_dim = 16;
  options.num_classes = 4;
  options.hidden_dim = 8;
  options.seed = seed;
  return std::move(data::SyntheticClassification::Create(options)).value();
}

std::unique_ptr<LocalEngine> Engine(OptimizerKind kind, float lr) {
  OptimizerOptions optimizer = DefaultOptimizerOptions(kind);
  optimizer.lr = lr;
  return std::move(LocalEngine::Create(optimizer, LrScheduleOptions())).value();
}

TEST(TrainerTest, LocalTrainingLearnsTheTeacher) {
  CpuBackend backend;
  auto train = Synthetic(4096, 1);
  auto eval = Synthetic(4096, 1);  // same teacher; the first 1024 samples
  auto model = std::move(Mlp::Create({16, {64}, 4}, &backend)).value();
  auto engine = Engine(OptimizerKind::kAdam, 0.01f);
  TrainerOptions options;
  options.batch_size = 64;
  options.steps = 400;
  options.log_every = 0;
  std::vector<float> params;
  auto summary = Train(options, *train, eval.get(), model.get(), &backend, engine.get(), &params);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 400);
  EXPECT_EQ(summary->samples, 400 * 64);
  // Chance is 0.25; the teacher is a small tanh network, which an MLP learns well.
  EXPECT_GT(summary->eval_accuracy, 0.8) << "eval loss " << summary->eval_loss;
  EXPECT_GT(summary->samples_per_second, 0);
}

TEST(TrainerTest, SameSeedSameParametersBitwise) {
  CpuBackend backend;
  auto train = Synthetic(512, 2);
  std::vector<float> first, second;
  for (std::vector<float>* params : {&first, &second}) {
    auto model = std::move(Mlp::Create({16, {32}, 4}, &backend)).value();
    auto engine = Engine(OptimizerKind::kMomentum, 0.05f);
    TrainerOptions options;
    options.steps = 30;
    options.log_every = 0;
    ASSERT_TRUE(Train(options, *train, nullptr, model.get(), &backend, engine.get(), params).ok());
  }
  EXPECT_EQ(first, second);
}

// The engine sees every step once, after backward, with the full gradient buffer final; this is
// the contract the distributed engines rely on.
class RecordingEngine final : public TrainingEngine {
 public:
  std::string_view name() const override { return "recording"; }
  Status Initialize(const ParameterLayout& layout, const std::vector<EmbeddingTableSpec>& tables,
                    float* params) override {
    size_ = layout.total_size();
    return OkStatus();
  }
  void OnGradientsReady(uint64_t offset, uint64_t size) override { ready_ += size; }
  Status Step(int64_t step, float* params, float* grads,
              const std::vector<SparseRows>& sparse) override {
    EXPECT_EQ(step, steps_ + 1);
    EXPECT_EQ(ready_, size_) << "Step before every gradient was ready";
    ready_ = 0;
    ++steps_;
    return step == fail_at_ ? UnavailableError("server 1 is gone") : OkStatus();
  }
  uint64_t size_ = 0, ready_ = 0;
  int64_t steps_ = 0;
  int64_t fail_at_ = -1;
};

TEST(TrainerTest, EngineContractAndErrorsCarryTheStep) {
  CpuBackend backend;
  auto train = Synthetic(100, 3);
  auto model = std::move(Mlp::Create({16, {8}, 4}, &backend)).value();
  RecordingEngine engine;
  engine.fail_at_ = 7;
  TrainerOptions options;
  options.steps = 10;
  options.batch_size = 30;  // 100 samples: crosses epochs
  options.log_every = 0;
  std::vector<float> params;
  auto summary = Train(options, *train, nullptr, model.get(), &backend, &engine, &params);
  EXPECT_EQ(engine.steps_, 7);
  EXPECT_EQ(summary.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(summary.status().message(), "recording step 7: server 1 is gone");
}

TEST(TrainerTest, RejectsMismatchedDatasetAndBadOptions) {
  CpuBackend backend;
  auto train = Synthetic(100, 3);
  auto model = std::move(Mlp::Create({8, {8}, 4}, &backend)).value();
  auto engine = Engine(OptimizerKind::kSgd, 0.1f);
  std::vector<float> params;
  TrainerOptions options;
  auto wrong_width = Train(options, *train, nullptr, model.get(), &backend, engine.get(), &params);
  EXPECT_NE(wrong_width.status().message().find("16 dense features but the mlp model takes 8"),
            std::string::npos)
      << wrong_width.status();
  auto ok_model = std::move(Mlp::Create({16, {8}, 4}, &backend)).value();
  options.batch_size = 0;
  EXPECT_NE(Train(options, *train, nullptr, ok_model.get(), &backend, engine.get(), &params)
                .status()
                .message()
                .find("--batch-size=0"),
            std::string::npos);
}

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Stopping after a checkpoint and resuming gives bitwise the parameters of an uninterrupted
// run: parameters, Adam's moments and the data order (across an epoch boundary) all continue.
TEST(TrainerTest, ResumingFromACheckpointIsBitwiseLikeNeverStopping) {
  CpuBackend backend;
  auto train = Synthetic(300, 4);  // 300 / 32: epochs end mid-batch
  auto run = [&](int64_t steps, const std::string& dir, int64_t every, bool resume,
                 std::vector<float>* params, std::optional<int64_t> resume_step = std::nullopt) {
    auto model = std::move(Mlp::Create({16, {32}, 4}, &backend)).value();
    auto engine = Engine(OptimizerKind::kAdam, 0.01f);
    TrainerOptions options;
    options.steps = steps;
    options.batch_size = 32;
    options.log_every = 0;
    options.checkpoint_dir = dir;
    options.checkpoint_every = every;
    options.resume = resume;
    options.resume_step = resume_step;
    return Train(options, *train, nullptr, model.get(), &backend, engine.get(), params);
  };
  std::vector<float> uninterrupted, resumed;
  ASSERT_TRUE(run(30, "", 0, false, &uninterrupted).ok());
  const std::string dir = TempDir("resume_ckpt");
  ASSERT_TRUE(run(17, dir, 5, false, &resumed).ok());  // checkpoints at 5, 10, 15, 17
  auto summary = run(30, dir, 0, true, &resumed);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->first_step, 18);
  EXPECT_EQ(resumed, uninterrupted);
  // A corrupted shard is named, and nothing trains on it.
  {
    std::fstream file(dir + "/step-000000000017/local.ckpt",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x55');
  }
  auto corrupted = run(30, dir, 0, true, &resumed);
  EXPECT_EQ(corrupted.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(corrupted.status().message().find("step-000000000017/local.ckpt"), std::string::npos)
      << corrupted.status();
  // ... and so is the way forward: the newest checkpoint that verifies, and the flag.
  EXPECT_NE(corrupted.status().message().find("the newest checkpoint before step 17 that "
                                              "verifies is step 15: resume from it with "
                                              "--resume-step 15"),
            std::string::npos)
      << corrupted.status();
  std::vector<float> from_15;
  auto resumed_15 = run(30, dir, 0, false, &from_15, 15);
  ASSERT_TRUE(resumed_15.ok()) << resumed_15.status();
  EXPECT_EQ(resumed_15->first_step, 16);
  EXPECT_EQ(from_15, uninterrupted);
  auto missing = run(30, dir, 0, false, &from_15, 12);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--resume-step 12: no checkpoint of step 12 in " +
                                            dir + " (it has steps 17, 15, 10, 5)"),
            std::string::npos)
      << missing.status();
  // --resume without a directory is an error, not a silent fresh start.
  EXPECT_NE(run(30, "", 0, true, &resumed).status().message().find("--checkpoint-dir"),
            std::string::npos);
}

// Preemption: a stop request after step 7 checkpoints that step and ends with Cancelled; the
// resumed run ends like one that was never stopped.
TEST(TrainerTest, StopRequestCheckpointsTheFinishedStepAndResumeContinues) {
  CpuBackend backend;
  auto train = Synthetic(300, 6);
  auto run = [&](const std::string& dir, bool resume, std::function<bool()> stop,
                 std::vector<float>* params) {
    auto model = std::move(Mlp::Create({16, {16}, 4}, &backend)).value();
    auto engine = Engine(OptimizerKind::kMomentum, 0.05f);
    TrainerOptions options;
    options.steps = 20;
    options.log_every = 0;
    options.checkpoint_dir = dir;
    options.resume = resume;
    options.should_stop = std::move(stop);
    options.checkpoint_on_stop = true;
    return Train(options, *train, nullptr, model.get(), &backend, engine.get(), params);
  };
  std::vector<float> uninterrupted, resumed;
  ASSERT_TRUE(run("", false, nullptr, &uninterrupted).ok());
  const std::string dir = TempDir("preempted");
  int polls = 0;
  auto stopped = run(dir, false, [&polls] { return ++polls == 7; }, &resumed);
  EXPECT_EQ(stopped.status().code(), StatusCode::kCancelled);
  EXPECT_NE(stopped.status().message().find("stopped after step 7"), std::string::npos)
      << stopped.status();
  ASSERT_TRUE(run(dir, true, nullptr, &resumed).ok());
  EXPECT_EQ(resumed, uninterrupted);
}

TEST(LocalEngineTest, OneSgdStepIsParamsMinusLrTimesGrad) {
  auto engine = Engine(OptimizerKind::kSgd, 0.5f);
  ParameterLayout layout;
  ASSERT_TRUE(layout.Add("w", {3}).ok());
  std::vector<float> params = {1, 2, 3}, grads = {0.5f, -1, 2};
  ASSERT_TRUE(engine->Initialize(layout, {}, params.data()).ok());
  ASSERT_TRUE(engine->Step(1, params.data(), grads.data(), {}).ok());
  EXPECT_EQ(params, (std::vector<float>{0.75f, 2.5f, 2.0f}));
  EXPECT_EQ(engine->last_lr(), 0.5f);
}

}  // namespace
}  // namespace tessera::worker
