#include "worker/engines/ps_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include <unistd.h>

#include "common/base/and_list.h"
#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"

namespace tessera::worker {
namespace {

enum OpIndex { kPushPull = 0, kSparsePush = 1, kSparsePull = 2 };

// Chunk `chunk` of `data` (null: no values); borrowed from `owner`'s memory when there is
// one, else copied.
TensorData ChunkTensor(const DenseChunk& chunk, const float* data,
                       const std::shared_ptr<const void>& owner) {
  std::string name = "chunk" + std::to_string(chunk.index);
  if (data == nullptr) {
    return TensorData{std::move(name), chunk.key, DataType::kFloat32,
                      {static_cast<int64_t>(chunk.size)}, Payload()};
  }
  if (owner != nullptr) {
    return TensorData::Floats(std::move(name), chunk.key, data, chunk.size, owner);
  }
  return TensorData::Floats(std::move(name), chunk.key,
                            std::vector<float>(data, data + chunk.size));
}

constexpr int64_t kStartingRetryMs = 20;

// A server that registered but has not installed its PsService yet (see Initialize), while
// there is time left to wait for it.
bool IsStillStarting(const Status& status, const Deadline& deadline) {
  return status.code() == StatusCode::kUnimplemented && !deadline.Expired();
}

}  // namespace

StatusOr<std::unique_ptr<PsEngine>> PsEngine::Create(const PsEngineOptions& options,
                                                     RpcEndpoint* endpoint, const FleetView& view,
                                                     int rank, MetricsRegistry* metrics) {
  std::unique_ptr<PsEngine> engine(new PsEngine(options, endpoint, view, rank));
  engine->job_token_ = PsJobToken(view);
  for (int s = 0; s < view.num_servers; ++s) {
    const MemberInfo* server = view.Find(Role::kServer, s);
    if (server == nullptr) {
      return FailedPreconditionError("the fleet view has no server " + std::to_string(s) + " of " +
                                     std::to_string(view.num_servers));
    }
    engine->server_addresses_.push_back(server->address);
  }
  if (view.num_servers < 1) {
    return InvalidArgumentError(std::string(PsModeName(options.consistency)) +
                                " needs parameter servers: start the fleet with --servers N "
                                "(tessera-launch) or --num-servers N");
  }
  if (view.replicas < 1 || view.replicas > view.num_servers) {
    return InvalidArgumentError("the fleet view has " + std::to_string(view.replicas) +
                                " replicas of each key range for " +
                                std::to_string(view.num_servers) + " servers");
  }
  engine->replicas_ = view.replicas;
  // ps-sync's copies apply each step's gradients summed in rank order, bitwise alike however
  // the pushes reach them; the other modes need one order, the primary's: two copies forward,
  // three or more forward along a chain (server/ps/dense_shard.h).
  engine->forwarding_ =
      view.replicas == 2 || (view.replicas > 2 && options.consistency != PsConsistency::kSync);
  engine->lost_.assign(static_cast<size_t>(view.num_servers), false);
  namespace names = metric_names;
  ASSIGN_OR_RETURN(HistogramFamily * latency,
                   metrics->RegisterHistogram(names::kPsClientLatencySeconds.name,
                                              names::kPsClientLatencySeconds.help, {"op"},
                                              DefaultLatencyBuckets()));
  const char* ops[] = {"push_pull", "sparse_push", "sparse_pull"};
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(engine->latency_[i], latency->WithLabels({ops[i]}));
  }
  ASSIGN_OR_RETURN(CounterFamily * sent,
                   metrics->RegisterCounter(names::kPsClientBytesSentTotal.name,
                                            names::kPsClientBytesSentTotal.help, {"op"}));
  ASSIGN_OR_RETURN(CounterFamily * received,
                   metrics->RegisterCounter(names::kPsClientBytesReceivedTotal.name,
                                            names::kPsClientBytesReceivedTotal.help, {"op"}));
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(engine->bytes_sent_[i], sent->WithLabels({ops[i]}));
    ASSIGN_OR_RETURN(engine->bytes_received_[i], received->WithLabels({ops[i]}));
  }
  ASSIGN_OR_RETURN(CounterFamily * failovers,
                   metrics->RegisterCounter(names::kPsClientFailoversTotal.name,
                                            names::kPsClientFailoversTotal.help, {}));
  ASSIGN_OR_RETURN(engine->failovers_, failovers->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * retargeted,
                   metrics->RegisterCounter(names::kPsClientRetargetedTotal.name,
                                            names::kPsClientRetargetedTotal.help, {}));
  ASSIGN_OR_RETURN(engine->retargeted_, retargeted->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * copies,
                   metrics->RegisterCounter(names::kPsClientRangeCopiesTotal.name,
                                            names::kPsClientRangeCopiesTotal.help, {}));
  ASSIGN_OR_RETURN(engine->range_copies_, copies->WithLabels({}));
  return engine;
}

std::shared_future<StatusOr<Envelope>> PsEngine::SendTo(int server, MessageBody request,
                                                        int64_t step, const std::string& what) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  const std::string& address = server_addresses_[static_cast<size_t>(server)];
  if (auto failed = failed_addresses_.find(address); failed != failed_addresses_.end()) {
    std::promise<StatusOr<Envelope>> answered;
    answered.set_value(failed->second.WithContext(what));
    return answered.get_future().share();
  }
  return endpoint_->CallAsync(address, std::move(request), step,
                              Deadline::AfterMillis(options_.request_timeout_ms), what,
                              options_.request_resend_ms);
}

PsEngine::Reply PsEngine::Send(int range, MessageBody request, int64_t step,
                               const std::string& what, Fanout fanout,
                               std::optional<std::pair<MessageBody, int64_t>> ask_again) {
  Reply reply;
  reply.range = range;
  if (ask_again.has_value()) {
    reply.ask_again = std::move(ask_again->first);
    reply.ask_again_step = ask_again->second;
  } else if (fanout == Fanout::kPrimary && replicas_ > 1) {
    reply.ask_again = request;
    reply.ask_again_step = step;
  }
  std::vector<int> servers = LiveReplicas(range);
  if (servers.empty()) {
    // Every copy failed: ServerLost has failed the endpoint, whose calls say why.
    servers.push_back(range);
  }
  // The backups a push names and the primary it goes to come from one view of the fleet: a
  // server declared failed between two looks would otherwise be skipped as the primary and
  // named as its own backup.
  if (fanout == Fanout::kPrimary) {
    NameBackups(servers, &request);
    servers.resize(1);
  }
  for (size_t k = 0; k < servers.size(); ++k) {
    MessageBody copy = k + 1 < servers.size() ? request : std::move(request);
    if (k > 0 && fanout == Fanout::kValues) {
      if (auto* push_pull = std::get_if<PsPushPullRequest>(&copy)) push_pull->ack_only = true;
    }
    const std::string copy_what =
        replicas_ == 1 ? what : what + " (replica on server " + std::to_string(servers[k]) + ")";
    reply.copies.emplace_back(servers[k], SendTo(servers[k], std::move(copy), step, copy_what));
  }
  return reply;
}

