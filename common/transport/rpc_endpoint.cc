#include "common/transport/rpc_endpoint.h"

#include <array>
#include <chrono>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/metrics/metric_names.h"

namespace tessera {
namespace {

// The child of `family` labelled with `type`'s name, looked up on first use and kept in
// `cache`; null without a family (or when the lookup failed).
template <typename Child, typename Family>
Child* ChildOfType(Family* family, std::array<Child*, kMessageTypeCount>& cache,
                   MessageType type) {
  if (family == nullptr) return nullptr;
  Child*& child = cache[static_cast<size_t>(type)];
  if (child == nullptr) {
    auto found = family->WithLabels({std::string(MessageTypeName(type))});
    if (found.ok()) child = *found;
  }
  return child;
}

}  // namespace

// Completes `call`, dropping its copy for resending first: the request's payloads belong to
// their owner again as soon as the caller can see the reply (the call itself may be held a
// moment longer, e.g. by the expiry thread).
void RpcEndpoint::Settle(PendingCall& call, StatusOr<Envelope> result) {
  call.resend.reset();
  call.promise.set_value(std::move(result));
  if (call.settled != nullptr) call.settled();
}

StatusOr<std::unique_ptr<RpcEndpoint>> RpcEndpoint::Start(std::unique_ptr<Transport> transport,
                                                          std::optional<Role> role, int32_t rank,
                                                          MetricsRegistry* metrics) {
  if (transport == nullptr) return InvalidArgumentError("RpcEndpoint::Start: no transport");
  std::unique_ptr<RpcEndpoint> endpoint(new RpcEndpoint());
  endpoint->identity_.Set(role, rank);
  if (role.has_value()) transport->SetIdentity(*role, rank);
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(endpoint->latency_family_,
                     metrics->RegisterHistogram(metric_names::kRpcLatencySeconds.name,
                                                metric_names::kRpcLatencySeconds.help, {"type"},
                                                DefaultLatencyBuckets()));
    ASSIGN_OR_RETURN(endpoint->resent_family_,
                     metrics->RegisterCounter(metric_names::kRpcResentTotal.name,
                                              metric_names::kRpcResentTotal.help, {"type"}));
  }
  RpcEndpoint* raw = endpoint.get();
  endpoint->transport_ = std::move(transport);
  RETURN_IF_ERROR(endpoint->transport_->Start(
      [raw](Envelope envelope) { raw->OnMessage(std::move(envelope)); }));
  endpoint->expire_thread_ = std::thread([raw] { raw->ExpireLoop(); });
  return endpoint;
}

RpcEndpoint::~RpcEndpoint() { Shutdown(); }

void RpcEndpoint::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  expire_cv_.notify_all();
  if (expire_thread_.joinable()) expire_thread_.join();
  if (transport_) transport_->Shutdown();  // no handler runs after this
  std::map<uint64_t, std::shared_ptr<PendingCall>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  for (auto& [id, call] : pending) {
    Settle(*call,
        CancelledError(call->what + ": endpoint shut down before " + call->address + " replied"));
  }
}

void RpcEndpoint::SetIdentity(Role role, int32_t rank) {
  identity_.Set(role, rank);
  transport_->SetIdentity(role, rank);
}

void RpcEndpoint::SetHandler(MessageType type, MessageHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[type] = std::move(handler);
}

void RpcEndpoint::ClearHandler(MessageType type) { ReplaceHandler(type, nullptr); }

void RpcEndpoint::ReplaceHandler(MessageType type, MessageHandler handler) {
  std::unique_lock<std::mutex> lock(mu_);
  if (handler) {
    handlers_[type] = std::move(handler);
  } else {
    handlers_.erase(type);
  }
  handlers_idle_cv_.wait(lock, [this] { return handlers_running_ == 0; });
}

std::shared_future<StatusOr<Envelope>> RpcEndpoint::CallAsync(
    const std::string& address, MessageBody request, int64_t step, Deadline deadline,
    std::string_view what, int64_t resend_after_ms, std::function<void()> settled) {
  const uint64_t request_id = next_request_id_.fetch_add(1);
  auto call = std::make_shared<PendingCall>();
  call->settled = std::move(settled);
  call->address = address;
  call->what = std::string(what);
  call->deadline = deadline;
  call->timeout_ms = deadline.RemainingMillis();
  call->started = SteadyClock::now();
  if (resend_after_ms > 0) {
    call->resend = OutgoingMessage{request_id, step, request};  // shares the payloads
    call->resend_wait = std::chrono::milliseconds(resend_after_ms);
    call->resend_max_ms = resend_after_ms * kMaxResendFactor;
    call->next_resend = call->started + call->resend_wait;
  }
  std::shared_future<StatusOr<Envelope>> future = call->promise.get_future().share();
  bool wake_expiry = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      Settle(*call, CancelledError(call->what + ": endpoint is shut down"));
      return future;
    }
    if (!failure_.ok()) {
      Settle(*call, failure_.WithContext(call->what + " not sent"));
      return future;
    }
    if (!pending_.emplace(request_id, call).second) {
      Settle(*call,
          InternalError(call->what + ": request id " + std::to_string(request_id) + " reused"));
      return future;
    }
    // The expiry thread sleeps until the earliest deadline; wake it only to move that earlier
    // (one wake-up per call would cost a context switch per request).
    const SteadyClock::time_point next = NextEvent(*call);
    wake_expiry = next < next_expiry_;
    if (wake_expiry) next_expiry_ = next;
  }
  if (wake_expiry) expire_cv_.notify_all();
  Status sent = transport_->Send(address, OutgoingMessage{request_id, step, std::move(request)});
  if (!sent.ok()) Complete(request_id, sent.WithContext(call->what));
  return future;
}

