#include "worker/collectives/channel/zmq/ring_zmq.h"

#include <algorithm>
#include <random>
#include <utility>

namespace tessera::worker {

StatusOr<std::unique_ptr<RingZmq>> RingZmq::Create(RingZmqOptions options) {
  const std::string where = "ring zmq: ";
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(where + "rank " + std::to_string(options.rank) +
                                " is not in a world of " + std::to_string(options.world_size));
  }
  if (options.peer_addresses.size() != static_cast<size_t>(options.world_size)) {
    return InvalidArgumentError(where + std::to_string(options.peer_addresses.size()) +
                                " peer addresses for a world of " +
                                std::to_string(options.world_size));
  }
  if (options.next >= options.world_size) {
    return InvalidArgumentError(where + "next rank " + std::to_string(options.next) +
                                " is not in a world of " + std::to_string(options.world_size));
  }
  if (options.transport == nullptr || options.mailbox == nullptr) {
    return InvalidArgumentError(where + "needs a transport and a mailbox");
  }
  if (options.communicator != kWorldCommunicator &&
      (options.communicator > kMaxCommunicatorId ||
       options.world_ranks.size() != static_cast<size_t>(options.world_size))) {
    return InvalidArgumentError(where + "group " + std::to_string(options.communicator) +
                                " needs an id up to " + std::to_string(kMaxCommunicatorId) +
                                " and the world rank of each of its " +
                                std::to_string(options.world_size) + " ranks");
  }
  std::random_device random;
  return std::unique_ptr<RingZmq>(new RingZmq(std::move(options), random()));
}

RingZmq::RingZmq(RingZmqOptions options, uint32_t id)
    : options_(std::move(options)),
      next_(options_.next >= 0 ? options_.next : (options_.rank + 1) % options_.world_size),
      id_(id),
      sent_(static_cast<size_t>(options_.world_size), 0) {
  if (options_.failures != nullptr) {
    wake_ = options_.failures->Subscribe([mailbox = options_.mailbox] { mailbox->WakeWaiters(); });
  }
}

std::string RingZmq::Peer(int rank) const {
  return MemberName(Role::kWorker, options_.world_ranks.empty()
                                       ? rank
                                       : options_.world_ranks[static_cast<size_t>(rank)]);
}

Status RingZmq::SendTo(int peer, RingFrame frame) {
  if (peer < 0 || peer >= options_.world_size) {
    return InvalidArgumentError("ring zmq: no worker " + std::to_string(peer) +
                                " in a world of " + std::to_string(options_.world_size));
  }
  frame.sender_rank = options_.rank;
  ASSIGN_OR_RETURN(frame.tag, WireTag(options_.communicator, frame.tag));
  // See the file comment: the caller may reuse a borrowed buffer once Send returns.
  if (!frame.data.empty() && frame.data.owner() == nullptr) {
    frame.data = Payload::Copy(frame.data.data(), frame.data.size());
  }
  const std::string& address = options_.peer_addresses[static_cast<size_t>(peer)];
  Status sent;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    frame.sequence = RingFrameNumber(id_, ++sent_[static_cast<size_t>(peer)]);
    sent = options_.transport->Send(address, OutgoingMessage{0, -1, std::move(frame)});
  }
  return sent.WithContext("ring zmq to " + Peer(peer) + " at " + address);
}

StatusOr<RingFrame> RingZmq::Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                                  uint8_t* /*into*/, size_t /*into_bytes*/) {
  ASSIGN_OR_RETURN(const uint64_t wire, WireTag(options_.communicator, tag));
  ASSIGN_OR_RETURN(RingFrame frame,
                   options_.mailbox->Pop(wire, slot, deadline, options_.failures.get()));
  frame.tag = tag;
  if (!options_.world_ranks.empty()) {
    // The transport names the sender by its world rank; this channel's ranks are the group's.
    const auto& ranks = options_.world_ranks;
    const auto at = std::find(ranks.begin(), ranks.end(), frame.sender_rank);
    if (at == ranks.end()) {
      return InternalError("ring zmq of group " + std::to_string(options_.communicator) +
                           ": a frame (tag " + std::to_string(tag) + ") from " +
                           MemberName(Role::kWorker, frame.sender_rank) +
                           ", which is not in the group");
    }
    frame.sender_rank = static_cast<int32_t>(at - ranks.begin());
  }
  return frame;
}

Status RingZmq::failure() const {
  if (options_.failures != nullptr) {
    if (Status failed = options_.failures->failure(); !failed.ok()) return failed;
  }
  return options_.mailbox->failure();
}

void RingZmq::Discard(uint64_t tag) {
  StatusOr<uint64_t> wire = WireTag(options_.communicator, tag);
  if (wire.ok()) options_.mailbox->Discard(*wire);
}

}  // namespace tessera::worker
