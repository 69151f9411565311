#include "worker/pipeline/pipeline_schedule.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "worker/pipeline/schedule_simulation.h"

namespace tessera::worker {
namespace {

constexpr std::pair<ScheduleKind, const char*> kNames[] = {
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::k1F1B, "1f1b"},
    {ScheduleKind::kInterleaved1F1B, "interleaved"},
    {ScheduleKind::kZeroBubbleH1, "zb-h1"},
};

// A rank's compute actions in order; the messages go in around them (WithMessages).
using Order = std::vector<PipelineAction>;

// The 1F1B family, as PyTorch orders it (torch/distributed/pipelining/schedules.py,
// _get_1f1b_rank_ops): `warmup` forwards, then per step a forward and a backward, then the
// backwards left. Op k's stage comes from forward_stage(k) or backward_stage(k), and each
// stage's micro-batches are taken in order. zero_bubble: each backward is an input gradient,
// and the weight gradient of the oldest one follows it once `late` backwards have run (the
// weight gradients held back fill the end).
Order OneFOneB(int ops, int warmup, const std::function<int(int)>& forward_stage,
               const std::function<int(int)>& backward_stage, bool zero_bubble, int late) {
  std::map<int, int> forwards, backwards, weights;  // the next micro-batch, by stage
  std::vector<int> backward_stages;                 // of the backwards run, in order
  size_t weights_run = 0;
  Order order;
  auto forward = [&](int k) {
    const int stage = forward_stage(k);
    order.push_back({PipelineOp::kForward, stage, forwards[stage]++});
  };
  auto weight = [&] {
    const int stage = backward_stages[weights_run++];
    order.push_back({PipelineOp::kBackwardWeight, stage, weights[stage]++});
  };
  auto backward = [&](int k) {
    const int stage = backward_stage(k);
    order.push_back({zero_bubble ? PipelineOp::kBackwardInput : PipelineOp::kBackward, stage,
                     backwards[stage]++});
    backward_stages.push_back(stage);
    if (zero_bubble && k - warmup >= late) weight();
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = warmup; k < ops; ++k) {
    forward(k);
    backward(k);
  }
  for (int k = ops; k < ops + warmup; ++k) backward(k);
  while (zero_bubble && weights_run < backward_stages.size()) weight();
  return order;
}

// The ordered actions of one rank: each compute action with the messages it needs before it
// and makes after it, between stages on different ranks.
std::vector<PipelineAction> WithMessages(const Order& order, int ranks, int stages) {
  auto other_rank = [&](int a, int b) { return b >= 0 && b < stages && a % ranks != b % ranks; };
  std::vector<PipelineAction> actions;
  for (const PipelineAction& a : order) {
    const int s = a.stage, m = a.micro_batch;
    switch (a.op) {
      case PipelineOp::kForward:
        if (other_rank(s, s - 1)) actions.push_back({PipelineOp::kRecvActivation, s, m});
        actions.push_back(a);
        if (other_rank(s, s + 1)) actions.push_back({PipelineOp::kSendActivation, s, m});
        break;
      case PipelineOp::kBackward:
      case PipelineOp::kBackwardInput:
        if (other_rank(s, s + 1)) actions.push_back({PipelineOp::kRecvGradient, s, m});
        actions.push_back(a);
        if (other_rank(s, s - 1)) actions.push_back({PipelineOp::kSendGradient, s, m});
        break;
      default:
        actions.push_back(a);
    }
  }
  return actions;
}

// Why `kind` cannot run `shape`, or "" if it can.
std::string Refusal(ScheduleKind kind, const PipelineShape& shape) {
  const int p = shape.ranks, m = shape.micro_batches, v = shape.stages_per_rank;
  if (p < 1) return "it needs at least 1 rank";
  if (m < 1) return "it needs at least 1 micro-batch";
  if (v < 1) return "it needs at least 1 stage per rank";
  if (kind != ScheduleKind::kInterleaved1F1B && v != 1) {
    return "it runs 1 stage per rank (interleaved runs several)";
  }
  if ((kind == ScheduleKind::k1F1B || kind == ScheduleKind::kZeroBubbleH1) && m < p) {
    return "it needs at least as many micro-batches as ranks (" + std::to_string(m) + " < " +
           std::to_string(p) + "; gpipe runs any number)";
  }
  if (kind == ScheduleKind::kInterleaved1F1B && m % p != 0) {
    return "it needs a multiple of the ranks' number of micro-batches (" + std::to_string(m) +
           " is not a multiple of " + std::to_string(p) + ")";
  }
  return "";
}

Order RankOrder(ScheduleKind kind, const PipelineShape& shape, int r) {
  const int p = shape.ranks, m = shape.micro_batches, v = shape.stages_per_rank;
  switch (kind) {
    case ScheduleKind::kGPipe: {
      Order order;
      for (int i = 0; i < m; ++i) order.push_back({PipelineOp::kForward, r, i});
      for (int i = 0; i < m; ++i) order.push_back({PipelineOp::kBackward, r, i});
      return order;
    }
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZeroBubbleH1: {
      const auto stage = [r](int) { return r; };
      return OneFOneB(m, std::min(p - 1 - r, m), stage, stage,
                      kind == ScheduleKind::kZeroBubbleH1, /*late=*/r);
    }
    case ScheduleKind::kInterleaved1F1B: {
      const int ops = v * m;
      // The last rank warms up its first V-1 rounds of P; each rank before it two more.
      const int warmup = std::min((v - 1) * p + 2 * (p - 1 - r), ops);
      const auto forward_stage = [=](int k) { return (k / p) % v * p + r; };
      const auto backward_stage = [=](int k) { return (v - 1 - (k - warmup) / p % v) * p + r; };
      return OneFOneB(ops, warmup, forward_stage, backward_stage, false, 0);
    }
  }
  return {};
}

}  // namespace

