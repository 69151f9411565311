#include "common/rendezvous/rendezvous_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <vector>

#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"

namespace tessera {
namespace {

// Extra time a client waits beyond the coordinator's own timeout, so that the coordinator's
// explanation (which members are missing) arrives before the client's bare deadline.
constexpr int64_t kCoordinatorGraceMs = 5000;
// A coordinator whose transport is up but whose handlers are not yet (a few milliseconds at
// its start; under srun every node starts at once) answers that it does not serve
// registration: ask again, every kStartingRetryMs, for this long before calling the address
// wrong.
constexpr int64_t kStartingCoordinatorMs = 5000;
constexpr int64_t kStartingRetryMs = 20;
// A goodbye is a courtesy; a process that is leaving does not wait long for its answer (a
// live coordinator answers within a millisecond; one that stopped at the same time never does,
// and the goodbye itself still leaves with the transport's shutdown).
constexpr int64_t kGoodbyeTimeoutMs = 500;

}  // namespace

RendezvousOptions RendezvousOptionsFrom(const ProcessConfig& config) {
  RendezvousOptions options;
  options.coordinator_address = "tcp://" + config.coordinator;
  options.role = config.role;
  options.requested_rank = config.rank;
  options.num_workers = config.role == Role::kWorker ? config.num_workers : 0;
  options.rendezvous_timeout_ms = config.rendezvous_timeout_ms;
  options.heartbeat_interval_ms = config.heartbeat_interval_ms;
  options.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
  options.request_timeout_ms = config.request_timeout_ms;
  return options;
}

RendezvousClient::RendezvousClient(RpcEndpoint* endpoint, const RendezvousOptions& options)
    : endpoint_(endpoint), options_(options) {}

StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Join(
    RpcEndpoint* endpoint, const RendezvousOptions& options, MetricsRegistry* metrics) {
  std::unique_ptr<RendezvousClient> client(new RendezvousClient(endpoint, options));
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(HistogramFamily * family,
                     metrics->RegisterHistogram(metric_names::kBarrierWaitSeconds.name,
                                                metric_names::kBarrierWaitSeconds.help, {},
                                                DefaultLatencyBuckets()));
    ASSIGN_OR_RETURN(client->barrier_wait_, family->WithLabels({}));
  }
  std::string me = MemberName(options.role, options.requested_rank);
  if (options.requested_rank < 0) me = std::string(RoleName(options.role)) + " (rank unassigned)";

  // Failure notices may arrive as soon as we are registered.
  RendezvousClient* raw = client.get();
  endpoint->SetHandler(MessageType::kFailureNotice, [raw](Envelope envelope) {
    raw->PeerFailed(*envelope.As<FailureNotice>());
  });
  // A newer view (a server joined in a failed one's place): to the handler, once per epoch.
  endpoint->SetHandler(MessageType::kFleetView, [raw](Envelope envelope) {
    const FleetView& view = *envelope.As<FleetView>();
    std::function<void(const FleetView&)> on_fleet_change;
    {
      std::lock_guard<std::mutex> lock(raw->mu_);
      if (view.epoch <= raw->newest_epoch_) return;
      raw->newest_epoch_ = view.epoch;
      on_fleet_change = raw->on_fleet_change_;
      if (!on_fleet_change && raw->options_.handlers_follow) raw->held_view_ = view;
    }
    TLOG(DEBUG) << "fleet view of epoch " << view.epoch << " from the coordinator";
    if (on_fleet_change) on_fleet_change(view);
  });

  RegisterRequest request;
  request.role = options.role;
  request.requested_rank = options.requested_rank;
  request.address = endpoint->address();
  request.metrics_address = options.metrics_address;
  request.host = options.host.empty() ? LocalHostName() : options.host;
  request.pid = static_cast<int64_t>(getpid());
  request.num_workers = options.num_workers;
  request.join = options.join;
  TLOG(INFO) << "registering as " << me << " with the coordinator at "
             << options.coordinator_address << " (waiting up to " << options.rendezvous_timeout_ms
             << " ms for the whole fleet)";
  const std::string what = "rendezvous of " + me + " with the coordinator";
  const Deadline deadline =
      Deadline::AfterMillis(options.rendezvous_timeout_ms + kCoordinatorGraceMs);
  const Deadline starting = Deadline::AfterMillis(kStartingCoordinatorMs);
  StatusOr<Envelope> reply = UnimplementedError("not asked yet");
  while (true) {
    reply = client->AwaitReply(
        endpoint->CallAsync(options.coordinator_address, request, -1, deadline, what), what);
    if (reply.ok() || reply.status().code() != StatusCode::kUnimplemented) break;
    if (starting.Expired()) {
      return reply.status().WithContext("is " + options.coordinator_address +
                                        " a Tessera coordinator? it has not served "
                                        "registration for " +
                                        std::to_string(kStartingCoordinatorMs) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kStartingRetryMs));
    if (options.stop_requested && options.stop_requested()) {
      return CancelledError(what + ": stopped while waiting (the process was asked to stop)");
    }
  }
  if (!reply.ok()) return reply.status();
  ASSIGN_OR_RETURN(client->view_, TakeBody<FleetView>(std::move(reply).value(), what));
  // Our rank is whatever member of our role lists our address.
  for (const MemberInfo& m : client->view_.members) {
    if (m.role == options.role && m.address == endpoint->address()) client->rank_ = m.rank;
  }
  if (client->rank_ < 0) {
    return InternalError("the fleet view from the coordinator does not list this process (" +
                         endpoint->address() + ")");
  }
  endpoint->SetIdentity(options.role, client->rank_);
  {
    std::lock_guard<std::mutex> lock(client->mu_);
    client->newest_epoch_ = std::max(client->newest_epoch_, client->view_.epoch);
  }
  if (!options.join) client->StartHeartbeats();
  return client;
}

