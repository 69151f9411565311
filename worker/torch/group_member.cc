#include "worker/torch/group_member.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "common/base/logging.h"
#include "common/base/role.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/ring_channel_setup.h"

namespace tessera::worker {
namespace {

// The high byte of a frame's tag says what it is; ring calls use small tags (their count).
constexpr uint8_t kPeerSpace = 0x80;      // send / recv
constexpr uint8_t kAllToAllSpace = 0x81;  // one all-to-all, numbered like the ring calls
constexpr uint8_t kMonitorSpace = 0x82;   // monitored barriers: arrivals and releases

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string AddressKey(int rank) { return "tessera/address/" + std::to_string(rank); }

}  // namespace

struct GroupMember::Parts {
  std::unique_ptr<RpcEndpoint> endpoint;
  std::shared_ptr<FailureBus> failures = std::make_shared<FailureBus>();
  std::shared_ptr<CollectiveMailbox> mailbox;
  std::unique_ptr<RingCollectives> ring;
  std::unique_ptr<RingZmq> peers;  // point-to-point frames through the transport
};

StatusOr<std::unique_ptr<GroupMember>> GroupMember::Join(const GroupMemberOptions& options) {
  const std::string who = "tessera process group rank " + std::to_string(options.rank) +
                          " of " + std::to_string(options.world_size);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(who + ": the rank is not in the world");
  }
  if (options.store == nullptr) return InvalidArgumentError(who + ": no store");
  if (options.timeout_ms <= 0) return InvalidArgumentError(who + ": the timeout is not positive");
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  auto parts = std::make_unique<Parts>();
  ZmqTransportOptions transport;
  transport.credentials = options.credentials;
  transport.bind_host = options.bind_host;
  transport.role = Role::kWorker;
  transport.rank = options.rank;
  ASSIGN_OR_RETURN(parts->endpoint, StartZmqEndpoint(transport, options.metrics));
  parts->mailbox = std::make_shared<CollectiveMailbox>(parts->failures);
  parts->endpoint->SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(parts->mailbox));

  // Rendezvous: every rank's transport address, through the store.
  RETURN_IF_ERROR(options.store->Set(AddressKey(options.rank), parts->endpoint->address())
                      .WithContext(who + ": publishing its address"));
  std::vector<std::string> addresses(static_cast<size_t>(options.world_size));
  for (int q = 0; q < options.world_size; ++q) {
    StatusOr<std::string> address = options.store->Get(AddressKey(q), deadline);
    if (!address.ok()) {
      return address.status().WithContext(who + ": waiting for " + Worker(q) + "'s address");
    }
    addresses[static_cast<size_t>(q)] = std::move(address).value();
  }

  RingChannelSetupOptions setup;
  setup.kind = options.ring_transport;
  setup.rank = options.rank;
  setup.world_size = options.world_size;
  setup.peer_addresses = addresses;
  setup.transport = &parts->endpoint->transport();
  setup.mailbox = parts->mailbox;
  setup.failures = parts->failures;
  setup.timeout_ms = std::max<int64_t>(1, deadline.RemainingMillis());
  setup.segment_bytes = options.segment_bytes;
  setup.credentials = options.credentials;
  setup.metrics = options.metrics;
  StatusOr<ConnectedRingChannel> channel = ConnectRingChannel(setup);
  if (!channel.ok()) return channel.status().WithContext(who);
  RingCollectivesOptions ring;
  ring.rank = options.rank;
  ring.world_size = options.world_size;
  ring.channel = channel->channel;
  ring.ring_order = channel->order;
  ring.timeout_ms = options.timeout_ms;
  ring.segment_bytes = options.segment_bytes;
  ASSIGN_OR_RETURN(parts->ring, RingCollectives::Create(ring));
  ASSIGN_OR_RETURN(parts->peers,
                   RingZmq::Create({options.rank, options.world_size, addresses,
                                    &parts->endpoint->transport(), parts->mailbox}));
  std::unique_ptr<GroupMember> member(new GroupMember(options, std::move(parts)));
  member->channel_description_ = channel->description;
  TLOG(DEBUG) << who << ": ring channel " << member->channel_description_;
  return member;
}

