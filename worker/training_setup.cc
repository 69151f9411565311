#include "worker/training_setup.h"

#include <sstream>

#include <CLI/CLI.hpp>

#include "common/base/logging.h"
#include "common/config/flag_checks.h"
#include "common/cuda/cuda_device.h"
#include "worker/data/binary_dataset.h"
#include "worker/data/mnist_reader.h"
#include "worker/data/offset_dataset.h"
#include "worker/data/synthetic_classification.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/nn/cpu/cpu_backend.h"
#include "worker/nn/ctr_model.h"
#include "worker/nn/cuda/cuda_backend.h"
#include "worker/nn/mlp.h"

namespace tessera::worker {
namespace {

CLI::Validator OneOf(std::vector<std::string> values) {
  std::string joined;
  for (const auto& v : values) joined += (joined.empty() ? "" : "|") + v;
  return CLI::Validator(
      [values, joined](std::string& value) -> std::string {
        for (const auto& v : values) {
          if (value == v) return "";
        }
        return "'" + value + "' is not one of " + joined;
      },
      joined, "one of");
}

StatusOr<std::vector<int64_t>> ParseWidths(const std::string& text) {
  std::vector<int64_t> widths;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      long long width = std::stoll(item, &used);
      if (used != item.size() || width <= 0) throw std::invalid_argument(item);
      widths.push_back(width);
    } catch (const std::exception&) {
      return InvalidArgumentError("--hidden=" + text + ": '" + item +
                                  "' is not a positive integer (widths are comma-separated, "
                                  "e.g. 1024,1024)");
    }
  }
  return widths;
}

}  // namespace

