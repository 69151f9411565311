#include "worker/pipeline/pipeline_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "common/metrics/metric_names.h"

namespace tessera::worker {
namespace {

// The op label: "F", "B", "I" or "W". REQUIRES: IsComputeAction(op).
std::string OpLabel(PipelineOp op) {
  switch (op) {
    case PipelineOp::kForward: return "F";
    case PipelineOp::kBackward: return "B";
    case PipelineOp::kBackwardInput: return "I";
    default: return "W";
  }
}

StatusOr<Counter*> OnlyCounter(MetricsRegistry* registry, const metric_names::MetricName& name) {
  ASSIGN_OR_RETURN(CounterFamily * family, registry->RegisterCounter(name.name, name.help));
  return family->WithLabels({});
}

StatusOr<Gauge*> OnlyGauge(MetricsRegistry* registry, const metric_names::MetricName& name) {
  ASSIGN_OR_RETURN(GaugeFamily * family, registry->RegisterGauge(name.name, name.help));
  return family->WithLabels({});
}

}  // namespace

StatusOr<std::unique_ptr<PipelineMetrics>> PipelineMetrics::Register(
    MetricsRegistry* registry) {
  namespace names = metric_names;
  std::unique_ptr<PipelineMetrics> m(new PipelineMetrics());
  ASSIGN_OR_RETURN(m->busy_, registry->RegisterCounter(names::kPipelineBusySecondsTotal.name,
                                                       names::kPipelineBusySecondsTotal.help,
                                                       {"stage"}));
  ASSIGN_OR_RETURN(CounterFamily * sent,
                   registry->RegisterCounter(names::kPipelineSentBytesTotal.name,
                                             names::kPipelineSentBytesTotal.help, {"kind"}));
  ASSIGN_OR_RETURN(m->activation_bytes_, sent->WithLabels({"activation"}));
  ASSIGN_OR_RETURN(m->gradient_bytes_, sent->WithLabels({"gradient"}));
  const std::vector<std::string> action_labels = {"op", "stage", "micro_batch"};
  ASSIGN_OR_RETURN(m->action_start_,
                   registry->RegisterGauge(names::kPipelineActionStartSeconds.name,
                                           names::kPipelineActionStartSeconds.help,
                                           action_labels));
  ASSIGN_OR_RETURN(m->action_end_,
                   registry->RegisterGauge(names::kPipelineActionEndSeconds.name,
                                           names::kPipelineActionEndSeconds.help,
                                           action_labels));
  ASSIGN_OR_RETURN(m->idle_, OnlyCounter(registry, names::kPipelineIdleSecondsTotal));
  ASSIGN_OR_RETURN(m->steps_, OnlyCounter(registry, names::kPipelineStepsTotal));
  ASSIGN_OR_RETURN(m->held_, OnlyGauge(registry, names::kPipelineMicroBatchesHeld));
  ASSIGN_OR_RETURN(m->held_bound_, OnlyGauge(registry, names::kPipelineMicroBatchesHeldBound));
  ASSIGN_OR_RETURN(m->rank_, OnlyGauge(registry, names::kPipelineRank));
  ASSIGN_OR_RETURN(m->bubble_formula_, OnlyGauge(registry, names::kPipelineBubbleFormula));
  ASSIGN_OR_RETURN(m->last_start_, OnlyGauge(registry, names::kPipelineLastStepStartSeconds));
  ASSIGN_OR_RETURN(m->last_seconds_, OnlyGauge(registry, names::kPipelineLastStepSeconds));
  return m;
}

void PipelineMetrics::SetSchedule(int pipeline_rank, int held_bound, double bubble_formula) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_->Set(pipeline_rank);
  held_bound_->Set(held_bound);
  bubble_formula_->Set(bubble_formula);
}

StatusOr<Counter*> PipelineMetrics::BusyOf(int stage) {
  auto it = busy_by_stage_.find(stage);
  if (it != busy_by_stage_.end()) return it->second;
  ASSIGN_OR_RETURN(Counter * counter, busy_->WithLabels({std::to_string(stage)}));
  busy_by_stage_.emplace(stage, counter);
  return counter;
}