void PsEngine::NameBackups(const std::vector<int>& live, MessageBody* request) const {
  if (!forwarding_) return;
  std::string* forward_to = nullptr;
  if (auto* push_pull = std::get_if<PsPushPullRequest>(request)) {
    if (push_pull->has_gradients) forward_to = &push_pull->forward_to;
  } else if (auto* rows = std::get_if<SparsePushRequest>(request)) {
    // ps-sync sends each row push to every copy.
    if (options_.consistency != PsConsistency::kSync) forward_to = &rows->forward_to;
  }
  if (forward_to == nullptr) return;
  forward_to->clear();
  for (size_t k = 1; k < live.size(); ++k) {
    if (k > 1) *forward_to += ',';
    *forward_to += server_addresses_[static_cast<size_t>(live[k])];
  }
}

std::vector<int> PsEngine::LiveReplicas(int range) const {
  std::vector<int> live;
  std::lock_guard<std::mutex> lock(lost_mu_);
  for (int k = 0; k < replicas_; ++k) {
    const int server = RangeReplicaServer(range, k, view_.num_servers);
    if (!lost_[static_cast<size_t>(server)] && copied_.count(server) == 0) live.push_back(server);
  }
  // Joined servers taken in by a copy (ps-async, ps-ssp) come last.
  for (int k = 0; k < replicas_; ++k) {
    const int server = RangeReplicaServer(range, k, view_.num_servers);
    auto copied = copied_.find(server);
    if (!lost_[static_cast<size_t>(server)] && copied != copied_.end() &&
        copied->second.count(range) > 0) {
      live.push_back(server);
    }
  }
  return live;
}

bool PsEngine::IsLost(int server) const {
  std::lock_guard<std::mutex> lock(lost_mu_);
  return lost_[static_cast<size_t>(server)];
}

std::string PsEngine::RangeLostMessage(int range) const {
  const auto [begin, end] = ServerKeyRange(view_.key_space, view_.num_servers, range);
  std::vector<int> replicas;
  for (int k = 0; k < replicas_; ++k) {
    replicas.push_back(RangeReplicaServer(range, k, view_.num_servers));
  }
  const std::string servers = AndList(replicas);
  return "range " + std::to_string(range) + " (keys [" + std::to_string(begin) + ", " +
         std::to_string(end) + ") and the embedding rows hashing to it) is lost: " +
         (replicas_ == 1 ? "its only copy was on server " + servers + " (--replicas 1)"
                         : "its " + std::to_string(replicas_) + " replicas, servers " + servers +
                               ", failed");
}

Status PsEngine::PeerLost(const FailureNotice& notice) {
  // A worker's loss is the job's end (an empty reason: the notice says it all).
  if (notice.role != Role::kServer) return AbortedError("");
  return ServerLost(notice.rank, notice.reason);
}

Status PsEngine::ServerLost(int server, const std::string& reason) {
  if (server < 0 || server >= view_.num_servers) {
    return InvalidArgumentError("server " + std::to_string(server) + " is not in the fleet view");
  }
  if (replicas_ == 1) return FailedPreconditionError(RangeLostMessage(server));
  const Status failed =
      UnavailableError("server " + std::to_string(server) + " failed: " + reason);
  std::string address;
  bool joiner = false;  // a joined server not taken in yet
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (lost_[static_cast<size_t>(server)]) {
      // A server that joined in its place and failed before it held its ranges: forgotten
      // (TakeInJoined passes it over), and calls to it fail now.
      auto joined = joined_.find(server);
      if (joined == joined_.end() || joined->second.empty()) return OkStatus();
      TLOG(WARNING) << "server " << server << ", which joined in the failed one's place, "
                    << "failed before it held its ranges (" << reason << ")";
      address = std::move(joined->second);
      joined->second.clear();
      joiner = true;
    } else {
      lost_[static_cast<size_t>(server)] = true;
      address = server_addresses_[static_cast<size_t>(server)];
      // A joined server that failed while (or after) its ranges were copied to it.
      copied_.erase(server);
      if (auto joined = joined_.find(server); joined != joined_.end()) joined->second.clear();
    }
    failed_addresses_.emplace(address, failed);
  }
  if (joiner) {
    endpoint_->FailCallsTo(address, failed);
    return OkStatus();
  }
  std::string moved;  // "range 1 to server 2, ..."
  for (int range = 0; range < view_.num_servers; ++range) {
    const int offset = (server - range + view_.num_servers) % view_.num_servers;
    if (offset >= replicas_) continue;  // not a replica of `range`
    const std::vector<int> live = LiveReplicas(range);
    if (live.empty()) return FailedPreconditionError(RangeLostMessage(range));
    // Its primary moved when the failed server was the first live one before.
    bool was_primary = true;
    for (int k = 0; k < offset; ++k) {
      if (!IsLost(RangeReplicaServer(range, k, view_.num_servers))) was_primary = false;
    }
    if (was_primary) {
      moved += std::string(moved.empty() ? "" : ", ") + "range " + std::to_string(range) +
               " to server " + std::to_string(live[0]);
    }
  }
  failovers_->Increment();
  TLOG(WARNING) << "server " << server << " failed (" << reason << "); carrying on with the "
                << "other replicas of its ranges"
                << (moved.empty() ? std::string() : "; new primaries: " + moved);
  endpoint_->FailCallsTo(address, failed);
  return OkStatus();
}

void PsEngine::FleetChanged(const FleetView& view) {
  for (const MemberInfo& member : view.members) {
    if (member.role != Role::kServer || member.state != MemberState::kAlive ||
        member.rank < 0 || member.rank >= view_.num_servers) {
      continue;
    }
    std::lock_guard<std::mutex> lock(lost_mu_);
    const auto rank = static_cast<size_t>(member.rank);
    auto joined = joined_.find(member.rank);
    if (!lost_[rank] || member.address == server_addresses_[rank] ||
        (joined != joined_.end() && joined->second == member.address)) {
      continue;
    }
    joined_[member.rank] = member.address;
    TLOG(INFO) << "server " << member.rank << " joined at " << member.address << " in the "
               << "failed one's place; it gets its ranges "
               << (options_.consistency == PsConsistency::kSync
                       ? "after the next step every worker agrees on"
                       : "from rank 0 after its next step");
    joined_cv_.notify_all();
  }
}

bool PsEngine::StopAskedIn(int64_t step) {
  if (stop_read_step_ != step) {
    stop_read_step_ = step;
    stop_asked_ = options_.stop_requested && options_.stop_requested();
    std::lock_guard<std::mutex> lock(lost_mu_);
    join_asked_ = joined_.empty() ? -1 : joined_.begin()->first;
  }
  return stop_asked_;
}

int PsEngine::JoinAskedIn(int64_t step) {
  StopAskedIn(step);
  return join_asked_;
}

