#include "worker/collectives/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "common/base/role.h"
#include "worker/collectives/channel/zmq/communicator_tags.h"
#include "worker/collectives/ring_channel_setup.h"

namespace tessera::worker {
namespace {

// A point-to-point message's slot: its sender's rank and its number among the sender's
// messages with that tag to this receiver (modulo 2^20; a mailbox holds far fewer frames), so
// that two senders' messages under one tag are told apart.
constexpr int kCountBits = 20;
uint32_t PointToPointSlot(int src, uint32_t count) {
  return (static_cast<uint32_t>(src) << kCountBits) | (count & ((1u << kCountBits) - 1));
}

std::string RankList(const std::vector<int>& ranks) {
  std::string list;
  for (int rank : ranks) list += (list.empty() ? "" : ", ") + std::to_string(rank);
  return list;
}

}  // namespace

struct Communicator::Process {
  explicit Process(const CommunicatorOptions& options)
      : world(options), pool(options.comm_spin_us) {}
  CommunicatorOptions world;
  mutable std::mutex mu;
  uint32_t next_group_id = 1;  // guarded by mu
  std::set<uint32_t> live;     // ids of the groups alive in this process; guarded by mu
  CommPool pool;  // every communicator's queues; stops when the last communicator has gone
};

Communicator::Communicator(std::shared_ptr<Process> process, uint32_t id, int rank,
                           std::vector<int> world_ranks, int64_t timeout_ms)
    : process_(std::move(process)),
      id_(id),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      timeout_ms_(timeout_ms),
      name_(id == kWorldCommunicator ? "the world"
                                     : "group " + std::to_string(id) + " (world ranks " +
                                           RankList(world_ranks_) + ")"),
      ops_(process_->pool.NewStrand()),
      receives_(process_->pool.NewStrand()) {}

StatusOr<std::unique_ptr<Communicator>> Communicator::Connect(const CommunicatorOptions& options) {
  const std::string who = "the world's communicator, rank " + std::to_string(options.rank);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(who + ": the rank is not in a world of " +
                                std::to_string(options.world_size));
  }
  if (options.peer_addresses.size() != static_cast<size_t>(options.world_size) ||
      options.transport == nullptr || options.mailbox == nullptr ||
      options.failures == nullptr) {
    return InvalidArgumentError(who + ": needs every worker's address, a transport, a mailbox "
                                      "and a failure bus");
  }
  if (options.timeout_ms <= 0) return InvalidArgumentError(who + ": the timeout is not positive");
  auto process = std::make_shared<Process>(options);
  std::vector<int> everyone(static_cast<size_t>(options.world_size));
  for (int q = 0; q < options.world_size; ++q) everyone[static_cast<size_t>(q)] = q;
  std::unique_ptr<Communicator> world(new Communicator(process, kWorldCommunicator, options.rank,
                                                       std::move(everyone), options.timeout_ms));
  world->failures_ = options.failures;
  RETURN_IF_ERROR(world->Start(options.ring_transport, options.setup_timeout_ms > 0
                                                           ? options.setup_timeout_ms
                                                           : options.timeout_ms));
  return world;
}

Communicator::~Communicator() {
  const std::string reason = name_ + " is being destroyed";
  if (id_ == kWorldCommunicator) {  // the process's bus is not this communicator's to fail
    CloseQueues(reason);
    return;
  }
  Abort(CancelledError(reason));
  CloseQueues(reason);
  // Frames its calls left behind (a failed call's peers' frames, a message nobody received)
  // or its peers send later would wait in the shared mailbox for good: they go with the group.
  process_->world.mailbox->ForgetGroup(id_);
  std::lock_guard<std::mutex> lock(process_->mu);
  process_->live.erase(id_);
}

