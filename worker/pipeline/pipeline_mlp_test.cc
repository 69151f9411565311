// PipelineMlp in one process: P x T threads, each one rank's model, linked by an in-memory
// StageLinks; one step's gradients, gathered into the full layout, against one Mlp's on the
// same batch. Covers every schedule, tensor-parallel pairs (with LayerNorm and GELU models:
// the recomputed forward keeps LayerNorm right), and the refusals Create makes.
#include "worker/pipeline/pipeline_mlp.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "worker/nn/cpu/cpu_backend.h"

namespace tessera::worker {
namespace {

constexpr auto kWait = std::chrono::seconds(20);

// The ranks' mailboxes and sums. Sums add the members' parts in rank order, so that every
// run gives the same bits.
class Hub {
 public:
  Hub(int pipeline, int tensor) : pipeline_(pipeline), tensor_(tensor) {}
  int pipeline() const { return pipeline_; }
  int tensor() const { return tensor_; }

  Status Send(int t, int from, int to, uint32_t tag, const float* data, size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    mail_[{t, from, to, tag}].emplace_back(data, data + count);
    cv_.notify_all();
    return OkStatus();
  }
  Status Recv(int t, int from, int to, uint32_t tag, float* data, size_t count,
              const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& queue = mail_[{t, from, to, tag}];
    if (!cv_.wait_for(lock, kWait, [&] { return !queue.empty(); })) {
      return DeadlineExceededError("no " + what + " from pipeline rank " + std::to_string(from));
    }
    if (queue.front().size() != count) {
      return InvalidArgumentError(what + ": " + std::to_string(queue.front().size()) +
                                  " floats, expected " + std::to_string(count));
    }
    std::copy(queue.front().begin(), queue.front().end(), data);
    queue.pop_front();
    return OkStatus();
  }
  // Member `rank` of the `size` members of group `group` (call number `call`).
  Status Sum(const std::string& group, uint64_t call, int rank, int size, float* data,
             size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    Slot& slot = slots_[{group, call}];
    slot.parts.resize(static_cast<size_t>(size));
    slot.parts[static_cast<size_t>(rank)].assign(data, data + count);
    ++slot.arrived;
    cv_.notify_all();
    if (!cv_.wait_for(lock, kWait, [&] { return slot.arrived == size; })) {
      return DeadlineExceededError("sum over " + group + ": not every member came");
    }
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (const auto& part : slot.parts) sum += part[i];
      data[i] = sum;
    }
    if (++slot.left == size) slots_.erase({group, call});
    return OkStatus();
  }

 private:
  struct Slot {
    std::vector<std::vector<float>> parts;
    int arrived = 0, left = 0;
  };
  const int pipeline_, tensor_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int, uint32_t>, std::deque<std::vector<float>>> mail_;
  std::map<std::pair<std::string, uint64_t>, Slot> slots_;
};

class HubLinks final : public StageLinks {
 public:
  HubLinks(Hub* hub, int p, int t) : hub_(hub), p_(p), t_(t) {}
  int pipeline_rank() const override { return p_; }
  int pipeline_ranks() const override { return hub_->pipeline(); }
  int tensor_rank() const override { return t_; }
  int tensor_ranks() const override { return hub_->tensor(); }
  Status Send(const float* data, size_t count, int peer, uint32_t tag,
              const std::string& what) override {
    return hub_->Send(t_, p_, peer, tag, data, count);
  }
  Status Recv(float* data, size_t count, int peer, uint32_t tag,
              const std::string& what) override {
    return hub_->Recv(t_, peer, p_, tag, data, count, what);
  }
  Status SumOverPipeline(float* data, size_t count, const std::string& what) override {
    return hub_->Sum("pp" + std::to_string(t_), pp_calls_++, p_, hub_->pipeline(), data, count);
  }
  Status SumOverTensor(float* data, size_t count, const std::string& what) override {
    return hub_->Sum("tp" + std::to_string(p_), tp_calls_++, t_, hub_->tensor(), data, count);
  }

