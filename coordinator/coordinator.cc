#include "coordinator/coordinator.h"

#include <algorithm>
#include <iterator>
#include <thread>

#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/process_alive.h"
#include "common/metrics/metric_names.h"
#include "common/transport/bind_address.h"
#include "common/transport/zmq/zmq_transport.h"

namespace tessera::coordinator {
namespace {

// How often CheckLocalProcesses looks (a kill() and a /proc read per member of this host).
constexpr int64_t kLocalCheckMs = 200;

// Members watched through a connection each at most (every server, and workers up to this
// many): each costs three ZeroMQ sockets (of the context's 1023) and four file descriptors
// (the process raised its limit to the hard one: common/base/descriptor_limit.h).
constexpr size_t kMaxWatched = 128;

// The requests the coordinator serves.
constexpr MessageType kHandledTypes[] = {MessageType::kRegisterRequest, MessageType::kHeartbeat,
                                         MessageType::kBarrierRequest, MessageType::kGoodbye};

// How often Run() wakes to check deadlines when no message arrives.
constexpr int64_t kTickMs = 20;

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "nobody" : out;
}

int64_t MillisSince(SteadyClock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - since).count();
}

}  // namespace

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(RpcEndpoint* endpoint,
                                                           const CoordinatorOptions& options,
                                                           MetricsRegistry* metrics) {
  if (options.num_workers < 0) {
    return InvalidArgumentError("negative number of workers (0: a long-running fleet)");
  }
  if (options.num_workers == 0 && options.exit_when_workers_leave) {
    return InvalidArgumentError(
        "a long-running fleet (--num-workers 0) does not exit when a job's workers leave");
  }
  if (options.num_servers < 0) return InvalidArgumentError("negative number of servers");
  if (options.num_servers > 0 && options.key_space < static_cast<uint64_t>(options.num_servers)) {
    return InvalidArgumentError("--key-space=" + std::to_string(options.key_space) +
                                " is smaller than --num-servers=" +
                                std::to_string(options.num_servers));
  }
  if (options.replicas < 1 || (options.replicas > 1 && options.replicas > options.num_servers)) {
    return InvalidArgumentError("--replicas=" + std::to_string(options.replicas) +
                                " must be between 1 and --num-servers=" +
                                std::to_string(options.num_servers));
  }
  if (options.min_workers != 0 || options.max_workers != 0) {
    const int max_workers = options.max_workers == 0 ? options.num_workers : options.max_workers;
    if (options.num_workers == 0 || options.min_workers < 1 ||
        options.min_workers > options.num_workers || options.num_workers > max_workers) {
      return InvalidArgumentError(
          "elastic job: --min-workers=" + std::to_string(options.min_workers) +
          " --num-workers=" + std::to_string(options.num_workers) + " --max-workers=" +
          std::to_string(options.max_workers) +
          " must satisfy 1 <= min <= num <= max (and not a long-running fleet)");
    }
    if (options.replicas > 1) {
      // DenseShard::RemoveWorker does not forward the step a leave completes: the backups
      // would silently fall behind their primaries.
      return InvalidArgumentError("elastic job: --min-workers=" +
                                  std::to_string(options.min_workers) + " with --replicas=" +
                                  std::to_string(options.replicas) +
                                  ": not yet (a step a leave completes is not forwarded to the "
                                  "backups)");
    }
  }
  std::unique_ptr<Coordinator> coordinator(new Coordinator(endpoint, options));
  if (options.min_workers > 0) {
    coordinator->membership_.emplace(
        options.min_workers,
        options.max_workers == 0 ? options.num_workers : options.max_workers,
        options.num_workers);
  }
  if (coordinator->IsFleet() && options.num_servers == 0) {
    coordinator->complete_ = true;  // nothing to wait for: jobs may attach at once
    coordinator->epoch_ = 1;
  }
  if (metrics != nullptr) RETURN_IF_ERROR(coordinator->RegisterMetrics(metrics));
  for (MessageType type : kHandledTypes) {
    endpoint->SetHandler(type, coordinator->inbox_.Handler());
  }
  coordinator->PublishSnapshot();
  return coordinator;
}

Coordinator::~Coordinator() { StopServing(OkStatus()); }

void Coordinator::StopServing(const Status& why) {
  if (stopped_serving_) return;
  stopped_serving_ = true;
  const Status stopped = UnavailableError(CoordinatorStoppedReason(options_.job) +
                                          (why.ok() ? "" : ": " + why.message()));
  // The responder refers to the endpoint only (which owns it), so it may outlive this.
  RpcEndpoint* endpoint = endpoint_;
  for (MessageType type : kHandledTypes) {
    endpoint_->ReplaceHandler(type, [endpoint, stopped](Envelope envelope) {
      if (envelope.origin.IsRequest()) endpoint->ReplyError(envelope, stopped);
    });
  }
  inbox_.Close();
  for (;;) {  // what arrived before the switch and was never handled
    StatusOr<Envelope> queued = inbox_.Pop(Deadline::AfterMillis(0), "queued request");
    if (!queued.ok()) break;
    if (queued->origin.IsRequest()) endpoint_->ReplyError(*queued, stopped);
  }
  // Members still here would learn it from their heartbeats only after their limit (this
  // process is about to exit, and an exited coordinator answers nothing): tell them now. Not
  // when the job is simply over: the servers left then are stopped by whoever started them
  // (node 0's tessera-launch), and must not report the end of a job as a failure.
  if (job_over_) return;
  for (auto& [key, member] : members_) {
    if (member.info.state != MemberState::kAlive) continue;
    FailureNotice notice{Role::kCoordinator, 0, endpoint_->address(), stopped.message()};
    Status sent = endpoint_->transport().Reply(member.route, OutgoingMessage{0, -1, notice});
    if (!sent.ok()) TLOG(WARNING) << "stop notice to " << member.info.Name() << ": " << sent;
  }
}