Status Communicator::Start(const std::string& ring_transport, int64_t setup_timeout_ms) {
  const CommunicatorOptions& world = process_->world;
  std::vector<std::string> addresses;
  for (int w : world_ranks_) addresses.push_back(world.peer_addresses[static_cast<size_t>(w)]);
  const bool group = id_ != kWorldCommunicator;
  RingChannelSetupOptions setup;
  setup.kind = ring_transport;
  setup.rank = rank_;
  setup.world_size = world_size();
  setup.peer_addresses = addresses;
  setup.transport = world.transport;
  setup.mailbox = world.mailbox;
  setup.failures = failures_;
  setup.timeout_ms = setup_timeout_ms;
  setup.segment_bytes = world.segment_bytes;
  setup.links_spin_us = world.links_spin_us;
  setup.credentials = world.credentials;
  setup.metrics = world.metrics;
  setup.communicator = id_;
  if (group) setup.world_ranks = world_ranks_;
  StatusOr<ConnectedRingChannel> channel = ConnectRingChannel(setup);
  if (!channel.ok()) return channel.status().WithContext(Where() + ": setting up its ring");
  RingCollectivesOptions ring;
  ring.rank = rank_;
  ring.world_size = world_size();
  ring.channel = channel->channel;
  ring.ring_order = channel->order;
  ring.timeout_ms = timeout_ms_;
  ring.segment_bytes = world.segment_bytes;
  ring.one_shot_max_bytes = world.one_shot_max_bytes;
  ASSIGN_OR_RETURN(ring_, RingCollectives::Create(ring));
  std::string direct = "; direct reads: off";
  bool several_hosts = false;
  if (world.direct_read_min_bytes > 0 && world_size() > 1) {
    // Every rank sees the same addresses, so every rank decides alike whether to probe.
    const std::string host = PeerHost(addresses[0]);
    const bool one_host = std::all_of(addresses.begin(), addresses.end(), [&](const auto& a) {
      return PeerHost(a) == host;
    });
    direct = "; direct reads: no (the ranks are on several hosts)";
    direct_min_bytes_ = world.direct_read_min_bytes;
    several_hosts = !one_host;
    if (one_host) {
      DirectReadCollectivesOptions options;
      options.rank = rank_;
      options.world_size = world_size();
      options.control = ring_.get();
      options.timeout_ms = timeout_ms_;
      options.failures = failures_;
      StatusOr<std::unique_ptr<DirectReadCollectives>> made =
          ConnectDirectReads(options, kDirectReadProbeTag);
      if (!made.ok()) return made.status().WithContext(Where() + ": probing direct reads");
      direct_ = std::move(made).value();
      direct = direct_ != nullptr
                   ? "; direct reads (cross-memory attach) for all-reduce, reduce-scatter and "
                     "all-gather from " + std::to_string(direct_min_bytes_) + " bytes, the ring "
                     "below"
                   : "; direct reads: refused by the kernel (logged), the ring carries all";
    }
  }
  RingZmqOptions peers;
  peers.rank = rank_;
  peers.world_size = world_size();
  peers.peer_addresses = addresses;
  peers.transport = world.transport;
  peers.mailbox = world.mailbox;
  peers.communicator = id_;
  if (group) peers.world_ranks = world_ranks_;
  peers.failures = group ? failures_ : nullptr;
  ASSIGN_OR_RETURN(peers_, RingZmq::Create(std::move(peers)));
  if (several_hosts) {
    StatusOr<std::string> hierarchy = StartHierarchy(addresses);
    if (!hierarchy.ok()) {
      return hierarchy.status().WithContext(Where() + ": making its hierarchical groups");
    }
    direct += *hierarchy;
  }
  channel_description_ = channel->description + direct;
  return OkStatus();
}

StatusOr<std::string> Communicator::StartHierarchy(const std::vector<std::string>& addresses) {
  // Hosts in the order of their lowest rank; every rank sees the same addresses, so every rank
  // decides alike.
  std::vector<std::string> hosts;
  std::vector<int> host_of, place_of;
  std::vector<int> ranks_on;
  for (const std::string& address : addresses) {
    const std::string host = PeerHost(address);
    const auto found = std::find(hosts.begin(), hosts.end(), host);
    const int h = static_cast<int>(found - hosts.begin());
    if (found == hosts.end()) {
      hosts.push_back(host);
      ranks_on.push_back(0);
    }
    host_of.push_back(h);
    place_of.push_back(ranks_on[static_cast<size_t>(h)]++);
  }
  const int per_host = ranks_on[0];
  // One rank on each host (a hierarchy's own group across the hosts, say): nothing to say.
  if (per_host == 1 && ranks_on.size() == addresses.size()) return std::string();
  if (per_host < 2 ||
      std::any_of(ranks_on.begin(), ranks_on.end(), [&](int n) { return n != per_host; })) {
    return std::string("; hierarchical all-reduce: no (not the same number of ranks, at least "
                       "two, on every host)");
  }
  const size_t r = static_cast<size_t>(rank_);
  ASSIGN_OR_RETURN(host_, Split(host_of[r], kHierarchySplitTag));
  ASSIGN_OR_RETURN(across_, Split(place_of[r], kHierarchySplitTag));
  return "; hierarchical all-reduce from " + std::to_string(direct_min_bytes_) + " bytes: " +
         std::to_string(per_host) + " ranks within each of " + std::to_string(hosts.size()) +
         " hosts (" + host_->channel_description() + "), across them " +
         across_->channel_description();
}

