#include "worker/torch/group_member.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/base/failure_bus.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/role.h"
#include "common/transport/bind_address.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"

namespace tessera::worker {
namespace {

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string AddressKey(int rank) { return "tessera/address/" + std::to_string(rank); }
std::string GroupIdKey(int rank) { return "tessera/group_id/" + std::to_string(rank); }
std::string ScopeKey(int rank) { return "tessera/loopback_scope/" + std::to_string(rank); }

// Whether `address` (tcp://HOST:PORT) is on a loopback host.
bool IsLoopbackAddress(const std::string& address) {
  const std::string prefix = "tcp://";
  StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(
      address.rfind(prefix, 0) == 0 ? address.substr(prefix.size()) : address);
  return host_port.ok() && IsLoopbackHost(host_port->first);
}

// What a rank publishes under ScopeKey: its LoopbackScope, and its host name for errors.
struct Whereabouts {
  std::string scope;
  std::string host_name;
};

std::string Encode(const Whereabouts& w) { return w.scope + "|" + w.host_name; }
Whereabouts Decode(const std::string& text) {
  const size_t bar = text.rfind('|');
  if (bar == std::string::npos) return {text, ""};
  return {text.substr(0, bar), text.substr(bar + 1)};
}

// FailedPrecondition when this rank or `peer` advertises a loopback address and the two do not
// share a loopback (LoopbackScope: another host, or another network namespace of this one):
// the ring would wait for the unreachable rank until the timeout and then blame a missing
// answer. A rank binds the loopback when it has no rendezvous host to find its route to
// (backend_config.h: no MASTER_ADDR and no TCPStore, as with a file:// init method).
Status CheckReachable(const std::string& who, int rank, const std::string& address,
                      const Whereabouts& here, int peer, const std::string& peer_address,
                      const Whereabouts& there) {
  if (here.scope == there.scope) return OkStatus();
  // The peer's loopback first: it is what this rank could not reach.
  const bool theirs = IsLoopbackAddress(peer_address);
  if (!theirs && !IsLoopbackAddress(address)) return OkStatus();
  return FailedPreconditionError(
      who + ": " + Worker(theirs ? peer : rank) + " advertises " +
      (theirs ? peer_address : address) + ", a loopback address, but " + Worker(rank) + " (on " +
      here.host_name + ", " + here.scope + ") and " + Worker(peer) + " (on " + there.host_name +
      ", " + there.scope + ") are on different hosts or network namespaces, which cannot "
      "reach each other's loopback. Without a rendezvous host (MASTER_ADDR or a TCPStore; "
      "a file:// init method has none) the backend binds the loopback: give every rank "
      "TESSERA_SOCKET_IFNAME=<the interface between the hosts, e.g. eth0>, "
      "TESSERA_BIND_HOST=<its address or interface>, or "
      "MASTER_ADDR=<the rendezvous host>, whose route decides the address");
}

}  // namespace

class GroupHost {
 public:
  ~GroupHost() {
    // What runs ends now: its peers may be gone too, and a wait for them must not hold the
    // process (up to the group's timeout) as it exits. The world then goes (what is queued
    // never starts), before the parts its work uses.
    failures->Fail(CancelledError("the process group is being destroyed"));
  }

  std::unique_ptr<RpcEndpoint> endpoint;
  std::shared_ptr<FailureBus> failures = std::make_shared<FailureBus>();
  std::shared_ptr<CollectiveMailbox> mailbox;
  std::unique_ptr<Communicator> world;  // its queues' threads stop before the parts go
};

namespace {

// The default group's host: the endpoint, and the world's communicator through the store.
StatusOr<std::shared_ptr<GroupHost>> MakeHost(const GroupMemberOptions& options,
                                              const std::string& who, Deadline deadline) {
  auto host = std::make_shared<GroupHost>();
  ZmqTransportOptions transport;
  transport.credentials = options.credentials;
  transport.bind_host = options.bind_host;
  transport.role = Role::kWorker;
  transport.rank = options.rank;
  ASSIGN_OR_RETURN(host->endpoint, StartZmqEndpoint(transport, options.metrics));
  host->mailbox = std::make_shared<CollectiveMailbox>(host->failures);
  host->endpoint->SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(host->mailbox));