Status PipelineMetrics::RecordStep(const PipelineStepRecord& step) {
  if (!(step.seconds >= 0) || !std::isfinite(step.seconds)) {
    return InvalidArgumentError("pipeline step record: the step's seconds must be finite and "
                                ">= 0, got " + std::to_string(step.seconds));
  }
  if (step.peak_held < 0) {
    return InvalidArgumentError("pipeline step record: peak_held must be >= 0, got " +
                                std::to_string(step.peak_held));
  }
  std::set<ActionKey> keys;
  for (const TimedAction& action : step.actions) {
    const std::string name = ActionName({action.op, action.stage, action.micro_batch});
    if (!IsComputeAction(action.op)) {
      return InvalidArgumentError("pipeline step record: action " + name +
                                  " is not a compute action (F, B, I or W)");
    }
    if (action.stage < 0 || action.micro_batch < 0) {
      return InvalidArgumentError("pipeline step record: action " + name +
                                  " has a negative stage or micro-batch");
    }
    // A little slack above the step's end: the front end reads its clock for the step after
    // the last action's.
    if (!(action.start_seconds >= 0) || !(action.end_seconds >= action.start_seconds) ||
        !(action.end_seconds <= step.seconds * (1 + 1e-9) + 1e-6)) {
      return InvalidArgumentError(
          "pipeline step record: action " + name + " runs from " +
          std::to_string(action.start_seconds) + " s to " + std::to_string(action.end_seconds) +
          " s, outside the step's 0 to " + std::to_string(step.seconds) + " s");
    }
    if (!keys.insert({action.op, action.stage, action.micro_batch}).second) {
      return InvalidArgumentError("pipeline step record: action " + name + " is listed twice");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t fresh = 0;
  for (const ActionKey& key : keys) fresh += actions_.count(key) == 0 ? 1 : 0;
  if (actions_.size() + fresh > kMaxActionSeries) {
    return InvalidArgumentError(
        "pipeline step record: " + std::to_string(actions_.size() + fresh) +
        " distinct actions would be kept, more than the " + std::to_string(kMaxActionSeries) +
        " the metrics page allows");
  }
  double busy = 0;
  for (const TimedAction& action : step.actions) {
    const ActionKey key{action.op, action.stage, action.micro_batch};
    auto it = actions_.find(key);
    if (it == actions_.end()) {
      const std::vector<std::string> labels = {OpLabel(action.op), std::to_string(action.stage),
                                               std::to_string(action.micro_batch)};
      ASSIGN_OR_RETURN(Gauge * start, action_start_->WithLabels(labels));
      ASSIGN_OR_RETURN(Gauge * end, action_end_->WithLabels(labels));
      it = actions_.emplace(key, ActionSeries{start, end}).first;
    }
    it->second.start->Set(action.start_seconds);
    it->second.end->Set(action.end_seconds);
    const double seconds = action.end_seconds - action.start_seconds;
    ASSIGN_OR_RETURN(Counter * stage_busy, BusyOf(action.stage));
    stage_busy->Increment(seconds);
    busy += seconds;
  }
  for (auto& [key, series] : actions_) {
    if (keys.count(key) != 0) continue;
    series.start->Set(std::numeric_limits<double>::quiet_NaN());
    series.end->Set(std::numeric_limits<double>::quiet_NaN());
  }
  idle_->Increment(std::max(0.0, step.seconds - busy));
  steps_->Increment();
  activation_bytes_->Increment(static_cast<double>(step.activation_bytes_sent));
  gradient_bytes_->Increment(static_cast<double>(step.gradient_bytes_sent));
  held_->Set(step.peak_held);
  last_start_->Set(step.start_unix_seconds);
  last_seconds_->Set(step.seconds);
  return OkStatus();
}

}  // namespace tessera::worker
