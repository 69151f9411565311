// Running a pipeline schedule on paper: each rank takes its actions in order, an action starts
// once what it needs is done (a recv waits for its send, a backward for its forward and for the
// next stage's gradient), and compute costs time. What PipelineSchedule::Make checks every
// schedule with, and what measures its bubble and memory.
//
//   ASSIGN_OR_RETURN(SimulatedSchedule run, SimulateSchedule(actions, stages, micro_batches));
//   run.bubble_fraction;  // idle share of ranks x run.makespan
//
// Thread-safety: a plain function.
#ifndef TESSERA_WORKER_PIPELINE_SCHEDULE_SIMULATION_H_
#define TESSERA_WORKER_PIPELINE_SCHEDULE_SIMULATION_H_

#include <vector>

#include "common/base/status.h"
#include "worker/pipeline/pipeline_schedule.h"

namespace tessera::worker {

// Time units per action; a whole backward costs backward_input + backward_weight. Messages
// cost nothing.
struct ScheduleCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

struct SimulatedSchedule {
  double makespan = 0;          // when the last rank finished
  std::vector<double> busy;     // by rank: time spent computing
  double bubble_fraction = 0;   // 1 - sum(busy) / (ranks x makespan)
  std::vector<int> peak_held;   // by rank: most micro-batches forwarded, not yet backwarded
};

// Runs `actions` (by rank; stage s on rank s mod ranks) of `stages` stages and `micro_batches`
// micro-batches. InvalidArgument naming the rank and the action for a list that is not a
// schedule: an action out of range or on the wrong rank, a forward or backward missing or
// repeated, a message missing, repeated or where none belongs, an action before what it needs
// on its own rank. FailedPrecondition "deadlock: ..." naming every waiting rank, its action
// and what that waits for, when no rank can go on.
StatusOr<SimulatedSchedule> SimulateSchedule(
    const std::vector<std::vector<PipelineAction>>& actions, int stages, int micro_batches,
    const ScheduleCosts& costs = {});

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_SCHEDULE_SIMULATION_H_