GroupMember::GroupMember(const GroupMemberOptions& options, std::unique_ptr<Parts> parts)
    : options_(options), parts_(std::move(parts)) {}

GroupMember::~GroupMember() {
  // What is queued never starts, and what runs ends now: its peers may be gone too, and a
  // wait for them must not hold the process (up to the group's timeout) as it exits. The
  // threads then join (the members declared last go first), and the endpoint stops.
  const std::string reason = "the process group is being destroyed";
  recv_thread_.CancelPending(reason);
  comm_thread_.CancelPending(reason);
  parts_->failures->Fail(CancelledError(reason));
}

std::shared_future<Status> GroupMember::Submit(std::function<Status()> op) {
  return comm_thread_.Submit(std::move(op));
}

std::shared_future<Status> GroupMember::SubmitRecv(std::function<Status()> op) {
  return recv_thread_.Submit(std::move(op));
}

Status GroupMember::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                              const std::string& what) {
  return parts_->ring->AllReduce(data, count, dtype, op, what, next_tag_++);
}

Status GroupMember::Broadcast(void* data, size_t count, DataType dtype, int root,
                              const std::string& what) {
  return parts_->ring->Broadcast(data, count, dtype, root, what, next_tag_++);
}

Status GroupMember::AllGather(const void* input, void* output, size_t count, DataType dtype,
                              const std::string& what) {
  // The ring's partition of world x count elements is `count` per rank, in rank order.
  uint8_t* own = static_cast<uint8_t*>(output) +
                 static_cast<size_t>(rank()) * count * DataTypeSize(dtype);
  if (count > 0 && own != input) std::memcpy(own, input, count * DataTypeSize(dtype));
  return parts_->ring->AllGather(own, output, count * static_cast<size_t>(world_size()), dtype,
                                 what, next_tag_++);
}

Status GroupMember::ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                                  ReduceOp op, const std::string& what) {
  return parts_->ring->ReduceScatter(input, output, count * static_cast<size_t>(world_size()),
                                     dtype, op, what, next_tag_++);
}

Status GroupMember::Barrier(const std::string& what) {
  return parts_->ring->Barrier(next_tag_++).WithContext(what);
}

uint64_t GroupMember::PeerTag(uint8_t space, int src, uint32_t tag) {
  return (uint64_t{space} << 56) | (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) |
         tag;
}

Status GroupMember::SendFrame(int dst, uint64_t tag, uint32_t slot, const void* data,
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
  return parts_->peers->SendTo(dst, std::move(frame));
}

Status GroupMember::TakeFrame(uint64_t tag, uint32_t slot, int src, void* data, size_t bytes,
                              Deadline deadline, const std::string& what) {
  StatusOr<RingFrame> frame = parts_->peers->Recv(tag, slot, deadline);
  if (!frame.ok()) {
    if (frame.status().code() == StatusCode::kDeadlineExceeded && frame.status().message().empty()) {
      return DeadlineExceededError(what + ": nothing from " + Worker(src) + " within " +
                                   std::to_string(options_.timeout_ms) + " ms");
    }
    return frame.status().WithContext(what + ": waiting for " + Worker(src));
  }
  if (frame->sender_rank != src) {
    return InternalError(what + ": a frame for " + Worker(src) + " came from " +
                         Worker(frame->sender_rank));
  }
  if (frame->data.size() != bytes) {
    return InvalidArgumentError(what + ": " + Worker(src) + " sent " +
                                std::to_string(frame->data.size()) + " bytes; rank " +
                                std::to_string(rank()) + " expects " + std::to_string(bytes));
  }
  if (bytes > 0) std::memcpy(data, frame->data.data(), bytes);
  return OkStatus();
}