std::string ScheduleKindName(ScheduleKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name) {
  std::string names;
  for (const auto& [kind, known] : kNames) {
    if (name == known) return kind;
    names += (names.empty() ? "" : ", ") + std::string(known);
  }
  return InvalidArgumentError("pipeline schedule '" + name + "': not one of " + names);
}

bool IsComputeAction(PipelineOp op) {
  return op == PipelineOp::kForward || op == PipelineOp::kBackward ||
         op == PipelineOp::kBackwardInput || op == PipelineOp::kBackwardWeight;
}

std::string ActionName(const PipelineAction& action) {
  const char* op = "?";
  switch (action.op) {
    case PipelineOp::kForward: op = "F"; break;
    case PipelineOp::kBackward: op = "B"; break;
    case PipelineOp::kBackwardInput: op = "I"; break;
    case PipelineOp::kBackwardWeight: op = "W"; break;
    case PipelineOp::kRecvActivation: op = "RECV_F"; break;
    case PipelineOp::kSendActivation: op = "SEND_F"; break;
    case PipelineOp::kRecvGradient: op = "RECV_B"; break;
    case PipelineOp::kSendGradient: op = "SEND_B"; break;
  }
  return std::to_string(action.stage) + op + std::to_string(action.micro_batch);
}

StatusOr<PipelineSchedule> PipelineSchedule::Make(ScheduleKind kind, const PipelineShape& shape) {
  PipelineSchedule schedule;
  schedule.kind_ = kind;
  schedule.shape_ = shape;
  if (const std::string why = Refusal(kind, shape); !why.empty()) {
    return InvalidArgumentError("pipeline schedule " + schedule.Describe() + ": " + why);
  }
  for (int r = 0; r < shape.ranks; ++r) {
    schedule.actions_.push_back(
        WithMessages(RankOrder(kind, shape, r), shape.ranks, schedule.stages()));
  }
  StatusOr<SimulatedSchedule> run =
      SimulateSchedule(schedule.actions_, schedule.stages(), shape.micro_batches);
  if (!run.ok()) {
    return InternalError("pipeline schedule " + schedule.Describe() +
                         " does not run: " + run.status().ToString());
  }
  schedule.bubble_fraction_ = run->bubble_fraction;
  schedule.peak_held_ = run->peak_held;
  return schedule;
}

std::string PipelineSchedule::Describe() const {
  std::string text = ScheduleKindName(kind_) + ", " + std::to_string(shape_.ranks) + " rank" +
                     (shape_.ranks == 1 ? "" : "s") + ", " +
                     std::to_string(shape_.micro_batches) + " micro-batch" +
                     (shape_.micro_batches == 1 ? "" : "es");
  if (shape_.stages_per_rank != 1) {
    text += ", " + std::to_string(shape_.stages_per_rank) + " stages per rank";
  }
  return text;
}

}  // namespace tessera::worker
