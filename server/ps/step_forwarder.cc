#include "server/ps/step_forwarder.h"

#include <chrono>
#include <utility>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/messages/ps_messages.h"

namespace tessera::server {
namespace {

// How often the thread looks at the stop flag while a call is unanswered.
constexpr auto kStopCheck = std::chrono::milliseconds(100);

}  // namespace

StepForwarder::StepForwarder(RpcEndpoint* endpoint, const StepForwarderOptions& options)
    : endpoint_(endpoint), options_(options), thread_([this] { Loop(); }) {}

StepForwarder::~StepForwarder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepForwarder::Forward(const std::string& to, int range, uint64_t job_token,
                            DenseShard::ForwardedStep forwarded, Done done) {
  const int64_t step = forwarded.step;
  std::string what = (forwarded.pushed_by >= 0
                          ? "worker " + std::to_string(forwarded.pushed_by) + "'s push of step "
                          : std::string("step ")) +
                     std::to_string(step) + " of range " + std::to_string(range) + " (" +
                     std::to_string(forwarded.gradients.size()) + " chunks) forwarded by server " +
                     std::to_string(options_.server_rank) + " to its backup at " + to;
  PsPushPullRequest request;
  request.has_gradients = forwarded.dropped_by < 0;
  request.tensors = std::move(forwarded.gradients);
  request.job_token = job_token;
  request.range = range;
  request.forwarded = true;
  request.dropped_by = forwarded.dropped_by;
  request.stopped_by = forwarded.stopped_by;
  request.joining = forwarded.joining;
  request.pushed_by = forwarded.pushed_by;
  request.updates = std::move(forwarded.updates);
  Send(to, std::move(request), step, std::move(what), std::move(done));
}

void StepForwarder::ForwardRows(const std::string& to, int range, SparseTables::ForwardedRows rows,
                                Done done) {
  std::string what = "worker " + std::to_string(rows.pushed_by) + "'s push of step " +
                     std::to_string(rows.step) + " to table '" + rows.table + "' of range " +
                     std::to_string(range) + " (update " + std::to_string(rows.update) +
                     ") forwarded by server " + std::to_string(options_.server_rank) +
                     " to its backup at " + to;
  SparsePushRequest request{std::move(rows.table), std::move(rows.row_ids), std::move(rows.values),
                            range};
  request.forwarded = true;
  request.pushed_by = rows.pushed_by;
  request.update = rows.update;
  Send(to, std::move(request), rows.step, std::move(what), std::move(done));
}

void StepForwarder::Send(const std::string& to, MessageBody request, int64_t step, std::string what,
                         Done done) {
  Pending pending{to, what, {}, std::move(done)};
  {
    // The call is made under the lock that PeerLost marks the backup lost under, before it
    // fails the calls to it: either this sees the backup lost, or PeerLost fails this call
    // (else a forward sent as its backup was declared failed waits out the whole timeout).
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_.count(to) > 0) {
      // The range lives here alone now: done, on the thread like every other update.
      std::promise<StatusOr<Envelope>> gone;
      gone.set_value(AbortedError(to + " was declared failed"));
      pending.reply = gone.get_future().share();
    } else {
      pending.reply = endpoint_->CallAsync(to, std::move(request), step,
                                           Deadline::AfterMillis(options_.timeout_ms), what,
                                           options_.resend_ms);
    }
    pending_.push_back(std::move(pending));
  }
  cv_.notify_all();
}

void StepForwarder::PeerLost(const std::string& address, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.insert(address).second) return;
  }
  endpoint_->FailCallsTo(address, AbortedError(why));
}

void StepForwarder::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    Pending pending = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    while (pending.reply.wait_for(kStopCheck) != std::future_status::ready) {
      lock.lock();
      const bool stopping = stopping_;
      lock.unlock();
      if (stopping) return;
    }
    const StatusOr<Envelope>& result = pending.reply.get();
    Status refused = OkStatus();
    if (!result.ok()) {
      lock.lock();
      const bool lost = !lost_.insert(pending.to).second;
      lock.unlock();
      if (lost) {
        // The coordinator's notice, which every process logs, said so already.
        TLOG(DEBUG) << pending.what << ": the backup is gone (" << result.status().message()
                    << "); the range lives on this server alone";
      } else {
        refused = result.status().WithContext(pending.what);
        TLOG(ERROR) << refused.message() << "; no further step goes there";
      }
    }
    pending.done(refused);
    lock.lock();
  }
}

}  // namespace tessera::server