Status PsEngine::TakeInJoined(int64_t step, int server, const float* params) {
  // This worker's view may come a moment after another's push named the server.
  std::string address;
  {
    std::unique_lock<std::mutex> lock(lost_mu_);
    const Deadline deadline = Deadline::AfterMillis(options_.request_timeout_ms);
    while (joined_.count(server) == 0) {
      if (deadline.Expired()) {
        return DeadlineExceededError(
            "the replies of step " + std::to_string(step) + " say server " +
            std::to_string(server) + " joined, but the coordinator's fleet view saying so did "
            "not reach this worker within " + std::to_string(options_.request_timeout_ms) + " ms");
      }
      if (options_.stop_requested && options_.stop_requested()) {
        return CancelledError("waiting for the fleet view with server " + std::to_string(server) +
                              ": stopped (the process was asked to stop)");
      }
      joined_cv_.wait_for(lock, std::chrono::milliseconds(kStopCheckMs));
    }
    address = joined_[server];
    if (address.empty()) {  // it failed since (ServerLost): its ranges keep their copies
      joined_.erase(server);
      TLOG(WARNING) << "server " << server << " was to hold its ranges after step " << step
                    << ", but failed before; they keep their other copies";
      return OkStatus();
    }
    server_addresses_[static_cast<size_t>(server)] = address;
  }
  auto started = SteadyClock::now();
  std::string copied;  // "range 0 from server 2, ..."
  double bytes = 0;
  if (rank_ == 0) {
    // The ranges it holds a copy of: those whose replicas include it.
    for (int range = 0; range < view_.num_servers; ++range) {
      if (!IsReplicaOf(server, range)) continue;
      CheckpointRequest ask{"", step, false, range};
      ask.copy = true;
      ASSIGN_OR_RETURN(std::string from,
                       CopyRange(std::move(ask), server, address, step, params, &bytes));
      if (from.empty()) {  // it failed meanwhile: the others fail over from it when told
        std::lock_guard<std::mutex> lock(lost_mu_);
        joined_.erase(server);
        return OkStatus();
      }
      copied += std::string(copied.empty() ? "" : ", ") + from;
    }
  }
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    lost_[static_cast<size_t>(server)] = false;
    joined_.erase(server);
  }
  if (rank_ == 0) {
    TLOG(WARNING) << "server " << server << " (" << address << ") holds its ranges again after "
                  << "step " << step << ": " << copied << " ("
                  << static_cast<uint64_t>(bytes) << " bytes in "
                  << std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() -
                                                                           started)
                         .count()
                  << " ms); " << replicas_ << " copies of every range it holds";
  } else {
    TLOG(INFO) << "server " << server << " (" << address << ") holds its ranges from step "
               << step + 1 << " on";
  }
  return OkStatus();
}

StatusOr<std::string> PsEngine::CopyRange(CheckpointRequest ask, int server,
                                          const std::string& address, int64_t step,
                                          const float* params, double* bytes) {
  const int range = ask.range;
  const std::string what = "copy of range " + std::to_string(range) + " at step " +
                           std::to_string(step) + " for server " + std::to_string(server) +
                           " (joined at " + address + ")";
  Reply copy = Send(range, std::move(ask), step, what);
  std::optional<Deadline> stop_grace;
  ASSIGN_OR_RETURN(Envelope answer, Await(&copy, what, &stop_grace));
  ASSIGN_OR_RETURN(CheckpointReply shard, TakeBody<CheckpointReply>(std::move(answer), what));
  PsInitRequest init{config_json_, {}, job_token_, range};
  for (size_t i : chunks_of_server_[static_cast<size_t>(range)]) {
    const DenseChunk& chunk = chunks_[i];
    init.tensors.push_back(ChunkTensor(chunk, params + chunk.offset, nullptr));
  }
  for (const TensorData& entry : shard.tensors) *bytes += static_cast<double>(entry.bytes.size());
  init.copy = std::move(shard.tensors);
  init.copy_step = step;
  const std::string to = "the copy of range " + std::to_string(range) + " to server " +
                         std::to_string(server) + " (joined at " + address + ")";
  {
    // Nothing else is sent there before it holds a range (it is not a live replica yet).
    std::lock_guard<std::mutex> lock(lost_mu_);
    server_addresses_[static_cast<size_t>(server)] = address;
  }
  Reply taken;
  taken.range = range;
  taken.copies.emplace_back(server, SendTo(server, std::move(init), step, to));
  if (Status sent = Await(&taken, to, &stop_grace).status(); !sent.ok()) {
    std::lock_guard<std::mutex> lock(lost_mu_);
    auto joined = joined_.find(server);
    if (joined == joined_.end() || !joined->second.empty()) return sent;
    TLOG(WARNING) << "server " << server << " failed while its ranges were copied to it (" << sent
                  << "); they keep their other copies";
    return std::string();
  }
  range_copies_->Increment();
  return "range " + std::to_string(range) + " from server " +
         std::to_string(copy.copies.front().first);
}

Status PsEngine::CopyToJoined(int64_t step, const float* params) {
  std::map<int, std::string> joined;
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    for (auto it = joined_.begin(); it != joined_.end();) {
      if (it->second.empty()) {  // it failed since (ServerLost): its ranges keep their copies
        it = joined_.erase(it);
      } else {
        ++it;
      }
    }
    if (rank_ != 0) return OkStatus();
    joined = joined_;
  }
  for (const auto& [server, address] : joined) {
    const auto started = SteadyClock::now();
    std::string copied;  // "range 0 from server 2, ..."
    double bytes = 0;
    bool failed = false;
    for (int range = 0; range < view_.num_servers; ++range) {
      if (!IsReplicaOf(server, range)) continue;
      CheckpointRequest ask{"", step, false, range};
      ask.copy = true;
      ask.forward_to = address;
      ask.forward_rank = server;
      ASSIGN_OR_RETURN(std::string from,
                       CopyRange(std::move(ask), server, address, step, params, &bytes));
      failed = from.empty();  // it failed meanwhile: its ranges keep their other copies
      if (failed) break;
      TakeInCopy(range, address);
      copied += std::string(copied.empty() ? "" : ", ") + from;
    }
    std::lock_guard<std::mutex> lock(lost_mu_);
    joined_.erase(server);
    if (failed) continue;
    TLOG(WARNING) << "server " << server << " (" << address << ") holds copies of its ranges "
                  << "again, each forwarded every update from its copy on: " << copied << " ("
                  << static_cast<uint64_t>(bytes) << " bytes in "
                  << std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() -
                                                                           started)
                         .count()
                  << " ms, at step " << step << "); " << replicas_
                  << " copies of every range it holds";
  }
  return OkStatus();
}

