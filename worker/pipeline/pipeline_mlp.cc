#include "worker/pipeline/pipeline_mlp.h"

#include <algorithm>
#include <chrono>

#include "common/base/logging.h"
#include "worker/nn/layers.h"
#include "worker/nn/tensor_parallel_linear.h"
#include "worker/pipeline/stage_split.h"

namespace tessera::worker {
namespace {

// The mlp's layers as AppendMlpLayers (mlp.h) makes them, in order.
enum class LayerKind { kLinear, kLayerNorm, kRelu, kGelu };
struct LayerSpec {
  LayerKind kind = LayerKind::kLinear;
  int64_t in = 0, out = 0;
};

std::vector<LayerSpec> MlpLayers(const MlpOptions& options) {
  std::vector<LayerSpec> specs;
  int64_t width = options.input_dim;
  for (int64_t hidden : options.hidden) {
    specs.push_back({LayerKind::kLinear, width, hidden});
    width = hidden;
    if (options.layer_norm) specs.push_back({LayerKind::kLayerNorm, width, width});
    specs.push_back({options.activation == Activation::kRelu ? LayerKind::kRelu
                                                             : LayerKind::kGelu,
                     width, width});
  }
  specs.push_back({LayerKind::kLinear, width, options.classes});
  return specs;
}

// Multiply-adds per sample: what balances the stages.
int64_t Cost(const LayerSpec& spec) {
  return spec.kind == LayerKind::kLinear ? spec.in * spec.out : spec.out;
}

bool Elementwise(LayerKind kind) { return kind == LayerKind::kRelu || kind == LayerKind::kGelu; }

// Point-to-point tags: what travels, the stage that sent it, the micro-batch.
enum TagKind : uint32_t { kActivation = 1, kGradient = 2, kEvalActivation = 3 };
uint32_t Tag(TagKind kind, int stage, int micro_batch) {
  return (static_cast<uint32_t>(kind) << 28) | ((static_cast<uint32_t>(stage) & 0xfff) << 16) |
         (static_cast<uint32_t>(micro_batch) & 0xffff);
}

std::string StageName(int stage, int micro_batch) {
  return "stage " + std::to_string(stage) + " micro-batch " + std::to_string(micro_batch);
}

// What a receive waits for, with the shape this stage takes, so that a stage built otherwise
// (its bytes of another size) is named with both sides: "activation of stage 0 micro-batch 3
// for stage 1 ([4, 33] float32 here)".
std::string Expected(const std::string& what, int from, int to, int m, int64_t rows,
                     int64_t dim) {
  return what + " of " + StageName(from, m) + " for stage " + std::to_string(to) + " ([" +
         std::to_string(rows) + ", " + std::to_string(dim) + "] float32 here)";
}

}  // namespace

PipelineMlp::~PipelineMlp() = default;

StatusOr<std::unique_ptr<PipelineMlp>> PipelineMlp::Create(const PipelineMlpOptions& options,
                                                           StageLinks* links,
                                                           ComputeBackend* backend) {
  if (!backend->host_memory()) {
    return InvalidArgumentError("pipeline and tensor parallelism run on the CPU (--device cpu); "
                                "the backend is " + std::string(backend->name()));
  }
  const int ranks = links->pipeline_ranks(), tp = links->tensor_ranks();
  const int tp_rank = links->tensor_rank(), pp_rank = links->pipeline_rank();
  ASSIGN_OR_RETURN(PipelineSchedule schedule,
                   PipelineSchedule::Make(options.schedule, {ranks, options.micro_batches,
                                                             options.virtual_stages}));
  std::unique_ptr<PipelineMlp> model(
      new PipelineMlp(options, links, backend, std::move(schedule)));
  ASSIGN_OR_RETURN(model->full_, Mlp::Create(options.mlp, backend));
  const std::vector<LayerSpec> specs = MlpLayers(options.mlp);
  std::vector<int64_t> costs;
  for (const LayerSpec& spec : specs) costs.push_back(Cost(spec));
  const int stages = model->schedule_.stages();
  ASSIGN_OR_RETURN(std::vector<int> begins, SplitStages(costs, stages, options.split));
  begins.push_back(static_cast<int>(specs.size()));
  TensorParallelSum sum = [links](float* data, size_t count, const std::string& what) {
    return links->SumOverTensor(data, count, what);
  };
  std::map<std::string, TensorSlice> slices;  // of the split tensors, by name
  for (int s = pp_rank; s < stages; s += ranks) {
    Stage stage;
    stage.index = s;
    stage.first_layer = begins[s];
    stage.layers = begins[s + 1] - begins[s];
    stage.net = std::make_unique<Sequential>(backend);
    for (int i = begins[s]; i < begins[s + 1]; ++i) {
      const LayerSpec& spec = specs[static_cast<size_t>(i)];
      const std::string name = "mlp." + std::to_string(i);
      // A Linear whose partner (the next Linear, with only activations between) is in the
      // same stage: column parallel, its activations and partner on its slice.
      int partner = -1;
      if (tp > 1 && spec.kind == LayerKind::kLinear) {
        int j = i + 1;
        while (j < begins[s + 1] && Elementwise(specs[static_cast<size_t>(j)].kind)) ++j;
        if (j < begins[s + 1] && specs[static_cast<size_t>(j)].kind == LayerKind::kLinear) {
          partner = j;
        }
      }
      if (partner < 0) {
        std::unique_ptr<Layer> layer;
        switch (spec.kind) {
          case LayerKind::kLinear: layer = std::make_unique<Linear>(spec.in, spec.out); break;
          case LayerKind::kLayerNorm:
            layer = std::make_unique<LayerNorm>(spec.out, backend);
            break;
          case LayerKind::kRelu: layer = std::make_unique<Relu>(spec.out); break;
          case LayerKind::kGelu: layer = std::make_unique<Gelu>(spec.out); break;
        }
        RETURN_IF_ERROR(stage.net->Add(std::move(layer)).WithContext(name));
        continue;
      }
      const LayerSpec& row = specs[static_cast<size_t>(partner)];
      const std::string row_name = "mlp." + std::to_string(partner);
      if (spec.out % tp != 0) {
        return InvalidArgumentError(
            "--tensor-parallel " + std::to_string(tp) + ": " + name + " (Linear " +
            std::to_string(spec.in) + " -> " + std::to_string(spec.out) + ") and " + row_name +
            " (Linear " + std::to_string(row.in) + " -> " + std::to_string(row.out) +
            ") split their " + std::to_string(spec.out) + " features, which " +
            std::to_string(tp) + " does not divide");
      }
      auto column = std::make_unique<ColumnParallelLinear>(spec.in, spec.out, tp_rank, tp, sum);
      slices[name + ".weight"] = column->weight_slice();
      slices[name + ".bias"] = column->bias_slice();
      RETURN_IF_ERROR(stage.net->Add(std::move(column)).WithContext(name));
      for (int j = i + 1; j < partner; ++j) {
        const int64_t width = spec.out / tp;
        std::unique_ptr<Layer> act;
        if (specs[static_cast<size_t>(j)].kind == LayerKind::kRelu) {
          act = std::make_unique<Relu>(width);
        } else {
          act = std::make_unique<Gelu>(width);
        }
        RETURN_IF_ERROR(stage.net->Add(std::move(act)).WithContext("mlp." + std::to_string(j)));
      }
      auto row_layer = std::make_unique<RowParallelLinear>(row.in, row.out, tp_rank, tp, sum);
      slices[row_name + ".weight"] = row_layer->weight_slice();
      slices[row_name + ".bias"] = row_layer->bias_slice();
      RETURN_IF_ERROR(stage.net->Add(std::move(row_layer)).WithContext(row_name));
      model->pairs_.push_back(name + "-" + row_name);
      i = partner;
    }
    stage.input_dim = specs[static_cast<size_t>(begins[s])].in;
    stage.output_dim = specs[static_cast<size_t>(begins[s + 1] - 1)].out;
    stage.grad_offset = model->layout_.total_size();
    RETURN_IF_ERROR(stage.net->DeclareParameters("mlp.", &model->layout_, stage.first_layer));
    stage.grad_size = model->layout_.total_size() - stage.grad_offset;
    model->stages_.push_back(std::move(stage));
  }
  for (const ParameterView& view : model->layout_.views()) {
    Part part;
    part.local = &view;
    part.full = model->full_->layout().Find(view.name);
    if (part.full == nullptr) {
      return InternalError("pipeline: " + view.name + " is not a tensor of the full mlp");
    }
    auto slice = slices.find(view.name);
    if (slice != slices.end()) part.slice = slice->second;
    model->parts_.push_back(part);
  }
  model->scratch_grads_.assign(model->layout_.total_size(), 0.0f);
  return model;
}

void PipelineMlp::InitializeParameters(uint64_t seed, float* params) const {
  std::vector<float> full(full_->layout().total_size());
  full_->InitializeParameters(seed, full.data());
  TakePart(full.data(), params);
}

void PipelineMlp::TakePart(const float* full, float* local) const {
  for (const Part& part : parts_) {
    ExtractSlice(part.slice, part.full->shape, full + part.full->offset,
                 local + part.local->offset);
  }
}

std::vector<PipelineMlp::Run> PipelineMlp::FullRuns(uint64_t offset, uint64_t size,
                                                    bool writing) const {
  std::vector<Run> runs;
  const uint64_t end = offset + size;
  for (const Part& part : parts_) {
    const uint64_t begin = std::max(offset, part.local->offset);
    const uint64_t stop = std::min(end, part.local->offset + part.local->size);
    if (begin >= stop) continue;
    if (writing && part.slice.axis < 0 && links_->tensor_rank() != 0) continue;
    const std::vector<int64_t>& shape = part.full->shape;
    const uint64_t columns = shape.size() > 1 ? static_cast<uint64_t>(shape[1]) : 1;
    if (part.slice.axis != 1) {  // the whole tensor, or whole rows: one run
      const uint64_t first = part.slice.axis == 0 ? part.slice.begin * columns : 0;
      runs.push_back({begin, part.full->offset + first + (begin - part.local->offset),
                      stop - begin});
      continue;
    }
    // Columns [slice.begin, slice.end) of each row: a run per (part of a) row.
    const uint64_t width = static_cast<uint64_t>(part.slice.end - part.slice.begin);
    for (uint64_t at = begin; at < stop;) {
      const uint64_t e = at - part.local->offset, row = e / width, column = e % width;
      const uint64_t count = std::min(width - column, stop - at);
      runs.push_back({at, part.full->offset + row * columns + part.slice.begin + column, count});
      at += count;
    }
  }
  return runs;
}

Status PipelineMlp::GatherFull(const float* local, std::vector<float>* full) {
  full->assign(full_->layout().total_size(), 0.0f);
  // Each element is written by exactly one rank of the pipeline and tensor groups (a
  // replicated tensor by tensor rank 0), so the sums are exact.
  for (const Part& part : parts_) {
    if (part.slice.axis < 0 && links_->tensor_rank() != 0) continue;
    InsertSlice(part.slice, part.full->shape, local + part.local->offset,
                full->data() + part.full->offset);
  }
  RETURN_IF_ERROR(links_->SumOverTensor(full->data(), full->size(), "the full parameters"));
  return links_->SumOverPipeline(full->data(), full->size(), "the full parameters");
}

PipelineMlp::Stage* PipelineMlp::LocalStage(int stage) {
  for (Stage& s : stages_) {
    if (s.index == stage) return &s;
  }
  return nullptr;
}

void PipelineMlp::Held(int stage, int m, bool held) {
  held_ += held ? 1 : -1;
  peak_held_ = std::max(peak_held_, held_);
  step_peak_held_ = std::max(step_peak_held_, held_);
}

void PipelineMlp::SetMetrics(PipelineMetrics* metrics) {
  metrics_ = metrics;
  if (metrics_ == nullptr) return;
  const int rank = links_->pipeline_rank();
  metrics_->SetSchedule(rank, schedule_.peak_held(rank), schedule_.bubble_fraction());
}

StatusOr<const float*> PipelineMlp::StageForward(Stage& stage, int m, const float* params,
                                                 int64_t rows) {
  const float* x = nullptr;
  if (stage.index == 0) {
    x = inputs_.features() + m * rows * stage.input_dim;
  } else {
    const std::vector<float>& input = micro_[{stage.index, m}]->input;
    if (input.size() != static_cast<size_t>(rows * stage.input_dim)) {
      return InternalError("no input for " + StageName(stage.index, m));
    }
    x = input.data();
  }
  return stage.net->Forward(params, rows, x);
}

Status PipelineMlp::StageBackward(Stage& stage, int m, const float* params, int64_t rows,
                                  float* grads) {
  MicroState& state = *micro_[{stage.index, m}];
  if (state.dout.size() != static_cast<size_t>(rows * stage.output_dim)) {
    return InternalError("no output gradient for " + StageName(stage.index, m));
  }
  // The forward again: only the stage's input was kept (see the header).
  RETURN_IF_ERROR(StageForward(stage, m, params, rows).status());
  const float* x = stage.index == 0 ? inputs_.features() + m * rows * stage.input_dim
                                    : state.input.data();
  float* dx = nullptr;
  if (stage.index > 0) {
    state.dx.resize(static_cast<size_t>(rows * stage.input_dim));
    dx = state.dx.data();
  }
  RETURN_IF_ERROR(stage.net->Backward(params, rows, x, state.dout.data(), dx, grads, {}));
  if (stage.index > 0 && schedule_.RankOf(stage.index - 1) == links_->pipeline_rank()) {
    auto& before = micro_[{stage.index - 1, m}];
    if (before == nullptr) before = std::make_unique<MicroState>();
    before->dout = std::move(state.dx);
  }
  return OkStatus();
}

Status PipelineMlp::RunAction(const PipelineAction& action, const float* params, int64_t rows,
                              StepStats* stats) {
  const int s = action.stage, m = action.micro_batch;
  const int me = links_->pipeline_rank();
  Stage* stage = LocalStage(s);
  if (stage == nullptr) return InternalError("the schedule gives this rank a stage it lacks");
  auto& slot = micro_[{s, m}];
  if (slot == nullptr) slot = std::make_unique<MicroState>();
  MicroState& state = *slot;
  const float scale = 1.0f / static_cast<float>(options_.micro_batches);
  auto accumulate = [&](const float* from) {
    for (uint64_t i = 0; i < stage->grad_size; ++i) {
      step_grads_[stage->grad_offset + i] += scale * from[i];
    }
  };
  switch (action.op) {
    case PipelineOp::kForward: {
      ASSIGN_OR_RETURN(const float* out, StageForward(*stage, m, params, rows));
      const size_t count = static_cast<size_t>(rows * stage->output_dim);
      if (s == schedule_.stages() - 1) {
        const int64_t classes = options_.mlp.classes;
        std::vector<float> probabilities(count);
        const int64_t* labels = inputs_.labels() + m * rows;
        auto loss = backend_->SoftmaxCrossEntropy(rows, classes, out, labels,
                                                  probabilities.data());
        stats->loss += loss.loss;
        stats->correct += loss.correct;
        state.dout.resize(count);
        backend_->SoftmaxCrossEntropyBackward(rows, classes, probabilities.data(), labels,
                                              state.dout.data());
      } else if (schedule_.RankOf(s + 1) == me) {
        auto& next = micro_[{s + 1, m}];
        if (next == nullptr) next = std::make_unique<MicroState>();
        next->input.assign(out, out + count);
      } else {
        state.output.assign(out, out + count);
      }
      Held(s, m, true);
      return OkStatus();
    }
    case PipelineOp::kSendActivation:
      RETURN_IF_ERROR(links_->Send(state.output.data(), state.output.size(),
                                   schedule_.RankOf(s + 1), Tag(kActivation, s, m),
                                   "activation of " + StageName(s, m)));
      step_activation_bytes_ += state.output.size() * sizeof(float);
      state.output = {};
      return OkStatus();
    case PipelineOp::kRecvActivation:
      state.input.resize(static_cast<size_t>(rows * stage->input_dim));
      return links_->Recv(state.input.data(), state.input.size(), schedule_.RankOf(s - 1),
                          Tag(kActivation, s - 1, m),
                          Expected("activation", s - 1, s, m, rows, stage->input_dim));
    case PipelineOp::kBackward:
      RETURN_IF_ERROR(StageBackward(*stage, m, params, rows, scratch_grads_.data()));
      accumulate(scratch_grads_.data() + stage->grad_offset);
      Held(s, m, false);
      return OkStatus();
    case PipelineOp::kBackwardInput:
      RETURN_IF_ERROR(StageBackward(*stage, m, params, rows, scratch_grads_.data()));
      state.weight_grads.assign(scratch_grads_.data() + stage->grad_offset,
                                scratch_grads_.data() + stage->grad_offset + stage->grad_size);
      return OkStatus();
    case PipelineOp::kBackwardWeight:
      if (state.weight_grads.size() != stage->grad_size) {
        return InternalError("W before I for " + StageName(s, m));
      }
      accumulate(state.weight_grads.data());
      state.weight_grads = {};
      Held(s, m, false);
      return OkStatus();
    case PipelineOp::kSendGradient:
      RETURN_IF_ERROR(links_->Send(state.dx.data(), state.dx.size(), schedule_.RankOf(s - 1),
                                   Tag(kGradient, s, m), "input gradient of " + StageName(s, m)));
      step_gradient_bytes_ += state.dx.size() * sizeof(float);
      state.dx = {};
      return OkStatus();
    case PipelineOp::kRecvGradient:
      state.dout.resize(static_cast<size_t>(rows * stage->output_dim));
      return links_->Recv(state.dout.data(), state.dout.size(), schedule_.RankOf(s + 1),
                          Tag(kGradient, s + 1, m),
                          Expected("input gradient", s + 1, s, m, rows, stage->output_dim));
  }
  return InternalError("unknown pipeline action");
}

StatusOr<StepStats> PipelineMlp::ForwardBackward(ParameterStorage* storage,
                                                 const data::Batch& batch,
                                                 std::vector<SparseRows>* sparse) {
  const std::string where = "pipeline rank " + std::to_string(links_->pipeline_rank()) +
                            ", tensor rank " + std::to_string(links_->tensor_rank());
  if (batch.sparse_fields != 0) {
    return InvalidArgumentError("mlp: the batch has sparse fields; an MLP takes dense features");
  }
  const int micro = options_.micro_batches;
  if (batch.size % static_cast<size_t>(micro) != 0) {
    return InvalidArgumentError("a batch of " + std::to_string(batch.size) +
                                " samples (--batch-size) cannot be cut into --micro-batches " +
                                std::to_string(micro) + " equal micro-batches");
  }
  RETURN_IF_ERROR(inputs_.Load(batch, options_.mlp.input_dim, options_.mlp.classes)
                      .WithContext("mlp"));
  const int64_t rows = static_cast<int64_t>(batch.size) / micro;
  // A rank whose stages are all without parameters (a lone activation) has none to ask for.
  const ParameterBlock all{0, layout_.total_size()};
  const float* params = nullptr;
  step_grads_ = nullptr;
  if (all.size > 0) {
    ASSIGN_OR_RETURN(params, storage->Acquire(all, Pass::kForward));
    StatusOr<float*> grads = storage->GradientBlock(all);
    if (!grads.ok()) {
      storage->Release(all);
      return grads.status();
    }
    step_grads_ = *grads;
    std::fill(step_grads_, step_grads_ + all.size, 0.0f);
  }
  micro_.clear();
  held_ = 0;
  step_peak_held_ = 0;
  step_activation_bytes_ = step_gradient_bytes_ = 0;
  StepStats stats;
  Status ran = OkStatus();
  // The step's compute actions, timed, for metrics_ (two clock reads an action: nothing
  // against a stage's GEMMs).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  const double started_unix = std::chrono::duration<double>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  PipelineStepRecord record;
  auto since_start = [started](Clock::time_point t) {
    return std::chrono::duration<double>(t - started).count();
  };
  for (const PipelineAction& action : schedule_.actions(links_->pipeline_rank())) {
    const Clock::time_point begin = Clock::now();
    ran = RunAction(action, params, rows, &stats);
    if (!ran.ok()) {
      ran = ran.WithContext(where + ": " + ActionName(action));
      break;
    }
    if (metrics_ != nullptr && IsComputeAction(action.op)) {
      record.actions.push_back({action.op, action.stage, action.micro_batch,
                                since_start(begin), since_start(Clock::now())});
    }
  }
  micro_.clear();
  step_grads_ = nullptr;
  if (all.size > 0) storage->Release(all);
  RETURN_IF_ERROR(ran);
  if (all.size > 0) RETURN_IF_ERROR(storage->GradientsDone(all));
  // The loss and accuracy are the last stage's; every rank reports them.
  float shared[2] = {static_cast<float>(stats.loss / micro), static_cast<float>(stats.correct)};
  RETURN_IF_ERROR(links_->SumOverPipeline(shared, 2, "the step's loss").WithContext(where));
  if (metrics_ != nullptr) {
    record.start_unix_seconds = started_unix;
    record.seconds = since_start(Clock::now());
    record.activation_bytes_sent = step_activation_bytes_;
    record.gradient_bytes_sent = step_gradient_bytes_;
    record.peak_held = step_peak_held_;
    // A bad record is a bug here, not a reason to stop training: logged, not returned.
    Status recorded = metrics_->RecordStep(record);
    if (!recorded.ok()) TLOG(WARNING) << where << ": pipeline metrics: " << recorded;
  }
  return StepStats{shared[0], static_cast<int64_t>(shared[1]),
                   static_cast<int64_t>(batch.size)};
}

StatusOr<StepStats> PipelineMlp::Evaluate(ParameterStorage* storage, const data::Batch& batch,
                                          std::vector<SparseRows>* sparse) {
  const std::string where = "pipeline rank " + std::to_string(links_->pipeline_rank()) +
                            " evaluating";
  RETURN_IF_ERROR(inputs_.Load(batch, options_.mlp.input_dim, options_.mlp.classes)
                      .WithContext("mlp"));
  const int64_t rows = static_cast<int64_t>(batch.size);
  const ParameterBlock all{0, layout_.total_size()};
  const float* params = nullptr;
  if (all.size > 0) {
    ASSIGN_OR_RETURN(params, storage->Acquire(all, Pass::kForward));
  }
  StepStats stats;
  std::vector<float> input, output;
  Status ran = OkStatus();
  for (Stage& stage : stages_) {  // in stage order: each waits only for the stage before
    const int s = stage.index;
    const float* x = inputs_.features();
    if (s > 0) {
      if (schedule_.RankOf(s - 1) != links_->pipeline_rank() || input.empty()) {
        input.resize(static_cast<size_t>(rows * stage.input_dim));
        ran = links_->Recv(input.data(), input.size(), schedule_.RankOf(s - 1),
                           Tag(kEvalActivation, s - 1, 0), "evaluation activation of stage " +
                                                               std::to_string(s - 1));
        if (!ran.ok()) break;
      }
      x = input.data();
    }
    StatusOr<const float*> out = stage.net->Forward(params, rows, x);
    if (!out.ok()) {
      ran = out.status();
      break;
    }
    const size_t count = static_cast<size_t>(rows * stage.output_dim);
    if (s == schedule_.stages() - 1) {
      std::vector<float> probabilities(count);
      auto loss = backend_->SoftmaxCrossEntropy(rows, options_.mlp.classes, *out,
                                                inputs_.labels(), probabilities.data());
      stats.loss = loss.loss;
      stats.correct = loss.correct;
    } else if (schedule_.RankOf(s + 1) == links_->pipeline_rank()) {
      output.assign(*out, *out + count);
      input = std::move(output);
    } else {
      input.clear();
      ran = links_->Send(*out, count, schedule_.RankOf(s + 1), Tag(kEvalActivation, s, 0),
                         "evaluation activation of stage " + std::to_string(s));
      if (!ran.ok()) break;
    }
  }
  if (all.size > 0) storage->Release(all);
  RETURN_IF_ERROR(ran.WithContext(where));
  float shared[2] = {static_cast<float>(stats.loss), static_cast<float>(stats.correct)};
  RETURN_IF_ERROR(links_->SumOverPipeline(shared, 2, "the evaluation loss").WithContext(where));
  return StepStats{shared[0], static_cast<int64_t>(shared[1]), rows};
}

std::string PipelineMlp::Describe() const {
  std::string text = "pipeline rank " + std::to_string(links_->pipeline_rank()) + " of " +
                     std::to_string(links_->pipeline_ranks()) + " (";
  for (size_t i = 0; i < stages_.size(); ++i) {
    const Stage& s = stages_[i];
    text += (i ? "; " : "") + std::string("stage ") + std::to_string(s.index) + ": layers " +
            std::to_string(s.first_layer) + ".." + std::to_string(s.first_layer + s.layers - 1);
  }
  text += "), tensor rank " + std::to_string(links_->tensor_rank()) + " of " +
          std::to_string(links_->tensor_ranks());
  if (!pairs_.empty()) {
    text += " (pairs";
    for (const std::string& pair : pairs_) text += " " + pair;
    text += ")";
  }
  return text + ", " + schedule_.Describe();
}

}  // namespace tessera::worker
