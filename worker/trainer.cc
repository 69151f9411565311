#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <iomanip>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>

#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "common/training/checkpoint.h"
#include "common/training/nonfinite.h"
#include "worker/data/distributed_sampler.h"
#include "worker/nn/device_buffer.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

// The model's view of the parameters and gradients: the host vectors themselves on the CPU,
// device copies on a GPU.
class ModelBuffers {
 public:
  ModelBuffers(ComputeBackend* backend, std::vector<float>* params, std::vector<float>* grads)
      : backend_(backend), host_params_(params), host_grads_(grads), params_(backend),
        grads_(backend) {}

  Status Allocate() {
    if (backend_->host_memory()) return OkStatus();
    RETURN_IF_ERROR(params_.Resize(host_params_->size()));
    return grads_.Resize(host_grads_->size());
  }
  bool mirrored() const { return !backend_->host_memory(); }
  const float* params() const { return mirrored() ? params_.data() : host_params_->data(); }
  float* grads() { return mirrored() ? grads_.data() : host_grads_->data(); }
  void UploadParams() {
    if (mirrored()) {
      backend_->CopyToDevice(params_.data(), host_params_->data(), bytes(*host_params_));
    }
  }
  void DownloadGrads() {
    if (mirrored()) backend_->CopyToHost(host_grads_->data(), grads_.data(), bytes(*host_grads_));
  }

 private:
  static size_t bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

  ComputeBackend* const backend_;
  std::vector<float>* const host_params_;
  std::vector<float>* const host_grads_;
  DeviceBuffer<float> params_, grads_;
};

// Groups the batch's sparse ids per table and fetches the rows from the engine.
Status FetchRows(const data::Batch& batch, const Model& model, TrainingEngine* engine,
                 std::vector<SparseRows>* sparse) {
  const auto& tables = model.embedding_tables();
  if (tables.empty() && batch.sparse_fields == 0) {
    sparse->clear();
    return OkStatus();
  }
  RETURN_IF_ERROR(GroupSparseIds(batch, tables, sparse));
  for (size_t t = 0; t < tables.size(); ++t) {
    RETURN_IF_ERROR(engine->LookupRows(t, (*sparse)[t].ids, (*sparse)[t].values.data())
                        .WithContext("rows of table '" + tables[t].name + "'"));
  }
  return OkStatus();
}

StatusOr<StepStats> EvaluateOn(const data::Dataset& eval, int64_t samples, int64_t batch_size,
                               Model* model, TrainingEngine* engine, ParameterStorage* storage) {
  StepStats total;
  const size_t count = std::min<size_t>(eval.size(), static_cast<size_t>(samples));
  data::Batch batch;
  std::vector<SparseRows> sparse;
  std::vector<size_t> indices;
  for (size_t begin = 0; begin < count; begin += static_cast<size_t>(batch_size)) {
    indices.clear();
    for (size_t i = begin; i < std::min(count, begin + static_cast<size_t>(batch_size)); ++i) {
      indices.push_back(i);
    }
    RETURN_IF_ERROR(data::MakeBatch(eval, indices, &batch).WithContext("evaluation"));
    RETURN_IF_ERROR(FetchRows(batch, *model, engine, &sparse).WithContext("evaluation"));
    ASSIGN_OR_RETURN(StepStats stats, model->Evaluate(storage, batch, &sparse));
    total.loss += stats.loss * static_cast<double>(stats.samples);
    total.correct += stats.correct;
    total.samples += stats.samples;
  }
  if (total.samples > 0) total.loss /= static_cast<double>(total.samples);
  return total;
}

// The training metrics, or nothing when the trainer has no registry.
struct TrainingMetrics {
  Gauge* step = nullptr;
  Gauge* loss = nullptr;
  Counter* samples = nullptr;
  Histogram* data = nullptr;
  Histogram* compute = nullptr;
  Histogram* engine = nullptr;
  Gauge* eval_accuracy = nullptr;
  Counter* nonfinite_steps = nullptr;