void RendezvousClient::StartHeartbeats() {
  if (heartbeat_thread_.joinable()) return;
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

void RendezvousClient::SetFleetChangeHandler(std::function<void(const FleetView&)> handler) {
  std::optional<FleetView> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_fleet_change_ = handler;
    if (on_fleet_change_) held.swap(held_view_);
  }
  if (held.has_value()) handler(*held);
}

RendezvousClient::~RendezvousClient() {
  StopHeartbeats();
  endpoint_->ClearHandler(MessageType::kFailureNotice);
  endpoint_->ClearHandler(MessageType::kFleetView);
}

void RendezvousClient::StopHeartbeats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

Status RendezvousClient::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

void RendezvousClient::PeerFailed(const FailureNotice& notice) {
  const std::string address = notice.address.empty() ? "?" : notice.address;
  const std::string reason = notice.reason.empty() ? "no reason given" : notice.reason;
  if (notice.role == Role::kCoordinator) {  // it stopped: nobody is left to carry on with
    if (health().ok() && IsCleanCoordinatorStop(notice.reason)) {
      coordinator_stopped_cleanly_ = true;
    }
    Fail(UnavailableError("lost contact with the coordinator: " + reason));
    return;
  }
  if (notice.membership_epoch > 0 && !options_.membership_changes_are_fatal) {
    // An elastic job's membership change, which the job survives: told, never fatal.
    TLOG(WARNING) << reason;
    std::function<void(const FailureNotice&)> on_membership;
    {
      std::lock_guard<std::mutex> lock(mu_);
      on_membership = on_membership_;
    }
    if (on_membership) on_membership(notice);
    return;
  }
  std::string what = MemberName(notice.role, notice.rank) + " (" + address + ") failed: " + reason;
  std::function<Status(const FailureNotice&)> on_peer_loss;
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_peer_loss = on_peer_loss_;
    if (!on_peer_loss && options_.handlers_follow && options_.peer_failures_are_fatal) {
      TLOG(INFO) << what << "; told to this process's handler once it has one";
      held_losses_.push_back(notice);
      return;
    }
  }
  if (!options_.peer_failures_are_fatal) {
    TLOG(WARNING) << what << "; carrying on";
    if (on_peer_loss) (void)on_peer_loss(notice);  // told, and carrying on anyway
    return;
  }
  if (on_peer_loss) {
    Status carry_on = on_peer_loss(notice);
    if (carry_on.ok()) return;  // the handler said how it carries on
    if (!carry_on.message().empty()) what += "; " + carry_on.message();
  }
  Fail(AbortedError(what));
}

Status RendezvousClient::SendStep(int64_t step) {
  SetStep(step);
  StatusOr<Envelope> ack = endpoint_->Call(
      options_.coordinator_address, Heartbeat{0}, step,
      Deadline::AfterMillis(options_.heartbeat_timeout_ms), "heartbeat with step " +
      std::to_string(step));
  return ack.status();
}

void RendezvousClient::SetMembershipHandler(std::function<void(const FailureNotice&)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  on_membership_ = std::move(handler);
}

void RendezvousClient::SetPeerLossHandler(std::function<Status(const FailureNotice&)> handler) {
  std::vector<FailureNotice> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_peer_loss_ = std::move(handler);
    if (on_peer_loss_) held.swap(held_losses_);
  }
  for (const FailureNotice& notice : held) PeerFailed(notice);
}

void RendezvousClient::SetFailureCallback(std::function<void(const Status&)> callback) {
  Status already;
  {
    std::lock_guard<std::mutex> lock(mu_);
    already = health_;
    if (already.ok()) {
      on_failure_ = std::move(callback);
      return;
    }
  }
  // The failure happened before the callback was set: run it now, outside the lock (it may
  // call health()).
  if (callback) callback(already);
}

