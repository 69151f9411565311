// ConsistencyPolicy: the release rules of ps-sync, ps-async and ps-ssp for one part of a job
// that workers push to (a dense chunk or an embedding table): what a push does, when a waiting
// reply may go, and the staleness record. Pure logic: it holds no values, locks or sockets.
//
// Words: a part's `version` counts the updates it applied (ps-sync: the last step applied);
// a worker's `clock` is the last step it pushed to the part.
//
//   ps-sync   a push of step t is held until all W workers pushed step t; the last of them
//             makes the part apply the W gradients (summed in rank order, averaged) as
//             optimizer step t, and the version becomes t. The reply to a push of step t waits
//             until the version is t, so every worker sees the same values.
//   ps-async  each push is applied on arrival as the part's next update (version + 1); its
//             reply goes at once. A worker's second push of a step is a copy: nothing is
//             applied, and its reply goes with the values.
//   ps-ssp    applied as in ps-async, but the reply to a push of step t waits until the slowest
//             worker's clock is at least t - K (K = the job's staleness).
//   A pull of step t (no gradients) waits until the version is at least t - 1, in every model.
// ps-sync also refuses a worker's second push of a step, and a push of a step already applied
// that this worker pushed here. A backup (two copies of a part: its primary forwards each step
// it applies, Advance) answers a push of a step it applied that way with the values: the
// worker's reply from the primary was lost with the primary.
// A skip (a worker's gradients of step t held a NaN or Inf, --on-nonfinite skip) counts as its
// push of step t: in ps-sync the step is then dropped for every worker (nothing applied, the
// version still becomes t, so every reply goes with the values of step t - 1); elsewhere it
// applies nothing and moves only that worker's clock.
// Elastic jobs (issue 47): a worker that left (Leave) stops counting at once: ps-sync's steps
// wait only for the workers that still count, and a step whose last missing push was the
// leaver's is complete there and then (its gradient is the average of the pushes that came,
// the leaver's included if it pushed before going). A worker that joins (Join) counts from a
// given step on; ps-ssp's slowest clock is that of the workers that count.
//
//   ConsistencyPolicy policy(PsConsistency::kSync, /*num_workers=*/2, /*staleness=*/0);
//   ASSIGN_OR_RETURN(PushDecision push, policy.Push(rank, step));
//   if (push.action == PushAction::kApplyHeld) { ...apply step push.update... }
//   waiters.push_back(push.reply);   // later: if (policy.MayRelease(rule)) send
//
// Thread-safety: not thread-safe; its owner keeps it under the part's lock.
#ifndef TESSERA_SERVER_PS_CONSISTENCY_POLICY_H_
#define TESSERA_SERVER_PS_CONSISTENCY_POLICY_H_

#include <cstdint>
#include <map>
#include <vector>

#include "common/base/status.h"
#include "common/training/ps_job.h"

namespace tessera::server {

// When a waiting reply may be released. Default: at once.
struct ReleaseRule {
  int64_t min_version = -1;  // once the part's version is at least this (-1: any)
  int64_t min_clock = -1;    // ps-ssp: once the slowest worker's clock is at least this (-1: any)
  int64_t step = 0;          // ps-ssp: the push's step, for the staleness record
};

enum class PushAction {
  kHold,       // ps-sync: keep the gradient for step `update`; not every worker has pushed it
  kApplyHeld,  // ps-sync: the last one: apply every worker's gradient of step `update`
  kApplyNow,   // ps-async / ps-ssp: apply this gradient alone as update `update`
  kDropHeld,   // ps-sync: the last push of step `update`, which worker `skipped_by` skipped:
               // drop every held gradient of it, apply nothing
  kNone,       // ps-async / ps-ssp: a skip: nothing to apply
  kApplied,    // ps-sync: step `update` was applied here without this worker's push (a step
               // forwarded by the part's former primary, Advance): nothing to apply, the
               // reply goes with the values after it. ps-async / ps-ssp: a copy of a push
               // this worker made (its step is not above its clock): nothing to apply
};

struct PushDecision {
  PushAction action = PushAction::kHold;
  // The optimizer's 1-based step of the update (its learning rate is that of `update - 1`
  // updates applied, common/training/lr_schedule.h).
  int64_t update = 0;
  ReleaseRule reply;  // when the push's reply may go
  int skipped_by = -1;  // kDropHeld: the first worker that skipped the step
};

class ConsistencyPolicy {
 public:
  // REQUIRES: num_workers >= 1, staleness >= 0.
  ConsistencyPolicy(PsConsistency model, int num_workers, int64_t staleness);