Status Coordinator::RegisterMetrics(MetricsRegistry* metrics) {
  namespace names = metric_names;
  ASSIGN_OR_RETURN(members_gauge_, metrics->RegisterGauge(names::kFleetMembers.name,
                                                          names::kFleetMembers.help,
                                                          {"role", "state"}));
  ASSIGN_OR_RETURN(CounterFamily * heartbeats,
                   metrics->RegisterCounter(names::kHeartbeatsReceivedTotal.name,
                                            names::kHeartbeatsReceivedTotal.help));
  ASSIGN_OR_RETURN(heartbeats_, heartbeats->WithLabels({}));
  ASSIGN_OR_RETURN(failures_, metrics->RegisterCounter(names::kFailuresDetectedTotal.name,
                                                       names::kFailuresDetectedTotal.help,
                                                       {"role"}));
  for (Role role : {Role::kServer, Role::kWorker}) {
    RETURN_IF_ERROR(failures_->WithLabels({std::string(RoleName(role))}).status());
  }
  ASSIGN_OR_RETURN(GaugeFamily * epoch, metrics->RegisterGauge(names::kMembershipEpoch.name,
                                                               names::kMembershipEpoch.help));
  ASSIGN_OR_RETURN(membership_epoch_, epoch->WithLabels({}));
  ASSIGN_OR_RETURN(membership_changes_,
                   metrics->RegisterCounter(names::kMembershipChangesTotal.name,
                                            names::kMembershipChangesTotal.help, {"kind"}));
  for (MembershipKind kind : {MembershipKind::kJoin, MembershipKind::kExit,
                              MembershipKind::kKilled, MembershipKind::kError}) {
    RETURN_IF_ERROR(membership_changes_->WithLabels({MembershipKindName(kind)}).status());
  }
  UpdateMemberGauges();
  return OkStatus();
}

Coordinator::Coordinator(RpcEndpoint* endpoint, const CoordinatorOptions& options)
    : endpoint_(endpoint), options_(options), host_(LocalHostName()) {}

Status Coordinator::Run(const std::function<bool()>& stop_requested) {
  Status result = Serve(stop_requested);
  StopServing(result);
  return result;
}

Status Coordinator::Serve(const std::function<bool()>& stop_requested) {
  if (IsFleet()) {
    TLOG(INFO) << "long-running fleet: waiting for " << options_.num_servers
               << " servers to register at " << endpoint_->address()
               << "; then jobs' workers attach one job at a time (rendezvous timeout "
               << options_.rendezvous_timeout_ms << " ms)";
  } else {
    TLOG(INFO) << "waiting for " << options_.num_servers << " servers and "
               << options_.num_workers << " workers to register at " << endpoint_->address()
               << " (rendezvous timeout " << options_.rendezvous_timeout_ms << " ms)";
  }
  while (!stop_requested()) {
    StatusOr<Envelope> next = inbox_.Pop(Deadline::AfterMillis(kTickMs), "message");
    if (next.ok()) Handle(*next);
    RETURN_IF_ERROR(CheckTimers());
    if (options_.exit_when_workers_leave && complete_) {
      std::vector<std::string> failed;
      bool alive = false;
      for (const auto& [key, member] : members_) {
        if (member.info.role != Role::kWorker) continue;
        alive |= member.info.state == MemberState::kAlive;
        if (member.info.state == MemberState::kFailed) failed.push_back(member.info.Name());
      }
      if (!alive) {
        if (!failed.empty()) {
          return AbortedError("job '" + options_.job + "' is over, but " + JoinNames(failed) +
                              " failed (--exit-when-workers-leave)");
        }
        TLOG(INFO) << "every worker has left; exiting (--exit-when-workers-leave)";
        job_over_ = true;
        return OkStatus();
      }
    }
  }
  // A fleet is often stopped because one of its processes died (tessera-launch stops the
  // rest at once): whoever is still attached learns which, instead of a lost coordinator.
  CheckLocalProcesses();
  return OkStatus();
}

void Coordinator::Handle(const Envelope& envelope) {
  switch (envelope.type()) {
    case MessageType::kRegisterRequest: return HandleRegister(envelope);
    case MessageType::kHeartbeat: return HandleHeartbeat(envelope);
    case MessageType::kBarrierRequest: return HandleBarrier(envelope);
    case MessageType::kGoodbye: return HandleGoodbye(envelope);
    default: break;
  }
}