  // Rendezvous: every rank's transport address, through the store.
  RETURN_IF_ERROR(options.store->Set(AddressKey(options.rank), host->endpoint->address())
                      .WithContext(who + ": publishing its address"));
  std::vector<std::string> addresses(static_cast<size_t>(options.world_size));
  for (int q = 0; q < options.world_size; ++q) {
    StatusOr<std::string> address = options.store->Get(AddressKey(q), deadline);
    if (!address.ok()) {
      return address.status().WithContext(who + ": waiting for " + Worker(q) + "'s address");
    }
    addresses[static_cast<size_t>(q)] = std::move(address).value();
  }
  // Which ranks share a loopback: one that advertises it to a rank elsewhere is an error now,
  // naming the fix, not a ring setup that waits for it until the timeout.
  const Whereabouts here{LoopbackScope(), LocalHostName()};
  RETURN_IF_ERROR(options.store->Set(ScopeKey(options.rank), Encode(here))
                      .WithContext(who + ": publishing where its loopback leads"));
  for (int q = 0; q < options.world_size; ++q) {
    StatusOr<std::string> there = options.store->Get(ScopeKey(q), deadline);
    if (!there.ok()) {
      return there.status().WithContext(who + ": waiting for " + Worker(q) +
                                         "'s loopback scope");
    }
    RETURN_IF_ERROR(CheckReachable(who, options.rank, host->endpoint->address(), here, q,
                                   addresses[static_cast<size_t>(q)], Decode(*there)));
  }
  CommunicatorOptions world;
  world.rank = options.rank;
  world.world_size = options.world_size;
  world.peer_addresses = std::move(addresses);
  world.transport = &host->endpoint->transport();
  world.mailbox = host->mailbox;
  world.failures = host->failures;
  world.ring_transport = options.ring_transport;
  world.timeout_ms = options.timeout_ms;
  world.setup_timeout_ms = std::max<int64_t>(1, deadline.RemainingMillis());
  world.segment_bytes = options.segment_bytes;
  world.direct_read_min_bytes = options.direct_read_min_bytes;
  world.one_shot_max_bytes = options.one_shot_max_bytes;
  world.comm_spin_us = options.comm_spin_us;
  world.credentials = options.credentials;
  world.metrics = options.metrics;
  StatusOr<std::unique_ptr<Communicator>> connected = Communicator::Connect(world);
  if (!connected.ok()) return connected.status().WithContext(who);
  host->world = std::move(connected).value();
  return host;
}

// A new_group's communicator over `host`'s world: its members agree on its id (the largest
// any of them could give it) through the group's store, then set up its ring.
StatusOr<std::unique_ptr<Communicator>> JoinGroup(GroupHost& host,
                                                  const GroupMemberOptions& options,
                                                  const std::string& who, Deadline deadline) {
  Communicator& world = *host.world;
  const std::vector<int>& ranks = options.global_ranks;
  if (ranks.size() != static_cast<size_t>(options.world_size) ||
      ranks[static_cast<size_t>(options.rank)] != world.rank()) {
    return InvalidArgumentError(who + ": its global ranks do not name this process (world rank " +
                                std::to_string(world.rank()) + ") as group rank " +
                                std::to_string(options.rank));
  }
  RETURN_IF_ERROR(options.store->Set(GroupIdKey(options.rank),
                                     std::to_string(world.NextGroupId()))
                      .WithContext(who + ": proposing the group's id"));
  uint32_t id = 0;
  for (int q = 0; q < options.world_size; ++q) {
    StatusOr<std::string> proposed = options.store->Get(GroupIdKey(q), deadline);
    if (!proposed.ok()) {
      return proposed.status().WithContext(who + ": waiting for group rank " +
                                           std::to_string(q) + "'s proposed id");
    }
    id = std::max<uint32_t>(id, static_cast<uint32_t>(std::stoul(*proposed)));
  }
  return world.Group(ranks, id, options.timeout_ms);
}

}  // namespace

