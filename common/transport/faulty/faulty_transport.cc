#include "common/transport/faulty/faulty_transport.h"

#include <utility>

namespace tessera {

FaultyTransport::FaultyTransport(std::unique_ptr<Transport> inner, FaultOptions options)
    : inner_(std::move(inner)), options_(options), random_(options.seed) {
  timer_ = std::thread([this] { TimerLoop(); });
}

FaultyTransport::~FaultyTransport() { Shutdown(); }

Status FaultyTransport::Send(const std::string& address, OutgoingMessage message) {
  Outgoing outgoing;
  outgoing.address = address;
  outgoing.message = std::move(message);
  return Submit(std::move(outgoing));
}

Status FaultyTransport::Reply(const Origin& origin, OutgoingMessage message) {
  Outgoing outgoing;
  outgoing.is_reply = true;
  outgoing.origin = origin;
  outgoing.message = std::move(message);
  return Submit(std::move(outgoing));
}

void FaultyTransport::Disconnect(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  disconnected_.insert(address);
}

void FaultyTransport::Reconnect(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  disconnected_.erase(address);
}

// Forwarding happens under mu_, so a message released by the timer and one sent now cannot
// pass each other; the inner transport only queues, and never calls back into us.
Status FaultyTransport::Submit(Outgoing outgoing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return CancelledError("transport at " + inner_->address() + " is shut down");
  // Three draws per message whatever happens to it, so one fault does not shift the others.
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const bool drop = uniform(random_) < options_.drop_probability;
  const bool duplicate = uniform(random_) < options_.duplicate_probability;
  const bool delay = uniform(random_) < options_.delay_probability;
  const std::string& destination = outgoing.is_reply ? outgoing.origin.reply_to : outgoing.address;
  if (drop || disconnected_.count(destination) > 0) {
    ++dropped_;
    return OkStatus();  // lost on the way: the sender cannot tell
  }
  if (duplicate) ++duplicated_;
  const SteadyClock::time_point now = SteadyClock::now();
  SteadyClock::time_point due = now;
  if (delay) {
    ++delayed_;
    due += std::chrono::milliseconds(options_.delay_ms);
  }
  auto last = last_due_.find(destination);
  if (last != last_due_.end() && last->second > due) due = last->second;  // keep its order
  // Behind any message to the same destination still waiting for the timer, even one already
  // due: sent now, this one would overtake it.
  if (due > now || waiting_[destination] > 0) {
    last_due_[destination] = due;
    const int copies = duplicate ? 2 : 1;
    waiting_[destination] += copies;
    if (duplicate) later_.emplace(due, outgoing);
    later_.emplace(due, std::move(outgoing));
    cv_.notify_all();
    return OkStatus();
  }
  if (duplicate) RETURN_IF_ERROR(Forward(outgoing));
  return Forward(outgoing);
}

Status FaultyTransport::Forward(const Outgoing& outgoing) {
  return outgoing.is_reply ? inner_->Reply(outgoing.origin, outgoing.message)
                           : inner_->Send(outgoing.address, outgoing.message);
}

void FaultyTransport::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    if (later_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = later_.begin();
    if (SteadyClock::now() < first->first) {
      cv_.wait_until(lock, first->first);
      continue;
    }
    (void)Forward(first->second);  // a send failing now is a loss like any other
    const Outgoing& sent = first->second;
    --waiting_[sent.is_reply ? sent.origin.reply_to : sent.address];
    later_.erase(first);
  }
}

void FaultyTransport::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    later_.clear();
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  inner_->Shutdown();
}

}  // namespace tessera
