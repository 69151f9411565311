// The training flags every mode shares (--model, --dataset, --batch-size, --steps,
// --optimizer, --lr, --seed, --device, ...) and what they build: the compute backend, the
// datasets, the model and the optimizer / schedule options. tessera-worker registers them for
// every mode; tessera-launch passes everything after `--` through to the workers.
//
// Thread-safety: plain functions over their arguments.
#ifndef TESSERA_WORKER_TRAINING_SETUP_H_
#define TESSERA_WORKER_TRAINING_SETUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "worker/data/dataset.h"
#include "worker/nn/compute_backend.h"
#include "worker/nn/cuda/cuda_backend.h"
#include "worker/nn/model.h"
#include "worker/pipeline/pipeline_mlp.h"
#include "worker/pipeline/stage_links.h"
#include "worker/trainer.h"

namespace tessera::worker {

struct TrainingFlags {
  std::string model = "mlp";  // mlp | ctr
  std::string hidden;         // comma-separated widths; empty: the model's default
  std::string activation = "relu";
  bool layer_norm = false;
  int64_t embedding_dim = 16;
  std::string dataset = "synthetic";  // synthetic | synthetic-ctr | mnist | file
  std::string data_path;              // mnist: directory of the idx files; file: a TSRDATA1 file
  std::string eval_data_path;         // file: the evaluation set (default: none)
  int64_t train_samples = 60000;      // synthetic sets
  int64_t input_dim = 784;            // synthetic: features per sample
  int64_t classes = 10;               // synthetic: classes
  int64_t batch_size = 64;
  int64_t grad_accumulation = 1;
  int64_t steps = 100;
  int64_t epochs = 0;
  std::string optimizer = "sgd";
  std::optional<double> lr;            // absent: the optimizer's default
  std::string optimizer_params;        // "momentum=0.9,nesterov=true"
  std::optional<double> weight_decay;  // absent: the optimizer's default
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t lr_step_size = 0;  // 0: not given (the step schedule then says it needs one)
  double lr_gamma = 0.1;
  double min_lr = 0;
  uint64_t seed = 0;
  std::string device = "auto";  // cpu | cuda | auto
  int64_t log_every = 10;
  int64_t eval_every = 0;
  int64_t eval_samples = 1024;
  bool json = false;
  std::string save_params;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  std::optional<int64_t> resume_step;  // --resume-step; absent: the newest checkpoint
  std::string on_nonfinite = "error";  // error | skip | off
  int64_t inject_nonfinite_step = 0;   // tests (hidden flag): a NaN input at this step
  bool checkpoint_on_sigterm = false;
  // Pipeline and tensor parallelism (issue 46): the world is D x P x T workers.
  int pipeline_stages = 1;                // P
  int micro_batches = 1;                  // M: --batch-size is cut into these
  std::string pipeline_schedule = "gpipe";  // gpipe | 1f1b | interleaved | zb-h1
  int pipeline_virtual_stages = 1;        // V: stages per pipeline rank (interleaved)
  std::string pipeline_split;             // where stages 1.. begin; empty: balanced by cost
  int tensor_parallel = 1;                // T
};

// The backend for --device: "cpu"; "cuda" (device local_rank, or 0; Unavailable with the
// CUDA runtime's reason when there is none); "auto" (CUDA when a device is there, else CPU).
// A CUDA backend gets `cuda`.
StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(const std::string& device, int local_rank,
                                                      const CudaBackendOptions& cuda);

struct Datasets {
  std::unique_ptr<data::Dataset> train;
  std::unique_ptr<data::Dataset> eval;  // may be null
  std::string description;              // "synthetic (60000 x 784, 10 classes, seed 0)"
};
StatusOr<Datasets> MakeDatasets(const TrainingFlags& flags);

// The model for --model, shaped to fit the dataset (input width, classes, sparse fields).
StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingFlags& flags, const data::Dataset& train,
                                           ComputeBackend* backend);

StatusOr<OptimizerOptions> MakeOptimizerOptions(const TrainingFlags& flags);
// total_steps is what the trainer will run (for the cosine schedule's length).
StatusOr<LrScheduleOptions> MakeLrSchedule(const TrainingFlags& flags, int64_t total_steps);
TrainerOptions MakeTrainerOptions(const TrainingFlags& flags, int rank, int world_size);

// How the world is split for pipeline and tensor parallelism: data x pipeline x tensor
// workers, row-major (rank = (d P + p) T + t: a tensor-parallel group is consecutive ranks).
struct ParallelShape {
  int data = 1, pipeline = 1, tensor = 1;
  bool used() const { return pipeline * tensor > 1; }
  // This world rank's data-parallel replica.
  int DataRank(int rank) const { return rank / (pipeline * tensor); }
};
// The shape for the flags, --mode `mode` and a world of `world` workers. InvalidArgument
// naming the flags and numbers: a world that is not a multiple of P x T, a mode other than
// allreduce or zero1, another model than mlp, a --batch-size that --micro-batches does not
// divide, --pipeline-virtual-stages with another schedule than interleaved, the pipeline
// flags without --pipeline-stages or --tensor-parallel, and --grad-accumulation (use
// --micro-batches).
StatusOr<ParallelShape> MakeParallelShape(const TrainingFlags& flags, const std::string& mode,
                                          int world);
// This rank's stages and tensor slices of the mlp the flags describe (pipeline_mlp.h).
StatusOr<std::unique_ptr<PipelineMlp>> MakePipelineModel(const TrainingFlags& flags,
                                                         const data::Dataset& train,
                                                         StageLinks* links,
                                                         ComputeBackend* backend);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TRAINING_SETUP_H_
