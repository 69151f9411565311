// PipelineMlp: this process's part of an mlp (worker/nn/mlp.h) trained with pipeline and
// tensor parallelism (issue 46, item 2), as a Model the trainer drives like any other.
//
// The mlp's layers (mlp.<i>, as Mlp names them) are split into S = P x V contiguous stages
// (stage_split.h: balanced by multiply-adds per sample, or --pipeline-split); pipeline rank r
// holds stages r, r + P, ... (pipeline_schedule.h). Within each stage, with T > 1 tensor-
// parallel ranks, consecutive Linear layers with only an elementwise activation between them
// are paired column parallel then row parallel (worker/nn/tensor_parallel_linear.h); a Linear
// left without a partner, and every other layer, is replicated on the T ranks.
//
// layout() holds only this rank's stages' parameters, its tensor slices of the paired ones,
// under the full model's names (TensorSlice says where each lies): a data-parallel engine
// reduces it across the ranks holding the same part. InitializeParameters initialises the
// full mlp from the seed and takes this rank's part, so every part starts where one process
// would; GatherFull puts the parts back together.
//
// ForwardBackward runs the schedule's actions for this rank on the replica batch, cut into M
// equal micro-batches: F (the first stage from the batch's features, the others from the
// activation received), B (or I, then W for zb-h1), and the sends and receives of activations
// and gradients through StageLinks with tags that encode what, the sending stage and the
// micro-batch. The last stage computes the loss of each micro-batch; each stage adds 1/M of
// each micro-batch's weight gradients, so the gradients are those of the mean loss over the
// batch, as one process would compute them. The returned StepStats (the batch's loss and
// accuracy) are the last stage's, summed over the pipeline group so every rank reports them.
//
// Activation memory: a stage keeps each micro-batch's input from its F to its B (or W) and
// recomputes its forward in B (GPipe's re-materialisation), so what it holds per micro-batch
// is one input, and layers that keep per-batch state (LayerNorm) stay correct with several
// micro-batches in flight. For zb-h1, I runs the whole backward of the stage (the weight
// gradients kept aside) and W adds them in: the schedule's order and memory bound hold, but
// W is not where the weight-gradient GEMMs run. peak_held() counts the (stage, micro-batch)
// pairs held at once, from F to B or W, as the schedule's peak_held bounds them.
//
// Runs on a backend with host memory (the CPU): activations travel from host buffers.
//
// Thread-safety: one thread at a time (the training thread).
#ifndef TESSERA_WORKER_PIPELINE_PIPELINE_MLP_H_
#define TESSERA_WORKER_PIPELINE_PIPELINE_MLP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "worker/nn/mlp.h"
#include "worker/nn/model.h"
#include "worker/nn/sequential.h"
#include "worker/nn/tensor_slice.h"
#include "worker/pipeline/pipeline_metrics.h"
#include "worker/pipeline/pipeline_schedule.h"
#include "worker/pipeline/stage_links.h"

namespace tessera::worker {

struct PipelineMlpOptions {
  MlpOptions mlp;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int micro_batches = 1;     // M
  int virtual_stages = 1;    // V (interleaved)
  std::vector<int> split;    // --pipeline-split: where stages 1.. begin; empty: by cost
};

class PipelineMlp final : public Model {
 public:
  // InvalidArgument naming what is wrong: the schedule's own refusals (M < P for 1f1b),
  // fewer layers than stages, a paired layer's width not divisible by T (naming the layer and
  // its dims), a backend without host memory. `links` must outlive the model.
  static StatusOr<std::unique_ptr<PipelineMlp>> Create(const PipelineMlpOptions& options,
                                                       StageLinks* links,
                                                       ComputeBackend* backend);
  ~PipelineMlp() override;

  std::string_view name() const override { return "mlp"; }
  const ParameterLayout& layout() const override { return layout_; }
  const std::vector<EmbeddingTableSpec>& embedding_tables() const override { return no_tables_; }
  int64_t input_dim() const override { return options_.mlp.input_dim; }
  int64_t num_classes() const override { return options_.mlp.classes; }
  void InitializeParameters(uint64_t seed, float* params) const override;
  using Model::Evaluate;
  using Model::ForwardBackward;
  StatusOr<StepStats> ForwardBackward(ParameterStorage* storage, const data::Batch& batch,
                                      std::vector<SparseRows>* sparse) override;
  StatusOr<StepStats> Evaluate(ParameterStorage* storage, const data::Batch& batch,
                               std::vector<SparseRows>* sparse) override;

