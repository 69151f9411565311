#include "worker/collectives/ring_channel_setup.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/base/host_port.h"
#include "common/base/role.h"
#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/mixed_hop_channel.h"
#include "worker/collectives/channel/shm/ring_shm.h"
#include "worker/collectives/channel/zmq/ring_zmq.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {
namespace {

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string MiB(size_t bytes) {
  const double mib = static_cast<double>(bytes) / (1 << 20);
  char text[32];
  std::snprintf(text, sizeof(text), "%g MiB", mib);
  return text;
}

// A setup message: `text` as the uint8 elements of a data frame under a reserved tag.
RingFrame SetupFrame(uint64_t tag, uint32_t slot, const std::string& text) {
  RingFrame frame;
  frame.kind = RingFrameKind::kData;
  frame.tag = tag;
  frame.op = CollectiveOp::kBarrier;
  frame.dtype = DataType::kUInt8;
  frame.slot = slot;
  frame.element_count = text.size();
  frame.buffer_elements = text.size();
  if (!text.empty()) frame.data = Payload::FromString(text);
  return frame;
}

// The text of the setup message (tag, slot), which must come from rank `from`.
StatusOr<std::string> ReceiveText(RingZmq& zmq, uint64_t tag, uint32_t slot, int from,
                                  Deadline deadline, const std::string& what,
                                  int64_t timeout_ms) {
  StatusOr<RingFrame> got = zmq.Recv(tag, slot, deadline);
  if (!got.ok()) {
    if (got.status().code() == StatusCode::kDeadlineExceeded && zmq.failure().ok()) {
      return DeadlineExceededError("waiting for " + what + ": no answer within " +
                                   std::to_string(timeout_ms) + " ms");
    }
    return got.status().WithContext("waiting for " + what);
  }
  if (got->sender_rank != from) {
    return InternalError(what + " came from " + Worker(got->sender_rank) + ", not from " +
                         Worker(from));
  }
  return std::string(reinterpret_cast<const char*>(got->data.data()), got->data.size());
}

int64_t RemainingMs(const Deadline& deadline) {
  return std::max<int64_t>(1, deadline.RemainingMillis());
}

// This rank's place in the ring (RingOrder's, the same on every rank).
struct Place {
  std::vector<int> order;
  int position = 0;
  int next = -1;
  int prev = -1;
};

// Next and prev stay -1 when the options are not a ring (RingZmq::Create says what is wrong).
Place PlaceOf(const RingChannelSetupOptions& options) {
  Place place;
  place.order = RingOrder(options.peer_addresses);
  const int world = static_cast<int>(place.order.size());
  place.position = static_cast<int>(
      std::find(place.order.begin(), place.order.end(), options.rank) - place.order.begin());
  if (world != options.world_size || place.position == world) {
    place.next = place.prev = -1;
    return place;
  }
  place.next = place.order[static_cast<size_t>((place.position + 1) % world)];
  place.prev = place.order[static_cast<size_t>((place.position + world - 1) % world)];
  return place;
}

// TCP links from prev and to next, or one of them (the other hop being shared memory).
StatusOr<std::unique_ptr<RingLinks>> ConnectLinks(const RingChannelSetupOptions& options,
                                                  const Place& place, RingZmq& zmq,
                                                  bool from_prev, bool to_next) {
  const int rank = options.rank;
  const int next = place.next;
  const int prev = place.prev;
  const std::string where = "ring links rank=" + std::to_string(rank);
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  // Listen on the host of our transport address, and tell prev where.
  std::unique_ptr<RingLinks::Listener> listener;
  if (from_prev) {
    const std::string& own = options.peer_addresses[static_cast<size_t>(rank)];
    StatusOr<std::pair<std::string, int>> host_port =
        ParseHostPort(own.rfind("tcp://", 0) == 0 ? own.substr(6) : own);
    if (!host_port.ok()) return host_port.status().WithContext(where + ": own address");
    ASSIGN_OR_RETURN(listener, RingLinks::Listen(host_port->first));
    RETURN_IF_ERROR(zmq.SendTo(prev, SetupFrame(kRingLinksSetupTag, 0, listener->address))
                        .WithContext(where + ": sending the link address to " + Worker(prev)));
  }
  RingLinksOptions links;
  links.rank = rank;
  links.world_size = options.world_size;
  links.next = next;
  links.prev = prev;
  if (to_next) {
    StatusOr<std::string> next_address =
        ReceiveText(zmq, kRingLinksSetupTag, 0, next, deadline,
                    Worker(next) + "'s link address", options.timeout_ms);
    if (!next_address.ok()) return next_address.status().WithContext(where);
    links.next_address = std::move(next_address).value();
  }
  links.failures = options.failures;
  links.timeout_ms = RemainingMs(deadline);
  links.spin_us = options.links_spin_us;
  links.credentials = options.credentials;
  links.metrics = options.metrics;
  return RingLinks::Connect(links, std::move(listener));
}

StatusOr<ConnectedRingChannel> ConnectAllLinks(const RingChannelSetupOptions& options,
                                               const Place& place, RingZmq& zmq,
                                               const std::string& why) {
  ASSIGN_OR_RETURN(std::unique_ptr<RingLinks> links,
                   ConnectLinks(options, place, zmq, /*from_prev=*/true, /*to_next=*/true));
  return ConnectedRingChannel{std::move(links), "links (TCP to the ring neighbours)" + why,
                              place.order};
}

// What every rank can do with shared memory, agreed among them. Hop p (from the rank at ring
// position p to the one at p + 1) can use it when the first can ring the second's doorbell
// and the second can map the first's ring.
struct ShmProbe {
  std::shared_ptr<RingShm::Segment> own;        // null: this rank could not make its segment
  std::shared_ptr<RingShm::Segment> prev_ring;  // null: not mapped
  std::shared_ptr<RingShm::Segment> next_bell;  // null: not mapped
  std::vector<bool> hop_shm;  // by hop (its sender's ring position), the same on every rank
  std::string unable_ranks;  // "worker 1, worker 3": the ranks that met an error of their own
  std::string cannot;        // this rank's error, if any
};

StatusOr<ShmProbe> ProbeShm(const RingChannelSetupOptions& options, const Place& place,
                            const std::shared_ptr<RingZmq>& zmq) {
  const int world = options.world_size;
  const int rank = options.rank;
  const int next = place.next;
  const int prev = place.prev;
  const std::string who = "ring shm rank=" + std::to_string(rank);
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  ShmProbe probe;

  // 1. Our segment, and its name to both neighbours (an empty name if we have none, so that
  // they do not wait for it).
  std::string own_name;
  if (auto created = RingShm::Create(rank, ShmRingBytes(options.segment_bytes)); created.ok()) {
    probe.own = std::move(created).value();
    own_name = EncodeSegmentName(RingShm::NameOf(*probe.own));
  } else {
    probe.cannot = created.status().message();
  }
  RETURN_IF_ERROR(zmq->SendTo(next, SetupFrame(kRingShmSetupTag, 0, own_name))
                      .WithContext(who + ": sending the segment name to " + Worker(next)));
  RETURN_IF_ERROR(zmq->SendTo(prev, SetupFrame(kRingShmSetupTag, 1, own_name))
                      .WithContext(who + ": sending the segment name to " + Worker(prev)));

  // 2. The neighbours' names (slot 0 from prev, 1 from next); map what we can of theirs. A
  // neighbour without a segment has said why itself.
  for (uint32_t slot : {0u, 1u}) {
    const int from = slot == 0 ? prev : next;
    const std::string what = Worker(from) + "'s segment name";
    StatusOr<std::string> text = ReceiveText(*zmq, kRingShmSetupTag, slot, from, deadline, what,
                                             options.timeout_ms);
    if (!text.ok()) return text.status().WithContext(who);
    StatusOr<RingShmSegmentName> name = DecodeSegmentName(*text);
    if (!name.ok()) return name.status().WithContext(who + ": " + what);
    if (probe.own == nullptr || name->name.empty()) continue;
    auto opened = slot == 0 ? RingShm::OpenRing(*name, from) : RingShm::OpenBell(*name, from);
    if (!opened.ok()) {
      if (probe.cannot.empty()) probe.cannot = opened.status().message();
      continue;
    }
    (slot == 0 ? probe.prev_ring : probe.next_bell) = std::move(opened).value();
  }

  // 3. Agree: every rank learns what every other could map, over the transport. Per rank:
  // whether its hop to next can use shared memory from its side, the hop from prev, and
  // whether it met an error of its own.
  RingCollectivesOptions agree;
  agree.rank = rank;
  agree.world_size = world;
  agree.channel = zmq;
  agree.ring_order = place.order;
  agree.timeout_ms = RemainingMs(deadline);
  ASSIGN_OR_RETURN(std::unique_ptr<RingCollectives> ring, RingCollectives::Create(agree));
  std::vector<float> unable(3 * static_cast<size_t>(world), 0.0f);
  unable[3 * static_cast<size_t>(rank)] = probe.next_bell == nullptr ? 1.0f : 0.0f;
  unable[3 * static_cast<size_t>(rank) + 1] = probe.prev_ring == nullptr ? 1.0f : 0.0f;
  unable[3 * static_cast<size_t>(rank) + 2] = probe.cannot.empty() ? 0.0f : 1.0f;
  RETURN_IF_ERROR(ring->AllReduce(unable.data(), unable.size(), DataType::kFloat32,
                                  ReduceOp::kMax, "ring-shm-setup", kRingShmAgreeTag)
                      .WithContext(who + ": agreeing which ranks can use shared memory"));
  for (int p = 0; p < world; ++p) {
    const size_t from = 3 * static_cast<size_t>(place.order[static_cast<size_t>(p)]);
    const size_t to = 3 * static_cast<size_t>(place.order[static_cast<size_t>((p + 1) % world)]);
    probe.hop_shm.push_back(unable[from] == 0.0f && unable[to + 1] == 0.0f);
  }
  for (int r = 0; r < world; ++r) {
    if (unable[3 * static_cast<size_t>(r) + 2] != 0.0f) {
      probe.unable_ranks += (probe.unable_ranks.empty() ? "" : ", ") + Worker(r);
    }
  }
  return probe;
}

std::string HopKind(bool shm) { return shm ? "shm" : "links"; }

// "0->1 shm, 1->2 links, 2->0 shm", in ring order.
std::string HopMap(const std::vector<bool>& hop_shm, const std::vector<int>& order) {
  const size_t world = hop_shm.size();
  std::string map;
  for (size_t p = 0; p < world; ++p) {
    map += (p == 0 ? "" : ", ") + std::to_string(order[p]) + "->" +
           std::to_string(order[(p + 1) % world]) + " " + HopKind(hop_shm[p]);
  }
  return map;
}

// Shared memory on every hop (kind shm, or auto where every rank can), a channel that mixes
// them per hop (auto), or TCP links on every hop (auto where no hop can). FailedPrecondition
// (on every rank alike) for shm when a hop cannot, naming the ranks that could not.
StatusOr<ConnectedRingChannel> ConnectShmOrAuto(const RingChannelSetupOptions& options,
                                                const Place& place,
                                                const std::shared_ptr<RingZmq>& zmq) {
  const bool is_auto = options.kind == "auto";
  const int rank = options.rank;
  const int world = options.world_size;
  const std::string who = "ring shm rank=" + std::to_string(rank);
  ASSIGN_OR_RETURN(ShmProbe probe, ProbeShm(options, place, zmq));
  const size_t hops = static_cast<size_t>(std::count(probe.hop_shm.begin(),
                                                     probe.hop_shm.end(), true));
  const std::string unable =
      who + ": not every rank can map its ring neighbours' shared memory (" +
      (probe.unable_ranks.empty() ? "none says why" : probe.unable_ranks + " cannot") + ")" +
      (probe.cannot.empty() ? "" : "; this rank: " + probe.cannot);
  if (hops < probe.hop_shm.size() && !is_auto) {
    return FailedPreconditionError(unable).WithContext("--ring-transport " + options.kind);
  }
  if (hops == 0) return ConnectAllLinks(options, place, *zmq, ", chosen by auto: " + unable);

  const bool to_next_shm = probe.hop_shm[static_cast<size_t>(place.position)];
  const bool from_prev_shm =
      probe.hop_shm[static_cast<size_t>((place.position + world - 1) % world)];
  const int next = place.next;
  const int prev = place.prev;
  std::unique_ptr<RingLinks> links;
  if (!to_next_shm || !from_prev_shm) {
    ASSIGN_OR_RETURN(links, ConnectLinks(options, place, *zmq, !from_prev_shm, !to_next_shm));
  }
  std::unique_ptr<RingShm> shm;
  if (to_next_shm || from_prev_shm) {
    ASSIGN_OR_RETURN(shm, RingShm::FromSegments(rank, next, prev, probe.own,
                                                from_prev_shm ? probe.prev_ring : nullptr,
                                                to_next_shm ? probe.next_bell : nullptr,
                                                options.failures));
    // Every rank has mapped what it will (the agreement is past): nobody opens the name again.
    shm->UnlinkOwnSegment();
  }
  if (hops == probe.hop_shm.size()) {
    const std::string rings = "shared-memory rings of " + MiB(shm->ring_bytes());
    return ConnectedRingChannel{std::move(shm),
                                "shm (" + rings + " each way)" +
                                    (is_auto ? ", chosen by auto" : ""),
                                place.order};
  }
  std::string description =
      HopKind(to_next_shm) + " to " + Worker(next) + ", " + HopKind(from_prev_shm) + " from " +
      Worker(prev) + ", chosen by auto per hop (" + HopMap(probe.hop_shm, place.order) + ")" +
      (probe.cannot.empty() ? "" : "; this rank: " + probe.cannot);
  std::shared_ptr<RingChannel> channel;
  if (to_next_shm && from_prev_shm) {
    channel = std::move(shm);
  } else if (!to_next_shm && !from_prev_shm) {
    channel = std::move(links);
  } else if (to_next_shm) {
    channel = std::make_shared<MixedHopChannel>(std::move(shm), std::move(links));
  } else {
    channel = std::make_shared<MixedHopChannel>(std::move(links), std::move(shm));
  }
  return ConnectedRingChannel{std::move(channel), std::move(description), place.order};
}

}  // namespace