Status GroupMember::Send(const void* data, size_t bytes, int dst, uint32_t tag,
                         const std::string& what) {
  if (dst < 0 || dst >= world_size()) {
    return InvalidArgumentError(what + ": no rank " + std::to_string(dst) + " in a group of " +
                                std::to_string(world_size()));
  }
  uint32_t slot;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    slot = sent_[{dst, tag}]++;
  }
  return SendFrame(dst, PeerTag(kPeerSpace, rank(), tag), slot, data, bytes,
                   CollectiveOp::kSendRecv)
      .WithContext(what);
}

Status GroupMember::Recv(void* data, size_t bytes, int src, uint32_t tag,
                         const std::string& what) {
  if (src < 0 || src >= world_size()) {
    return InvalidArgumentError(what + ": no rank " + std::to_string(src) + " in a group of " +
                                std::to_string(world_size()));
  }
  uint32_t slot;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    slot = received_[{src, tag}]++;
  }
  return TakeFrame(PeerTag(kPeerSpace, src, tag), slot, src, data, bytes,
                   Deadline::AfterMillis(options_.timeout_ms), what);
}

StatusOr<int> GroupMember::RecvAny(void* data, size_t bytes, uint32_t tag,
                                   const std::string& what) {
  if (world_size() == 1) {
    return InvalidArgumentError(what + ": rank 0 is alone in its group; no rank can send to it");
  }
  // The mailbox waits for one (tag, slot) at a time, so each other rank's next frame with
  // `tag` is looked for in turn, without waiting, and the look repeats with a growing pause
  // (up to 1 ms) until one is there. The turn starts after the rank last taken from, so a
  // rank that sends often does not starve the others.
  const Deadline deadline = Deadline::AfterMillis(options_.timeout_ms);
  std::chrono::microseconds pause(20);
  int start = (last_any_source_ + 1) % world_size();
  while (true) {
    for (int i = 0; i < world_size(); ++i) {
      const int src = (start + i) % world_size();
      if (src == rank()) continue;
      uint32_t slot;
      {
        std::lock_guard<std::mutex> lock(p2p_mu_);
        slot = received_[{src, tag}];
      }
      StatusOr<RingFrame> frame =
          parts_->peers->Recv(PeerTag(kPeerSpace, src, tag), slot, Deadline::AfterMillis(0));
      if (!frame.ok()) {
        if (frame.status().code() == StatusCode::kDeadlineExceeded &&
            frame.status().message().empty()) {
          continue;  // nothing from `src` yet
        }
        return frame.status().WithContext(what + ": waiting for any rank");
      }
      {
        std::lock_guard<std::mutex> lock(p2p_mu_);
        ++received_[{src, tag}];
      }
      if (frame->data.size() != bytes) {
        return InvalidArgumentError(what + ": " + Worker(src) + " sent " +
                                    std::to_string(frame->data.size()) + " bytes; rank " +
                                    std::to_string(rank()) + " expects " + std::to_string(bytes));
      }
      if (bytes > 0) std::memcpy(data, frame->data.data(), bytes);
      last_any_source_ = src;
      return src;
    }
    if (deadline.Expired()) {
      return DeadlineExceededError(what + ": nothing with tag " + std::to_string(tag) +
                                   " from any rank within " +
                                   std::to_string(options_.timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    start = (last_any_source_ + 1) % world_size();
  }
}

Status GroupMember::AllToAll(const void* input, const std::vector<size_t>& send_counts,
                             void* output, const std::vector<size_t>& recv_counts,
                             size_t element_bytes, const std::string& what) {
  const size_t world = static_cast<size_t>(world_size());
  if (send_counts.size() != world || recv_counts.size() != world) {
    return InvalidArgumentError(what + ": " + std::to_string(send_counts.size()) + " send and " +
                                std::to_string(recv_counts.size()) + " receive counts for " +
                                std::to_string(world) + " ranks");
  }
  // Numbered like a ring call (every rank counts the same calls), one slot per sender.
  const uint32_t call = static_cast<uint32_t>(next_tag_++);
  const Deadline deadline = Deadline::AfterMillis(options_.timeout_ms);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  size_t offset = 0;
  for (size_t q = 0; q < world; ++q) {
    const size_t bytes = send_counts[q] * element_bytes;
    if (static_cast<int>(q) == rank()) {
      if (send_counts[q] != recv_counts[q]) {
        return InvalidArgumentError(what + ": rank " + std::to_string(rank()) + " sends itself " +
                                    std::to_string(send_counts[q]) + " elements but expects " +
                                    std::to_string(recv_counts[q]));
      }
    } else {
      RETURN_IF_ERROR(SendFrame(static_cast<int>(q),
                                PeerTag(kAllToAllSpace, 0, call), static_cast<uint32_t>(rank()),
                                in + offset, bytes, CollectiveOp::kAllToAll)
                          .WithContext(what));
    }
    offset += bytes;
  }
  size_t in_offset = 0, out_offset = 0;
  for (size_t q = 0; q < world; ++q) {
    const size_t bytes = recv_counts[q] * element_bytes;
    if (static_cast<int>(q) == rank()) {
      size_t own = 0;
      for (size_t p = 0; p < q; ++p) own += send_counts[p] * element_bytes;
      if (bytes > 0) std::memcpy(out + out_offset, in + own, bytes);
    } else {
      RETURN_IF_ERROR(TakeFrame(PeerTag(kAllToAllSpace, 0, call), static_cast<uint32_t>(q),
                                static_cast<int>(q), out + out_offset, bytes, deadline, what));
    }
    out_offset += bytes;
    in_offset += send_counts[q] * element_bytes;
  }
  return OkStatus();
}

Status GroupMember::MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks) {
  const std::string what = "monitored barrier of rank " + std::to_string(rank());
  const uint32_t call = static_cast<uint32_t>(next_tag_++);
  const uint64_t arrivals = PeerTag(kMonitorSpace, 0, call);
  const uint64_t releases = PeerTag(kMonitorSpace, 1, call);
  const Deadline deadline = Deadline::AfterMillis(timeout_ms);
  if (rank() != 0) {
    RETURN_IF_ERROR(SendFrame(0, arrivals, static_cast<uint32_t>(rank()), nullptr, 0,
                              CollectiveOp::kBarrier)
                        .WithContext(what));
    return TakeFrame(releases, 0, 0, nullptr, 0, deadline, what + ": release by rank 0");
  }
  // The wording is Gloo's, which scripts and torch's own tests match.
  if (timeout_ms <= 0 && world_size() > 1) {
    return DeadlineExceededError("Rank 0 timed out in monitoredBarrier after " +
                                 std::to_string(timeout_ms) + " ms (the timeout left no time)");
  }
  std::vector<int> missing;
  for (int q = 1; q < world_size(); ++q) {
    Status arrived = TakeFrame(arrivals, static_cast<uint32_t>(q), q, nullptr, 0, deadline, what);
    if (arrived.ok()) continue;
    if (arrived.code() != StatusCode::kDeadlineExceeded) return arrived;
    missing.push_back(q);
    if (!wait_all_ranks) break;
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int q : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    return DeadlineExceededError(std::string(missing.size() > 1 ? "Ranks " : "Rank ") + ranks +
                                 " failed to pass monitoredBarrier in " +
                                 std::to_string(timeout_ms) + " ms (rank 0 waited for " +
                                 (wait_all_ranks ? "all ranks" : "the first missing rank") + ")");
  }
  for (int q = 1; q < world_size(); ++q) {
    RETURN_IF_ERROR(SendFrame(q, releases, 0, nullptr, 0, CollectiveOp::kBarrier).WithContext(what));
  }
  return OkStatus();
}

}  // namespace tessera::worker
