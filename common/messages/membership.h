// Membership of an elastic job (issue 47): each worker that leaves or joins a running job is a
// membership epoch, which the coordinator records, exports and tells every live process, and
// which tessera-launch --membership-log writes as a JSON line.
//
//   MembershipHistory history(/*min_workers=*/2, /*max_workers=*/4, /*initial_workers=*/4);
//   ASSIGN_OR_RETURN(MembershipChange left,
//                    history.Leave(2, MembershipKind::kKilled, "SIGKILL", /*step=*/40, now));
//   if (history.BelowMinimum()) ... stop the job with history.StopReason(left) ...
//   StatusOr<MembershipChange> joined = history.Join(/*rank=*/2, /*step=*/57, now);
//
// Epoch 0 is the job's start (its initial workers); every change adds one. `step` is the last
// step the job completed when the change was recorded: a leaver is missing from step + 1 on, a
// joiner counts from step + 1 on (ps modes: ConsistencyPolicy::Join). Items 3 and 5 of issue 47
// (rings re-formed, PyTorch) build on the same record: a process that learns of an epoch knows
// who went or came, why and after which step.
//
// Thread-safety: MembershipHistory is not thread-safe (the coordinator's Run thread owns it).
#ifndef TESSERA_COMMON_MESSAGES_MEMBERSHIP_H_
#define TESSERA_COMMON_MESSAGES_MEMBERSHIP_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

enum class MembershipKind {
  kJoin,    // a worker joined (tessera-worker --join, tessera-launch --add-workers)
  kExit,    // a worker left cleanly (its goodbye)
  kKilled,  // a worker's process died or went silent without a word (a signal, a crash)
  kError,   // a worker stopped because of an error, which `reason` quotes
};

// "join", "exit", "killed", "error": the log's and the metric's label values.
const char* MembershipKindName(MembershipKind kind);
StatusOr<MembershipKind> ParseMembershipKind(const std::string& name);

struct MembershipChange {
  uint64_t epoch = 0;
  int64_t step = 0;  // the last step completed when the change was recorded
  MembershipKind kind = MembershipKind::kJoin;
  int rank = -1;       // the worker that left or joined
  std::string reason;  // why (the goodbye's text, the error, "process gone", "join")
  int world_size = 0;  // workers in the job after the change
  double unix_time_s = 0;
};

// One line of JSON without the newline: {"epoch":3,"step":40,"kind":"killed","rank":2,
// "reason":"...","world_size":3,"time":1765123456.25}.
std::string MembershipJsonLine(const MembershipChange& change);
// Its inverse; InvalidArgument naming the field that is missing or of the wrong type.
StatusOr<MembershipChange> ParseMembershipJsonLine(const std::string& line);
// For logs and errors: "membership epoch 3: worker 2 left after step 40 (killed: SIGKILL);
// 3 workers now".
std::string DescribeMembershipChange(const MembershipChange& change);

class MembershipHistory {
 public:
  // REQUIRES: 1 <= min_workers <= initial_workers <= max_workers (validated by the flags).
  MembershipHistory(int min_workers, int max_workers, int initial_workers);

  // Worker `rank` left. FailedPrecondition when it is not in the job (a second report of the
  // same loss changes nothing).
  StatusOr<MembershipChange> Leave(int rank, MembershipKind kind, const std::string& reason,
                                   int64_t step, double unix_time_s);
  // A worker asks to join: ResourceExhausted naming both numbers when the job has
  // max_workers already ("join refused: the job has 4 workers, --max-workers 4"); else it
  // takes `rank`, which must not be in the job (FailedPrecondition).
  StatusOr<MembershipChange> Join(int rank, int64_t step, double unix_time_s);
  // The lowest rank below max_workers not in the job (a joiner's), or -1 when it is full.
  int FreeRank() const;

  // Whether fewer than min_workers are in the job or left it cleanly: a worker that finished
  // (or chose to leave) did its part, and in ps-async the fast ones finish long before the
  // slow ones; only failures (killed, error) can take a job below its minimum.
  bool BelowMinimum() const { return world_size() + exited_ < min_workers_; }
  // Why a job below its minimum stops, naming the change that took it there and the last
  // checkpoint (empty: not known here, not mentioned), e.g. "the job has 1 worker, below
  // --min-workers 2, since membership epoch 3: worker 2 left after step 40 (killed: SIGKILL);
  // 1 worker now; last checkpoint: ...".
  std::string StopReason(const MembershipChange& cause, const std::string& checkpoint) const;

  uint64_t epoch() const { return changes_.empty() ? 0 : changes_.back().epoch; }
  int world_size() const { return static_cast<int>(in_job_.size()); }
  const std::set<int>& in_job() const { return in_job_; }
  const std::vector<MembershipChange>& changes() const { return changes_; }
  int min_workers() const { return min_workers_; }
  int max_workers() const { return max_workers_; }

 private:
  const int min_workers_;
  const int max_workers_;
  std::set<int> in_job_;
  int exited_ = 0;  // workers that left cleanly (MembershipKind::kExit)
  std::vector<MembershipChange> changes_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_MEMBERSHIP_H_
