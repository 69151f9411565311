// Pipeline schedules (issue 46, item 1): for each process of a pipeline, the ordered list of
// what it does in one training step, used by the native trainer and the PyTorch front end.
//
//   ASSIGN_OR_RETURN(PipelineSchedule schedule,
//                    PipelineSchedule::Make(ScheduleKind::k1F1B, {/*ranks=*/4, /*micro=*/8}));
//   for (const PipelineAction& action : schedule.actions(my_pipeline_rank)) { ... }
//   schedule.bubble_fraction();      // 0.27: the share of the step the ranks sit idle
//   schedule.peak_held(rank);        // micro-batches whose activations the rank holds at once
//
// Words:
//   rank        a process of the pipeline, 0 .. P-1 (its place in the pipeline group).
//   stage       a contiguous piece of the model, 0 .. S-1 with S = P x V: stage s runs on rank
//               s mod P, so with V stages per rank (interleaved) rank r holds r, r+P, ...
//   micro-batch one of the M pieces the step's batch is cut into, 0 .. M-1.
//   F, B        the forward and the backward of one stage on one micro-batch; the zero-bubble
//               schedule splits B into I (the gradient of the stage's input, what the stage
//               before waits for) and W (the gradients of its weights, which nobody waits for
//               and so fill what would be idle time).
//   send, recv  of an activation (F's output to the next stage) or of a gradient (B's or I's
//               input gradient to the stage before), listed where a rank does them: a recv just
//               before the action that needs it, a send just after the one that made it. Only
//               between stages on different ranks; sends never wait (the transport queues).
//
// The schedules, as in PyTorch's torch.distributed.pipelining (whose orders these follow, so
// that a program moved from it behaves the same):
//   gpipe        every forward (micro-batches in order), then every backward. Holds all M.
//   1f1b         rank r runs P-r forwards, then alternates one backward and one forward, then
//                the remaining backwards: the same bubble as GPipe, at most P-r held.
//                Needs M >= P.
//   interleaved  1F1B over V >= 1 stages per rank (Narayanan et al. 2021, "depth first"): the
//                bubble shrinks about V-fold for more messages. Needs M a multiple of P.
//   zb-h1        1F1B with B split into I and W (Qi et al. 2023, ZB-H1): rank r runs its first
//                r backwards' W late, where 1F1B would wait, and the rest right after their I;
//                at most 1F1B's memory (P held), 0.36-0.41x its bubble for P of 2 to 8 and M of
//                8 and 16 (F, I and W of equal cost). Needs M >= P.
// A shape a schedule cannot run is refused by Make, naming why. Make also runs the schedule
// (schedule_simulation.h) and refuses one that would deadlock or leave a dependency unmet,
// which the unit tests check over many shapes.
//
// Thread-safety: a PipelineSchedule is immutable after Make.
#ifndef TESSERA_WORKER_PIPELINE_PIPELINE_SCHEDULE_H_
#define TESSERA_WORKER_PIPELINE_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera::worker {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "zb-h1" (the --pipeline-schedule names).
std::string ScheduleKindName(ScheduleKind kind);
// The kind of one of those names; InvalidArgument listing them otherwise.
StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name);

enum class PipelineOp : uint8_t {
  kForward,
  kBackward,        // the whole backward (input and weight gradients)
  kBackwardInput,   // zero-bubble: the input's gradient only
  kBackwardWeight,  // zero-bubble: the weights' gradients
  kRecvActivation,  // the previous stage's output for this stage's forward
  kSendActivation,  // this stage's output to the next stage
  kRecvGradient,    // the next stage's input gradient for this stage's backward
  kSendGradient,    // this stage's input gradient to the previous stage
};

struct PipelineAction {
  PipelineOp op = PipelineOp::kForward;
  int stage = 0;
  int micro_batch = 0;
  friend bool operator==(const PipelineAction& a, const PipelineAction& b) {
    return a.op == b.op && a.stage == b.stage && a.micro_batch == b.micro_batch;
  }
};

// F, B, I and W: what computes (the rest move messages).
bool IsComputeAction(PipelineOp op);

// torch's notation: "2F0" (stage 2's forward of micro-batch 0), "1B3", "0I1", "0W1",
// "3RECV_F0", "2SEND_F0", "1RECV_B3", "2SEND_B3".
std::string ActionName(const PipelineAction& action);

struct PipelineShape {
  int ranks = 1;            // P
  int micro_batches = 1;    // M
  int stages_per_rank = 1;  // V (interleaved only; the others take 1)
};

class PipelineSchedule {
 public:
  // The schedule of `kind` for `shape`, checked by running it; InvalidArgument naming the
  // schedule, the shape and why for a shape it cannot run.
  static StatusOr<PipelineSchedule> Make(ScheduleKind kind, const PipelineShape& shape);

  ScheduleKind kind() const { return kind_; }
  const PipelineShape& shape() const { return shape_; }
  int stages() const { return shape_.ranks * shape_.stages_per_rank; }
  int RankOf(int stage) const { return stage % shape_.ranks; }
  // Rank `rank`'s actions in the order it runs them.
  const std::vector<PipelineAction>& actions(int rank) const {
    return actions_[static_cast<size_t>(rank)];
  }
  const std::vector<std::vector<PipelineAction>>& all_actions() const { return actions_; }

  // From running the schedule with a forward taking 1 time unit and a backward 2 (an input
  // gradient 1 and a weight gradient 1), messages free: the share of P x the step's length in
  // which ranks are idle, and the most (stage, micro-batch) pairs a rank holds activations for
  // at once, from the forward to the backward (or to the weight gradient). With V stages per
  // rank each pair is a stage's: 1/V of the rank's layers.
  double bubble_fraction() const { return bubble_fraction_; }
  int peak_held(int rank) const { return peak_held_[static_cast<size_t>(rank)]; }

  // "1f1b, 4 ranks, 8 micro-batches" (", 2 stages per rank" when more than one).
  std::string Describe() const;

 private:
  PipelineSchedule() = default;

  ScheduleKind kind_ = ScheduleKind::kGPipe;
  PipelineShape shape_;
  std::vector<std::vector<PipelineAction>> actions_;  // by rank
  double bubble_fraction_ = 0;
  std::vector<int> peak_held_;  // by rank
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_PIPELINE_SCHEDULE_H_