void Coordinator::HandleRegister(const Envelope& envelope) {
  const RegisterRequest* request = envelope.As<RegisterRequest>();
  const uint64_t request_id = envelope.header.request_id;
  const Role role = request->role;
  if (role == Role::kCoordinator) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError("only servers and workers register with the "
                                           "coordinator, not a coordinator"));
  }
  std::string role_name(RoleName(role));
  const std::string& address = request->address;
  if (!IsValidTcpAddress(address)) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError(role_name + " registered with listen address '" +
                                           address + "', expected tcp://HOST:PORT"));
  }
  if (Status reachable = CheckReachable(*request, envelope.origin.source_host); !reachable.ok()) {
    TLOG(WARNING) << reachable.message();
    return ReplyError(envelope.origin, request_id, reachable);
  }
  if (request->join) return HandleJoin(envelope);
  const bool job_worker = IsFleet() && role == Role::kWorker;
  if (job_worker) {
    const int size = request->num_workers;
    if (size < 1) {
      return ReplyError(envelope.origin, request_id,
                        InvalidArgumentError(
                            "a worker at " + address + " registered without its job's size; "
                            "fleet '" + options_.job + "' is long-running and takes each job's "
                            "size from its workers' --num-workers (or WORLD_SIZE etc.)"));
    }
    if (job_complete_) {
      return ReplyError(envelope.origin, request_id,
                        FailedPreconditionError(
                            "fleet '" + options_.job + "' is running a job of " +
                            std::to_string(job_workers_) + " workers (job " +
                            std::to_string(jobs_done_ + 1) + "); a worker at " + address +
                            " can attach only after that job's workers have left"));
    }
    if (job_workers_ == 0) {
      job_workers_ = size;
      job_started_ = SteadyClock::now();
      TLOG(INFO) << "job " << jobs_done_ + 1 << " of fleet '" << options_.job << "': waiting for "
                 << size << " workers";
    } else if (size != job_workers_) {
      return ReplyError(envelope.origin, request_id,
                        InvalidArgumentError(
                            "a worker at " + address + " says its job has --num-workers=" +
                            std::to_string(size) + ", but the job assembling on fleet '" +
                            options_.job + "' has " + std::to_string(job_workers_)));
    }
  }
  int expected = role == Role::kServer ? options_.num_servers : ExpectedWorkers();
  if (complete_ && !job_worker) {
    return ReplyError(envelope.origin, request_id,
                      FailedPreconditionError(
                          "the rendezvous of job '" + options_.job +
                          "' is already complete (epoch " + std::to_string(epoch_) +
                          "); a " + role_name + " at " + address + " cannot join it" +
                          (role == Role::kServer
                               ? " (start it with --join to take a failed server's place)"
                               : "")));
  }
  if (expected == 0) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError("job '" + options_.job + "' expects no " + role_name +
                                           "s (--num-" + role_name + "s=0)"));
  }
  int rank = request->requested_rank;
  if (rank >= expected) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError(role_name + " rank " + std::to_string(rank) +
                                           " is out of range: job '" + options_.job + "' has " +
                                           std::to_string(expected) + " " + role_name + "s"));
  }
  if (rank < 0) {
    for (rank = 0; rank < expected && members_.count({role, rank}); ++rank) {
    }
    if (rank == expected) {
      return ReplyError(envelope.origin, request_id,
                        AlreadyExistsError("all " + std::to_string(expected) + " " + role_name +
                                           " ranks of job '" + options_.job + "' are taken"));
    }
  }
  auto existing = members_.find({role, rank});
  if (existing != members_.end() && existing->second.info.address != address) {
    const MemberInfo& other = existing->second.info;
    return ReplyError(envelope.origin, request_id,
                      AlreadyExistsError(other.Name() + " is already registered by pid " +
                                         std::to_string(other.pid) + " at " + other.address +
                                         "; a second process (pid " +
                                         std::to_string(request->pid) + " at " + address +
                                         ") asked for the same rank"));
  }
  Member& member = members_[{role, rank}];
  member.info.role = role;
  member.info.rank = rank;
  TakeRegistration(envelope, &member);
  TLOG(INFO) << member.info.Name() << " registered from " << address << " (pid "
             << member.info.pid << "); " << members_.size() << " of "
             << options_.num_servers + ExpectedWorkers() << " processes are here";
  UpdateMemberGauges();
  if (IsFleet()) {
    if (!complete_ && CountRegistered(Role::kServer) == options_.num_servers) {
      CompleteRendezvous();
    }
    MaybeCompleteJob();
  } else if (static_cast<int>(members_.size()) == options_.num_servers + options_.num_workers) {
    CompleteRendezvous();
  }
  PublishSnapshot();
}

void Coordinator::TakeRegistration(const Envelope& envelope, Member* member) {
  const RegisterRequest* request = envelope.As<RegisterRequest>();
  member->info.address = request->address;
  member->info.metrics_address = request->metrics_address;
  member->info.host = request->host;
  member->info.pid = request->pid;
  member->info.state = MemberState::kJoining;
  member->route = envelope.origin;
  member->register_request_id = envelope.header.request_id;
  member->last_seen = SteadyClock::now();
  const std::string& address = member->info.address;
  if (watched_.count(address) != 0) return;
  if (watched_.size() >= kMaxWatched && member->info.role != Role::kServer) {
    if (!watch_limit_logged_) {
      watch_limit_logged_ = true;
      TLOG(INFO) << "watching the connections of " << kMaxWatched << " members already; the "
                 << "deaths of further workers are found by their pids (on this host) and "
                 << "heartbeats";
    }
    return;
  }
  std::shared_ptr<GoneAddresses> gone = gone_;
  Status watched = endpoint_->transport().Watch(address, [gone, address] {
    std::lock_guard<std::mutex> lock(gone->mu);
    gone->addresses.push_back(address);
  });
  if (!watched.ok()) {
    TLOG(WARNING) << "cannot watch " << member->info.Name() << "'s connection (its death is "
                  << "found by its heartbeats only): " << watched;
    return;
  }
  watched_.insert(address);
}

void Coordinator::CheckGoneAddresses() {
  std::vector<std::string> addresses;
  {
    std::lock_guard<std::mutex> lock(gone_->mu);
    addresses.swap(gone_->addresses);
  }
  bool failed = false, local = false;
  for (const std::string& address : addresses) {
    watched_.erase(address);  // the transport closed that connection
    for (auto& [key, member] : members_) {
      if (member.info.address != address || member.info.state != MemberState::kAlive) continue;
      if (!host_.empty() && member.info.host == host_) {
        local = true;  // its pid tells more (and CheckLocalProcesses says it as always)
        continue;
      }
      DeclareGone(member,
                  "its connection closed and " + address + " refuses connections (on " +
                      member.info.host + ")",
                  /*stopped=*/false, ": it crashed or was killed");
      failed = true;
    }
  }
  if (failed) MaybeEndJob();  // not inside the loop: it erases members
  if (local) CheckLocalProcesses();
}

