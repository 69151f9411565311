#include "server/ps/step_forwarder.h"

#include <chrono>
#include <list>
#include <utility>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/messages/ps_messages.h"
#include "server/ps/forward_chain.h"

namespace tessera::server {
namespace {

// How often the thread looks at the stop flag while a call is unanswered.
constexpr auto kStopCheck = std::chrono::milliseconds(100);

// The copies after the one `request` goes to, for it to forward on to.
void SetForwardTo(MessageBody* request, const std::string& rest) {
  if (auto* push_pull = std::get_if<PsPushPullRequest>(request)) {
    push_pull->forward_to = rest;
  } else if (auto* rows = std::get_if<SparsePushRequest>(request)) {
    rows->forward_to = rest;
  }
}

}  // namespace

StepForwarder::StepForwarder(RpcEndpoint* endpoint, const StepForwarderOptions& options)
    : endpoint_(endpoint), options_(options), thread_([this] { Loop(); }) {}

StepForwarder::~StepForwarder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wakeup_->Signal();
  thread_.join();
}

void StepForwarder::Forward(const std::string& chain, int range, uint64_t job_token,
                            DenseShard::ForwardedStep forwarded, Done done) {
  const int64_t step = forwarded.step;
  std::string update = (forwarded.pushed_by >= 0
                            ? "worker " + std::to_string(forwarded.pushed_by) + "'s push of step "
                            : std::string("step ")) +
                       std::to_string(step) + " of range " + std::to_string(range) + " (" +
                       std::to_string(forwarded.gradients.size()) +
                       " chunks) forwarded by server " + std::to_string(options_.server_rank);
  PsPushPullRequest request;
  request.has_gradients = forwarded.dropped_by < 0;
  request.tensors = std::move(forwarded.gradients);
  request.in_region = forwarded.in_region;
  request.job_token = job_token;
  request.range = range;
  request.forwarded = true;
  request.dropped_by = forwarded.dropped_by;
  request.stopped_by = forwarded.stopped_by;
  request.joining = forwarded.joining;
  request.pushed_by = forwarded.pushed_by;
  request.updates = std::move(forwarded.updates);
  Send(chain, std::move(request), step, std::move(update), std::move(done));
}

void StepForwarder::ForwardRows(const std::string& chain, int range,
                                SparseTables::ForwardedRows rows, Done done) {
  std::string update = "worker " + std::to_string(rows.pushed_by) + "'s push of step " +
                       std::to_string(rows.step) + " to table '" + rows.table + "' of range " +
                       std::to_string(range) + " (update " + std::to_string(rows.update) +
                       ") forwarded by server " + std::to_string(options_.server_rank);
  SparsePushRequest request{std::move(rows.table), std::move(rows.row_ids), std::move(rows.values),
                            range};
  request.forwarded = true;
  request.pushed_by = rows.pushed_by;
  request.update = rows.update;
  Send(chain, std::move(request), rows.step, std::move(update), std::move(done));
}

void StepForwarder::Send(const std::string& chain, MessageBody request, int64_t step,
                         std::string update, Done done) {
  Pending pending;
  pending.done = std::move(done);
  {
    // The call is made under the lock that PeerLost marks the backup lost under, before it
    // fails the calls to it: either this sees the backup lost, or PeerLost fails this call
    // (else a forward sent as its backup was declared failed waits out the whole timeout).
    std::lock_guard<std::mutex> lock(mu_);
    std::string rest = chain;
    while (!rest.empty()) {
      auto [first, after] = SplitChain(rest);
      rest = std::move(after);
      if (pending.to.empty()) pending.to = first;  // named when every copy is gone
      if (lost_.count(first) == 0) {
        pending.to = std::move(first);
        break;
      }
    }
    pending.what = update + " to its backup at " + pending.to;
    if (lost_.count(pending.to) > 0) {
      // The range lives here alone now: done, on the thread like every other update.
      std::promise<StatusOr<Envelope>> gone;
      gone.set_value(AbortedError(pending.to + " was declared failed"));
      pending.reply = gone.get_future().share();
    } else {
      // What it forwards on to (a forward sent on past a failed copy names fewer).
      SetForwardTo(&request, rest);
      if (!rest.empty()) {
        // Kept to go on to the next copy if this one fails first (the frames are shared).
        pending.request = request;
        pending.rest = std::move(rest);
        pending.step = step;
        pending.update = std::move(update);
      }
      pending.reply = endpoint_->CallAsync(
          pending.to, std::move(request), step, Deadline::AfterMillis(options_.timeout_ms),
          pending.what, options_.resend_ms, [wakeup = wakeup_] { wakeup->Signal(); });
    }
    pending_.push_back(std::move(pending));
  }
  wakeup_->Signal();
}

void StepForwarder::PeerLost(const std::string& address, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.insert(address).second) return;
  }
  endpoint_->FailCallsTo(address, AbortedError(why));
}

void StepForwarder::Wakeup::Signal() {
  {
    std::lock_guard<std::mutex> lock(mu);
    ++signals;
  }
  cv.notify_one();
}

// The calls are finished as they are answered, not in the order sent: in a chain a primary's
// forward is acknowledged only once the middle copy passed it on, and the middle's forward on
// may wait here behind this server's own forward as a primary, which waits in turn on a third
// server (each server is primary, middle and last of different ranges).
void StepForwarder::Loop() {
  std::list<Pending> waiting;  // this thread's
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(wakeup_->mu);
      wakeup_->cv.wait_for(lock, kStopCheck, [&] { return wakeup_->signals != seen; });
      seen = wakeup_->signals;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      while (!pending_.empty()) {
        waiting.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (it->reply.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++it;
        continue;
      }
      Finish(std::move(*it));
      it = waiting.erase(it);
    }
  }
}

void StepForwarder::Finish(Pending pending) {
  const StatusOr<Envelope>& result = pending.reply.get();
  Status refused = OkStatus();
  if (!result.ok()) {
    bool lost = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost = !lost_.insert(pending.to).second;
    }
    if (lost && !pending.rest.empty()) {
      // A middle copy of the chain failed before it acknowledged: the next one gets the
      // update from here (it skips it if the failed one passed it on already).
      TLOG(INFO) << pending.what << ": the backup is gone (" << result.status().message()
                 << "); sending it on to " << pending.rest;
      Send(pending.rest, std::move(pending.request), pending.step, std::move(pending.update),
           std::move(pending.done));
      return;
    }
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
}

}  // namespace tessera::server