StatusOr<Envelope> RpcEndpoint::Call(const std::string& address, MessageBody request,
                                     int64_t step, Deadline deadline, std::string_view what,
                                     int64_t resend_after_ms) {
  return CallAsync(address, std::move(request), step, deadline, what, resend_after_ms).get();
}

void RpcEndpoint::Reply(const Envelope& request, MessageBody reply) {
  const MessageType type = TypeOf(reply);
  Status sent = transport_->Reply(
      request.origin, OutgoingMessage{request.header.request_id, -1, std::move(reply)});
  if (!sent.ok()) {
    TLOG(WARNING) << "cannot answer " << MessageTypeName(request.type()) << " from "
                  << request.header.DescribeSender() << " with a " << MessageTypeName(type)
                  << ": " << sent;
  }
}

void RpcEndpoint::ReplyError(const Envelope& request, const Status& status) {
  Reply(request, ErrorReplyOf(status));
}

void RpcEndpoint::FailAll(const Status& status) {
  std::map<uint64_t, std::shared_ptr<PendingCall>> pending;
  Status root;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = status;
    root = failure_;
    pending.swap(pending_);
  }
  for (auto& [id, call] : pending) Settle(*call, root.WithContext(call->what));
}

void RpcEndpoint::FailCallsTo(const std::string& address, const Status& status) {
  std::vector<std::shared_ptr<PendingCall>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->address == address) {
        failed.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& call : failed) Settle(*call, status.WithContext(call->what));
}

void RpcEndpoint::Complete(uint64_t request_id, StatusOr<Envelope> result) {
  std::shared_ptr<PendingCall> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(request_id);
    if (it == pending_.end()) return;
    call = std::move(it->second);
    pending_.erase(it);
  }
  Settle(*call, std::move(result));
}

void RpcEndpoint::OnMessage(Envelope envelope) {
  const MessageType type = envelope.type();
  if (!envelope.origin.IsRequest()) {
    std::shared_ptr<PendingCall> call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(envelope.header.request_id);
      if (it != pending_.end() && it->second->address == envelope.origin.peer_address) {
        call = std::move(it->second);
        pending_.erase(it);
      }
    }
    if (call != nullptr) {
      if (const ErrorReply* error = envelope.As<ErrorReply>()) {
        Settle(*call, StatusOf(*error).WithContext(
            call->what + ": " + envelope.header.DescribeSender() + " at " + call->address));
        return;
      }
      if (Histogram* latency = ChildOfType(latency_family_, latency_, type)) {
        latency->Observe(std::chrono::duration<double>(SteadyClock::now() - call->started).count());
      }
      Settle(*call, std::move(envelope));
      return;
    }
  }
  MessageHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(type);
    if (it != handlers_.end()) {
      handler = it->second;
      ++handlers_running_;
    }
  }
  if (handler) {
    handler(std::move(envelope));
    handler = nullptr;  // drop its captures before ClearHandler callers proceed
    std::lock_guard<std::mutex> lock(mu_);
    if (--handlers_running_ == 0) handlers_idle_cv_.notify_all();
    return;
  }
  if (envelope.origin.IsRequest()) {
    ReplyError(envelope, UnimplementedError(identity_.Header(0, -1).DescribeSender() +
                                            " does not serve " +
                                            std::string(MessageTypeName(type)) + " requests"));
    return;
  }
  TLOG(DEBUG) << "dropped " << MessageTypeName(type) << " from " << envelope.origin.peer_address
              << " (request id " << envelope.header.request_id
              << "): no pending call and no handler (a late reply?)";
}

SteadyClock::time_point RpcEndpoint::NextEvent(const PendingCall& call) {
  return std::min(call.deadline.when(), call.next_resend);
}

void RpcEndpoint::ExpireLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    auto next = SteadyClock::time_point::max();
    auto now = SteadyClock::now();
    std::vector<std::shared_ptr<PendingCall>> expired;
    std::vector<std::pair<std::string, OutgoingMessage>> resends;
    for (auto it = pending_.begin(); it != pending_.end();) {
      PendingCall& call = *it->second;
      if (call.deadline.when() <= now) {
        expired.push_back(std::move(it->second));
        it = pending_.erase(it);
        continue;
      }
      if (call.next_resend <= now) {
        resends.emplace_back(call.address, *call.resend);
        call.resend_wait = std::min(2 * call.resend_wait,
                                    std::chrono::milliseconds(call.resend_max_ms));
        call.next_resend = now + call.resend_wait;
      }
      next = std::min(next, NextEvent(call));
      ++it;
    }
    if (!expired.empty() || !resends.empty()) {
      lock.unlock();
      for (auto& call : expired) {
        Settle(*call, DeadlineExceededError(
            call->what + ": no reply from " + call->address + " within " +
            std::to_string(call->timeout_ms) + " ms"));
      }
      for (auto& [address, message] : resends) {
        const MessageType type = TypeOf(message.body);
        if (Counter* resent = ChildOfType(resent_family_, resent_, type)) resent->Increment();
        const uint64_t request_id = message.request_id;
        // A failure to queue it is the same loss as before: the next resend or the deadline.
        Status sent = transport_->Send(address, std::move(message));
        TLOG(DEBUG) << "resent " << MessageTypeName(type) << " " << request_id << " to "
                    << address << (sent.ok() ? std::string() : ": " + sent.ToString());
      }
      lock.lock();
      continue;
    }
    next_expiry_ = next;
    if (next == SteadyClock::time_point::max()) {
      expire_cv_.wait(lock);
    } else {
      expire_cv_.wait_until(lock, next);
    }
  }
}

}  // namespace tessera
