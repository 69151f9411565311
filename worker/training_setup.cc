#include "worker/training_setup.h"

#include <sstream>

#include "common/base/logging.h"
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
#include "worker/pipeline/stage_split.h"

namespace tessera::worker {
namespace {

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

namespace {

StatusOr<MlpOptions> MakeMlpOptions(const TrainingFlags& flags, const data::Dataset& train) {
  MlpOptions options;
  ASSIGN_OR_RETURN(options.activation, ParseActivation(flags.activation));
  if (!flags.hidden.empty()) {
    ASSIGN_OR_RETURN(options.hidden, ParseWidths(flags.hidden));
  }
  options.input_dim = static_cast<int64_t>(train.feature_dim());
  options.classes = static_cast<int64_t>(train.num_classes());
  options.layer_norm = flags.layer_norm;
  return options;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingFlags& flags, const data::Dataset& train,
                                           ComputeBackend* backend) {
  ASSIGN_OR_RETURN(Activation activation, ParseActivation(flags.activation));
  std::vector<int64_t> hidden;
  if (!flags.hidden.empty()) {
    ASSIGN_OR_RETURN(hidden, ParseWidths(flags.hidden));
  }
  if (flags.model == "mlp") {
    ASSIGN_OR_RETURN(MlpOptions options, MakeMlpOptions(flags, train));
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

StatusOr<ParallelShape> MakeParallelShape(const TrainingFlags& flags, const std::string& mode,
                                          int world) {
  ParallelShape shape;
  shape.pipeline = flags.pipeline_stages;
  shape.tensor = flags.tensor_parallel;
  if (shape.pipeline < 1 || shape.tensor < 1) {
    return InvalidArgumentError("--pipeline-stages " + std::to_string(shape.pipeline) +
                                " and --tensor-parallel " + std::to_string(shape.tensor) +
                                " must be at least 1");
  }
  const bool pipeline_flags = flags.micro_batches != 1 || flags.pipeline_virtual_stages != 1 ||
                              !flags.pipeline_split.empty() ||
                              flags.pipeline_schedule != "gpipe";
  if (!shape.used()) {
    if (pipeline_flags) {
      return InvalidArgumentError("--micro-batches, --pipeline-schedule, "
                                  "--pipeline-virtual-stages and --pipeline-split need "
                                  "--pipeline-stages (or --tensor-parallel) above 1");
    }
    shape.data = world;
    return shape;
  }
  const std::string given = "--pipeline-stages " + std::to_string(shape.pipeline) +
                            " --tensor-parallel " + std::to_string(shape.tensor);
  if (mode != "allreduce" && mode != "zero1") {
    return InvalidArgumentError(given + " run with --mode allreduce or zero1 across the "
                                "data-parallel groups, not --mode " + mode);
  }
  if (world % (shape.pipeline * shape.tensor) != 0) {
    return InvalidArgumentError(
        "the world of " + std::to_string(world) + " workers is not a multiple of " + given +
        " (" + std::to_string(shape.pipeline) + " x " + std::to_string(shape.tensor) + " = " +
        std::to_string(shape.pipeline * shape.tensor) + " workers per data-parallel replica)");
  }
  shape.data = world / (shape.pipeline * shape.tensor);
  if (flags.model != "mlp") {
    return InvalidArgumentError(given + " split the native mlp; --model " + flags.model +
                                " is not supported with them");
  }
  if (flags.micro_batches < 1 || flags.batch_size % flags.micro_batches != 0) {
    return InvalidArgumentError("--batch-size " + std::to_string(flags.batch_size) +
                                " (per data-parallel replica) is not divisible by "
                                "--micro-batches " + std::to_string(flags.micro_batches));
  }
  ASSIGN_OR_RETURN(ScheduleKind kind, ParseScheduleKind(flags.pipeline_schedule));
  if (flags.pipeline_virtual_stages != 1 && kind != ScheduleKind::kInterleaved1F1B) {
    return InvalidArgumentError("--pipeline-virtual-stages " +
                                std::to_string(flags.pipeline_virtual_stages) +
                                " is for --pipeline-schedule interleaved, not " +
                                flags.pipeline_schedule);
  }
  if (flags.grad_accumulation != 1) {
    return InvalidArgumentError(given + ": use --micro-batches instead of --grad-accumulation");
  }
  return shape;
}

StatusOr<std::unique_ptr<PipelineMlp>> MakePipelineModel(const TrainingFlags& flags,
                                                         const data::Dataset& train,
                                                         StageLinks* links,
                                                         ComputeBackend* backend) {
  PipelineMlpOptions options;
  ASSIGN_OR_RETURN(options.mlp, MakeMlpOptions(flags, train));
  ASSIGN_OR_RETURN(options.schedule, ParseScheduleKind(flags.pipeline_schedule));
  options.micro_batches = flags.micro_batches;
  options.virtual_stages = flags.pipeline_virtual_stages;
  ASSIGN_OR_RETURN(options.split, ParsePipelineSplit(flags.pipeline_split));
  return PipelineMlp::Create(options, links, backend);
}

}  // namespace tessera::worker
