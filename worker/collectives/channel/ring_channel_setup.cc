#include "worker/collectives/channel/ring_channel_setup.h"

#include <algorithm>
#include <utility>

#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/shm/ring_shm.h"

namespace tessera::worker {
namespace {

std::string MiB(size_t bytes) {
  const double mib = static_cast<double>(bytes) / (1 << 20);
  char text[32];
  std::snprintf(text, sizeof(text), "%g MiB", mib);
  return text;
}

StatusOr<ConnectedRingChannel> ConnectLinks(const RingChannelSetupOptions& options,
                                            std::string why) {
  RingLinksOptions links;
  links.rank = options.rank;
  links.world_size = options.world_size;
  links.peer_addresses = options.peer_addresses;
  links.transport = options.transport;
  links.mailbox = options.mailbox;
  links.timeout_ms = options.timeout_ms;
  links.spin_us = options.links_spin_us;
  ASSIGN_OR_RETURN(std::unique_ptr<RingLinks> connected, RingLinks::Connect(links));
  return ConnectedRingChannel{std::move(connected), "links (TCP to the ring neighbours)" + why};
}

}  // namespace

size_t ShmRingBytes(size_t segment_bytes) {
  return std::max<size_t>(size_t{4} << 20, 2 * (segment_bytes + 4096));
}

StatusOr<ConnectedRingChannel> ConnectRingChannel(const RingChannelSetupOptions& options) {
  const std::string& kind = options.kind;
  if (kind != "auto" && kind != "shm" && kind != "links" && kind != "zmq") {
    return InvalidArgumentError("ring transport " + kind +
                                " is not one of auto, shm, links, zmq");
  }
  if (kind == "zmq") return ConnectedRingChannel{nullptr, "zmq (through the transport)"};
  if (options.world_size < 2) return ConnectedRingChannel{nullptr, "none (a world of 1)"};
  if (kind == "links") return ConnectLinks(options, "");

  RingShmOptions shm;
  shm.rank = options.rank;
  shm.world_size = options.world_size;
  shm.peer_addresses = options.peer_addresses;
  shm.transport = options.transport;
  shm.mailbox = options.mailbox;
  shm.timeout_ms = options.timeout_ms;
  shm.ring_bytes = ShmRingBytes(options.segment_bytes);
  StatusOr<std::unique_ptr<RingShm>> connected = RingShm::Connect(shm);
  if (connected.ok()) {
    const std::string bytes = MiB((*connected)->ring_bytes());
    return ConnectedRingChannel{std::move(connected).value(),
                                "shm (shared-memory rings of " + bytes + " each way)" +
                                    (kind == "auto" ? ", chosen by auto" : "")};
  }
  // Every rank got the same verdict (the agreement is collective): all fall back alike.
  if (kind == "auto" && connected.status().code() == StatusCode::kFailedPrecondition) {
    return ConnectLinks(options, ", chosen by auto: " + connected.status().message());
  }
  return connected.status().WithContext("--ring-transport " + kind);
}

}  // namespace tessera::worker