void Coordinator::HandleJoin(const Envelope& envelope) {
  const RegisterRequest* request = envelope.As<RegisterRequest>();
  const uint64_t request_id = envelope.header.request_id;
  const std::string& address = request->address;
  if (request->role != Role::kServer) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError("only a server joins a running fleet in a failed "
                                           "one's place (--join); a " +
                                           std::string(RoleName(request->role)) + " at " +
                                           address + " asked to"));
  }
  if (!complete_) {
    return ReplyError(envelope.origin, request_id,
                      FailedPreconditionError(
                          "a server at " + address + " asked to join (--join), but the fleet of "
                          "job '" + options_.job + "' is still assembling; start it without "
                          "--join"));
  }
  std::vector<int> failed;
  for (const auto& [key, member] : members_) {
    if (key.first == Role::kServer && member.info.state == MemberState::kFailed) {
      failed.push_back(key.second);
    }
  }
  std::string failed_names;
  for (int rank : failed) {
    failed_names += (failed_names.empty() ? "" : ", ") + std::to_string(rank);
  }
  int rank = request->requested_rank;
  if (rank < 0) {
    if (failed.empty()) {
      return ReplyError(envelope.origin, request_id,
                        FailedPreconditionError(
                            "a server at " + address + " asked to join (--join) job '" +
                            options_.job + "', but none of its " +
                            std::to_string(options_.num_servers) +
                            " servers has failed: a joining server takes a failed one's place"));
    }
    rank = failed.front();
  } else if (std::find(failed.begin(), failed.end(), rank) == failed.end()) {
    auto it = members_.find({Role::kServer, rank});
    const std::string state = rank >= options_.num_servers
                                  ? "not in the fleet (it has " +
                                        std::to_string(options_.num_servers) + " servers)"
                              : it == members_.end() ? "not registered"
                                                     : std::string(MemberStateName(
                                                           it->second.info.state));
    return ReplyError(envelope.origin, request_id,
                      FailedPreconditionError(
                          "a server at " + address + " asked to join job '" + options_.job +
                          "' as server " + std::to_string(rank) + ", which is " + state +
                          "; a joining server takes a failed one's place (failed: " +
                          (failed.empty() ? std::string("none") : failed_names) + ")"));
  }
  Member& member = members_.at({Role::kServer, rank});
  TakeRegistration(envelope, &member);
  member.joining_late = true;
  TLOG(INFO) << member.info.Name() << " joins job '" << options_.job << "' from " << address
             << " (pid " << member.info.pid << ") in the place of the failed one; it is "
             << "alive once it heartbeats (serving), and the workers then copy its ranges to it";
  Status sent = endpoint_->transport().Reply(member.route,
                                             OutgoingMessage{request_id, -1, BuildView()});
  if (!sent.ok()) TLOG(WARNING) << "fleet view for " << member.info.Name() << ": " << sent;
  UpdateMemberGauges();
  PublishSnapshot();
}

void Coordinator::PromoteJoined(Member& member) {
  member.info.state = MemberState::kAlive;
  member.joining_late = false;
  ++epoch_;
  TLOG(INFO) << member.info.Name() << " (pid " << member.info.pid << ") is serving: telling "
             << "every process (fleet view epoch " << epoch_ << ")";
  const FleetView view = BuildView();
  for (auto& [key, other] : members_) {
    if (other.info.state != MemberState::kAlive || &other == &member) continue;
    Status sent = endpoint_->transport().Reply(other.route, OutgoingMessage{0, -1, view});
    if (!sent.ok()) TLOG(WARNING) << "fleet view to " << other.info.Name() << ": " << sent;
  }
  UpdateMemberGauges();
  PublishSnapshot();
}

Status Coordinator::CheckReachable(const RegisterRequest& request, const std::string& source) {
  StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(request.address.substr(6));
  if (!host_port.ok()) return OkStatus();  // IsValidTcpAddress passed; nothing more to say
  const std::string& host = host_port->first;
  std::string who = "a " + std::string(RoleName(request.role));
  if (request.requested_rank >= 0) who += " asking for rank " + std::to_string(request.requested_rank);
  who += " (pid " + std::to_string(request.pid) +
         (request.host.empty() ? "" : " on " + request.host) + ")";
  const std::string from = source.empty() ? "" : " from " + source;
  const std::string fix =
      "start it with --bind-host auto (the default: the address on its route to the "
      "coordinator), its own address" + (source.empty() ? "" : " (--bind-host " + source + ")") +
      " or its interface's name (--bind-host eth0, or TESSERA_SOCKET_IFNAME)";
  if (IsUnspecifiedHost(host)) {
    return InvalidArgumentError(who + " connected" + from + " advertising " + request.address +
                                ", which no other process can connect to; " + fix);
  }
  // A loopback address is fine when the member is on the coordinator's host; the coordinator
  // cannot tell which host the others are on, but one that came from elsewhere is elsewhere.
  if (IsLoopbackHost(host) && !source.empty() && !IsLoopbackHost(source) &&
      !IsAddressOfThisHost(source)) {
    return InvalidArgumentError(who + " connected from " + source + " advertising " +
                                request.address +
                                ", a loopback address the processes on other hosts cannot reach; " +
                                fix);
  }
  return OkStatus();
}