StatusOr<std::vector<std::string>> RingPeerAddresses(const FleetView& view) {
  std::vector<const MemberInfo*> workers = view.OfRole(Role::kWorker);
  std::vector<std::string> addresses;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i]->rank != static_cast<int>(i)) {
      return InternalError("the fleet view's worker ranks are not 0.." +
                           std::to_string(workers.size() - 1) + ": found " +
                           workers[i]->Name() + " at position " + std::to_string(i));
    }
    addresses.push_back(workers[i]->address);
  }
  return addresses;
}

size_t ShmRingBytes(size_t segment_bytes) {
  return std::max<size_t>(size_t{4} << 20, 2 * (segment_bytes + 4096));
}

StatusOr<ConnectedRingChannel> ConnectRingChannel(const RingChannelSetupOptions& options) {
  const std::string& kind = options.kind;
  if (kind != "auto" && kind != "shm" && kind != "links" && kind != "zmq") {
    return InvalidArgumentError("ring transport " + kind +
                                " is not one of auto, shm, links, zmq");
  }
  if (options.failures == nullptr) {
    return InvalidArgumentError("ring channel setup: no failure bus");
  }
  const Place place = PlaceOf(options);
  RingZmqOptions zmq_options;
  zmq_options.rank = options.rank;
  zmq_options.world_size = options.world_size;
  zmq_options.peer_addresses = options.peer_addresses;
  zmq_options.transport = options.transport;
  zmq_options.mailbox = options.mailbox;
  zmq_options.next = place.next;
  zmq_options.communicator = options.communicator;
  zmq_options.world_ranks = options.world_ranks;
  zmq_options.failures = options.failures;
  ASSIGN_OR_RETURN(std::shared_ptr<RingZmq> zmq, RingZmq::Create(zmq_options));
  if (options.world_size < 2) {
    return ConnectedRingChannel{zmq, "none (a world of 1)", place.order};
  }
  std::string order;
  if (!std::is_sorted(place.order.begin(), place.order.end())) {
    for (int rank : place.order) order += (order.empty() ? "" : ", ") + std::to_string(rank);
    order = "; ring order " + order + " (each host's ranks next to each other)";
  }
  StatusOr<ConnectedRingChannel> connected = InternalError("no channel");
  if (kind == "zmq") {
    connected = ConnectedRingChannel{zmq, "zmq (through the transport)", place.order};
  } else if (kind == "links") {
    connected = ConnectAllLinks(options, place, *zmq, "");
  } else {
    // Every rank gets the same verdict on every hop (the agreement is collective), so the two
    // ends of each hop choose alike.
    connected = ConnectShmOrAuto(options, place, zmq);
  }
  if (connected.ok()) connected->description += order;
  return connected;
}

std::string PeerHost(const std::string& address) {
  StatusOr<std::pair<std::string, int>> host_port =
      ParseHostPort(address.rfind("tcp://", 0) == 0 ? address.substr(6) : address);
  return host_port.ok() ? host_port->first : address;
}

std::vector<int> RingOrder(const std::vector<std::string>& peer_addresses) {
  std::vector<std::string> hosts;  // in the order of their lowest rank
  std::vector<std::vector<int>> ranks;
  for (size_t rank = 0; rank < peer_addresses.size(); ++rank) {
    const std::string host = PeerHost(peer_addresses[rank]);
    const size_t at = static_cast<size_t>(std::find(hosts.begin(), hosts.end(), host) -
                                          hosts.begin());
    if (at == hosts.size()) {
      hosts.push_back(host);
      ranks.emplace_back();
    }
    ranks[at].push_back(static_cast<int>(rank));
  }
  std::vector<int> order;
  for (const std::vector<int>& on_host : ranks) {
    order.insert(order.end(), on_host.begin(), on_host.end());
  }
  return order;
}

}  // namespace tessera::worker