 private:
  Hub* const hub_;
  const int p_, t_;
  uint64_t pp_calls_ = 0, tp_calls_ = 0;
};

data::Batch MakeBatch(int64_t rows, int64_t dim, int64_t classes) {
  data::Batch batch;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  batch.size = static_cast<size_t>(rows);
  batch.feature_dim = static_cast<size_t>(dim);
  for (int64_t i = 0; i < rows * dim; ++i) batch.features.push_back(normal(rng));
  for (int64_t i = 0; i < rows; ++i) batch.labels.push_back(static_cast<int64_t>(rng() % classes));
  return batch;
}

struct Case {
  ScheduleKind schedule;
  int pipeline, tensor, micro, virtual_stages;
  bool layer_norm;
  Activation activation;
};

MlpOptions Model(const Case& c) {
  MlpOptions options;
  options.input_dim = 12;
  options.hidden = {16, 16, 16, 16};
  options.classes = 4;
  options.layer_norm = c.layer_norm;
  options.activation = c.activation;
  return options;
}

class PipelineMlpTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineMlpTest, GradientsEqualOneProcess) {
  const Case& c = GetParam();
  const data::Batch batch = MakeBatch(16, 12, 4);
  CpuBackend backend;
  auto reference = Mlp::Create(Model(c), &backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const uint64_t total = (*reference)->layout().total_size();
  std::vector<float> params(total), grads(total);
  (*reference)->InitializeParameters(9, params.data());
  std::vector<SparseRows> sparse;
  auto want = (*reference)->ForwardBackward(params.data(), batch, &sparse, grads.data(), {});
  ASSERT_TRUE(want.ok()) << want.status();

  Hub hub(c.pipeline, c.tensor);
  std::vector<Status> results(static_cast<size_t>(c.pipeline * c.tensor), OkStatus());
  std::vector<std::vector<float>> full_grads(results.size());
  std::vector<double> losses(results.size());
  std::vector<std::thread> threads;
  for (int p = 0; p < c.pipeline; ++p) {
    for (int t = 0; t < c.tensor; ++t) {
      const size_t index = static_cast<size_t>(p * c.tensor + t);
      threads.emplace_back([&, p, t, index] {
        CpuBackend own;
        HubLinks links(&hub, p, t);
        PipelineMlpOptions options;
        options.mlp = Model(c);
        options.schedule = c.schedule;
        options.micro_batches = c.micro;
        options.virtual_stages = c.virtual_stages;
        auto model = PipelineMlp::Create(options, &links, &own);
        if (!model.ok()) {
          results[index] = model.status();
          return;
        }
        MetricsRegistry registry;
        auto metrics = PipelineMetrics::Register(&registry);
        if (!metrics.ok()) {
          results[index] = metrics.status();
          return;
        }
        (*model)->SetMetrics(metrics->get());
        const uint64_t size = (*model)->layout().total_size();
        std::vector<float> local(size), local_grads(size);
        (*model)->InitializeParameters(9, local.data());
        std::vector<SparseRows> none;
        auto stats = (*model)->ForwardBackward(local.data(), batch, &none, local_grads.data(), {});
        if (!stats.ok()) {
          results[index] = stats.status();
          return;
        }
        losses[index] = stats->loss;
        results[index] = (*model)->GatherFull(local_grads.data(), &full_grads[index]);
        if (results[index].ok() && (*model)->peak_held() !=
                                       (*model)->schedule().peak_held(p)) {
          results[index] = InternalError("peak held " + std::to_string((*model)->peak_held()) +
                                         ", the schedule's " +
                                         std::to_string((*model)->schedule().peak_held(p)));
        }
        // The step's metrics: one step, its held bound, one timeline entry per compute action.
        const std::string text = registry.RenderText();
        size_t computes = 0;
        for (const PipelineAction& action : (*model)->schedule().actions(p)) {
          computes += IsComputeAction(action.op) ? 1 : 0;
        }
        size_t timed = 0;
        for (size_t at = text.find("\ntessera_pipeline_action_end_seconds{");
             at != std::string::npos;
             at = text.find("\ntessera_pipeline_action_end_seconds{", at + 1)) {
          ++timed;
        }
        const std::string held =
            "\ntessera_pipeline_micro_batches_held " +
            std::to_string((*model)->schedule().peak_held(p)) + "\n";
        if (results[index].ok() &&
            (text.find("\ntessera_pipeline_steps_total 1\n") == std::string::npos ||
             text.find(held) == std::string::npos || timed != computes)) {
          results[index] = InternalError("pipeline metrics after one step (" +
                                         std::to_string(timed) + " of " +
                                         std::to_string(computes) + " actions timed):\n" + text);
        }
      });
    }
  }
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i];
    EXPECT_NEAR(losses[i], want->loss, 1e-5);
    for (const ParameterView& view : (*reference)->layout().views()) {
      double scale = 0, worst = 0;
      for (uint64_t e = view.offset; e < view.offset + view.size; ++e) {
        scale = std::max(scale, std::fabs(static_cast<double>(grads[e])));
        worst = std::max(worst, std::fabs(static_cast<double>(full_grads[i][e]) - grads[e]));
      }
      EXPECT_LE(worst, 1e-5 * scale + 1e-9) << "rank " << i << " " << view.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PipelineMlpTest,
    ::testing::Values(Case{ScheduleKind::kGPipe, 2, 1, 4, 1, false, Activation::kRelu},
                      Case{ScheduleKind::k1F1B, 3, 1, 4, 1, true, Activation::kGelu},
                      Case{ScheduleKind::kZeroBubbleH1, 2, 2, 4, 1, false, Activation::kRelu},
                      Case{ScheduleKind::kInterleaved1F1B, 2, 1, 4, 2, true, Activation::kRelu},
                      Case{ScheduleKind::kGPipe, 1, 4, 2, 1, false, Activation::kGelu},
                      Case{ScheduleKind::k1F1B, 2, 2, 2, 1, true, Activation::kRelu}));

TEST(PipelineMlpCreateTest, RefusesWhatCannotRun) {
  Hub hub(2, 1);
  HubLinks links(&hub, 0, 0);
  CpuBackend backend;
  PipelineMlpOptions options;
  options.mlp.input_dim = 12;
  options.mlp.hidden = {16};
  options.mlp.classes = 4;
  options.schedule = ScheduleKind::k1F1B;
  options.micro_batches = 1;
  auto fewer = PipelineMlp::Create(options, &links, &backend);
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("1 < 2"), std::string::npos) << fewer.status();
  options.micro_batches = 4;
  options.schedule = ScheduleKind::kInterleaved1F1B;
  options.virtual_stages = 2;  // 4 stages of 3 layers
  auto layers = PipelineMlp::Create(options, &links, &backend);
  ASSERT_FALSE(layers.ok());
  EXPECT_NE(layers.status().message().find("3 layers, fewer than the 4 stages"),
            std::string::npos)
      << layers.status();
}

}  // namespace
}  // namespace tessera::worker