void PsEngine::TakeInCopy(int range, const std::string& address) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  // The joined server at that address, from the coordinator's fleet view (until it comes, the
  // later replies say so again; a server that failed since, or its predecessor's address, is
  // no longer there).
  auto joined = joined_.begin();
  while (joined != joined_.end() && joined->second != address) ++joined;
  if (joined == joined_.end() || !IsReplicaOf(joined->first, range)) return;
  const int server = joined->first;
  auto copied = copied_.find(server);
  if (copied != copied_.end() && copied->second.count(range) > 0) return;
  server_addresses_[static_cast<size_t>(server)] = joined->second;
  copied_[server].insert(range);
  lost_[static_cast<size_t>(server)] = false;
  TLOG(DEBUG) << "server " << server << " (" << joined->second << ") holds a copy of range "
              << range << " now, last among its replicas";
  bool all = true;
  for (int other = 0; other < view_.num_servers; ++other) {
    if (IsReplicaOf(server, other) && copied_[server].count(other) == 0) all = false;
  }
  if (!all || rank_ == 0) return;  // rank 0 says so once it copied them all (CopyToJoined)
  TLOG(INFO) << "server " << server << " (" << joined->second << ") holds copies of its "
             << "ranges now, last among their replicas";
  joined_.erase(joined);
}

Status PsEngine::AwaitReply(const std::shared_future<StatusOr<Envelope>>& reply,
                            const std::string& what, std::optional<Deadline>* stop_grace) {
  while (options_.stop_requested && options_.stop_grace &&
         reply.wait_for(std::chrono::milliseconds(kStopCheckMs)) != std::future_status::ready) {
    if (!stop_grace->has_value() && options_.stop_requested()) {
      *stop_grace = Deadline::AfterMillis(kStopGraceMs);
    }
    if (stop_grace->has_value() && (*stop_grace)->Expired()) {
      return CancelledError(what + ": stopped while waiting (the process was asked to stop, "
                            "and no reply came within " + std::to_string(kStopGraceMs) +
                            " ms)");
    }
  }
  reply.wait();
  return OkStatus();
}

StatusOr<Envelope> PsEngine::Await(Reply* reply, const std::string& what,
                                   std::optional<Deadline>* stop_grace) {
  while (true) {
    for (const auto& [server, copy] : reply->copies) {
      RETURN_IF_ERROR(AwaitReply(copy, what, stop_grace));
    }
    std::optional<StatusOr<Envelope>> answer;
    bool first_lost = false;
    for (size_t k = 0; k < reply->copies.size(); ++k) {
      const auto& [server, copy] = reply->copies[k];
      const StatusOr<Envelope>& result = copy.get();
      if (!result.ok() && replicas_ > 1 && IsLost(server)) {
        first_lost |= k == 0;
        continue;  // a replica that failed: the others answer for it
      }
      if (!result.ok()) return result.status().WithContext(what);
      if (!answer.has_value()) answer = result;
    }
    if (answer.has_value() && !(first_lost && reply->ask_again.has_value())) {
      return std::move(*answer);
    }
    const std::vector<int> live = LiveReplicas(reply->range);
    if (live.empty() || !reply->ask_again.has_value()) {
      return FailedPreconditionError(RangeLostMessage(reply->range)).WithContext(what);
    }
    // What only the failed primary was to answer, from the range's new one.
    retargeted_->Increment();
    const std::string again = what + " (asked again of server " + std::to_string(live[0]) +
                              ", the range's primary now)";
    MessageBody request = *reply->ask_again;
    NameBackups(live, &request);  // not the new primary itself
    reply->copies.clear();
    reply->copies.emplace_back(live[0],
                               SendTo(live[0], std::move(request), reply->ask_again_step, again));
  }
}

Status PsEngine::WaitAll(std::vector<std::pair<Reply, std::string>>* replies,
                         std::vector<StatusOr<Envelope>>* results) {
  Status first = OkStatus();
  results->clear();
  std::optional<Deadline> stop_grace;  // set once a stop is seen
  for (auto& [reply, what] : *replies) {
    StatusOr<Envelope> result = Await(&reply, what, &stop_grace);
    if (!result.ok() && result.status().code() == StatusCode::kCancelled) return result.status();
    if (!result.ok() && first.ok()) first = result.status();
    results->push_back(std::move(result));
  }
  return first;
}

Status PsEngine::Initialize(const ParameterLayout& layout,
                            const std::vector<EmbeddingTableSpec>& tables, float* params) {
  ASSIGN_OR_RETURN(chunks_, PlanDenseChunks(layout.total_size(), options_.chunk_elements,
                                            view_.num_servers, view_.key_space));
  chunks_of_server_.assign(static_cast<size_t>(view_.num_servers), {});
  for (size_t i = 0; i < chunks_.size(); ++i) chunks_of_server_[chunks_[i].server].push_back(i);
  regions_.assign(chunks_of_server_.size(), nullptr);
  region_holders_.assign(chunks_of_server_.size(), {});
  region_floats_.assign(chunks_of_server_.size(), 0);
  region_offset_.assign(chunks_.size(), 0);
  for (size_t s = 0; s < chunks_of_server_.size(); ++s) {
    std::vector<DenseChunk> own;
    for (size_t i : chunks_of_server_[s]) own.push_back(chunks_[i]);
    const std::vector<uint64_t> offsets = PsRegionOffsets(own, &region_floats_[s]);
    for (size_t k = 0; k < own.size(); ++k) region_offset_[chunks_of_server_[s][k]] = offsets[k];
  }
  tables_ = tables;
  fingerprint_ = layout.Fingerprint();
  dense_elements_ = layout.total_size();
  PsJobConfig config;
  config.consistency = options_.consistency;
  config.staleness = options_.staleness;
  config.num_workers = view_.num_workers;
  config.optimizer = options_.optimizer;
  config.schedule = options_.schedule;
  config.dense_elements = layout.total_size();
  config.layout_fingerprint = layout.Fingerprint();
  config.chunk_elements = options_.chunk_elements;
  config.tables = tables;
  config.model = DescribePsModel(layout, tables);
  RETURN_IF_ERROR(ValidatePsJobConfig(config));
  // A server is in the fleet view from the moment it registers but serves ps-* requests only
  // once its PsService is installed, a moment later: a job attaching to a fleet that is still
  // starting is answered Unimplemented in between, so both first contacts retry that until
  // the request deadline.
  const Deadline serving_deadline = Deadline::AfterMillis(options_.request_timeout_ms);
  config_json_ = EncodePsJobConfig(config);
  if (rank_ == 0) {
    const std::string& json = config_json_;
    // Each range on each of its replicas (with --replicas 1: server s, range s).
    auto init = [&](std::pair<int, int> range_server) {
      const auto [range, server] = range_server;
      PsInitRequest request{json, {}, job_token_, range};
      for (size_t i : chunks_of_server_[range]) {
        const DenseChunk& chunk = chunks_[i];
        request.tensors.push_back(ChunkTensor(chunk, params + chunk.offset, nullptr));
      }
      std::string what = "init of server " + std::to_string(server);
      if (range != server) what += " (a replica of range " + std::to_string(range) + ")";
      Reply reply;
      reply.range = range;
      reply.copies.emplace_back(server, SendTo(server, std::move(request), 0, what));
      return std::make_pair(std::move(reply), "initialising server " + std::to_string(server));
    };
    std::vector<std::pair<int, int>> pending;
    for (int range = 0; range < view_.num_servers; ++range) {
      for (int k = 0; k < replicas_; ++k) {
        pending.emplace_back(range, RangeReplicaServer(range, k, view_.num_servers));
      }
    }
    bool told = false;
    while (!pending.empty()) {
      std::vector<std::pair<Reply, std::string>> replies;
      for (const auto& range_server : pending) replies.push_back(init(range_server));
      std::vector<StatusOr<Envelope>> results;
      Status first = WaitAll(&replies, &results);
      if (first.ok()) break;
      std::vector<std::pair<int, int>> starting;
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].ok()) continue;
        if (!IsStillStarting(results[i].status(), serving_deadline)) {
          return results[i].status().WithContext(replies[i].second);
        }
        starting.push_back(pending[i]);
      }
      if (!told) {
        TLOG(INFO) << starting.size() << " server(s) registered but not serving yet (starting): "
                   << first << "; retrying for up to " << options_.request_timeout_ms << " ms";
        told = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kStartingRetryMs));
      pending = std::move(starting);
    }
    TLOG(INFO) << "initialised " << view_.num_servers << " servers"
               << (replicas_ > 1 ? " (" + std::to_string(replicas_) + " copies of each of their " +
                                       std::to_string(view_.num_servers) + " key ranges)"
                                 : std::string())
               << ": " << chunks_.size() << " dense chunks of up to " << options_.chunk_elements
               << " floats, " << tables.size() << " embedding tables";
  }
  // Everyone, rank 0 included, starts from the servers' values.
  while (true) {
    Status pulled = PushPull(/*step=*/1, /*grads=*/nullptr, params, config.model);
    if (pulled.ok()) break;
    if (!IsStillStarting(pulled, serving_deadline)) return pulled.WithContext("initial pull");
    std::this_thread::sleep_for(std::chrono::milliseconds(kStartingRetryMs));
  }
  if (!options_.shared_memory) return OkStatus();
  std::vector<int> ranges(static_cast<size_t>(view_.num_servers));
  for (int range = 0; range < view_.num_servers; ++range) ranges[range] = range;
  return OfferRegions(/*step=*/1, ranges);
}