// Reduce-scatter within the host into this rank's slice of `data` (in place), all-reduce of the
// slice across the hosts, all-gather within the host. An average averages within the host,
// then across.
Status Communicator::HierarchicalAllReduce(uint8_t* data, size_t count, DataType dtype,
                                           ReduceOp op, const std::string& tensor,
                                           uint64_t world_tag) {
  // The groups take tags below 2^32 (their own spaces, used by nothing else): the caller's
  // folded, so that calls that may run at once (the world's tags differ in their low bits:
  // steps and buckets) stay apart, and one under a tag reused later maps alike.
  const uint64_t tag = static_cast<uint32_t>(world_tag ^ (world_tag >> 32));
  const size_t bytes = DataTypeSize(dtype);
  const Partition own = PartitionOf(count, host_->world_size(), host_->rank());
  uint8_t* slice = data + own.offset * bytes;
  RETURN_IF_ERROR(host_->ReduceScatter(data, slice, count, dtype, op, tensor, tag)
                      .WithContext("hierarchical all-reduce: within the host"));
  RETURN_IF_ERROR(across_->AllReduce(slice, own.size, dtype, op, tensor, tag)
                      .WithContext("hierarchical all-reduce: across the hosts"));
  return host_->AllGather(slice, data, count, dtype, tensor, tag)
      .WithContext("hierarchical all-reduce: within the host");
}

std::string Communicator::Where() const {
  if (id_ == kWorldCommunicator) return "rank " + std::to_string(rank_);
  return name_ + " rank " + std::to_string(rank_) + " (world rank " +
         std::to_string(world_rank()) + ")";
}

Status Communicator::Named(Status status) const {
  // Where() only on failure: a collective's success costs no string.
  return status.ok() ? status : status.WithContext(Where());
}

std::string Communicator::Worker(int rank) const {
  return MemberName(Role::kWorker, world_ranks_[static_cast<size_t>(rank)]);
}

// ---------------------------------------------------------------------------------------------
// Collectives

Collectives& Communicator::For(const void* buffer, size_t bytes) {
  if (device_ != nullptr && IsDeviceMemory(buffer)) return *device_;
  if (direct_ != nullptr && bytes >= direct_min_bytes_) return *direct_;
  return *ring_;
}

Status Communicator::UseDevice(NcclCollectivesOptions options) {
  options.rank = rank_;
  options.world_size = world_size();
  StatusOr<std::unique_ptr<Collectives>> device = CreateNcclCollectives(options, ring_.get());
  if (!device.ok()) return device.status().WithContext(Where() + ": its device backend");
  device_ = std::move(device).value();
  return OkStatus();
}

Status Communicator::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                               const std::string& tensor, uint64_t tag) {
  const size_t bytes = count * DataTypeSize(dtype);
  if (host_ != nullptr && bytes >= direct_min_bytes_ && bytes > 0 &&
      (device_ == nullptr || !IsDeviceMemory(data))) {
    return Named(HierarchicalAllReduce(static_cast<uint8_t*>(data), count, dtype, op, tensor,
                                       tag));
  }
  return Named(For(data, count * DataTypeSize(dtype)).AllReduce(data, count, dtype, op, tensor,
                                                                 tag));
}

Status Communicator::ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                                   ReduceOp op, const std::string& tensor, uint64_t tag) {
  return Named(For(input, count * DataTypeSize(dtype))
                   .ReduceScatter(input, output, count, dtype, op, tensor, tag));
}

Status Communicator::AllGather(const void* input, void* output, size_t count, DataType dtype,
                               const std::string& tensor, uint64_t tag) {
  return Named(For(output, count * DataTypeSize(dtype))
                   .AllGather(input, output, count, dtype, tensor, tag));
}

