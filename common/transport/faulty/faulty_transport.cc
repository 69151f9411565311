#include "common/transport/faulty/faulty_transport.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace tessera {

StatusOr<FaultOptions> FaultOptions::Parse(std::string_view text) {
  FaultOptions options;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string part(text.substr(begin, end - begin));
    begin = end + 1;
    if (part.empty()) continue;
    const size_t equals = part.find('=');
    const std::string name = part.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : part.substr(equals + 1);
    const auto bad = [&](const std::string& why) {
      return InvalidArgumentError("faults \"" + std::string(text) + "\": \"" + part + "\" " + why);
    };
    char* rest = nullptr;
    errno = 0;
    if (name == "drop" || name == "duplicate" || name == "delay") {
      const double p = std::strtod(value.c_str(), &rest);
      if (value.empty() || *rest != '\0' || errno != 0 || !(p >= 0 && p <= 1)) {
        return bad("is not a probability in [0, 1]");
      }
      (name == "drop" ? options.drop_probability
                      : name == "duplicate" ? options.duplicate_probability
                                            : options.delay_probability) = p;
    } else if (name == "seed" || name == "delay_ms") {
      const unsigned long long n = std::strtoull(value.c_str(), &rest, 10);
      if (value.empty() || *rest != '\0' || errno != 0 || value[0] == '-' ||
          (name == "delay_ms" && n > 3600000)) {
        return bad(name == "seed" ? "is not a number" : "is not 0-3600000 ms");
      }
      if (name == "seed") {
        options.seed = n;
      } else {
        options.delay_ms = static_cast<int64_t>(n);
      }
    } else if (name == "sends") {
      if (value != "ps") return bad("names no kind of request (sends=ps)");
      options.send_types = {MessageType::kPsInitRequest, MessageType::kPsPushPullRequest,
                            MessageType::kSparsePushRequest, MessageType::kSparsePullRequest,
                            MessageType::kCheckpointRequest};
    } else {
      return bad("is not one of seed, drop, duplicate, delay, delay_ms, sends");
    }
  }
  return options;
}

std::string FaultOptions::ToString() const {
  std::ostringstream out;
  out << "seed " << seed << ", drop " << drop_probability << ", duplicate "
      << duplicate_probability << ", delay " << delay_probability << " (" << delay_ms << " ms)"
      << (send_types.empty() ? ", every message" : ", parameter-server requests and replies");
  return out.str();
}

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
  const std::string& to = outgoing.is_reply ? outgoing.origin.reply_to : outgoing.address;
  if (!outgoing.is_reply && !options_.send_types.empty() &&
      options_.send_types.count(TypeOf(outgoing.message.body)) == 0) {
    // Untouched, but never ahead of a delayed message to the same destination.
    if (waiting_[to] == 0) return Forward(outgoing);
    ++waiting_[to];
    later_.emplace(last_due_[to], std::move(outgoing));
    cv_.notify_all();
    return OkStatus();
  }
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