Status PsEngine::RenewRegions(int64_t step) {
  std::vector<int> ranges;
  for (int range = 0; range < view_.num_servers; ++range) {
    if (regions_[static_cast<size_t>(range)] != nullptr && RegionFor(range) == nullptr) {
      ranges.push_back(range);
    }
  }
  return ranges.empty() ? OkStatus() : OfferRegions(step, ranges, /*renewal=*/true);
}

Status PsEngine::OfferRegions(int64_t step, const std::vector<int>& ranges, bool renewal) {
  struct Offer {
    int range;
    int server;
    std::shared_ptr<SharedRegion> region;
    std::shared_future<StatusOr<Envelope>> reply;
    std::string what;
  };
  std::vector<Offer> offered;
  for (int range : ranges) {
    regions_[static_cast<size_t>(range)] = nullptr;
    region_holders_[static_cast<size_t>(range)].clear();
    // The gradients, then a values half for each copy of the range (server/ps/worker_regions.h).
    StatusOr<std::shared_ptr<SharedRegion>> region = SharedRegion::Create(
        (1 + static_cast<size_t>(replicas_)) * region_floats_[range] * sizeof(float));
    if (!region.ok()) {
      TLOG(INFO) << (replicas_ == 1 ? "server " : "range ") << range << ": no shared region ("
                 << region.status() << "); its chunks travel over the transport";
      continue;
    }
    for (int k = 0; k < replicas_; ++k) {
      const int server = RangeReplicaServer(range, k, view_.num_servers);
      if (IsLost(server)) continue;
      PsPushPullRequest offer{{}, false, job_token_, ""};
      offer.range = range;
      offer.region_pid = getpid();
      offer.region_fd = (*region)->fd();
      offer.region_token_high = (*region)->token().high;
      offer.region_token_low = (*region)->token().low;
      offer.region_writers = replicas_;
      offer.region_writer = k;
      std::string what = "shared-region offer to server " + std::to_string(server);
      if (replicas_ > 1) what += " for range " + std::to_string(range);
      auto reply = SendTo(server, std::move(offer), step, what);
      offered.push_back({range, server, *region, std::move(reply), std::move(what)});
    }
  }
  // Each copy's answer; one that failed meanwhile maps nothing (its range goes on with the
  // others, ServerLost).
  std::optional<Deadline> stop_grace;
  Status answered = OkStatus();
  for (const Offer& offer : offered) {
    answered = AwaitReply(offer.reply, offer.what, &stop_grace);
    if (!answered.ok()) break;
  }
  for (Offer& offer : offered) offer.region->CloseFd();  // mapped by now, or never
  RETURN_IF_ERROR(answered);
  int mapped = 0;
  for (const Offer& offer : offered) {
    StatusOr<Envelope> result = offer.reply.get();
    if (!result.ok() && replicas_ > 1 && IsLost(offer.server)) {
      // Said per copy, so that what a renewal straddling a failure left out can be told apart
      // from a copy that refused (tests/ps_replication_test.cc checks each against the layout).
      TLOG(INFO) << "range " << offer.range << "'s copy on server " << offer.server
                 << " shares no region with this worker: the server failed meanwhile";
      continue;
    }
    if (!result.ok()) return result.status().WithContext(offer.what);
    ASSIGN_OR_RETURN(PsPushPullReply reply,
                     TakeBody<PsPushPullReply>(std::move(result).value(), offer.what));
    if (reply.region_mapped) {
      regions_[offer.range] = offer.region;
      region_holders_[offer.range].insert(server_addresses_[offer.server]);
      ++mapped;
    } else {
      TLOG(INFO) << "server " << offer.server << " did not map this worker's shared region"
                 << (replicas_ == 1 ? std::string() : " for range " + std::to_string(offer.range))
                 << " ("
                 << (reply.region_refusal.empty() ? "an older server" : reply.region_refusal)
                 << "); " << (replicas_ == 1 ? "its" : "the range's")
                 << " chunks travel over the transport";
    }
  }
  if (mapped > 0 && !renewal) {
    TLOG(INFO) << mapped << " of " << offered.size()
               << (replicas_ == 1 ? " servers" : " copies of the key ranges")
               << " share memory with this worker: their chunks pass through it";
  } else if (mapped > 0) {
    TLOG(INFO) << (ranges.size() == 1 ? "range " : "ranges ") << AndList(ranges) << ": " << mapped
               << " of " << offered.size() << " copies, a server taken in among them, share a "
               << "fresh region with this worker";
  }
  return OkStatus();
}

const SharedRegion* PsEngine::RegionFor(int range) const {
  const SharedRegion* region = regions_[static_cast<size_t>(range)].get();
  if (region == nullptr || replicas_ == 1) return region;
  const std::set<std::string>& holders = region_holders_[static_cast<size_t>(range)];
  for (int server : LiveReplicas(range)) {
    if (holders.count(server_addresses_[static_cast<size_t>(server)]) == 0) return nullptr;
  }
  return region;
}