  static StatusOr<TrainingMetrics> Register(MetricsRegistry* registry) {
    TrainingMetrics m;
    if (registry == nullptr) return m;
    namespace names = metric_names;
    auto gauge = [&](const names::MetricName& name) -> StatusOr<Gauge*> {
      ASSIGN_OR_RETURN(GaugeFamily * family, registry->RegisterGauge(name.name, name.help));
      return family->WithLabels({});
    };
    ASSIGN_OR_RETURN(m.step, gauge(names::kTrainStep));
    ASSIGN_OR_RETURN(m.loss, gauge(names::kTrainLoss));
    ASSIGN_OR_RETURN(m.eval_accuracy, gauge(names::kTrainEvalAccuracy));
    ASSIGN_OR_RETURN(CounterFamily * samples,
                     registry->RegisterCounter(names::kTrainSamplesTotal.name,
                                               names::kTrainSamplesTotal.help));
    ASSIGN_OR_RETURN(m.samples, samples->WithLabels({}));
    ASSIGN_OR_RETURN(CounterFamily * nonfinite,
                     registry->RegisterCounter(names::kTrainNonFiniteStepsTotal.name,
                                               names::kTrainNonFiniteStepsTotal.help));
    ASSIGN_OR_RETURN(m.nonfinite_steps, nonfinite->WithLabels({}));
    ASSIGN_OR_RETURN(HistogramFamily * phases,
                     registry->RegisterHistogram(names::kTrainStepPhaseSeconds.name,
                                                 names::kTrainStepPhaseSeconds.help, {"phase"},
                                                 DefaultLatencyBuckets()));
    ASSIGN_OR_RETURN(m.data, phases->WithLabels({"data"}));
    ASSIGN_OR_RETURN(m.compute, phases->WithLabels({"compute"}));
    ASSIGN_OR_RETURN(m.engine, phases->WithLabels({"engine"}));
    return m;
  }
};

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double Accuracy(const StepStats& stats) {
  return static_cast<double>(stats.correct) / static_cast<double>(std::max<int64_t>(1, stats.samples));
}

}  // namespace

int64_t TotalSteps(const TrainerOptions& options, size_t train_size) {
  if (options.steps > 0 || options.epochs <= 0 || options.batch_size < 1) return options.steps;
  const int64_t world = std::max(1, options.world_size);
  const int64_t per_rank = (static_cast<int64_t>(train_size) + world - 1) / world;
  const int64_t per_step = options.batch_size * std::max<int64_t>(1, options.accumulation_steps);
  return options.epochs * ((per_rank + per_step - 1) / per_step);
}

StatusOr<NonFinitePolicy> ParseNonFinitePolicy(const std::string& text) {
  if (text == "error") return NonFinitePolicy::kError;
  if (text == "skip") return NonFinitePolicy::kSkip;
  if (text == "off") return NonFinitePolicy::kOff;
  return InvalidArgumentError("--on-nonfinite " + text + ": expected error, skip or off");
}