  // A push of step `step` by worker `rank`; the caller must then do what the decision says.
  // ps-sync refuses with AlreadyExists a worker's second push of a step ("worker 0 pushed step
  // 3 twice") and a push of a step the part has applied already; nothing changes then.
  // ps-async and ps-ssp take a push of a step at or below the worker's clock as a copy
  // (kApplied; a skip's kNone).
  // REQUIRES: 0 <= rank < num_workers, step >= 1.
  StatusOr<PushDecision> Push(int rank, int64_t step);
  // Worker `rank`'s skip of step `step`: a push without gradients, refused as Push refuses.
  StatusOr<PushDecision> Skip(int rank, int64_t step);

  // A pull of the dense values after step `step` - 1.
  ReleaseRule Pull(int64_t step) const;
  // A pull of embedding rows: as Pull in ps-sync; at once otherwise (a table is pushed only by
  // workers that touched its rows, so outside ps-sync its version does not count steps).
  ReleaseRule RowPull(int64_t step) const;

  bool MayRelease(const ReleaseRule& rule) const;

  // The staleness record (ps-ssp). Spread: the fastest worker's clock minus the slowest's.
  // Lead: how many steps a reply released now runs ahead of the slowest worker (0 for a rule
  // without a clock condition).
  int64_t Spread() const;
  int64_t Lead(const ReleaseRule& rule) const;

  // ps-sync: step `step` was applied to the part elsewhere (its primary forwarded it): the
  // version becomes `step`, and pushes of it held here are answered as their step applied
  // (the caller drops their gradients). False, changing nothing, when the version is `step`
  // or later already (a copy of the forward). REQUIRES: version() >= step - 1.
  bool Advance(int64_t step);

  // The part was restored from a checkpoint of step `step`: its version and every worker's
  // clock are `step`, and nothing is held any more.
  void Restore(int64_t step);
  // ps-async, ps-ssp: the part was copied from another replica (a server that joined takes the
  // copy): its version and the workers' clocks are the copy's, and nothing is held.
  // REQUIRES: clocks.size() == num_workers.
  void Restore(int64_t version, std::vector<int64_t> clocks);

  // ps-sync: the workers whose push of `step` has not come, by rank (every worker that counts
  // for it when none has; none once the step is applied).
  std::vector<int> NotPushed(int64_t step) const;

  // Worker `rank` left the job (elastic): it no longer counts for any step, and its later
  // pushes are refused (FailedPrecondition naming it). ps-sync: the held steps this completes,
  // oldest first, each kApplyHeld (or kDropHeld when a worker skipped it); the caller applies
  // them as it would the last push's decision, then releases its waiting replies. Empty for the
  // other models, or when nothing was waiting only for it. Leaving twice changes nothing.
  // REQUIRES: 0 <= rank < num_workers.
  std::vector<PushDecision> Leave(int rank);
  // Worker `rank` (a place free since its former holder left, or never taken) counts from
  // step `first_step` on: steps before it neither wait for it nor take its pushes. Refused
  // (FailedPrecondition) when the rank counts already, or when `first_step` is not after the
  // version (a step applied cannot take a gradient any more). REQUIRES: 0 <= rank < num_workers.
  Status Join(int rank, int64_t first_step);
  // Whether worker `rank` counts for step `step`.
  bool Counts(int rank, int64_t step) const;
  // How many workers count for `step`.
  int CountingWorkers(int64_t step) const;

  PsConsistency model() const { return model_; }
  int64_t staleness() const { return staleness_; }
  int64_t version() const { return version_; }
  const std::vector<int64_t>& clocks() const { return clocks_; }  // by rank

 private:
  StatusOr<PushDecision> Arrive(int rank, int64_t step, bool skip);
  // ps-sync: whether every worker that counts for `step` pushed it, given who did.
  bool Complete(int64_t step, const std::vector<bool>& pushed) const;
  // The step's decision once Complete: apply (or drop) it; the version becomes `step`.
  PushDecision CompleteStep(int64_t step);
  int64_t SlowestClock() const;

  const PsConsistency model_;
  const int num_workers_;
  const int64_t staleness_;
  int64_t version_ = 0;
  std::vector<int64_t> clocks_;                  // by rank
  std::map<int64_t, std::vector<bool>> pushed_;  // ps-sync: who pushed a step not yet applied
  std::map<int64_t, int> skipped_by_;            // ps-sync: the first who skipped such a step
  // Elastic membership, by rank: whether the worker is in the job, and the first step it
  // counts for (0 for the workers the job started with).
  std::vector<bool> in_job_;
  std::vector<int64_t> first_step_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_CONSISTENCY_POLICY_H_
