// RpcEndpoint: request/reply on top of a Transport, plus routing of everything else by type.
//
//   ASSIGN_OR_RETURN(auto transport, ZmqTransport::Create(transport_options, &metrics));
//   ASSIGN_OR_RETURN(auto endpoint, RpcEndpoint::Start(std::move(transport), role, rank,
//                                                      &metrics));
//   endpoint->SetHandler(MessageType::kFailureNotice, [&](Envelope e) { ... });
//   StatusOr<Envelope> reply = endpoint->Call(server, SparsePullRequest{...}, step,
//                                             Deadline::AfterMillis(30000), "pull of emb");
//   endpoint->Reply(request, Ack{});  // in a handler (or later, from another thread)
//
// A message that arrives on one of our outgoing connections and carries the request id of a
// pending Call completes that Call; an ErrorReply completes it with the error it describes.
// Every other message (requests from others, unsolicited notices) goes to the handler set for
// its type; a request of a type nobody handles is answered with Unimplemented.
//
// Thread-safety: all methods are thread-safe. Handlers run on the transport's I/O thread and
// must not block (in particular, they must not Call): queue work for another thread.
#ifndef TESSERA_COMMON_TRANSPORT_RPC_ENDPOINT_H_
#define TESSERA_COMMON_TRANSPORT_RPC_ENDPOINT_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/transport/sender_identity.h"
#include "common/transport/transport.h"

namespace tessera {

class RpcEndpoint {
 public:
  // Starts `transport` with this endpoint as its handler, and names us `role` and `rank` in
  // what we send (SetIdentity changes them later). `metrics` may be null.
  static StatusOr<std::unique_ptr<RpcEndpoint>> Start(std::unique_ptr<Transport> transport,
                                                      std::optional<Role> role, int32_t rank,
                                                      MetricsRegistry* metrics);
  ~RpcEndpoint();

  Transport& transport() { return *transport_; }
  const std::string& address() const { return transport_->address(); }
  void SetIdentity(Role role, int32_t rank);

  // Routes messages of `type` that are not replies to our calls. Replaces an earlier handler.
  void SetHandler(MessageType type, MessageHandler handler);
  // Removes the handler of `type` and waits until no handler is running, so whatever the
  // handler refers to may be destroyed afterwards. REQUIRES: not called from a handler.
  void ClearHandler(MessageType type);
  // Replaces the handler of `type` with `handler` (null: none) and waits like ClearHandler,
  // with no moment in which `type` is unhandled. REQUIRES: not called from a handler.
  void ReplaceHandler(MessageType type, MessageHandler handler);

  // Sends `request` (of training step `step`, -1 for none) to `address` and returns a future
  // for its reply. The future is completed with DeadlineExceeded naming `what` and `address`
  // if no reply arrives by `deadline`, or with the error of an ErrorReply.
  //
  // With `resend_after_ms` > 0 the request is sent again, with the same id, when no reply has
  // come that long after it was sent, then after twice as long, and so on (at most
  // kMaxResendFactor times the first wait), until the deadline: for a receiver that serves a
  // request id once (server/ps/request_ledger.h), since a request or its reply may be lost.
  // The request's payloads are sent again as they are then: their owner keeps them unchanged
  // until the future completes. Counted in tessera_rpc_resent_total{type}.
  //
  // `settled` (null: none) runs once the future is completed, on the thread that completed it
  // (possibly within this call, possibly under this endpoint's lock): it must be quick, and
  // may take only locks that are never held while calling into this endpoint (e.g. signal a
  // thread that waits for several calls, in whatever order they are answered).
  std::shared_future<StatusOr<Envelope>> CallAsync(const std::string& address, MessageBody request,
                                                   int64_t step, Deadline deadline,
                                                   std::string_view what,
                                                   int64_t resend_after_ms = 0,
                                                   std::function<void()> settled = nullptr);
  // CallAsync and wait.
  StatusOr<Envelope> Call(const std::string& address, MessageBody request, int64_t step,
                          Deadline deadline, std::string_view what,
                          int64_t resend_after_ms = 0);

  // The longest wait between two sends of one request, as a multiple of resend_after_ms.
  static constexpr int64_t kMaxResendFactor = 8;

  // Answers `request` (which arrived as a request) with `reply`; a failure to queue it is
  // logged, naming the requester (the requester's deadline reports the loss).
  void Reply(const Envelope& request, MessageBody reply);
  // Answers `request` with an ErrorReply carrying `status`.
  void ReplyError(const Envelope& request, const Status& status);

  // Fails every pending call with `status` (e.g. a peer was declared failed) and later calls
  // too, until the endpoint is destroyed. The first status given is kept as the root cause.
  void FailAll(const Status& status);
  // Fails the pending calls to `address` with `status` (a peer this process can do without
  // was declared failed); later calls to it are not refused.
  void FailCallsTo(const std::string& address, const Status& status);

  void Shutdown();

 private:
  struct PendingCall {
    std::promise<StatusOr<Envelope>> promise;
    std::string address;
    std::string what;
    Deadline deadline{SteadyClock::time_point::max()};
    int64_t timeout_ms = 0;
    SteadyClock::time_point started;
    // Resending (resend_after_ms > 0): what to send again, when, and the wait after that.
    std::optional<OutgoingMessage> resend;
    SteadyClock::time_point next_resend = SteadyClock::time_point::max();
    std::chrono::milliseconds resend_wait{0};
    int64_t resend_max_ms = 0;
    std::function<void()> settled;  // CallAsync's
  };

  RpcEndpoint() = default;
  void OnMessage(Envelope envelope);
  void Complete(uint64_t request_id, StatusOr<Envelope> result);
  // Sets `call`'s result, once it is out of pending_ (see the definition).
  static void Settle(PendingCall& call, StatusOr<Envelope> result);
  void ExpireLoop();
  // When `call` next needs the expiry thread: its deadline or its next resend.
  static SteadyClock::time_point NextEvent(const PendingCall& call);

  std::unique_ptr<Transport> transport_;
  // Reply latency by message type (family null without a registry); each child is looked up
  // on its type's first reply and cached. Both are touched on the transport's I/O thread only.
  HistogramFamily* latency_family_ = nullptr;
  std::array<Histogram*, kMessageTypeCount> latency_{};
  // Resends by message type, as latency_; touched on the expiry thread only.
  CounterFamily* resent_family_ = nullptr;
  std::array<Counter*, kMessageTypeCount> resent_{};
  std::atomic<uint64_t> next_request_id_{1};
  SenderIdentity identity_;  // for the text of our own errors

  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<PendingCall>> pending_;  // guarded by mu_
  std::map<MessageType, MessageHandler> handlers_;            // guarded by mu_
  Status failure_;                                             // guarded by mu_
  bool stopping_ = false;                                      // guarded by mu_
  int handlers_running_ = 0;                                   // guarded by mu_
  // When the expiry thread wakes next, for a deadline or a resend (max: it waits for a notify).
  SteadyClock::time_point next_expiry_ = SteadyClock::time_point::max();  // guarded by mu_
  std::condition_variable handlers_idle_cv_;
  std::condition_variable expire_cv_;
  std::thread expire_thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_RPC_ENDPOINT_H_
