// ConnectRingChannel: picks and sets up how a rank's ring frames travel, the same way on every
// rank (tessera-worker --ring-transport):
//   zmq    RingZmq: frames as messages through the process's transport.
//   links  RingLinks: TCP connections to the neighbours (works across hosts).
//   shm    RingShm: shared-memory rings to the neighbours (one host, one /dev/shm); fails with
//          FailedPrecondition naming the ranks that cannot map their neighbours' segments.
//   auto   per hop: shared memory where both ends can map each other's segments (a host's
//          ranks), TCP links elsewhere (between hosts); MixedHopChannel
//          (mixed_hop_channel.h) for a rank whose two hops differ. Which hop can is agreed
//          collectively (a max all-reduce over RingZmq), so both ends of every hop choose
//          alike.
//
// The ring visits the ranks in RingOrder (below), which puts each host's ranks next to each
// other: pass `order` on to RingCollectivesOptions::ring_order.
//
//   auto mailbox = std::make_shared<CollectiveMailbox>(failures);
//   endpoint.SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(mailbox));
//   RingChannelSetupOptions setup;  // kind, rank, world_size, peers, transport, mailbox, ...
//   ASSIGN_OR_RETURN(ConnectedRingChannel channel, ConnectRingChannel(setup));
//   ring_options.channel = channel.channel;
//   ring_options.ring_order = channel.order;
//   TLOG(INFO) << "ring channel: " << channel.description;
//
// The direct channels bootstrap over RingZmq: each rank tells its neighbours where it listens
// (links) or which segment is its (shm) under reserved tags, which collectives must not use.
#ifndef TESSERA_WORKER_COLLECTIVES_RING_CHANNEL_SETUP_H_
#define TESSERA_WORKER_COLLECTIVES_RING_CHANNEL_SETUP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/channel/zmq/communicator_tags.h"

namespace tessera::worker {

// Tags the setup uses; collectives must not.
inline constexpr uint64_t kRingLinksSetupTag = ~uint64_t{0};
inline constexpr uint64_t kRingShmSetupTag = ~uint64_t{0} - 1;
inline constexpr uint64_t kRingShmAgreeTag = ~uint64_t{0} - 2;
// The direct-read probe over a communicator's ring (direct_read_collectives.h).
inline constexpr uint64_t kDirectReadProbeTag = ~uint64_t{0} - 3;
// The splits that make a communicator's hierarchical groups (communicator.h).
inline constexpr uint64_t kHierarchySplitTag = ~uint64_t{0} - 4;

struct RingChannelSetupOptions {
  std::string kind = "auto";  // auto, shm, links or zmq
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> peer_addresses;     // transport addresses by rank
  Transport* transport = nullptr;              // not owned
  std::shared_ptr<CollectiveMailbox> mailbox;  // where the endpoint delivers ring frames
  std::shared_ptr<FailureBus> failures;        // the process's; wakes the channels' waiters
  int64_t timeout_ms = 30000;                  // bounds the setup
  size_t segment_bytes = 1024 * 1024;          // the ring's; shm rings hold two and more
  int64_t links_spin_us = 0;                   // RingLinksOptions::spin_us
  // Who may join the ring's TCP links (RingLinksOptions::credentials: the same on every
  // rank); the default admits anyone.
  Credentials credentials;
  MetricsRegistry* metrics = nullptr;  // counts refused links; may be null; not owned
  // A group's ring (communicator.h): its id and its ranks' world ranks (RingZmqOptions), with
  // rank, world_size and peer_addresses the group's. The world: kWorldCommunicator.
  uint32_t communicator = kWorldCommunicator;
  std::vector<int> world_ranks;
};

struct ConnectedRingChannel {
  std::shared_ptr<RingChannel> channel;
  std::string description;  // for the startup log: what and why
  std::vector<int> order;   // the ring's order (RingOrder), for RingCollectivesOptions
};

// The host of a worker's transport address ("tcp://host:port"): what RingOrder groups by;
// the address itself when it has no host and port.
std::string PeerHost(const std::string& address);

// The order the ring visits the ranks in, the same on every rank: each host's ranks next to
// each other (the host of a rank is that of its transport address), so that as few hops as
// possible cross hosts, and under auto as many as can use shared memory. Hosts come in the
// order of their lowest rank, a host's ranks in rank order: where each host's ranks are
// consecutive already (tessera-launch, srun's default block distribution, torchrun), 0, 1,
// ..., W-1.
std::vector<int> RingOrder(const std::vector<std::string>& peer_addresses);

// The workers' transport addresses by rank, from the coordinator's fleet view (the ring's
// order on every rank). Internal error if the view's worker ranks are not 0..W-1.
StatusOr<std::vector<std::string>> RingPeerAddresses(const FleetView& view);

// The bytes of each shm ring for a segment size: two segments and their headers, at least
// 4 MiB (so that a rank's first sends of a call rarely wait).
size_t ShmRingBytes(size_t segment_bytes);

// Sets up the channel `options.kind` names (see above); every rank must call it with the same
// kind. A world of 1 gets RingZmq, which it never uses. InvalidArgument for an unknown kind.
StatusOr<ConnectedRingChannel> ConnectRingChannel(const RingChannelSetupOptions& options);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_RING_CHANNEL_SETUP_H_
