// ConnectRingChannel: picks and sets up how a rank's ring segments travel, the same way on
// every rank (tessera-worker --ring-transport):
//   zmq    no channel: segments go through the transport and mailbox.
//   links  RingLinks: TCP connections to the neighbours (works across hosts).
//   shm    RingShm: shared-memory rings to the neighbours (one host, one /dev/shm); fails with
//          FailedPrecondition naming the rank that cannot map its neighbours' segments.
//   auto   shm when every rank can, else links. RingShm::Connect's agreement is collective,
//          so every rank falls back together.
//
//   RingChannelSetupOptions setup;  // kind, rank, world_size, peers, transport, mailbox, ...
//   ASSIGN_OR_RETURN(ConnectedRingChannel channel, ConnectRingChannel(setup));
//   ring_options.links = channel.channel;  // null for zmq
//   TLOG(INFO) << "ring channel: " << channel.description;
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_SETUP_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_SETUP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"

namespace tessera::worker {

struct RingChannelSetupOptions {
  std::string kind = "auto";  // auto, shm, links or zmq
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> peer_addresses;  // transport addresses by rank
  Transport* transport = nullptr;           // not owned
  CollectiveMailbox* mailbox = nullptr;     // not owned
  int64_t timeout_ms = 30000;               // bounds the setup
  size_t segment_bytes = 1024 * 1024;       // the ring's; shm rings hold two and more
  int64_t links_spin_us = 0;                // RingLinksOptions::spin_us
};

struct ConnectedRingChannel {
  std::shared_ptr<RingChannel> channel;  // null: through transport and mailbox
  std::string description;               // for the startup log: what and why
};

// The bytes of each shm ring for a segment size: two segments and their headers, at least
// 4 MiB (so that a rank's first sends of a call rarely wait).
size_t ShmRingBytes(size_t segment_bytes);

// Sets up the channel `options.kind` names (see above); every rank must call it with the same
// kind. World 1 needs none. InvalidArgument for an unknown kind.
StatusOr<ConnectedRingChannel> ConnectRingChannel(const RingChannelSetupOptions& options);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_SETUP_H_
