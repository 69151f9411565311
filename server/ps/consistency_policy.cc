#include "server/ps/consistency_policy.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tessera::server {

ConsistencyPolicy::ConsistencyPolicy(PsConsistency model, int num_workers, int64_t staleness)
    : model_(model),
      num_workers_(num_workers),
      staleness_(staleness),
      clocks_(static_cast<size_t>(num_workers), 0),
      in_job_(static_cast<size_t>(num_workers), true),
      first_step_(static_cast<size_t>(num_workers), 0) {}

StatusOr<PushDecision> ConsistencyPolicy::Push(int rank, int64_t step) {
  return Arrive(rank, step, /*skip=*/false);
}

StatusOr<PushDecision> ConsistencyPolicy::Skip(int rank, int64_t step) {
  return Arrive(rank, step, /*skip=*/true);
}

StatusOr<PushDecision> ConsistencyPolicy::Arrive(int rank, int64_t step, bool skip) {
  PushDecision decision;
  if (!Counts(rank, step)) {
    // A leaver's push still in flight, or a joiner's before its first step: taking it would
    // let a worker the others no longer wait for (or do not wait for yet) change a step.
    return FailedPreconditionError(
        "worker " + std::to_string(rank) + " pushed step " + std::to_string(step) + ", but " +
        (in_job_[rank] ? "it counts only from step " + std::to_string(first_step_[rank])
                       : std::string("it left the job")));
  }
  if (model_ != PsConsistency::kSync) {
    if (model_ == PsConsistency::kSsp) {
      decision.reply.min_clock = step - staleness_;
      decision.reply.step = step;
    }
    // A worker's steps come in order, one push each: a step at or below its clock is a copy
    // (asked again of a backup that took the push from the former primary), applied once.
    if (step <= clocks_[rank]) {
      decision.action = skip ? PushAction::kNone : PushAction::kApplied;
      decision.update = version_;
      // Its reply carries every update here, so it waits, as theirs do, for the ones still
      // being forwarded (a chain's new primary may still be passing on the one it copies).
      if (!skip) decision.reply.min_version = version_;
      return decision;
    }
    clocks_[rank] = step;
    decision.action = skip ? PushAction::kNone : PushAction::kApplyNow;
    decision.update = skip ? version_ : ++version_;
    // Once the part has it: at once here; a forwarded update's reply waits for the backup too.
    if (!skip) decision.reply.min_version = decision.update;
    return decision;
  }
  // A step at or below the version was applied (or restored): a push of it would start a step
  // that nobody else pushes again, and apply it a second time if everybody did. One applied
  // without this worker's push here (forwarded, Advance) is its first push of the step here:
  // the worker lost its reply with the former primary and asks again.
  if (step <= version_ && clocks_[rank] < step) {
    clocks_[rank] = step;
    decision.action = PushAction::kApplied;
    decision.update = step;
    decision.reply.min_version = step;
    return decision;
  }
  if (step <= version_) {
    return AlreadyExistsError("worker " + std::to_string(rank) + " pushed step " +
                              std::to_string(step) + ", which is applied already (step " +
                              std::to_string(version_) + ")");
  }
  std::vector<bool>& pushed = pushed_[step];
  pushed.resize(static_cast<size_t>(num_workers_), false);
  if (pushed[rank]) {
    return AlreadyExistsError("worker " + std::to_string(rank) + " pushed step " +
                              std::to_string(step) + " twice");
  }
  pushed[rank] = true;
  if (skip) skipped_by_.emplace(step, rank);  // the first one's
  clocks_[rank] = std::max(clocks_[rank], step);
  decision.update = step;
  decision.reply.min_version = step;
  if (!Complete(step, pushed)) {
    decision.action = PushAction::kHold;
    return decision;
  }
  PushDecision completed = CompleteStep(step);
  completed.reply = decision.reply;
  return completed;
}

bool ConsistencyPolicy::Complete(int64_t step, const std::vector<bool>& pushed) const {
  bool any = false;
  for (int rank = 0; rank < num_workers_; ++rank) {
    const bool did = static_cast<size_t>(rank) < pushed.size() && pushed[rank];
    any |= did;
    if (Counts(rank, step) && !did) return false;
  }
  return any;  // a step nobody pushed has nothing to apply
}