void AddTrainingFlags(CLI::App* app, TrainingFlags* f) {
  auto* model = app->add_option_group("Model");
  model->add_option("--model", f->model, "Model: mlp (classifier) or ctr (embeddings + MLP, "
                                         "for click-through data)")
      ->check(OneOf({"mlp", "ctr"}))
      ->capture_default_str();
  model->add_option("--hidden", f->hidden,
                    "Hidden widths, comma-separated (default: mlp 1024,1024; ctr 256,128)");
  model->add_option("--activation", f->activation, "relu or gelu")
      ->check(OneOf({"relu", "gelu"}))
      ->capture_default_str();
  model->add_flag("--layer-norm", f->layer_norm, "LayerNorm after every hidden Linear");
  model->add_option("--embedding-dim", f->embedding_dim, "ctr: floats per embedding row")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();

  auto* data = app->add_option_group("Data");
  data->add_option("--dataset", f->dataset,
                   "synthetic (teacher-labelled classification), synthetic-ctr (Zipf ids + "
                   "dense features), mnist (idx files in --data-path), file (TSRDATA1 file "
                   "--data-path, see docs/data-format.md)")
      ->check(OneOf({"synthetic", "synthetic-ctr", "mnist", "file"}))
      ->capture_default_str();
  data->add_option("--data-path", f->data_path,
                   "mnist: directory with train-/t10k- idx files; file: the training file");
  data->add_option("--eval-data-path", f->eval_data_path, "file: the evaluation file");
  data->add_option("--train-samples", f->train_samples, "Synthetic sets: samples")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  data->add_option("--input-dim", f->input_dim, "synthetic: features per sample")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  data->add_option("--classes", f->classes, "synthetic: classes")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();

  auto* train = app->add_option_group("Training");
  train->add_option("--batch-size", f->batch_size, "Samples per step, per worker")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  train->add_option("--grad-accumulation", f->grad_accumulation,
                    "Micro-batches of --batch-size per optimizer step (gradients averaged; in "
                    "allreduce mode only the last one communicates)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--steps", f->steps, "Optimizer steps (0: use --epochs)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--epochs", f->epochs, "Passes over this worker's share when --steps is 0")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--optimizer", f->optimizer, "sgd, momentum, adam, adamw or adagrad")
      ->check(OneOf({"sgd", "momentum", "adam", "adamw", "adagrad"}))
      ->capture_default_str();
  // Largest --lr, --weight-decay and --min-lr accepted: far past any that trains, and a typo
  // of a few digits too many is caught.
  constexpr double kMaxRate = 1e6;
  train->add_option_function<double>(
          "--lr", [f](const double& lr) { f->lr = lr; },
          "Learning rate (default: the optimizer's, as in PyTorch)")
      ->check(FiniteRange(0, kMaxRate));
  train->add_option("--optimizer-params", f->optimizer_params,
                    "Other optimizer fields, e.g. momentum=0.9,nesterov=true or "
                    "beta2=0.98,eps=1e-6");
  train->add_option_function<double>(
          "--weight-decay", [f](const double& decay) { f->weight_decay = decay; },
          "Weight decay (L2; decoupled for adamw); default: the optimizer's")
      ->check(FiniteRange(0, kMaxRate));
  train->add_option("--lr-schedule", f->lr_schedule, "constant, step or cosine")
      ->check(OneOf({"constant", "step", "cosine"}))
      ->capture_default_str();
  train->add_option("--warmup-steps", f->warmup_steps, "Linear warmup steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--lr-step-size", f->lr_step_size, "step schedule: steps between decays")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  train->add_option("--lr-gamma", f->lr_gamma, "step schedule: decay factor, in (0, 1]")
      ->check(FiniteRange(0, 1))
      ->capture_default_str();
  train->add_option("--min-lr", f->min_lr, "cosine schedule: final learning rate")
      ->check(FiniteRange(0, kMaxRate))
      ->capture_default_str();
  train->add_option("--seed", f->seed, "Seed of the parameters, the data order and synthetic data")
      ->check(UnsignedRange(0, UINT64_MAX))
      ->capture_default_str();
  train->add_option("--on-nonfinite", f->on_nonfinite,
                    "A NaN or Inf gradient or loss: error (stop, naming the step, rank and "
                    "tensor), skip (drop that step's update on every rank; in ps-async and "
                    "ps-ssp only this worker's) or off (no check)")
      ->check(OneOf({"error", "skip", "off"}))
      ->capture_default_str();
  // Tests only (so not in --help): makes the step's loss and gradients NaN on this rank.
  train->add_option("--inject-nonfinite-step", f->inject_nonfinite_step)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->group("");
  train->add_option("--device", f->device, "cpu, cuda or auto (cuda when a GPU is there)")
      ->check(OneOf({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  train->add_option("--log-every", f->log_every, "Progress line every N steps (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--eval-every", f->eval_every, "Evaluate every N steps (0: at the end only)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--eval-samples", f->eval_samples, "Samples of the evaluation set to use")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_flag("--json", f->json, "Print the final summary as one JSON object on stdout");
  train->add_option("--save-params", f->save_params,
                    "Write the final dense parameters to PATH (raw float32) and PATH.json "
                    "(manifest); see docs/params-format.md");
  train->add_option("--checkpoint-dir", f->checkpoint_dir,
                    "Where checkpoints go (step-N/ directories, MANIFEST.json, LATEST)");
  train->add_option("--checkpoint-every", f->checkpoint_every,
                    "Checkpoint after every N steps and after the last (needs --checkpoint-dir)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_flag("--checkpoint-on-sigterm", f->checkpoint_on_sigterm,
                  "On SIGTERM or SIGINT (preemption), checkpoint the step just finished into "
                  "--checkpoint-dir before exiting (ps-sync, allreduce, zero1-3: the step all "
                  "workers agree to stop after; waits are then not cut 1 s after the signal)");
  train->add_flag("--resume", f->resume,
                  "Continue after the newest checkpoint in --checkpoint-dir (from step 1 if "
                  "there is none yet)");
  train->add_option_function<int64_t>(
          "--resume-step", [f](const int64_t& step) { f->resume_step = step; },
          "Continue after the checkpoint of step N in --checkpoint-dir instead of the newest "
          "(e.g. when the newest does not verify: the error names the newest that does)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
}

StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(const std::string& device, int local_rank,
                                                      const CudaBackendOptions& cuda) {
  if (device == "cpu") return std::unique_ptr<ComputeBackend>(new CpuBackend());
  const int index = local_rank >= 0 ? local_rank : 0;
  if (device == "cuda") {
    auto backend = CreateCudaBackend(index, cuda);
    if (!backend.ok()) return backend.status().WithContext("--device cuda");
    return backend;
  }
  if (device != "auto") {
    return InvalidArgumentError("--device " + device + ": expected cpu, cuda or auto");
  }
  if (CudaDeviceCount() > 0) {
    auto backend = CreateCudaBackend(index % CudaDeviceCount(), cuda);
    if (backend.ok()) return backend;
    TLOG(WARNING) << "--device auto: a CUDA device is present but unusable (" << backend.status()
                  << "); training on the CPU";
  }
  return std::unique_ptr<ComputeBackend>(new CpuBackend());
}

StatusOr<Datasets> MakeDatasets(const TrainingFlags& flags) {
  Datasets sets;
  const bool ctr_model = flags.model == "ctr";
  if (flags.dataset == "synthetic" || flags.dataset == "synthetic-ctr") {
    if (!flags.data_path.empty()) {
      return InvalidArgumentError("--data-path is for --dataset mnist or file, not " +
                                  flags.dataset);
    }
  }
  if (flags.dataset == "synthetic") {
    if (ctr_model) {
      return InvalidArgumentError("--model ctr needs sparse fields: use --dataset synthetic-ctr "
                                  "(--dataset synthetic has dense features only)");
    }
    data::SyntheticClassificationOptions options;
    options.num_samples = static_cast<size_t>(flags.train_samples);
    options.feature_dim = static_cast<size_t>(flags.input_dim);
    options.num_classes = static_cast<size_t>(flags.classes);
    options.seed = flags.seed;
    ASSIGN_OR_RETURN(auto train, data::SyntheticClassification::Create(options));
    // The same teacher, other samples: the indices past the training set.
    options.num_samples = static_cast<size_t>(flags.train_samples + flags.eval_samples);
    ASSIGN_OR_RETURN(auto all, data::SyntheticClassification::Create(options));
    sets.train = std::move(train);
    sets.eval = std::make_unique<data::OffsetDataset>(std::move(all),
                                                      static_cast<size_t>(flags.train_samples));
    sets.description = "synthetic (" + std::to_string(flags.train_samples) + " x " +
                       std::to_string(flags.input_dim) + ", " + std::to_string(flags.classes) +
                       " classes, seed " + std::to_string(flags.seed) + ")";
    return sets;
  }
  if (flags.dataset == "synthetic-ctr") {
    data::SyntheticCtrOptions options;
    options.num_samples = static_cast<size_t>(flags.train_samples + flags.eval_samples);
    options.seed = flags.seed;
    ASSIGN_OR_RETURN(auto all, data::SyntheticCtr::Create(options));
    options.num_samples = static_cast<size_t>(flags.train_samples);
    ASSIGN_OR_RETURN(auto train, data::SyntheticCtr::Create(options));
    sets.description = "synthetic-ctr (" + std::to_string(flags.train_samples) + " samples, " +
                       std::to_string(options.dense_dim) + " dense, " +
                       std::to_string(options.field_sizes.size()) + " sparse fields, seed " +
                       std::to_string(flags.seed) + ")";
    sets.train = std::move(train);
    sets.eval = std::make_unique<data::OffsetDataset>(std::move(all),
                                                      static_cast<size_t>(flags.train_samples));
    return sets;
  }
  if (ctr_model) {
    return InvalidArgumentError("--model ctr needs sparse fields: use --dataset synthetic-ctr");
  }
  if (flags.data_path.empty()) {
    return InvalidArgumentError("--dataset " + flags.dataset + " needs --data-path");
  }
  if (flags.dataset == "mnist") {
    const std::string dir = flags.data_path + "/";
    ASSIGN_OR_RETURN(sets.train, data::ReadMnist(dir + "train-images-idx3-ubyte",
                                                 dir + "train-labels-idx1-ubyte"));
    ASSIGN_OR_RETURN(sets.eval, data::ReadMnist(dir + "t10k-images-idx3-ubyte",
                                                dir + "t10k-labels-idx1-ubyte"));
    sets.description = "mnist (" + flags.data_path + ")";
    return sets;
  }
  ASSIGN_OR_RETURN(sets.train, data::ReadBinaryDataset(flags.data_path));
  if (!flags.eval_data_path.empty()) {
    ASSIGN_OR_RETURN(sets.eval, data::ReadBinaryDataset(flags.eval_data_path));
  }
  sets.description = "file (" + flags.data_path + ")";
  return sets;
}

StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingFlags& flags, const data::Dataset& train,
                                           ComputeBackend* backend) {
  ASSIGN_OR_RETURN(Activation activation, ParseActivation(flags.activation));
  std::vector<int64_t> hidden;
  if (!flags.hidden.empty()) {
    ASSIGN_OR_RETURN(hidden, ParseWidths(flags.hidden));
  }
  if (flags.model == "mlp") {
    MlpOptions options;
    options.input_dim = static_cast<int64_t>(train.feature_dim());
    options.classes = static_cast<int64_t>(train.num_classes());
    if (!flags.hidden.empty()) options.hidden = hidden;
    options.activation = activation;
    options.layer_norm = flags.layer_norm;
    ASSIGN_OR_RETURN(auto model, Mlp::Create(options, backend));
    return std::unique_ptr<Model>(std::move(model));
  }
  if (flags.model == "ctr") {
    CtrModelOptions options;
    options.dense_dim = static_cast<int64_t>(train.feature_dim());
    options.field_sizes = train.sparse_field_sizes();
    options.embedding_dim = flags.embedding_dim;
    if (!flags.hidden.empty()) options.hidden = hidden;
    options.activation = activation;
    options.layer_norm = flags.layer_norm;
    options.seed = flags.seed;
    ASSIGN_OR_RETURN(auto model, CtrModel::Create(options, backend));
    return std::unique_ptr<Model>(std::move(model));
  }
  return InvalidArgumentError("--model " + flags.model + ": expected mlp or ctr");
}

StatusOr<OptimizerOptions> MakeOptimizerOptions(const TrainingFlags& flags) {
  std::string params = flags.optimizer_params;
  auto append = [&params](const std::string& field) {
    params += (params.empty() ? "" : ",") + field;
  };
  if (flags.lr) append("lr=" + std::to_string(*flags.lr));
  if (flags.weight_decay) append("weight_decay=" + std::to_string(*flags.weight_decay));
  auto options = ParseOptimizerOptions(flags.optimizer, params);
  if (!options.ok()) return options.status().WithContext("--optimizer " + flags.optimizer);
  // std::to_string rounds to 6 decimals: take the exact values from the flags.
  if (flags.lr) options->lr = static_cast<float>(*flags.lr);
  if (flags.weight_decay) options->weight_decay = static_cast<float>(*flags.weight_decay);
  RETURN_IF_ERROR(ValidateOptimizerOptions(*options).WithContext("--optimizer"));
  return options;
}

StatusOr<LrScheduleOptions> MakeLrSchedule(const TrainingFlags& flags, int64_t total_steps) {
  LrScheduleOptions schedule;
  ASSIGN_OR_RETURN(schedule.kind, ParseLrScheduleKind(flags.lr_schedule));
  schedule.warmup_steps = flags.warmup_steps;
  schedule.step_size = flags.lr_step_size;
  schedule.gamma = static_cast<float>(flags.lr_gamma);
  schedule.total_steps = total_steps;
  schedule.min_lr = static_cast<float>(flags.min_lr);
  return schedule;
}

TrainerOptions MakeTrainerOptions(const TrainingFlags& flags, int rank, int world_size) {
  TrainerOptions options;
  options.batch_size = flags.batch_size;
  options.accumulation_steps = flags.grad_accumulation;
  options.steps = flags.steps;
  options.epochs = flags.epochs;
  options.seed = flags.seed;
  options.rank = rank;
  options.world_size = world_size;
  options.log_every = flags.log_every;
  options.eval_every = flags.eval_every;
  options.eval_samples = flags.eval_samples;
  options.checkpoint_dir = flags.checkpoint_dir;
  options.checkpoint_every = flags.checkpoint_every;
  options.resume = flags.resume;
  options.resume_step = flags.resume_step;
  options.checkpoint_on_stop = flags.checkpoint_on_sigterm;
  // --on-nonfinite's check (OneOf) admits only the three names.
  options.on_nonfinite = ParseNonFinitePolicy(flags.on_nonfinite).value();
  options.inject_nonfinite_step = flags.inject_nonfinite_step;
  return options;
}

}  // namespace tessera::worker