StatusOr<std::unique_ptr<GroupMember>> GroupMember::Join(const GroupMemberOptions& options) {
  const std::string who = "tessera process group rank " + std::to_string(options.rank) +
                          " of " + std::to_string(options.world_size);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(who + ": the rank is not in the world");
  }
  if (options.store == nullptr) return InvalidArgumentError(who + ": no store");
  if (options.timeout_ms <= 0) return InvalidArgumentError(who + ": the timeout is not positive");
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  if (options.host == nullptr) {
    ASSIGN_OR_RETURN(std::shared_ptr<GroupHost> host, MakeHost(options, who, deadline));
    TLOG(DEBUG) << who << ": ring channel " << host->world->channel_description();
    return std::unique_ptr<GroupMember>(new GroupMember(std::move(host), nullptr));
  }
  StatusOr<std::unique_ptr<Communicator>> group =
      JoinGroup(*options.host, options, who, deadline);
  if (!group.ok()) return group.status().WithContext(who);
  TLOG(DEBUG) << (*group)->name() << ": ring channel " << (*group)->channel_description();
  return std::unique_ptr<GroupMember>(new GroupMember(options.host, std::move(group).value()));
}

GroupMember::GroupMember(std::shared_ptr<GroupHost> host, std::unique_ptr<Communicator> own)
    : host_(std::move(host)),
      own_(std::move(own)),
      communicator_(own_ != nullptr ? own_.get() : host_->world.get()) {}

GroupMember::~GroupMember() {
  // This group's waits end now (a new_group's alone; the default group's fails every group,
  // as torch destroys them all with it); what it has queued never starts.
  const std::string reason = "the process group is being destroyed";
  communicator_->Abort(CancelledError(reason));
  communicator_->CloseQueues(reason);
}

std::shared_future<Status> GroupMember::Submit(std::function<Status()> op) {
  return communicator_->Enqueue(std::move(op));
}

std::shared_future<Status> GroupMember::SubmitRecv(std::function<Status()> op) {
  return communicator_->EnqueueRecv(std::move(op));
}

Status GroupMember::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                              const std::string& what) {
  return communicator_->AllReduce(data, count, dtype, op, what, next_tag_++);
}

Status GroupMember::Broadcast(void* data, size_t count, DataType dtype, int root,
                              const std::string& what) {
  return communicator_->Broadcast(data, count, dtype, root, what, next_tag_++);
}

Status GroupMember::AllGather(const void* input, void* output, size_t count, DataType dtype,
                              const std::string& what) {
  // The ring's partition of world x count elements is `count` per rank, in rank order.
  uint8_t* own = static_cast<uint8_t*>(output) +
                 static_cast<size_t>(rank()) * count * DataTypeSize(dtype);
  if (count > 0 && own != input) std::memcpy(own, input, count * DataTypeSize(dtype));
  return communicator_->AllGather(own, output, count * static_cast<size_t>(world_size()), dtype,
                                  what, next_tag_++);
}

Status GroupMember::ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                                  ReduceOp op, const std::string& what) {
  return communicator_->ReduceScatter(input, output, count * static_cast<size_t>(world_size()),
                                      dtype, op, what, next_tag_++);
}

Status GroupMember::Barrier(const std::string& what) {
  return communicator_->Barrier(next_tag_++).WithContext(what);
}

Status GroupMember::AllToAll(const void* input, const std::vector<size_t>& send_counts,
                             void* output, const std::vector<size_t>& recv_counts,
                             size_t element_bytes, const std::string& what) {
  return communicator_->AllToAll(input, send_counts, output, recv_counts, element_bytes, what,
                                 static_cast<uint32_t>(next_tag_++));
}

Status GroupMember::MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks) {
  return communicator_->MonitoredBarrier(timeout_ms, wait_all_ranks,
                                         static_cast<uint32_t>(next_tag_++));
}

Status GroupMember::Send(const void* data, size_t bytes, int dst, uint32_t tag,
                         const std::string& what) {
  return communicator_->Send(data, bytes, dst, tag, what);
}

Status GroupMember::Recv(void* data, size_t bytes, int src, uint32_t tag,
                         const std::string& what) {
  return communicator_->Recv(data, bytes, src, tag, what);
}

StatusOr<int> GroupMember::RecvAny(void* data, size_t bytes, uint32_t tag,
                                   const std::string& what) {
  return communicator_->RecvAny(data, bytes, tag, what);
}

}  // namespace tessera::worker