void RendezvousClient::Fail(const Status& status) {
  std::function<void(const Status&)> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!health_.ok()) return;  // the first failure is the root cause
    health_ = status;
    callback = std::move(on_failure_);
    on_failure_ = nullptr;
  }
  // A process that is stopping anyway (a launcher stopping everyone) hears its peers' stops
  // as news, not as its error.
  if (options_.stop_requested && options_.stop_requested()) {
    TLOG(INFO) << status.message();
  } else {
    TLOG(ERROR) << status.message();
  }
  endpoint_->FailAll(status);
  if (callback) callback(status);
}

void RendezvousClient::HeartbeatLoop() {
  auto last_ack = SteadyClock::now();
  uint64_t sequence = 0;
  std::vector<std::shared_future<StatusOr<Envelope>>> in_flight;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_ && health_.ok()) {
    lock.unlock();
    in_flight.push_back(endpoint_->CallAsync(
        options_.coordinator_address, Heartbeat{sequence++},
        last_step_.load(std::memory_order_relaxed),
        Deadline::AfterMillis(options_.heartbeat_timeout_ms), "heartbeat"));
    // Collect answered heartbeats: an ack refreshes contact; an error from the coordinator
    // (e.g. "not a member": it restarted or declared us failed) is final.
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      if (it->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++it;
        continue;
      }
      const StatusOr<Envelope>& result = it->get();
      if (result.ok()) {
        last_ack = SteadyClock::now();
      } else if (result.status().code() == StatusCode::kUnavailable) {
        // The coordinator answered that it has stopped (or its address cannot be reached).
        Fail(UnavailableError("lost contact with the coordinator: " + result.status().message()));
      } else if (result.status().code() != StatusCode::kDeadlineExceeded &&
                 result.status().code() != StatusCode::kAborted &&
                 result.status().code() != StatusCode::kCancelled) {
        Fail(result.status().WithContext("coordinator at " + options_.coordinator_address +
                                         " rejected a heartbeat of " + MemberName(options_.role, rank_)));
      }
      it = in_flight.erase(it);
    }
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - last_ack);
    if (silent.count() > options_.heartbeat_timeout_ms) {
      Fail(UnavailableError("lost contact with the coordinator at " +
                            options_.coordinator_address + ": no heartbeat reply for " +
                            std::to_string(silent.count()) + " ms (limit " +
                            std::to_string(options_.heartbeat_timeout_ms) + " ms)"));
    }
    lock.lock();
    stop_cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms),
                      [this] { return stopping_; });
  }
}

Status RendezvousClient::Barrier(const std::string& name, std::optional<Role> scope,
                                 int64_t timeout_ms) {
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!health_.ok()) return health_.WithContext("barrier '" + name + "' not entered");
    generation = barrier_generation_[name]++;
  }
  auto started = SteadyClock::now();
  const std::string what = "barrier '" + name + "' generation " + std::to_string(generation) +
                           " of " + MemberName(options_.role, rank_);
  StatusOr<Envelope> reply = AwaitReply(
      endpoint_->CallAsync(options_.coordinator_address,
                           BarrierRequest{name, generation, timeout_ms, scope}, -1,
                           Deadline::AfterMillis(timeout_ms + kCoordinatorGraceMs), what),
      what);
  if (!reply.ok()) return reply.status();
  if (barrier_wait_ != nullptr) {
    barrier_wait_->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  }
  return OkStatus();
}

StatusOr<Envelope> RendezvousClient::AwaitReply(
    const std::shared_future<StatusOr<Envelope>>& call, const std::string& what) const {
  if (options_.stop_requested) {
    while (call.wait_for(std::chrono::milliseconds(kStopCheckMs)) != std::future_status::ready) {
      if (options_.stop_requested()) {
        return CancelledError(what + ": stopped while waiting (the process was asked to stop)");
      }
    }
  }
  return call.get();
}

void RendezvousClient::Leave(const std::string& reason) { SendGoodbye(Goodbye{reason}); }

void RendezvousClient::LeaveWithError(const Status& error) {
  SendGoodbye(Goodbye{std::string(StatusCodeName(error.code())) + ": " + error.message(),
                      error.ok() ? StatusCode::kUnknown : error.code()});
}

void RendezvousClient::LeaveStopped(const std::string& why) {
  SendGoodbye(Goodbye{why, StatusCode::kCancelled});
}

void RendezvousClient::SendGoodbye(Goodbye goodbye) {
  StopHeartbeats();
  if (!health().ok()) return;  // the coordinator is gone or the fleet failed: nobody to tell
  StatusOr<Envelope> reply = endpoint_->Call(
      // With the last step (SetStep): an elastic job's change names it.
      options_.coordinator_address, std::move(goodbye), last_step_.load(std::memory_order_relaxed),
      Deadline::AfterMillis(std::min<int64_t>(options_.request_timeout_ms, kGoodbyeTimeoutMs)),
      "goodbye");
  // A failure or stop relayed while saying goodbye already told the coordinator's side.
  if (!reply.ok() && health().ok()) TLOG(WARNING) << "leaving: " << reply.status();
}

}  // namespace tessera