void Coordinator::CompleteRendezvous() {
  complete_ = true;
  epoch_ = 1;
  auto now = SteadyClock::now();
  for (auto& [key, member] : members_) {
    if (IsFleet() && member.info.role == Role::kWorker) continue;  // MaybeCompleteJob's
    member.info.state = MemberState::kAlive;
    member.last_seen = now;  // heartbeats start now
    if (member.info.role == Role::kServer) {
      auto [begin, end] = ServerKeyRange(options_.key_space, options_.num_servers, member.info.rank);
      member.info.key_begin = begin;
      member.info.key_end = end;
    }
  }
  FleetView view = BuildView();
  for (auto& [key, member] : members_) {
    if (IsFleet() && member.info.role == Role::kWorker) continue;
    Status sent = endpoint_->transport().Reply(
        member.route, OutgoingMessage{member.register_request_id, -1, view});
    if (!sent.ok()) TLOG(WARNING) << "fleet view for " << member.info.Name() << ": " << sent;
  }
  if (IsFleet()) {
    TLOG(INFO) << "fleet of " << options_.num_servers << " servers complete after "
               << MillisSince(started_) << " ms; jobs' workers may attach";
  } else {
    TLOG(INFO) << "fleet complete after " << MillisSince(started_) << " ms: "
               << options_.num_servers << " servers, " << options_.num_workers << " workers";
  }
  UpdateMemberGauges();
}

int Coordinator::CountRegistered(Role role) const {
  int count = 0;
  for (const auto& [key, member] : members_) count += member.info.role == role;
  return count;
}

void Coordinator::MaybeCompleteJob() {
  if (!IsFleet() || !complete_ || job_workers_ == 0 || job_complete_) return;
  if (CountRegistered(Role::kWorker) < job_workers_) return;
  job_complete_ = true;
  ++epoch_;
  auto now = SteadyClock::now();
  for (auto& [key, member] : members_) {
    if (member.info.role != Role::kWorker) continue;
    member.info.state = MemberState::kAlive;
    member.last_seen = now;
  }
  FleetView view = BuildView();
  for (auto& [key, member] : members_) {
    if (member.info.role != Role::kWorker) continue;
    Status sent = endpoint_->transport().Reply(
        member.route, OutgoingMessage{member.register_request_id, -1, view});
    if (!sent.ok()) TLOG(WARNING) << "fleet view for " << member.info.Name() << ": " << sent;
  }
  TLOG(INFO) << "job " << jobs_done_ + 1 << ": all " << job_workers_ << " workers attached after "
             << MillisSince(job_started_) << " ms (" << options_.num_servers << " servers)";
  UpdateMemberGauges();
}

void Coordinator::MaybeEndJob() {
  if (!IsFleet() || !job_complete_) return;
  int left = 0, failed = 0;
  for (const auto& [key, member] : members_) {
    if (member.info.role != Role::kWorker) continue;
    if (member.info.state == MemberState::kAlive) return;
    (member.info.state == MemberState::kFailed ? failed : left) += 1;
  }
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second.info.role == Role::kWorker ? members_.erase(it) : std::next(it);
  }
  for (auto it = barriers_.begin(); it != barriers_.end();) {  // the job's; none should remain
    it = it->second.scope == Role::kServer ? std::next(it) : barriers_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    for (auto it = last_heard_.begin(); it != last_heard_.end();) {
      it = it->first.first == Role::kWorker ? last_heard_.erase(it) : std::next(it);
    }
  }
  ++jobs_done_;
  ++epoch_;
  job_workers_ = 0;
  job_complete_ = false;
  TLOG(INFO) << "job " << jobs_done_ << " is over (" << left << " workers left, " << failed
             << " failed); fleet '" << options_.job << "' waits for the next job";
  UpdateMemberGauges();
  PublishSnapshot();
}

void Coordinator::AbandonJob(const Status& status) {
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.info.role != Role::kWorker) {
      ++it;
      continue;
    }
    ReplyError(it->second.route, it->second.register_request_id, status);
    it = members_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    for (auto it = last_heard_.begin(); it != last_heard_.end();) {
      it = it->first.first == Role::kWorker ? last_heard_.erase(it) : std::next(it);
    }
  }
  job_workers_ = 0;
  job_complete_ = false;
  TLOG(ERROR) << status.message() << "; fleet '" << options_.job << "' waits for the next job";
  UpdateMemberGauges();
  PublishSnapshot();
}

Coordinator::Member* Coordinator::FindLive(const MessageHeader& header) {
  if (!header.sender_role.has_value()) return nullptr;
  auto it = members_.find({*header.sender_role, header.sender_rank});
  if (it == members_.end() || it->second.info.state != MemberState::kAlive) return nullptr;
  return &it->second;
}

void Coordinator::HandleHeartbeat(const Envelope& envelope) {
  if (heartbeats_ != nullptr) heartbeats_->Increment();
  if (envelope.header.sender_role.has_value()) {
    auto joining = members_.find({*envelope.header.sender_role, envelope.header.sender_rank});
    if (joining != members_.end() && joining->second.joining_late &&
        joining->second.info.state == MemberState::kJoining) {
      PromoteJoined(joining->second);  // its first heartbeat: it serves now
    }
  }
  Member* member = FindLive(envelope.header);
  if (member != nullptr) member->last_step = std::max(member->last_step, envelope.header.step);
  if (member == nullptr) {
    return ReplyError(envelope.origin, envelope.header.request_id,
                      FailedPreconditionError(envelope.header.DescribeSender() +
                                              " is not a live member of job '" + options_.job +
                                              "' (it never registered, left, or was declared "
                                              "failed)"));
  }
  member->last_seen = SteadyClock::now();
  member->route = envelope.origin;  // a reconnect gives a new route
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    last_heard_[{member->info.role, member->info.rank}] = member->last_seen;
  }
  Status sent = endpoint_->transport().Reply(
      envelope.origin, OutgoingMessage{envelope.header.request_id, -1, HeartbeatAck{epoch_}});
  if (!sent.ok()) TLOG(WARNING) << "heartbeat ack: " << sent;
}

