// RingZmq: a rank's ring channel (ring_channel.h) through the process's Transport: each frame
// is a message to the successor's transport address, and the predecessor's arrive in the
// CollectiveMailbox the endpoint delivers them to.
//
//   auto mailbox = std::make_shared<CollectiveMailbox>(failures);
//   endpoint.SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(mailbox));
//   ASSIGN_OR_RETURN(auto channel, RingZmq::Create({rank, world, peer_addresses,
//                                                   &endpoint.transport(), mailbox}));
//
// Works wherever the transport does, with no setup of its own, so ring channel setup also
// uses it to bootstrap the direct channels (RingLinks, RingShm) and to agree on them. It is
// the slowest channel: a frame passes four thread hand-offs (docs/benchmarks.md).
//
// Borrowed payloads (no owner) are copied when sent, since the transport hands frames to
// ZeroMQ on its own thread later; so Flush has nothing to wait for.
//
// Each frame to a peer carries its number (RingFrame::sequence, RingFrameNumber in
// collective_mailbox.h), by which the peer's mailbox drops a frame the transport delivered
// twice.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_RING_ZMQ_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_RING_ZMQ_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/channel/zmq/communicator_tags.h"

namespace tessera::worker {

struct RingZmqOptions {
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> peer_addresses;  // transport addresses by rank
  Transport* transport = nullptr;           // not owned
  std::shared_ptr<CollectiveMailbox> mailbox;
  int next = -1;  // the rank Send sends to; -1: rank + 1 (mod world_size)
  // A group's channel over the world's transport and mailbox (communicator_tags.h): the
  // group's id, which its frames' tags carry, and the world rank of each of its ranks (the
  // transport names senders by world rank; Recv's frames name them by group rank). The world:
  // kWorldCommunicator and no world_ranks.
  uint32_t communicator = kWorldCommunicator;
  std::vector<int> world_ranks;
  // Fails this channel's waits besides the mailbox's own bus (a group being destroyed); may be
  // null.
  std::shared_ptr<FailureBus> failures;
};

class RingZmq final : public RingChannel {
 public:
  // InvalidArgument for a rank outside the world, a peer list of another size, or no
  // transport or mailbox.
  static StatusOr<std::unique_ptr<RingZmq>> Create(RingZmqOptions options);

  int rank() const override { return options_.rank; }
  Status Send(RingFrame frame) override { return SendTo(next_, std::move(frame)); }
  // Sends `frame` to any rank of the ring (ring channel setup tells its predecessor too).
  // InvalidArgument for a rank outside the world.
  Status SendTo(int peer, RingFrame frame);
  StatusOr<RingFrame> Recv(uint64_t tag, uint32_t slot, Deadline deadline, uint8_t* into = nullptr,
                           size_t into_bytes = 0) override;
  Status Flush(Deadline deadline) override { return OkStatus(); }
  void CopyUnsentPayloads() override {}
  size_t unsent() const override { return 0; }  // handed to the transport at once
  Status failure() const override;
  void Discard(uint64_t tag) override;
  size_t kept() const override { return options_.mailbox->queued(); }

 private:
  RingZmq(RingZmqOptions options, uint32_t id);

  // "worker 3" (its world rank) for a rank of this channel's world.
  std::string Peer(int rank) const;

  const RingZmqOptions options_;
  const int next_;
  const uint32_t id_;  // the channel part of its frames' numbers, drawn at random
  // Held from numbering a frame until the transport has queued it, so that the numbers to
  // each peer leave in order.
  std::mutex send_mu_;
  std::vector<uint32_t> sent_;  // frames sent to each rank so far; guarded by send_mu_
  std::shared_ptr<void> wake_;  // wakes the mailbox's waiters when options_.failures fails
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_RING_ZMQ_H_