  // The full mlp's layout, and its parameters from every rank's `local` (layout() size):
  // collective over the tensor-parallel and the pipeline group; every rank gets them.
  const ParameterLayout& full_layout() const { return full_->layout(); }
  Status GatherFull(const float* local, std::vector<float>* full);
  // This rank's part of the full parameters `full` (full_layout() size) into `local`.
  void TakePart(const float* full, float* local) const;
  // Where layout() elements [offset, offset + size) lie in full_layout(): runs of elements
  // consecutive in both, in local order. With `writing`, without the replicated tensors'
  // copies on tensor ranks other than 0 (so that each element is written once).
  struct Run {
    uint64_t local_offset = 0, full_offset = 0, size = 0;
  };
  std::vector<Run> FullRuns(uint64_t offset, uint64_t size, bool writing) const;

  // Feeds `metrics` (may be null; must outlive the model) after every training step: the
  // step's compute actions as a timeline, the bytes sent, the micro-batches held
  // (pipeline_metrics.h), as tessera.torch.pipelining does for its schedules.
  void SetMetrics(PipelineMetrics* metrics);

  const PipelineSchedule& schedule() const { return schedule_; }
  // The most (stage, micro-batch) pairs held at once in any step so far.
  int peak_held() const { return peak_held_; }
  // "pipeline rank 1 of 2 (stages 1, 3: layers 2..2, 4..4), tensor rank 0 of 2 (pairs mlp.0-
  // mlp.2)".
  std::string Describe() const;

 private:
  // One stage this rank runs.
  struct Stage {
    int index = 0;          // global stage number
    int first_layer = 0;    // in the full mlp
    int layers = 0;
    int64_t input_dim = 0, output_dim = 0;
    std::unique_ptr<Sequential> net;
    uint64_t grad_offset = 0, grad_size = 0;  // its range of layout()
  };
  // Where a tensor of layout() comes from in the full one.
  struct Part {
    const ParameterView* local = nullptr;
    const ParameterView* full = nullptr;
    TensorSlice slice;
  };
  // One (stage, micro-batch)'s buffers during a step.
  struct MicroState {
    std::vector<float> input;         // the activation from the stage before (not stage 0)
    std::vector<float> output;        // F's output, until sent
    std::vector<float> dout;          // the output's gradient: received, or the loss's
    std::vector<float> dx;            // B's (or I's) input gradient, until sent
    std::vector<float> weight_grads;  // I's weight gradients (the stage's range), until W
  };

  PipelineMlp(const PipelineMlpOptions& options, StageLinks* links, ComputeBackend* backend,
              PipelineSchedule schedule)
      : options_(options), links_(links), backend_(backend), schedule_(std::move(schedule)),
        inputs_(backend) {}
  Stage* LocalStage(int stage);
  Status RunAction(const PipelineAction& action, const float* params, int64_t rows,
                   StepStats* stats);
  // The stage's forward on micro-batch `m` (its input held or the features).
  StatusOr<const float*> StageForward(Stage& stage, int m, const float* params, int64_t rows);
  // B or I: the recomputed forward, then the backward; weight gradients into `grads` (the
  // stage's range), the input gradient to the previous stage.
  Status StageBackward(Stage& stage, int m, const float* params, int64_t rows, float* grads);
  void Held(int stage, int m, bool held);

  const PipelineMlpOptions options_;
  StageLinks* const links_;
  ComputeBackend* const backend_;
  const PipelineSchedule schedule_;
  const std::vector<EmbeddingTableSpec> no_tables_;
  std::unique_ptr<Mlp> full_;  // the whole model: its layout, initialisation, names
  ParameterLayout layout_;
  std::vector<Stage> stages_;  // this rank's, in stage order
  std::vector<Part> parts_;
  std::vector<std::string> pairs_;  // "mlp.0-mlp.2": the tensor-parallel pairs (Describe)
  DeviceBatch inputs_;
  // During a step: by (stage, micro-batch).
  std::map<std::pair<int, int>, std::unique_ptr<MicroState>> micro_;
  std::vector<float> scratch_grads_;  // layout() size: one micro-batch's weight gradients
  float* step_grads_ = nullptr;       // the trainer's gradient buffer during ForwardBackward
  int held_ = 0, peak_held_ = 0;
  // The step's, for metrics_.
  int step_peak_held_ = 0;
  uint64_t step_activation_bytes_ = 0, step_gradient_bytes_ = 0;
  PipelineMetrics* metrics_ = nullptr;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_PIPELINE_MLP_H_