void Coordinator::HandleGoodbye(const Envelope& envelope) {
  Member* member = FindLive(envelope.header);
  if (member == nullptr) {
    return ReplyAck(envelope.origin, envelope.header.request_id, "not a live member");
  }
  const Goodbye& goodbye = *envelope.As<Goodbye>();
  member->last_step = std::max(member->last_step, envelope.header.step);
  const bool workers_alive =
      std::any_of(members_.begin(), members_.end(), [](const auto& entry) {
        return entry.second.info.role == Role::kWorker &&
               entry.second.info.state == MemberState::kAlive;
      });
  const bool stopped = goodbye.code == StatusCode::kCancelled;
  // A server stopped once no worker needs it (a launcher ending a finished job) just leaves.
  if (stopped && (member->info.role != Role::kServer || workers_alive)) {
    // Stopped by a signal: the others cannot go on without it (an all-reduce would wait for
    // it), so they hear it at once, as a stop. But a launcher stops everyone as soon as one
    // of its processes dies: a process of this host that is gone is the root cause, told
    // first (this stop then goes quietly).
    CheckLocalProcesses();  // may end a fleet's job, erasing its workers: look again
    member = FindLive(envelope.header);
    if (member == nullptr) {
      return ReplyAck(envelope.origin, envelope.header.request_id, "the job ended already");
    }
    DeclareGone(*member, goodbye.reason, /*stopped=*/true);
    ReplyAck(envelope.origin, envelope.header.request_id, "stop relayed");
    MaybeEndJob();
    return;
  }
  // Elastic: a worker's going, clean or not, is a membership change the others survive.
  if (!stopped && ElasticLeave(*member, goodbye.code == StatusCode::kOk ? MembershipKind::kExit
                                                                          : MembershipKind::kError,
                               goodbye.reason)) {
    ReplyAck(envelope.origin, envelope.header.request_id, "membership change relayed");
    MaybeEndJob();
    return;
  }
  if (!stopped && goodbye.code != StatusCode::kOk) {
    // Its error is the root cause of whatever fails next: every other process hears it now,
    // not a heartbeat timeout later.
    DeclareFailed(*member, "it stopped with " + goodbye.reason);
    ReplyAck(envelope.origin, envelope.header.request_id, "failure relayed");
    MaybeEndJob();
    return;
  }
  member->info.state = MemberState::kLeft;
  ++epoch_;
  TLOG(INFO) << member->info.Name() << " left: " << goodbye.reason;
  ReplyAck(envelope.origin, envelope.header.request_id, "goodbye");
  UpdateMemberGauges();
  PublishSnapshot();
  TryReleaseBarriers();  // it no longer holds anyone up
  MaybeEndJob();
}

bool Coordinator::IsParticipant(const Member& member, const std::optional<Role>& scope) const {
  if (member.info.state != MemberState::kAlive) return false;
  // A long-running fleet's servers belong to no one job: a job's unscoped barrier is its
  // workers'.
  if (IsFleet() && !scope.has_value()) return member.info.role == Role::kWorker;
  return !scope.has_value() || member.info.role == *scope;
}

void Coordinator::HandleBarrier(const Envelope& envelope) {
  const BarrierRequest* request = envelope.As<BarrierRequest>();
  const uint64_t request_id = envelope.header.request_id;
  const std::string& name = request->name;
  Member* member = FindLive(envelope.header);
  if (!complete_ || member == nullptr) {
    return ReplyError(envelope.origin, request_id,
                      FailedPreconditionError(envelope.header.DescribeSender() +
                                              " entered barrier '" + name +
                                              "' but is not a live member of a complete fleet"));
  }
  const std::optional<Role> scope = request->scope;
  if (scope == Role::kCoordinator) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError("barrier '" + name + "': the coordinator is not a "
                                           "scope (servers, workers, or everyone)"));
  }
  if (!IsParticipant(*member, scope)) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError(member->info.Name() + " entered barrier '" + name +
                                           "' whose scope does not include it"));
  }
  int64_t timeout_ms = std::max<int64_t>(1, request->timeout_ms);
  auto key = std::make_pair(name, request->generation);
  auto [it, created] = barriers_.try_emplace(key);
  PendingBarrier& barrier = it->second;
  if (created) {
    barrier.name = name;
    barrier.generation = request->generation;
    barrier.scope = scope;
    barrier.timeout_ms = timeout_ms;
    barrier.deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  } else if (barrier.scope != scope) {
    return ReplyError(envelope.origin, request_id,
                      InvalidArgumentError(member->info.Name() + " entered barrier '" + name +
                                           "' with a different scope than the others"));
  }
  barrier.arrived[{member->info.role, member->info.rank}] = {envelope.origin, request_id};
  TryReleaseBarriers();
}

std::vector<std::string> Coordinator::Missing(const PendingBarrier& barrier) const {
  std::vector<std::string> missing;
  for (const auto& [key, member] : members_) {
    if (IsParticipant(member, barrier.scope) && !barrier.arrived.count(key)) {
      missing.push_back(member.info.Name());
    }
  }
  return missing;
}

void Coordinator::TryReleaseBarriers() {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    PendingBarrier& barrier = it->second;
    if (!Missing(barrier).empty()) {
      ++it;
      continue;
    }
    for (auto& [key, arrival] : barrier.arrived) {
      Status sent = endpoint_->transport().Reply(
          arrival.route,
          OutgoingMessage{arrival.request_id, -1, BarrierRelease{barrier.name, barrier.generation}});
      if (!sent.ok()) TLOG(WARNING) << "barrier release: " << sent;
    }
    TLOG(DEBUG) << "barrier '" << barrier.name << "' generation " << barrier.generation
                << " released " << barrier.arrived.size() << " processes";
    it = barriers_.erase(it);
  }
}