std::pair<PsEngine::Reply, std::string> PsEngine::SendChunks(int64_t step,
                                                             const std::vector<size_t>& group,
                                                             const float* grads,
                                                             const std::string& model,
                                                             bool skip, double* sent) {
  const bool push = grads != nullptr;
  const bool send_gradients = push && !skip;
  const int server = chunks_[group[0]].server;  // the range (its server with --replicas 1)
  PsPushPullRequest request{{}, push, job_token_, model};
  request.range = server;
  const SharedRegion* region = RegionFor(server);
  request.in_region = region != nullptr;
  request.skip = skip;
  request.stop = push && StopAskedIn(step);
  if (push && replicas_ > 1 && options_.consistency == PsConsistency::kSync) {
    request.join = JoinAskedIn(step);
  }
  for (size_t i : group) {
    const DenseChunk& chunk = chunks_[i];
    if (region != nullptr && send_gradients) {
      std::memcpy(region->data() + region_offset_[i] * sizeof(float), grads + chunk.offset,
                  chunk.size * sizeof(float));
    }
    request.tensors.push_back(ChunkTensor(
        chunk, send_gradients && region == nullptr ? grads + chunk.offset : nullptr,
        grads_owner_));
    if (send_gradients) *sent += static_cast<double>(chunk.size * sizeof(float));
  }
  std::string what = std::string(skip ? "skip-pull" : push ? "push-pull" : "pull") + " of step " +
                     std::to_string(step) + " (" + std::to_string(group.size()) +
                     " chunks from chunk " + std::to_string(chunks_[group[0]].index) + ") with " +
                     (replicas_ == 1 ? "server " : "range ") + std::to_string(server);
  if (forwarding_) {
    // The range's primary alone; asked again of the next one as it is (Send), since the
    // backup has the update only if the primary applied and forwarded it.
    Reply reply = Send(server, std::move(request), step, what, Fanout::kPrimary);
    return {std::move(reply), std::move(what)};
  }
  // Asked again of a new primary: the values this request's reply carries, as a pull (the
  // push reached every replica already, and a pull applies nothing).
  std::optional<std::pair<MessageBody, int64_t>> ask_again;
  if (replicas_ > 1) {
    PsPushPullRequest pull{{}, false, job_token_, model};
    pull.range = server;
    for (const TensorData& tensor : request.tensors) {
      pull.tensors.push_back(
          TensorData{tensor.name, tensor.key, tensor.dtype, tensor.shape, Payload()});
    }
    ask_again.emplace(std::move(pull), push ? step + 1 : step);
  }
  Reply reply = Send(server, std::move(request), step, what, Fanout::kValues,
                     std::move(ask_again));
  return {std::move(reply), std::move(what)};
}

void PsEngine::OnBackwardStart(int64_t step, float* grads) {
  // A step that may be skipped sends nothing before every chunk is checked.
  early_step_ = grads != nullptr && !MaySkip() ? step : 0;
  early_grads_ = grads;
  unready_.resize(chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) unready_[i] = chunks_[i].size;
  early_sent_.assign(chunks_.size(), false);
  early_replies_.clear();
  early_groups_.clear();
  early_bytes_ = 0;
  early_check_ = OkStatus();
}

StatusOr<bool> PsEngine::CheckChunks(int64_t step, const std::vector<size_t>& group,
                                     const float* grads) const {
  for (size_t i : group) {
    const DenseChunk& chunk = chunks_[i];
    ASSIGN_OR_RETURN(bool go_on,
                     CheckGradients(step, grads + chunk.offset, chunk.offset, chunk.size));
    if (!go_on) return false;
  }
  return true;
}

void PsEngine::OnGradientsReady(uint64_t offset, uint64_t size) {
  if (early_step_ == 0 || chunks_.empty() || size == 0) return;
  const uint64_t end = offset + size;
  // Chunks are contiguous and in order: the first one that reaches past `offset`, on.
  auto first = std::upper_bound(
      chunks_.begin(), chunks_.end(), offset,
      [](uint64_t at, const DenseChunk& c) { return at < c.offset + c.size; });
  for (auto it = first; it != chunks_.end() && it->offset < end; ++it) {
    const size_t i = static_cast<size_t>(it - chunks_.begin());
    const uint64_t covered = std::min(end, it->offset + it->size) - std::max(offset, it->offset);
    unready_[i] -= std::min(unready_[i], covered);
    if (unready_[i] != 0 || early_sent_[i] || !early_check_.ok()) continue;
    // While the chunk is in cache. Without MaySkip the check passes or fails.
    early_check_ = CheckChunks(early_step_, {i}, early_grads_).status();
    if (!early_check_.ok()) continue;  // Step reports it; nothing more goes out
    early_sent_[i] = true;
    early_groups_.push_back({i});
    early_replies_.push_back(
        SendChunks(early_step_, {i}, early_grads_, "", /*skip=*/false, &early_bytes_));
  }
}

