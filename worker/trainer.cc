#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>

#include "common/logging.h"
#include "worker/data/distributed_sampler.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

StatusOr<StepStats> EvaluateOn(const data::Dataset& eval, int64_t samples, int64_t batch_size,
                               Mlp* model, const float* params) {
  StepStats total;
  const size_t count = std::min<size_t>(eval.size(), static_cast<size_t>(samples));
  for (size_t begin = 0; begin < count; begin += static_cast<size_t>(batch_size)) {
    std::vector<size_t> indices;
    for (size_t i = begin; i < std::min(count, begin + static_cast<size_t>(batch_size)); ++i) {
      indices.push_back(i);
    }
    data::Batch batch;
    RETURN_IF_ERROR(data::MakeBatch(eval, indices, &batch));
    ASSIGN_OR_RETURN(StepStats stats,
                     model->Evaluate(params, batch.features.data(), batch.labels.data(),
                                     static_cast<int64_t>(batch.size)));
    total.loss += stats.loss * static_cast<double>(stats.samples);
    total.correct += stats.correct;
    total.samples += stats.samples;
  }
  if (total.samples > 0) total.loss /= static_cast<double>(total.samples);
  return total;
}

}  // namespace

StatusOr<TrainingSummary> Train(const TrainerOptions& options, const data::Dataset& train,
                                const data::Dataset* eval, Mlp* model, TrainingEngine* engine,
                                std::vector<float>* params) {
  if (options.batch_size < 1) {
    return InvalidArgumentError("--batch-size=" + std::to_string(options.batch_size) +
                                " must be at least 1");
  }
  if (options.steps < 0) {
    return InvalidArgumentError("--steps=" + std::to_string(options.steps) + " is negative");
  }
  if (train.feature_dim() != static_cast<size_t>(model->layout().views()[0].shape[1])) {
    return InvalidArgumentError(
        "the dataset has " + std::to_string(train.feature_dim()) + " features but the model's "
        "input layer takes " + std::to_string(model->layout().views()[0].shape[1]));
  }
  ASSIGN_OR_RETURN(data::DistributedSampler sampler,
                   data::DistributedSampler::Create({static_cast<int64_t>(train.size()),
                                                     options.world_size, options.rank,
                                                     /*shuffle=*/true, options.seed,
                                                     /*drop_last=*/false}));
  if (sampler.per_rank_count() == 0) {
    return InvalidArgumentError("the training set is empty");
  }
  const ParameterLayout& layout = model->layout();
  params->assign(layout.total_size(), 0.0f);
  model->InitializeParameters(options.seed, params->data());
  RETURN_IF_ERROR(engine->Initialize(layout, params->data()));
  std::vector<float> grads(layout.total_size());

  TrainingSummary summary;
  uint64_t epoch = 0;
  std::vector<size_t> order = sampler.Indices(epoch);
  size_t cursor = 0;
  data::Batch batch;
  std::vector<size_t> indices;
  auto started = Clock::now();
  auto window_started = started;
  int64_t window_samples = 0;
  for (int64_t step = 1; step <= options.steps; ++step) {
    indices.clear();
    while (indices.size() < static_cast<size_t>(options.batch_size)) {
      if (cursor == order.size()) {  // next epoch, reshuffled
        order = sampler.Indices(++epoch);
        cursor = 0;
      }
      indices.push_back(order[cursor++]);
    }
    RETURN_IF_ERROR(data::MakeBatch(train, indices, &batch));
    ASSIGN_OR_RETURN(
        StepStats stats,
        model->ForwardBackward(params->data(), batch.features.data(), batch.labels.data(),
                               static_cast<int64_t>(batch.size), grads.data(),
                               [engine](uint64_t offset, uint64_t size) {
                                 engine->OnGradientsReady(offset, size);
                               }));
    RETURN_IF_ERROR(engine->Step(step, params->data(), grads.data())
                        .WithContext(std::string(engine->name()) + " step " + std::to_string(step)));
    summary.steps = step;
    summary.samples += stats.samples;
    summary.final_loss = stats.loss;
    window_samples += stats.samples;
    if (options.log_every > 0 && (step % options.log_every == 0 || step == options.steps)) {
      double seconds = std::chrono::duration<double>(Clock::now() - window_started).count();
      std::ostringstream line;
      line << std::fixed << std::setprecision(4) << "step " << step << "/" << options.steps
           << " loss " << stats.loss << " accuracy "
           << static_cast<double>(stats.correct) / static_cast<double>(stats.samples)
           << std::setprecision(0) << " samples/s "
           << (seconds > 0 ? static_cast<double>(window_samples) / seconds : 0.0);
      TLOG(INFO) << line.str();
      window_started = Clock::now();
      window_samples = 0;
    }
    if (eval != nullptr && options.eval_every > 0 && step % options.eval_every == 0 &&
        step != options.steps) {
      ASSIGN_OR_RETURN(StepStats e, EvaluateOn(*eval, options.eval_samples, options.batch_size,
                                               model, params->data()));
      TLOG(INFO) << "eval at step " << step << ": loss " << e.loss << " accuracy "
                 << static_cast<double>(e.correct) / static_cast<double>(std::max<int64_t>(1, e.samples));
    }
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  summary.samples_per_second =
      summary.seconds > 0 ? static_cast<double>(summary.samples) / summary.seconds : 0;
  if (eval != nullptr) {
    ASSIGN_OR_RETURN(StepStats e, EvaluateOn(*eval, options.eval_samples, options.batch_size,
                                             model, params->data()));
    summary.eval_loss = e.loss;
    summary.eval_accuracy =
        static_cast<double>(e.correct) / static_cast<double>(std::max<int64_t>(1, e.samples));
  }
  return summary;
}

}  // namespace tessera::worker
