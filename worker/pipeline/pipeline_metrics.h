// PipelineMetrics: the Prometheus instruments of one pipeline rank, fed once per step by
// whichever front end ran the step (the native trainer or tessera.torch.pipelining), so that
// the dashboard can draw the last step as a timeline (issue 46, item 6):
//
//   tessera_pipeline_busy_seconds_total{stage}      seconds computing the stage's F, B, I, W
//   tessera_pipeline_idle_seconds_total             the rest of every step: the bubble
//   tessera_pipeline_steps_total
//   tessera_pipeline_sent_bytes_total{kind}         activation, gradient
//   tessera_pipeline_micro_batches_held             the last step's most held at once
//   tessera_pipeline_micro_batches_held_bound       the schedule's bound for this rank
//   tessera_pipeline_rank, tessera_pipeline_bubble_formula
//   tessera_pipeline_last_step_start_seconds        Unix time of the last step's start
//   tessera_pipeline_last_step_seconds
//   tessera_pipeline_action_{start,end}_seconds{op,stage,micro_batch}
//                                                   the last step's compute actions, in
//                                                   seconds after its start
//
// A step's actions replace the last step's: a series of an action the new step did not run
// (a forward-only step has no B) reads NaN, which the dashboard leaves out. At most
// kMaxActionSeries distinct actions are kept, so a long-lived process cannot grow its page
// without bound.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<PipelineMetrics> metrics,
//                    PipelineMetrics::Register(registry));
//   metrics->SetSchedule(/*pipeline_rank=*/1, schedule.peak_held(1), schedule.bubble_fraction());
//   RETURN_IF_ERROR(metrics->RecordStep(step));   // after every step
//
// Thread-safety: every member function from any thread (one mutex; a step's record is a few
// dozen gauge writes).
#ifndef TESSERA_WORKER_PIPELINE_PIPELINE_METRICS_H_
#define TESSERA_WORKER_PIPELINE_PIPELINE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "worker/pipeline/pipeline_schedule.h"

namespace tessera::worker {

// One compute action (F, B, I or W) as it ran.
struct TimedAction {
  PipelineOp op = PipelineOp::kForward;
  int stage = 0;
  int micro_batch = 0;
  double start_seconds = 0;  // after the step's start
  double end_seconds = 0;
};

struct PipelineStepRecord {
  double start_unix_seconds = 0;
  double seconds = 0;  // the step's wall time
  std::vector<TimedAction> actions;  // the step's compute actions, in any order
  uint64_t activation_bytes_sent = 0;
  uint64_t gradient_bytes_sent = 0;
  int peak_held = 0;
};

class PipelineMetrics {
 public:
  static constexpr size_t kMaxActionSeries = 4096;

  // Registers (or finds) the families in `registry`, which must outlive the result.
  static StatusOr<std::unique_ptr<PipelineMetrics>> Register(MetricsRegistry* registry);

  // What the schedule says of this rank.
  void SetSchedule(int pipeline_rank, int held_bound, double bubble_formula);

  // Adds one finished step. InvalidArgument, naming the action, for an action that is not a
  // compute action, has a negative stage or micro-batch, or times outside [0, seconds] or
  // ending before it starts; or when the step would make more than kMaxActionSeries distinct
  // actions. Nothing is recorded then.
  Status RecordStep(const PipelineStepRecord& step);

 private:
  PipelineMetrics() = default;

  using ActionKey = std::tuple<PipelineOp, int, int>;  // op, stage, micro-batch
  struct ActionSeries {
    Gauge* start = nullptr;
    Gauge* end = nullptr;
  };
  StatusOr<Counter*> BusyOf(int stage);  // mu_

  GaugeFamily* action_start_ = nullptr;
  GaugeFamily* action_end_ = nullptr;
  CounterFamily* busy_ = nullptr;
  Counter* idle_ = nullptr;
  Counter* steps_ = nullptr;
  Counter* activation_bytes_ = nullptr;
  Counter* gradient_bytes_ = nullptr;
  Gauge* held_ = nullptr;
  Gauge* held_bound_ = nullptr;
  Gauge* rank_ = nullptr;
  Gauge* bubble_formula_ = nullptr;
  Gauge* last_start_ = nullptr;
  Gauge* last_seconds_ = nullptr;

  std::mutex mu_;
  std::map<ActionKey, ActionSeries> actions_;  // every action series made; mu_
  std::map<int, Counter*> busy_by_stage_;      // mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_PIPELINE_METRICS_H_