Status PsEngine::PushPull(int64_t step, const float* grads, float* params,
                          const std::string& model) {
  const bool push = grads != nullptr;
  std::vector<std::pair<Reply, std::string>> replies;
  std::vector<std::vector<size_t>> groups;  // the chunks of each request
  double sent = 0;
  const bool early = push && early_step_ == step;
  if (early) {
    replies = std::move(early_replies_);
    groups = std::move(early_groups_);
    sent = early_bytes_;
  }
  early_step_ = 0;
  early_replies_.clear();
  early_groups_.clear();
  if (early) RETURN_IF_ERROR(early_check_);
  // A skip must be every chunk's, so the whole gradient (the chunks, end to end) is checked
  // before the first chunk goes.
  bool skip = false;
  if (push && MaySkip() && !chunks_.empty()) {
    ASSIGN_OR_RETURN(bool go_on,
                     CheckGradients(step, grads, 0, chunks_.back().offset + chunks_.back().size));
    skip = !go_on;
  }
  const size_t per = static_cast<size_t>(std::max(1, options_.chunks_per_request));
  for (int s = 0; s < view_.num_servers; ++s) {
    std::vector<size_t> left;
    for (size_t i : chunks_of_server_[s]) {
      if (!early || !early_sent_[i]) left.push_back(i);
    }
    for (size_t begin = 0; begin < left.size(); begin += per) {
      std::vector<size_t> group(left.begin() + static_cast<std::ptrdiff_t>(begin),
                                left.begin() + static_cast<std::ptrdiff_t>(
                                                   std::min(left.size(), begin + per)));
      if (push && !MaySkip()) RETURN_IF_ERROR(CheckChunks(step, group, grads).status());
      replies.push_back(SendChunks(step, group, grads, model, skip, &sent));
      groups.push_back(std::move(group));
    }
  }
  // Each reply's values go into the parameters as soon as it is here, while the later ones
  // are still on their way: the copy overlaps the transfer instead of following it. A failed
  // reply ends the step; requests still out keep what they borrowed (SetGradientOwner).
  auto started = SteadyClock::now();
  std::optional<Deadline> stop_grace;  // set once a stop is seen
  double received = 0;
  bool told_skip = false;
  for (size_t r = 0; r < replies.size(); ++r) {
    ASSIGN_OR_RETURN(Envelope result, Await(&replies[r].first, replies[r].second, &stop_grace));
    // In a shared region, the copy that answered wrote the values into its own half.
    const int range = replies[r].first.range;
    const int writer = (result.header.sender_rank - range + view_.num_servers) % view_.num_servers;
    ASSIGN_OR_RETURN(PsPushPullReply reply,
                     TakeBody<PsPushPullReply>(std::move(result), replies[r].second));
    // ps-sync: another worker skipped this step, so the servers dropped it (told once).
    if (reply.skipped_by >= 0 && reply.skipped_by != rank_ && !told_skip) {
      told_skip = true;
      SkippedByPeer(step, reply.skipped_by, std::nullopt);
    }
    if (push && reply.stopped_by >= 0) {
      if (stopped_step_ != step) stopped_by_ = -1;
      stopped_step_ = step;
      stopped_by_ = stopped_by_ < 0 ? reply.stopped_by : std::min(stopped_by_, reply.stopped_by);
    }
    if (push && !reply.copied_to.empty()) {
      copies_seen_.emplace(replies[r].first.range, reply.copied_to);  // taken in after the step
    }
    if (push && reply.joining >= 0) {
      if (joining_step_ != step) joining_ = -1;
      joining_step_ = step;
      joining_ = joining_ < 0 ? reply.joining : std::min(joining_, reply.joining);
    }
    if (reply.tensors.size() != groups[r].size()) {
      return DataLossError(replies[r].second + ": the reply has " +
                           std::to_string(reply.tensors.size()) + " chunks, not " +
                           std::to_string(groups[r].size()));
    }
    for (size_t k = 0; k < groups[r].size(); ++k) {
      const size_t i = groups[r][k];
      const DenseChunk& chunk = chunks_[i];
      const TensorData& values = reply.tensors[k];
      const size_t bytes = chunk.size * sizeof(float);
      // From a server that mapped this worker's region, the values are there (unless the
      // reply carries them after all).
      const SharedRegion* region = regions_[chunk.server].get();
      const bool in_region = region != nullptr && values.bytes.empty() && writer < replicas_;
      if (values.key != chunk.key || values.dtype != DataType::kFloat32 ||
          (!in_region && values.bytes.size() != bytes)) {
        return DataLossError(replies[r].second + ": chunk " + std::to_string(chunk.index) +
                             " came back as key " + std::to_string(values.key) + " with " +
                             std::to_string(values.bytes.size()) + " bytes of " +
                             std::string(DataTypeName(values.dtype)));
      }
      const uint8_t* from =
          in_region ? region->data() + ((1 + static_cast<uint64_t>(writer)) *
                                            region_floats_[chunk.server] +
                                        region_offset_[i]) *
                                           sizeof(float)
                    : values.bytes.data();
      std::memcpy(params + chunk.offset, from, bytes);
      received += static_cast<double>(bytes);
    }
  }
  latency_[kPushPull]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  bytes_sent_[kPushPull]->Increment(sent);
  bytes_received_[kPushPull]->Increment(received);
  return OkStatus();
}

Status PsEngine::LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) {
  if (table >= tables_.size()) {
    return InvalidArgumentError("no embedding table " + std::to_string(table));
  }
  const EmbeddingTableSpec& spec = tables_[table];
  const size_t dim = static_cast<size_t>(spec.dim);
  std::vector<std::vector<int64_t>> ids_of(static_cast<size_t>(view_.num_servers));
  std::vector<std::vector<size_t>> positions_of(ids_of.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int owner = SparseRowOwner(table, ids[i], view_.num_servers);
    ids_of[owner].push_back(ids[i]);
    positions_of[owner].push_back(i);
  }
  std::vector<std::pair<Reply, std::string>> replies;
  std::vector<int> servers;
  for (int s = 0; s < view_.num_servers; ++s) {
    if (ids_of[s].empty()) continue;
    std::string what = "pull of " + std::to_string(ids_of[s].size()) + " rows of table '" +
                       spec.name + "' from server " + std::to_string(s);
    // The ids are copied: a request may outlive this call (see SetGradientOwner).
    SparsePullRequest request{spec.name, TensorData::Int64s("row_ids", ids_of[s]), s};
    bytes_sent_[kSparsePull]->Increment(static_cast<double>(ids_of[s].size() * sizeof(int64_t)));
    replies.emplace_back(Send(s, std::move(request), last_step_ + 1, what), what);
    servers.push_back(s);
  }
  auto started = SteadyClock::now();
  std::vector<StatusOr<Envelope>> results;
  RETURN_IF_ERROR(WaitAll(&replies, &results));
  latency_[kSparsePull]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  for (size_t r = 0; r < results.size(); ++r) {
    const int s = servers[r];
    ASSIGN_OR_RETURN(SparsePullReply reply,
                     TakeBody<SparsePullReply>(std::move(results[r]).value(), replies[r].second));
    if (reply.values.dtype != DataType::kFloat32 ||
        reply.values.bytes.size() != ids_of[s].size() * dim * sizeof(float)) {
      return DataLossError(replies[r].second + ": the reply does not hold " +
                           std::to_string(ids_of[s].size()) + " rows of " + std::to_string(dim) +
                           " floats");
    }
    bytes_received_[kSparsePull]->Increment(static_cast<double>(reply.values.bytes.size()));
    // A joined server holds the range (a range without dense chunks says so only here).
    if (!reply.copied_to.empty()) copies_seen_.emplace(s, reply.copied_to);
    const uint8_t* bytes = reply.values.bytes.data();
    for (size_t k = 0; k < positions_of[s].size(); ++k) {
      std::memcpy(values + positions_of[s][k] * dim, bytes + k * dim * sizeof(float),
                  dim * sizeof(float));
    }
  }
  return OkStatus();
}