Status Communicator::Broadcast(void* data, size_t count, DataType dtype, int root,
                               const std::string& tensor, uint64_t tag) {
  return Named(For(data).Broadcast(data, count, dtype, root, tensor, tag));
}

Status Communicator::Barrier(uint64_t tag) { return Named(ring_->Barrier(tag)); }

// ---------------------------------------------------------------------------------------------
// Point to point

Status Communicator::SendFrame(int dst, uint64_t tag, uint32_t slot, const void* data,
                               size_t bytes, CollectiveOp op) {
  RingFrame frame;
  frame.kind = RingFrameKind::kData;
  frame.tag = tag;
  frame.op = op;
  frame.dtype = DataType::kUInt8;
  frame.slot = slot;
  frame.element_count = bytes;
  frame.buffer_elements = bytes;
  // Borrowed: RingZmq copies it before Send returns.
  if (bytes > 0) frame.data = Payload::Borrow(data, bytes, nullptr);
  return peers_->SendTo(dst, std::move(frame));
}

Status Communicator::TakeFrame(uint64_t tag, uint32_t slot, int src, void* data, size_t bytes,
                               Deadline deadline, const std::string& what) {
  StatusOr<RingFrame> frame = peers_->Recv(tag, slot, deadline);
  if (!frame.ok()) {
    if (frame.status().code() == StatusCode::kDeadlineExceeded &&
        frame.status().message().empty()) {
      return DeadlineExceededError(Where() + ": " + what + ": nothing from rank " +
                                   std::to_string(src) + " (" + Worker(src) + ") within " +
                                   std::to_string(timeout_ms_) + " ms");
    }
    return frame.status().WithContext(Where() + ": " + what + ": waiting for rank " +
                                      std::to_string(src) + " (" + Worker(src) + ")");
  }
  if (frame->sender_rank != src) {
    return InternalError(Where() + ": " + what + ": a message for rank " + std::to_string(src) +
                         " came from rank " + std::to_string(frame->sender_rank));
  }
  return CopyPayload(*frame, src, data, bytes, what);
}

Status Communicator::CopyPayload(const RingFrame& frame, int src, void* data, size_t bytes,
                                 const std::string& what) const {
  if (frame.data.size() != bytes) {
    return InvalidArgumentError(Where() + ": " + what + ": rank " + std::to_string(src) + " (" +
                                Worker(src) + ") sent " + std::to_string(frame.data.size()) +
                                " bytes; this rank expects " + std::to_string(bytes));
  }
  if (bytes > 0) std::memcpy(data, frame.data.data(), bytes);
  return OkStatus();
}

Status Communicator::Checked(const std::string& what, int peer) const {
  if (peer < 0 || peer >= world_size()) {
    return InvalidArgumentError(Where() + ": " + what + ": no rank " + std::to_string(peer) +
                                " in a communicator of " + std::to_string(world_size()));
  }
  if (world_size() > kMaxPointToPointRanks) {
    return InvalidArgumentError(Where() + ": " + what + ": point-to-point messages take at most " +
                                std::to_string(kMaxPointToPointRanks) + " ranks");
  }
  return failures_->failure();
}

Status Communicator::Send(const void* data, size_t bytes, int dst, uint32_t tag,
                          const std::string& what) {
  RETURN_IF_ERROR(Checked(what, dst));
  uint32_t count;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    count = sent_[{dst, tag}]++;
  }
  Status sent = SendFrame(dst, SpaceTag(TagSpace::kPointToPoint, id_, tag),
                          PointToPointSlot(rank_, count), data, bytes, CollectiveOp::kSendRecv);
  return sent.ok() ? sent : sent.WithContext(Where() + ": " + what);
}

Status Communicator::Recv(void* data, size_t bytes, int src, uint32_t tag,
                          const std::string& what) {
  RETURN_IF_ERROR(Checked(what, src));
  uint32_t count;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    count = received_[{src, tag}]++;
  }
  return TakeFrame(SpaceTag(TagSpace::kPointToPoint, id_, tag), PointToPointSlot(src, count), src,
                   data, bytes, Deadline::AfterMillis(timeout_ms_), what);
}