void Coordinator::CheckLocalProcesses() {
  if (host_.empty()) return;
  bool failed = false;
  for (auto& [key, member] : members_) {
    if (member.info.state != MemberState::kAlive || member.info.host != host_ ||
        member.info.pid <= 0 || ProcessAlive(static_cast<pid_t>(member.info.pid))) {
      continue;
    }
    DeclareGone(member,
                "its process (pid " + std::to_string(member.info.pid) + " on " + host_ +
                    ") is gone",
                /*stopped=*/false, ": it crashed or was killed");
    failed = true;
  }
  if (failed) MaybeEndJob();  // not inside the loop: it erases members
}

void Coordinator::DeclareGone(Member& member, const std::string& reason, bool stopped,
                              const std::string& unexplained) {
  if (ElasticLeave(member, MembershipKind::kKilled, reason)) return;
  const bool after_a_failure =
      (member.info.role == Role::kWorker || stopped) &&
      std::any_of(members_.begin(), members_.end(), [](const auto& entry) {
        return entry.second.info.state == MemberState::kFailed;
      });
  if (!after_a_failure) return DeclareFailed(member, reason + unexplained, stopped);
  member.info.state = MemberState::kFailed;
  ++epoch_;
  TLOG(INFO) << member.info.Name() << " went after the failure or stop above (" << reason << ")";
  UpdateMemberGauges();
  PublishSnapshot();
}

bool Coordinator::ElasticLeave(Member& member, MembershipKind kind, const std::string& reason) {
  // Once below the minimum the job is over: what follows is its consequence, not a change.
  if (!membership_.has_value() || !complete_ || member.info.role != Role::kWorker ||
      membership_->BelowMinimum() || membership_->in_job().count(member.info.rank) == 0) {
    return false;
  }
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  StatusOr<MembershipChange> change =
      membership_->Leave(member.info.rank, kind, reason, member.last_step, now);
  if (!change.ok()) return false;
  const std::string described = DescribeMembershipChange(*change);
  if (membership_epoch_ != nullptr) membership_epoch_->Set(static_cast<double>(change->epoch));
  if (membership_changes_ != nullptr) {
    StatusOr<Counter*> counter = membership_changes_->WithLabels({MembershipKindName(kind)});
    if (counter.ok()) (*counter)->Increment();
  }
  if (options_.on_membership_change) options_.on_membership_change(*change);
  // A clean exit never stops the others (at the end of a job every worker exits).
  if (kind != MembershipKind::kExit && membership_->BelowMinimum()) {
    DeclareFailed(member, membership_->StopReason(*change, ""));
    return true;
  }
  member.info.state = MemberState::kLeft;
  ++epoch_;
  if (kind == MembershipKind::kExit) {
    TLOG(INFO) << described << "; telling every other process";
  } else {
    TLOG(WARNING) << described << "; telling every other process";
  }
  for (auto& [key, other] : members_) {
    if (other.info.state != MemberState::kAlive) continue;
    FailureNotice notice{member.info.role, member.info.rank, member.info.address, described};
    notice.membership_epoch = change->epoch;
    notice.membership_step = change->step;
    notice.world_size = change->world_size;
    Status sent = endpoint_->transport().Reply(other.route, OutgoingMessage{0, -1, notice});
    if (!sent.ok()) TLOG(WARNING) << "membership notice to " << other.info.Name() << ": " << sent;
  }
  UpdateMemberGauges();
  PublishSnapshot();
  TryReleaseBarriers();  // it no longer holds anyone up
  return true;
}

void Coordinator::DeclareFailed(Member& member, const std::string& reason, bool stopped) {
  member.info.state = MemberState::kFailed;
  ++epoch_;
  if (failures_ != nullptr && !stopped) {
    StatusOr<Counter*> counter = failures_->WithLabels({std::string(RoleName(member.info.role))});
    if (counter.ok()) (*counter)->Increment();
  }
  std::string what = member.info.Name() + " (" + member.info.address + ", pid " +
                     std::to_string(member.info.pid) + ") " + (stopped ? "" : "failed: ") +
                     reason;
  if (stopped) {
    TLOG(WARNING) << what << "; telling every other process";
  } else {
    TLOG(ERROR) << what << "; telling every other process";
  }
  for (auto& [key, other] : members_) {
    if (other.info.state != MemberState::kAlive) continue;
    FailureNotice notice{member.info.role, member.info.rank, member.info.address, reason};
    Status sent = endpoint_->transport().Reply(other.route, OutgoingMessage{0, -1, notice});
    if (!sent.ok()) TLOG(WARNING) << "failure notice to " << other.info.Name() << ": " << sent;
  }
  // Barriers that waited for it can never complete.
  MemberKey key{member.info.role, member.info.rank};
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    PendingBarrier& barrier = it->second;
    if (!barrier.scope.has_value() || *barrier.scope == member.info.role) {
      if (!barrier.arrived.count(key)) {
        for (auto& [arrived_key, arrival] : barrier.arrived) {
          ReplyError(arrival.route, arrival.request_id,
                     AbortedError("barrier '" + barrier.name + "' generation " +
                                  std::to_string(barrier.generation) +
                                  " cannot complete: " + what));
        }
        it = barriers_.erase(it);
        continue;
      }
    }
    ++it;
  }
  UpdateMemberGauges();
  PublishSnapshot();
}