PushDecision ConsistencyPolicy::CompleteStep(int64_t step) {
  PushDecision decision;
  decision.update = step;
  decision.reply.min_version = step;
  decision.action = PushAction::kApplyHeld;
  if (auto skipped = skipped_by_.find(step); skipped != skipped_by_.end()) {
    decision.action = PushAction::kDropHeld;
    decision.skipped_by = skipped->second;
    skipped_by_.erase(skipped);
  }
  pushed_.erase(step);
  version_ = std::max(version_, step);
  return decision;
}

std::vector<PushDecision> ConsistencyPolicy::Leave(int rank) {
  std::vector<PushDecision> completed;
  if (!in_job_[rank]) return completed;
  in_job_[rank] = false;
  if (model_ != PsConsistency::kSync) return completed;
  // Oldest first, as the pushes that completed them would have. (Workers push a step only
  // once the one before it is applied, so there is at most one held step in practice.)
  std::vector<int64_t> complete;
  for (const auto& [step, pushed] : pushed_) {
    if (Complete(step, pushed)) complete.push_back(step);
  }
  for (int64_t step : complete) completed.push_back(CompleteStep(step));
  return completed;
}

Status ConsistencyPolicy::Join(int rank, int64_t first_step) {
  if (in_job_[rank]) {
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " cannot join: that rank is in the job already");
  }
  if (first_step <= version_) {
    return FailedPreconditionError("worker " + std::to_string(rank) + " cannot join at step " +
                                   std::to_string(first_step) + ": step " +
                                   std::to_string(version_) + " is applied here already");
  }
  in_job_[rank] = true;
  first_step_[rank] = first_step;
  clocks_[rank] = first_step - 1;
  return OkStatus();
}

bool ConsistencyPolicy::Counts(int rank, int64_t step) const {
  return in_job_[rank] && step >= first_step_[rank];
}

int ConsistencyPolicy::CountingWorkers(int64_t step) const {
  int count = 0;
  for (int rank = 0; rank < num_workers_; ++rank) count += Counts(rank, step) ? 1 : 0;
  return count;
}

ReleaseRule ConsistencyPolicy::Pull(int64_t step) const {
  ReleaseRule rule;
  rule.min_version = step - 1;
  return rule;
}

ReleaseRule ConsistencyPolicy::RowPull(int64_t step) const {
  return model_ == PsConsistency::kSync ? Pull(step) : ReleaseRule{};
}

bool ConsistencyPolicy::MayRelease(const ReleaseRule& rule) const {
  if (rule.min_version >= 0 && version_ < rule.min_version) return false;
  if (rule.min_clock >= 0 && SlowestClock() < rule.min_clock) return false;
  return true;
}

int64_t ConsistencyPolicy::Spread() const {
  int64_t fastest = SlowestClock();
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (in_job_[rank]) fastest = std::max(fastest, clocks_[rank]);
  }
  return fastest - SlowestClock();
}

int64_t ConsistencyPolicy::Lead(const ReleaseRule& rule) const {
  return rule.min_clock >= 0 ? rule.step - SlowestClock() : 0;
}

bool ConsistencyPolicy::Advance(int64_t step) {
  if (step <= version_) return false;
  version_ = step;
  pushed_.erase(step);
  skipped_by_.erase(step);
  return true;
}

void ConsistencyPolicy::Restore(int64_t step) {
  version_ = step;
  std::fill(clocks_.begin(), clocks_.end(), step);
  pushed_.clear();
  skipped_by_.clear();
}

void ConsistencyPolicy::Restore(int64_t version, std::vector<int64_t> clocks) {
  version_ = version;
  clocks_ = std::move(clocks);
  pushed_.clear();
  skipped_by_.clear();
}

std::vector<int> ConsistencyPolicy::NotPushed(int64_t step) const {
  std::vector<int> missing;
  if (step <= version_) return missing;
  auto pushed = pushed_.find(step);
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (!Counts(rank, step)) continue;
    if (pushed == pushed_.end() || !pushed->second[static_cast<size_t>(rank)]) {
      missing.push_back(rank);
    }
  }
  return missing;
}

int64_t ConsistencyPolicy::SlowestClock() const {
  // A worker that left would hold the others back for ever: only those in the job count. With
  // nobody left, nothing waits: the fastest clock any worker reached.
  int64_t slowest = INT64_MAX;
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (in_job_[rank]) slowest = std::min(slowest, clocks_[rank]);
  }
  return slowest != INT64_MAX ? slowest : *std::max_element(clocks_.begin(), clocks_.end());
}

}  // namespace tessera::server