StatusOr<TrainingSummary> Train(const TrainerOptions& options, const data::Dataset& train,
                                const data::Dataset* eval, Model* model, ComputeBackend* backend,
                                TrainingEngine* engine, std::vector<float>* params) {
  if (options.batch_size < 1) {
    return InvalidArgumentError("--batch-size=" + std::to_string(options.batch_size) +
                                " must be at least 1");
  }
  if (options.accumulation_steps < 1) {
    return InvalidArgumentError("--grad-accumulation=" + std::to_string(options.accumulation_steps) +
                                " must be at least 1");
  }
  if (options.accumulation_steps > 1 && !model->embedding_tables().empty()) {
    return InvalidArgumentError("--grad-accumulation does not support models with embedding "
                                "tables yet (each micro-batch touches other rows)");
  }
  if (options.steps < 0 || options.epochs < 0) {
    return InvalidArgumentError("--steps=" + std::to_string(options.steps) + " and --epochs=" +
                                std::to_string(options.epochs) + " must not be negative");
  }
  if (train.feature_dim() != static_cast<size_t>(model->input_dim())) {
    return InvalidArgumentError("the dataset has " + std::to_string(train.feature_dim()) +
                                " dense features but the " + std::string(model->name()) +
                                " model takes " + std::to_string(model->input_dim()));
  }
  if (train.sparse_field_sizes().size() != model->embedding_tables().size()) {
    return InvalidArgumentError("the dataset has " +
                                std::to_string(train.sparse_field_sizes().size()) +
                                " sparse fields but the " + std::string(model->name()) +
                                " model has " + std::to_string(model->embedding_tables().size()) +
                                " embedding tables");
  }
  if (train.num_classes() > static_cast<size_t>(model->num_classes())) {
    return InvalidArgumentError("the dataset has " + std::to_string(train.num_classes()) +
                                " classes but the model predicts " +
                                std::to_string(model->num_classes()));
  }
  ASSIGN_OR_RETURN(data::DistributedSampler sampler,
                   data::DistributedSampler::Create({static_cast<int64_t>(train.size()),
                                                     options.world_size, options.rank,
                                                     /*shuffle=*/true, options.seed,
                                                     /*drop_last=*/false}));
  if (sampler.per_rank_count() == 0) {
    return InvalidArgumentError("the training set is empty");
  }
  const int64_t steps = TotalSteps(options, train.size());
  const ParameterLayout& layout = model->layout();
  params->assign(layout.total_size(), 0.0f);
  model->InitializeParameters(options.seed, params->data());
  RETURN_IF_ERROR(engine->Initialize(layout, model->embedding_tables(), params->data())
                      .WithContext(std::string(engine->name()) + " engine initialisation"));
  const bool resume = options.resume || options.resume_step.has_value();
  if ((resume || options.checkpoint_every > 0) && options.checkpoint_dir.empty()) {
    return InvalidArgumentError(
        "--resume, --resume-step and --checkpoint-every need --checkpoint-dir");
  }
  int64_t first_step = 1;
  if (resume) {
    const std::string& dir = options.checkpoint_dir;
    StatusOr<int64_t> from = options.resume_step.has_value()
                                 ? StatusOr<int64_t>(*options.resume_step)
                                 : LatestCheckpointStep(dir);
    if (options.resume_step.has_value()) {
      const std::vector<int64_t> steps = CheckpointSteps(dir);
      if (std::find(steps.begin(), steps.end(), *from) == steps.end()) {
        std::string have;
        for (int64_t step : steps) have += (have.empty() ? "" : ", ") + std::to_string(step);
        return NotFoundError("--resume-step " + std::to_string(*from) + ": no checkpoint of step " +
                             std::to_string(*from) + " in " + dir + " (" +
                             (have.empty() ? "it has none" : "it has steps " + have) + ")");
      }
    }
    if (from.ok()) {
      Status restored = engine->RestoreCheckpoint(dir, *from, params->data());
      if (restored.code() == StatusCode::kDataLoss) {
        return Status(restored.code(), restored.message() + ResumeAdvice(dir, *from));
      }
      RETURN_IF_ERROR(restored);
      first_step = *from + 1;
      TLOG(INFO) << "resumed from the checkpoint of step " << *from << " in " << dir;
    } else if (from.status().code() == StatusCode::kNotFound) {
      TLOG(INFO) << from.status().message() << "; starting from step 1";
    } else if (from.status().code() == StatusCode::kDataLoss) {  // LATEST is unreadable
      return Status(from.status().code(), from.status().message() +
                                              ResumeAdvice(dir, std::nullopt));
    } else {
      return from.status();
    }
  }
  const int64_t micro = options.accumulation_steps;
  // An engine that holds the parameters (ZeRO stage 2 and 3) runs the model on its storage;
  // the full buffers go.
  ParameterStorage* const engine_storage = engine->parameter_storage();
  if (engine_storage != nullptr) {
    if (!backend->host_memory()) {
      return UnimplementedError(std::string(engine->name()) + " mode runs on the CPU only so far "
                                "(--device cpu)");
    }
    params->clear();
    params->shrink_to_fit();
  }
  // Shared, never resized: an engine that sends gradients may send them from here without a
  // copy, keeping the buffer alive while its transport holds them (SetGradientOwner).
  auto grads_owner =
      std::make_shared<std::vector<float>>(engine_storage != nullptr ? 0 : layout.total_size());
  std::vector<float>& host_grads = *grads_owner;
  if (engine_storage == nullptr) engine->SetGradientOwner(grads_owner);
  ModelBuffers buffers(backend, params, &host_grads);
  RETURN_IF_ERROR(buffers.Allocate());
  buffers.UploadParams();
  // Gradients are ready in host memory only after the copy on a GPU: report them then.
  GradientsReady on_ready;
  if (!buffers.mirrored() && micro == 1) {
    on_ready = [engine](uint64_t offset, uint64_t size) { engine->OnGradientsReady(offset, size); };
  }
  // An engine may finish the parameters after Step returns (zero1's all-gathers overlap the
  // forward): each layer waits for its own. A GPU copy waits for all of them after Step.
  ParametersNeeded on_needed;
  if (!buffers.mirrored()) {
    on_needed = [engine](uint64_t offset, uint64_t size) {
      return engine->AwaitParameters(offset, size);
    };
  }
  FlatParameterStorage flat_storage(buffers.params(), buffers.grads(), on_ready, on_needed);
  FlatParameterStorage flat_eval_storage(buffers.params(), nullptr, {}, on_needed);
  ParameterStorage* const storage = engine_storage != nullptr ? engine_storage : &flat_storage;
  ParameterStorage* const eval_storage =
      engine_storage != nullptr ? engine_storage : &flat_eval_storage;

  ASSIGN_OR_RETURN(TrainingMetrics metrics, TrainingMetrics::Register(options.metrics));
  TrainingSummary summary;
  int64_t skipped_step = 0;  // the last step the gradient check skipped
  if (options.on_nonfinite != NonFinitePolicy::kOff) {
    // All-reduce and ZeRO engines check what the reduction gave them, not this rank's own.
    const bool reduced = options.gradients_reduced_across_ranks;
    const bool skip = options.on_nonfinite == NonFinitePolicy::kSkip;
    auto tensor_at = [&layout](uint64_t element) -> const ParameterView* {
      for (const ParameterView& view : layout.views()) {
        if (element >= view.offset && element < view.offset + view.size) return &view;
      }
      return nullptr;
    };
    GradientCheck check;
    check.may_skip = skip;
    check.scan = [&options, &metrics, &skipped_step, &summary, reduced, skip, tensor_at](
                     int64_t step, const float* grads, uint64_t offset,
                     uint64_t size) -> StatusOr<bool> {
      const auto scan_started = Clock::now();
      std::optional<size_t> at = FirstNonFinite(grads, size);
      summary.nonfinite_check_seconds += Seconds(scan_started, Clock::now());
      if (!at) return true;
      const uint64_t element = offset + *at;
      std::string where = "element " + std::to_string(element);
      if (const ParameterView* view = tensor_at(element)) {
        where = "'" + view->name + "' (element " + std::to_string(element - view->offset) +
                " of " + std::to_string(view->size) + ")";
      }
      const std::string what = "rank " + std::to_string(options.rank) + ": the " +
                               std::string(reduced ? "reduced gradient" : "gradient") + " of " +
                               where + " is " + NonFiniteName(grads[*at]) +
                               (reduced ? " (a NaN or Inf of any rank reaches every rank)" : "");
      if (skip) {
        TLOG(WARNING) << "step " << step << " skipped: " << what << " (--on-nonfinite skip)";
        if (metrics.nonfinite_steps != nullptr) metrics.nonfinite_steps->Increment();
        skipped_step = step;
        return false;
      }
      return InvalidArgumentError(what + "; stopping (--on-nonfinite skip drops such steps "
                                  "instead)");
    };
    check.skipped_by_peer = [&metrics, &skipped_step, tensor_at](
                                int64_t step, int rank, std::optional<uint64_t> offset) {
      std::string what = "rank " + std::to_string(rank) + " found a NaN or Inf in its gradients";
      if (const ParameterView* view = offset ? tensor_at(*offset) : nullptr) {
        what += " of '" + view->name + "'";
      }
      TLOG(WARNING) << "step " << step << " skipped: " << what << " (--on-nonfinite skip)";
      if (metrics.nonfinite_steps != nullptr) metrics.nonfinite_steps->Increment();
      skipped_step = step;
    };
    engine->SetGradientCheck(std::move(check));
  }
  uint64_t epoch = 0;
  std::vector<size_t> order = sampler.Indices(epoch);
  size_t cursor = 0;
  data::Batch batch;
  std::vector<SparseRows> sparse;
  std::vector<size_t> indices;
  // Micro-batches' gradients summed here, unless the engine takes each micro-batch's gradients
  // itself (its storage: ZeRO 2-3 reduce-scatter each and add them into their shard).
  const bool accumulate_here = micro > 1 && engine_storage == nullptr;
  std::vector<float> accumulated(accumulate_here ? layout.total_size() : 0);
  // The samples the steps before first_step consumed (resuming): same order, not loaded.
  for (int64_t skipped = 1; skipped < first_step; ++skipped) {
    for (int64_t i = 0; i < options.batch_size * micro; ++i) {
      if (cursor == order.size()) {
        order = sampler.Indices(++epoch);
        cursor = 0;
      }
      ++cursor;
    }
  }
  summary.first_step = first_step;
  summary.steps = first_step - 1;
  auto started = Clock::now();
  auto window_started = started;
  int64_t window_samples = 0;
  for (int64_t step = first_step; step <= steps; ++step) {
    const std::string where = std::string(engine->name()) + " step " + std::to_string(step);
    // `micro` micro-batches of batch_size samples; only the last one's backward may start
    // communication (like DDP's no_sync), and only when there is just one. An engine with its
    // own storage sees every micro-batch's backward (announced once, before the first).
    StepStats stats;
    double data_seconds = 0, compute_seconds = 0;  // this step's, over its micro-batches
    Clock::time_point compute_mark;
    for (int64_t m = 0; m < micro; ++m) {
      indices.clear();
      while (indices.size() < static_cast<size_t>(options.batch_size)) {
        if (cursor == order.size()) {  // next epoch, reshuffled
          order = sampler.Indices(++epoch);
          cursor = 0;
        }
        indices.push_back(order[cursor++]);
      }
      const auto data_started = Clock::now();
      RETURN_IF_ERROR(data::MakeBatch(train, indices, &batch).WithContext(where));
      if (step == options.inject_nonfinite_step && m == 0 && !batch.features.empty()) {
        batch.features[0] = std::numeric_limits<float>::quiet_NaN();
      }
      RETURN_IF_ERROR(FetchRows(batch, *model, engine, &sparse).WithContext(where));
      const auto compute_started = Clock::now();
      data_seconds += Seconds(data_started, compute_started);
      if (m == 0 && !accumulate_here) engine->OnBackwardStart(step, host_grads.data());
      compute_mark = compute_started;
      ASSIGN_OR_RETURN(StepStats micro_stats,
                       model->ForwardBackward(storage, batch, &sparse));
      if (buffers.mirrored()) buffers.DownloadGrads();
      if (accumulate_here) {
        for (size_t i = 0; i < accumulated.size(); ++i) {
          accumulated[i] = m == 0 ? host_grads[i] : accumulated[i] + host_grads[i];
        }
      }
      if (m + 1 < micro) compute_seconds += Seconds(compute_mark, Clock::now());
      stats.loss += micro_stats.loss / static_cast<double>(micro);
      stats.correct += micro_stats.correct;
      stats.samples += micro_stats.samples;
    }
    if (accumulate_here) {
      const float scale = 1.0f / static_cast<float>(micro);
      for (size_t i = 0; i < accumulated.size(); ++i) host_grads[i] = accumulated[i] * scale;
      engine->OnBackwardStart(step, host_grads.data());
      engine->OnGradientsReady(0, layout.total_size());
    } else if (buffers.mirrored()) {
      engine->OnGradientsReady(0, layout.total_size());
    }
    const auto engine_started = Clock::now();
    compute_seconds += Seconds(compute_mark, engine_started);
    RETURN_IF_ERROR(engine->Step(step, params->data(), host_grads.data(), sparse).WithContext(where));
    if (options.on_nonfinite == NonFinitePolicy::kError && !std::isfinite(stats.loss)) {
      return InvalidArgumentError(where + ": rank " + std::to_string(options.rank) +
                                  ": the loss is " + NonFiniteName(static_cast<float>(stats.loss)));
    }
    if (skipped_step == step) ++summary.skipped_steps;
    if (metrics.step != nullptr) {
      metrics.data->Observe(data_seconds);
      metrics.compute->Observe(compute_seconds);
      metrics.engine->Observe(Seconds(engine_started, Clock::now()));
      metrics.step->Set(static_cast<double>(step));
      metrics.loss->Set(stats.loss);
      metrics.samples->Increment(static_cast<double>(stats.samples));
    }
    if (buffers.mirrored()) {
      RETURN_IF_ERROR(engine->AwaitParameters(0, layout.total_size()).WithContext(where));
    }
    buffers.UploadParams();
    if (options.after_step) options.after_step(step);
    bool stop = false, asked = false;
    if (options.should_stop) {
      asked = options.should_stop();
      ASSIGN_OR_RETURN(stop, engine->AgreeToStop(step, asked));
      if (stop && options.on_stop_agreed) options.on_stop_agreed();
    }
    const bool scheduled =
        options.checkpoint_every > 0 && (step % options.checkpoint_every == 0 || step == steps);
    if (scheduled || (stop && options.checkpoint_on_stop && !options.checkpoint_dir.empty())) {
      RETURN_IF_ERROR(engine->SaveCheckpoint(options.checkpoint_dir, step, params->data())
                          .WithContext(where + " checkpoint"));
    }
    if (stop) {
      return CancelledError("stopped after step " + std::to_string(step) +
                            (options.checkpoint_on_stop && !options.checkpoint_dir.empty()
                                 ? " (checkpointed in " + options.checkpoint_dir + ")"
                                 : "") +
                            (asked ? "" : ", with the other ranks: one of them was asked to stop"));
    }
    summary.steps = step;
    summary.samples += stats.samples;
    summary.final_loss = stats.loss;
    window_samples += stats.samples;
    if (options.log_every > 0 && (step % options.log_every == 0 || step == steps)) {
      double seconds = std::chrono::duration<double>(Clock::now() - window_started).count();
      std::ostringstream line;
      line << std::fixed << std::setprecision(4) << "step " << step << "/" << steps << " loss "
           << stats.loss << " accuracy " << Accuracy(stats) << std::setprecision(0)
           << " samples/s " << (seconds > 0 ? static_cast<double>(window_samples) / seconds : 0.0);
      TLOG(INFO) << line.str();
      window_started = Clock::now();
      window_samples = 0;
    }
    if (eval != nullptr && options.eval_every > 0 && step % options.eval_every == 0 &&
        step != steps) {
      ASSIGN_OR_RETURN(StepStats e, EvaluateOn(*eval, options.eval_samples, options.batch_size,
                                               model, engine, eval_storage));
      TLOG(INFO) << "eval at step " << step << ": loss " << e.loss << " accuracy " << Accuracy(e);
      if (metrics.eval_accuracy != nullptr) metrics.eval_accuracy->Set(Accuracy(e));
    }
  }
  if (engine_storage != nullptr) {  // the full parameters, for the caller (--save-params)
    params->assign(layout.total_size(), 0.0f);
    RETURN_IF_ERROR(engine->GatherParameters(params->data())
                        .WithContext("gathering the parameters after training"));
  } else {
    RETURN_IF_ERROR(engine->AwaitParameters(0, layout.total_size())
                        .WithContext("the parameters after training"));
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  summary.samples_per_second =
      summary.seconds > 0 ? static_cast<double>(summary.samples) / summary.seconds : 0;
  if (eval != nullptr) {
    ASSIGN_OR_RETURN(StepStats e, EvaluateOn(*eval, options.eval_samples, options.batch_size,
                                             model, engine, eval_storage));
    summary.eval_loss = e.loss;
    summary.eval_accuracy = Accuracy(e);
    if (metrics.eval_accuracy != nullptr) metrics.eval_accuracy->Set(summary.eval_accuracy);
  }
  return summary;
}

}  // namespace tessera::worker