Status Coordinator::CheckTimers() {
  auto now = SteadyClock::now();
  if (IsFleet() && complete_ && job_workers_ > 0 && !job_complete_ &&
      MillisSince(job_started_) >= options_.rendezvous_timeout_ms) {
    std::vector<std::string> missing, present;
    for (int rank = 0; rank < job_workers_; ++rank) {
      (members_.count({Role::kWorker, rank}) ? present : missing)
          .push_back(MemberName(Role::kWorker, rank));
    }
    AbandonJob(DeadlineExceededError(
        "job " + std::to_string(jobs_done_ + 1) + " of fleet '" + options_.job + "' (" +
        std::to_string(job_workers_) + " workers) did not assemble within " +
        std::to_string(options_.rendezvous_timeout_ms) + " ms: missing " + JoinNames(missing) +
        " (registered: " + JoinNames(present) + ")"));
  }
  if (!complete_) {
    if (MillisSince(started_) < options_.rendezvous_timeout_ms) return OkStatus();
    std::vector<std::string> missing, present;
    for (Role role : {Role::kServer, Role::kWorker}) {
      int expected = role == Role::kServer ? options_.num_servers : ExpectedWorkers();
      for (int rank = 0; rank < expected; ++rank) {
        (members_.count({role, rank}) ? present : missing).push_back(MemberName(role, rank));
      }
    }
    Status failure = DeadlineExceededError(
        "rendezvous of job '" + options_.job + "' timed out after " +
        std::to_string(options_.rendezvous_timeout_ms) + " ms: missing " + JoinNames(missing) +
        " (registered: " + JoinNames(present) + ")");
    for (auto& [key, member] : members_) {
      ReplyError(member.route, member.register_request_id, failure);
    }
    TLOG(ERROR) << failure.message();
    return failure;
  }
  if (now >= next_local_check_) {
    next_local_check_ = now + std::chrono::milliseconds(kLocalCheckMs);
    CheckLocalProcesses();
  }
  CheckGoneAddresses();
  for (auto& [key, member] : members_) {
    if (member.joining_late && member.info.state == MemberState::kJoining &&
        std::chrono::duration_cast<std::chrono::milliseconds>(now - member.last_seen).count() >
            options_.heartbeat_timeout_ms) {
      member.info.state = MemberState::kFailed;
      member.joining_late = false;
      TLOG(WARNING) << member.info.Name() << " (pid " << member.info.pid << ") joined but did "
                    << "not heartbeat within " << options_.heartbeat_timeout_ms
                    << " ms; its place is free again";
      UpdateMemberGauges();
      PublishSnapshot();
      continue;
    }
    if (member.info.state != MemberState::kAlive) continue;
    int64_t silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - member.last_seen).count();
    if (silent > options_.heartbeat_timeout_ms) {
      DeclareGone(member, "no heartbeat for " + std::to_string(silent) + " ms (limit " +
                              std::to_string(options_.heartbeat_timeout_ms) +
                              " ms): crashed, hung or unreachable");
    }
  }
  MaybeEndJob();  // not inside the loop: it erases members
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    PendingBarrier& barrier = it->second;
    if (now < barrier.deadline) {
      ++it;
      continue;
    }
    Status timeout = DeadlineExceededError(
        "barrier '" + barrier.name + "' generation " + std::to_string(barrier.generation) +
        " timed out after " + std::to_string(barrier.timeout_ms) + " ms waiting for " +
        JoinNames(Missing(barrier)));
    TLOG(WARNING) << timeout.message();
    for (auto& [key, arrival] : barrier.arrived) ReplyError(arrival.route, arrival.request_id, timeout);
    it = barriers_.erase(it);
  }
  return OkStatus();
}

void Coordinator::ReplyError(const Origin& route, uint64_t request_id, const Status& status) {
  Status sent = endpoint_->transport().Reply(
      route, OutgoingMessage{request_id, -1, ErrorReplyOf(status)});
  if (!sent.ok()) TLOG(WARNING) << "error reply (" << status.message() << "): " << sent;
}

void Coordinator::ReplyAck(const Origin& route, uint64_t request_id, const std::string& detail) {
  Status sent = endpoint_->transport().Reply(route, OutgoingMessage{request_id, -1, Ack{detail}});
  if (!sent.ok()) TLOG(WARNING) << "ack: " << sent;
}

FleetView Coordinator::BuildView() const {
  FleetView view;
  view.job = options_.job;
  view.epoch = epoch_;
  view.num_servers = options_.num_servers;
  view.num_workers = ExpectedWorkers();
  view.key_space = options_.key_space;
  view.replicas = options_.replicas;
  for (const auto& [key, member] : members_) view.members.push_back(member.info);
  return view;
}

void Coordinator::PublishSnapshot() {
  FleetView view = BuildView();
  if (options_.on_fleet_change) options_.on_fleet_change(view);
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = std::move(view);
  for (const auto& [key, member] : members_) last_heard_[key] = member.last_seen;
}

FleetView Coordinator::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

std::map<std::pair<Role, int>, int64_t> Coordinator::MillisSinceHeard() const {
  std::map<std::pair<Role, int>, int64_t> ages;
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  for (const auto& [key, heard] : last_heard_) ages[key] = MillisSince(heard);
  return ages;
}

void Coordinator::UpdateMemberGauges() {
  if (members_gauge_ == nullptr) return;
  for (Role role : {Role::kServer, Role::kWorker}) {
    for (MemberState state : {MemberState::kJoining, MemberState::kAlive, MemberState::kFailed,
                              MemberState::kLeft}) {
      int count = 0;
      for (const auto& [key, member] : members_) {
        if (member.info.role == role && member.info.state == state) ++count;
      }
      StatusOr<Gauge*> gauge = members_gauge_->WithLabels(
          {std::string(RoleName(role)), std::string(MemberStateName(state))});
      if (gauge.ok()) (*gauge)->Set(count);
    }
  }
}

}  // namespace tessera::coordinator