StatusOr<int> Communicator::RecvAny(void* data, size_t bytes, uint32_t tag,
                                    const std::string& what) {
  if (world_size() == 1) {
    return InvalidArgumentError(Where() + ": " + what +
                                ": the rank is alone in its communicator; no rank can send to it");
  }
  RETURN_IF_ERROR(Checked(what, 0));
  // The mailbox waits for one (tag, slot) at a time, so each other rank's next message with
  // `tag` is looked for in turn, without waiting, and the look repeats with a growing pause
  // (up to 1 ms) until one is there.
  const uint64_t wire = SpaceTag(TagSpace::kPointToPoint, id_, tag);
  const Deadline deadline = Deadline::AfterMillis(timeout_ms_);
  std::chrono::microseconds pause(20);
  while (true) {
    int start;
    {
      std::lock_guard<std::mutex> lock(p2p_mu_);
      start = (last_any_source_ + 1) % world_size();
    }
    for (int i = 0; i < world_size(); ++i) {
      const int src = (start + i) % world_size();
      if (src == rank_) continue;
      uint32_t count;
      {
        std::lock_guard<std::mutex> lock(p2p_mu_);
        count = received_[{src, tag}];
      }
      StatusOr<RingFrame> frame =
          peers_->Recv(wire, PointToPointSlot(src, count), Deadline::AfterMillis(0));
      if (!frame.ok()) {
        if (frame.status().code() == StatusCode::kDeadlineExceeded &&
            frame.status().message().empty()) {
          continue;  // nothing from `src` yet
        }
        return frame.status().WithContext(Where() + ": " + what + ": waiting for any rank");
      }
      {
        std::lock_guard<std::mutex> lock(p2p_mu_);
        ++received_[{src, tag}];
        last_any_source_ = src;
      }
      RETURN_IF_ERROR(CopyPayload(*frame, src, data, bytes, what));
      return src;
    }
    if (deadline.Expired()) {
      return DeadlineExceededError(Where() + ": " + what + ": nothing with tag " +
                                   std::to_string(tag) + " from any rank within " +
                                   std::to_string(timeout_ms_) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

Status Communicator::AllToAll(const void* input, const std::vector<size_t>& send_counts,
                              void* output, const std::vector<size_t>& recv_counts,
                              size_t element_bytes, const std::string& what, uint32_t tag) {
  const size_t world = static_cast<size_t>(world_size());
  if (send_counts.size() != world || recv_counts.size() != world) {
    return InvalidArgumentError(Where() + ": " + what + ": " +
                                std::to_string(send_counts.size()) + " send and " +
                                std::to_string(recv_counts.size()) + " receive counts for " +
                                std::to_string(world) + " ranks");
  }
  RETURN_IF_ERROR(failures_->failure());
  // One tag per call; each sender's frame is its slot.
  const uint64_t wire = SpaceTag(TagSpace::kAllToAll, id_, tag);
  const Deadline deadline = Deadline::AfterMillis(timeout_ms_);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  size_t offset = 0, own = 0;
  for (size_t q = 0; q < world; ++q) {
    const size_t bytes = send_counts[q] * element_bytes;
    if (static_cast<int>(q) == rank_) {
      own = offset;
      if (send_counts[q] != recv_counts[q]) {
        return InvalidArgumentError(Where() + ": " + what + ": rank " + std::to_string(rank_) +
                                    " sends itself " + std::to_string(send_counts[q]) +
                                    " elements but expects " + std::to_string(recv_counts[q]));
      }
    } else {
      Status sent = SendFrame(static_cast<int>(q), wire, static_cast<uint32_t>(rank_),
                              in + offset, bytes, CollectiveOp::kAllToAll);
      if (!sent.ok()) return sent.WithContext(Where() + ": " + what);
    }
    offset += bytes;
  }
  size_t out_offset = 0;
  for (size_t q = 0; q < world; ++q) {
    const size_t bytes = recv_counts[q] * element_bytes;
    if (static_cast<int>(q) == rank_) {
      if (bytes > 0) std::memcpy(out + out_offset, in + own, bytes);
    } else {
      RETURN_IF_ERROR(TakeFrame(wire, static_cast<uint32_t>(q), static_cast<int>(q),
                                out + out_offset, bytes, deadline, what));
    }
    out_offset += bytes;
  }
  return OkStatus();
}

Status Communicator::MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks, uint32_t tag) {
  const std::string what = "monitored barrier";
  // Arrivals reach rank 0 (slot: the sender) and releases the others (slot 0), each in its
  // own mailbox, so one tag serves both.
  const uint64_t wire = SpaceTag(TagSpace::kMonitor, id_, tag);
  const Deadline deadline = Deadline::AfterMillis(timeout_ms);
  if (rank_ != 0) {
    RETURN_IF_ERROR(SendFrame(0, wire, static_cast<uint32_t>(rank_), nullptr, 0,
                              CollectiveOp::kBarrier)
                        .WithContext(Where() + ": " + what));
    return TakeFrame(wire, 0, 0, nullptr, 0, deadline, what + ": release by rank 0");
  }
  // The wording is Gloo's, which scripts and torch's own tests match.
  if (timeout_ms <= 0 && world_size() > 1) {
    return DeadlineExceededError("Rank 0 timed out in monitoredBarrier after " +
                                 std::to_string(timeout_ms) + " ms (the timeout left no time)");
  }
  std::vector<int> missing;
  for (int q = 1; q < world_size(); ++q) {
    Status arrived = TakeFrame(wire, static_cast<uint32_t>(q), q, nullptr, 0, deadline, what);
    if (arrived.ok()) continue;
    if (arrived.code() != StatusCode::kDeadlineExceeded) return arrived;
    missing.push_back(q);
    if (!wait_all_ranks) break;
  }
  if (!missing.empty()) {
    return DeadlineExceededError(std::string(missing.size() > 1 ? "Ranks " : "Rank ") +
                                 RankList(missing) + " failed to pass monitoredBarrier in " +
                                 std::to_string(timeout_ms) + " ms (rank 0 waited for " +
                                 (wait_all_ranks ? "all ranks" : "the first missing rank") + ")");
  }
  for (int q = 1; q < world_size(); ++q) {
    RETURN_IF_ERROR(SendFrame(q, wire, 0, nullptr, 0, CollectiveOp::kBarrier)
                        .WithContext(Where() + ": " + what));
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Asynchronous

std::shared_future<Status> Communicator::Enqueue(std::function<Status()> op) {
  return process_->pool.Submit(ops_, std::move(op));
}

std::shared_future<Status> Communicator::EnqueueRecv(std::function<Status()> op) {
  return process_->pool.Submit(receives_, std::move(op));
}

std::shared_future<Status> Communicator::RecvAsync(void* data, size_t bytes, int src,
                                                   uint32_t tag, std::string what) {
  return EnqueueRecv([this, data, bytes, src, tag, what = std::move(what)] {
    return Recv(data, bytes, src, tag, what);
  });
}

void Communicator::CloseQueues(const std::string& why) {
  process_->pool.Close(*receives_, why);
  process_->pool.Close(*ops_, why);
}

// ---------------------------------------------------------------------------------------------
// Groups

uint32_t Communicator::NextGroupId() const {
  std::lock_guard<std::mutex> lock(process_->mu);
  return process_->next_group_id;
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, uint64_t tag) {
  // Every rank's color and the id it would give a group; every rank learns all of them.
  const size_t world = static_cast<size_t>(world_size());
  std::vector<int64_t> table(2 * world);
  table[2 * static_cast<size_t>(rank_)] = color < 0 ? -1 : color;
  table[2 * static_cast<size_t>(rank_) + 1] = NextGroupId();
  RETURN_IF_ERROR(AllGather(table.data() + 2 * static_cast<size_t>(rank_), table.data(),
                            table.size(), DataType::kInt64, "split", tag)
                      .WithContext("splitting " + name_));
  // The groups' ids: from the largest any rank proposed, one per color in increasing order, so
  // that no member of any of them has a live group with its id.
  int64_t base = 1;
  std::set<int64_t> colors;
  for (size_t q = 0; q < world; ++q) {
    base = std::max(base, table[2 * q + 1]);
    if (table[2 * q] >= 0) colors.insert(table[2 * q]);
  }
  if (base + static_cast<int64_t>(colors.size()) > int64_t{kMaxCommunicatorId} + 1) {
    return ResourceExhaustedError(Where() + ": splitting " + name_ + ": the ids of " +
                                  std::to_string(kMaxCommunicatorId) + " groups are used up");
  }
  {
    std::lock_guard<std::mutex> lock(process_->mu);
    process_->next_group_id =
        std::max<uint32_t>(process_->next_group_id,
                           static_cast<uint32_t>(base) + static_cast<uint32_t>(colors.size()));
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<int> members;
  for (size_t q = 0; q < world; ++q) {
    if (table[2 * q] == color) members.push_back(static_cast<int>(q));
  }
  const uint32_t id = static_cast<uint32_t>(
      base + std::distance(colors.begin(), colors.find(color)));
  return Group(members, id, timeout_ms_);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Split(const std::vector<int>& ranks,
                                                            uint64_t tag) {
  // Checked before the collective, alike on every rank (every rank passes the same ranks).
  for (int r : ranks) {
    if (r < 0 || r >= world_size() || std::count(ranks.begin(), ranks.end(), r) > 1) {
      return InvalidArgumentError(Where() + ": splitting " + name_ + " into ranks " +
                                  RankList(ranks) + ": rank " + std::to_string(r) +
                                  (r < 0 || r >= world_size() ? " is not in it" : " twice"));
    }
  }
  // The group's id: the largest any rank proposes (so no member has a live group with it).
  std::vector<int64_t> proposed(static_cast<size_t>(world_size()));
  proposed[static_cast<size_t>(rank_)] = NextGroupId();
  RETURN_IF_ERROR(AllGather(proposed.data() + rank_, proposed.data(), proposed.size(),
                            DataType::kInt64, "split", tag)
                      .WithContext("splitting " + name_));
  const int64_t id = *std::max_element(proposed.begin(), proposed.end());
  if (id > int64_t{kMaxCommunicatorId}) {
    return ResourceExhaustedError(Where() + ": splitting " + name_ + ": the ids of " +
                                  std::to_string(kMaxCommunicatorId) + " groups are used up");
  }
  {
    std::lock_guard<std::mutex> lock(process_->mu);
    process_->next_group_id =
        std::max(process_->next_group_id, static_cast<uint32_t>(id) + 1);
  }
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) {
    return std::unique_ptr<Communicator>();
  }
  return Group(ranks, static_cast<uint32_t>(id), timeout_ms_);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Group(const std::vector<int>& ranks,
                                                            uint32_t id, int64_t timeout_ms) {
  const std::string who = Where() + ": making group " + std::to_string(id) + " of ranks " +
                          RankList(ranks);
  if (id == kWorldCommunicator || id > kMaxCommunicatorId) {
    return InvalidArgumentError(who + ": a group's id is from 1 to " +
                                std::to_string(kMaxCommunicatorId));
  }
  if (timeout_ms <= 0) return InvalidArgumentError(who + ": the timeout is not positive");
  std::vector<int> world_ranks;
  int rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= world_size()) {
      return InvalidArgumentError(who + ": rank " + std::to_string(r) + " is not in " + name_ +
                                  " of " + std::to_string(world_size()));
    }
    if (std::count(ranks.begin(), ranks.end(), r) > 1) {
      return InvalidArgumentError(who + ": rank " + std::to_string(r) + " is named twice");
    }
    if (r == rank_) rank = static_cast<int>(i);
    world_ranks.push_back(world_ranks_[static_cast<size_t>(r)]);
  }
  if (rank < 0) return InvalidArgumentError(who + ": this rank is not in it");
  {
    std::lock_guard<std::mutex> lock(process_->mu);
    if (!process_->live.insert(id).second) {
      return AlreadyExistsError(who + ": this process has a group with that id already");
    }
    process_->next_group_id = std::max(process_->next_group_id, id + 1);
  }
  std::unique_ptr<Communicator> group(
      new Communicator(process_, id, rank, std::move(world_ranks), timeout_ms));
  group->failures_ = std::make_shared<FailureBus>();
  // The process's failure (a worker died) is every group's.
  std::weak_ptr<FailureBus> child = group->failures_;
  std::weak_ptr<FailureBus> parent = process_->world.failures;
  group->parent_subscription_ = process_->world.failures->Subscribe([child, parent] {
    auto c = child.lock();
    auto p = parent.lock();
    if (c != nullptr && p != nullptr) c->Fail(p->failure());
  });
  RETURN_IF_ERROR(group->Start(process_->world.ring_transport, timeout_ms));
  return group;
}

void Communicator::Abort(const Status& why) {
  const Status failure = why.ok() ? CancelledError(name_ + " was aborted") : why;
  failures_->Fail(failure);
  // The hierarchical groups hear of the process's failures themselves, not of this one's.
  if (host_ != nullptr) host_->Abort(failure);
  if (across_ != nullptr) across_->Abort(failure);
}

}  // namespace tessera::worker