Status PsEngine::Step(int64_t step, float* params, float* grads,
                      const std::vector<SparseRows>& sparse) {
  if (sparse.size() != tables_.size()) {
    return InvalidArgumentError("gradients for " + std::to_string(sparse.size()) +
                                " embedding tables, the job has " + std::to_string(tables_.size()));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    const size_t dim = static_cast<size_t>(tables_[t].dim);
    if (sparse[t].grads.size() != sparse[t].ids.size() * dim) {
      return InvalidArgumentError("step " + std::to_string(step) + ": embedding table '" +
                                  tables_[t].name + "': " +
                                  std::to_string(sparse[t].grads.size()) +
                                  " gradient floats for " + std::to_string(sparse[t].ids.size()) +
                                  " rows of " + std::to_string(dim));
    }
  }
  // Sparse rows first (their acks are waited for below, with the dense replies): ps-sync
  // servers need a push, possibly empty, from every worker for every table.
  std::vector<std::pair<Reply, std::string>> acks;
  auto started = SteadyClock::now();
  for (size_t t = 0; t < tables_.size(); ++t) {
    const size_t dim = static_cast<size_t>(tables_[t].dim);
    const SparseRows& rows = sparse[t];
    std::vector<std::vector<int64_t>> ids_of(static_cast<size_t>(view_.num_servers));
    std::vector<std::vector<float>> grads_of(ids_of.size());
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      const int owner = SparseRowOwner(t, rows.ids[i], view_.num_servers);
      ids_of[owner].push_back(rows.ids[i]);
      grads_of[owner].insert(grads_of[owner].end(), rows.grads.begin() + i * dim,
                             rows.grads.begin() + (i + 1) * dim);
    }
    for (int s = 0; s < view_.num_servers; ++s) {
      if (ids_of[s].empty() && options_.consistency != PsConsistency::kSync) continue;
      std::string what = "push of " + std::to_string(ids_of[s].size()) + " rows of table '" +
                         tables_[t].name + "' at step " + std::to_string(step) + " to server " +
                         std::to_string(s);
      bytes_sent_[kSparsePush]->Increment(
          static_cast<double>(ids_of[s].size() * (sizeof(int64_t) + dim * sizeof(float))));
      SparsePushRequest request{tables_[t].name,
                                TensorData::Int64s("row_ids", std::move(ids_of[s])),
                                TensorData::Floats("values", 0, std::move(grads_of[s])), s};
      // ps-async, ps-ssp with two copies: to the primary, which forwards the rows to the
      // backup (the same order on both); else to every copy (ps-sync applies a step's rows at
      // once, in rank order, on each).
      const bool forward = forwarding_ && options_.consistency != PsConsistency::kSync;
      acks.emplace_back(
          Send(s, std::move(request), step, what, forward ? Fanout::kPrimary : Fanout::kAll), what);
    }
  }
  Status dense = PushPull(step, grads, params);
  std::vector<StatusOr<Envelope>> results;
  Status sparse_status = WaitAll(&acks, &results);
  if (!acks.empty()) {
    latency_[kSparsePush]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  }
  RETURN_IF_ERROR(dense);
  RETURN_IF_ERROR(sparse_status);
  last_step_ = step;
  if (options_.consistency != PsConsistency::kSync && forwarding_) {
    // Between steps: no request is out, so none sent to a joined server's failed predecessor
    // is judged by the joined one's liveness.
    for (const auto& [range, address] : copies_seen_) TakeInCopy(range, address);
    copies_seen_.clear();
    RETURN_IF_ERROR(CopyToJoined(step, params));
  } else if (joining_step_ == step && joining_ >= 0) {
    RETURN_IF_ERROR(TakeInJoined(step, joining_, params)
                        .WithContext("taking in server " + std::to_string(joining_) +
                                     " after step " + std::to_string(step)));
  }
  // A server taken in holds ranges it was not offered this worker's regions for.
  return RenewRegions(step + 1);
}

StatusOr<bool> PsEngine::AgreeToStop(int64_t step, bool stop) {
  if (options_.consistency != PsConsistency::kSync || chunks_.empty()) return stop;
  const bool said = StopAskedIn(step);  // what this worker's pushes of the step said
  const int by = stopped_step_ == step ? stopped_by_ : -1;
  if (by >= 0) {
    if (!said) {
      TLOG(INFO) << "worker " << by << " was asked to stop: every worker stops after step "
                 << step;
    }
    return true;
  }
  if (said) {
    // Servers that record no stop requests (of a version before them) answered: stopping
    // alone, as workers did then, beats never stopping.
    TLOG(WARNING) << "this worker's pushes of step " << step << " said it was asked to stop, "
                  << "and the servers' replies did not (servers of an older version?): "
                  << "stopping without the other workers";
    return true;
  }
  if (stop) {
    TLOG(INFO) << "asked to stop during step " << step << "; every worker stops after step "
               << step + 1 << " (this worker's pushes of it say so)";
  }
  return false;
}

StatusOr<std::vector<ShardFileInfo>> PsEngine::CheckpointServers(const std::string& root,
                                                                  int64_t step, bool restore) {
  std::vector<std::pair<Reply, std::string>> replies;
  for (int s = 0; s < view_.num_servers; ++s) {
    std::string what = std::string(restore ? "restore" : "checkpoint") + " of step " +
                       std::to_string(step) + " on server " + std::to_string(s);
    // Every replica loads its range's file; the primary alone writes it.
    replies.emplace_back(Send(s, CheckpointRequest{root, step, restore, s}, step, what,
                              restore ? Fanout::kAll : Fanout::kPrimary),
                         what);
  }
  std::vector<StatusOr<Envelope>> results;
  RETURN_IF_ERROR(WaitAll(&replies, &results));
  std::vector<ShardFileInfo> files;
  for (size_t r = 0; r < results.size(); ++r) {
    ASSIGN_OR_RETURN(CheckpointReply reply,
                     TakeBody<CheckpointReply>(std::move(results[r]).value(), replies[r].second));
    if (reply.files.size() != 1 || reply.bytes.size() != 1 || reply.checksums.size() != 1) {
      return DataLossError(replies[r].second + ": the reply does not describe one shard file");
    }
    files.push_back({reply.files[0], reply.bytes[0], reply.checksums[0]});
  }
  return files;
}

Status PsEngine::SaveCheckpoint(const std::string& root, int64_t step, const float* params) {
  if (rank_ != 0) return OkStatus();
  RETURN_IF_ERROR(PrepareCheckpointStep(root, step));
  ASSIGN_OR_RETURN(std::vector<ShardFileInfo> files, CheckpointServers(root, step, false));
  CheckpointManifest manifest;
  manifest.step = step;
  manifest.mode = std::string(PsModeName(options_.consistency));
  manifest.layout_fingerprint = fingerprint_;
  manifest.dense_elements = dense_elements_;
  manifest.num_servers = view_.num_servers;
  manifest.chunk_elements = options_.chunk_elements;
  manifest.files = std::move(files);
  RETURN_IF_ERROR(CommitCheckpoint(root, manifest));
  TLOG(INFO) << "checkpoint of step " << step << " committed in "
             << CheckpointStepDirectory(root, step) << " (" << manifest.files.size()
             << " server shards)";
  return OkStatus();
}

Status PsEngine::RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
    const std::vector<std::string>& restorable = options_.restores_checkpoints_of;
    if (std::find(restorable.begin(), restorable.end(), manifest.mode) == restorable.end()) {
      return FailedPreconditionError("checkpoint " + CheckpointStepDirectory(root, step) +
                                     " was written in mode " + manifest.mode +
                                     "; a ps-* job resumes from a ps-* checkpoint");
    }
    RETURN_IF_ERROR(CheckpointServers(root, step, true).status());
  }
  // Every rank: the restored values (servers answer once their versions reached `step`).
  last_step_ = step;
  return PushPull(step + 1, /*grads=*/nullptr, params).WithContext("pull after restore");
}

}  // namespace tessera::worker
