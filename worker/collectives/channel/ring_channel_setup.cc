#include "worker/collectives/channel/ring_channel_setup.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/base/host_port.h"
#include "common/base/role.h"
#include "worker/collectives/channel/links/ring_links.h"
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

StatusOr<ConnectedRingChannel> ConnectLinks(const RingChannelSetupOptions& options,
                                            RingZmq& zmq, const std::string& why) {
  const int rank = options.rank;
  const int next = (rank + 1) % options.world_size;
  const int prev = (rank + options.world_size - 1) % options.world_size;
  const std::string where = "ring links rank=" + std::to_string(rank);
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  // Listen on the host of our transport address, and tell prev where.
  const std::string& own = options.peer_addresses[static_cast<size_t>(rank)];
  StatusOr<std::pair<std::string, int>> host_port =
      ParseHostPort(own.rfind("tcp://", 0) == 0 ? own.substr(6) : own);
  if (!host_port.ok()) return host_port.status().WithContext(where + ": own address");
  ASSIGN_OR_RETURN(std::unique_ptr<RingLinks::Listener> listener,
                   RingLinks::Listen(host_port->first));
  RETURN_IF_ERROR(zmq.SendTo(prev, SetupFrame(kRingLinksSetupTag, 0, listener->address))
                      .WithContext(where + ": sending the link address to " + Worker(prev)));
  StatusOr<std::string> next_address =
      ReceiveText(zmq, kRingLinksSetupTag, 0, next, deadline, Worker(next) + "'s link address",
                  options.timeout_ms);
  if (!next_address.ok()) return next_address.status().WithContext(where);
  RingLinksOptions links;
  links.rank = rank;
  links.world_size = options.world_size;
  links.next_address = std::move(next_address).value();
  links.failures = options.failures;
  links.timeout_ms = RemainingMs(deadline);
  links.spin_us = options.links_spin_us;
  StatusOr<std::unique_ptr<RingLinks>> connected = RingLinks::Connect(links, std::move(listener));
  if (!connected.ok()) return connected.status();
  return ConnectedRingChannel{std::move(connected).value(),
                              "links (TCP to the ring neighbours)" + why};
}

// Shared memory, or FailedPrecondition (on every rank alike) naming the ranks that cannot.
StatusOr<ConnectedRingChannel> ConnectShm(const RingChannelSetupOptions& options,
                                          const std::shared_ptr<RingZmq>& zmq) {
  const int world = options.world_size;
  const int rank = options.rank;
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  const std::string who = "ring shm rank=" + std::to_string(rank);
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);

  // 1. Our segment, and its name to both neighbours (an empty name if we have none, so that
  // they do not wait for it).
  std::string cannot;  // why this rank cannot use shared memory
  std::shared_ptr<RingShm::Segment> own;
  std::string own_name;
  if (auto created = RingShm::Create(rank, ShmRingBytes(options.segment_bytes)); created.ok()) {
    own = std::move(created).value();
    own_name = EncodeSegmentName(RingShm::NameOf(*own));
  } else {
    cannot = created.status().message();
  }
  RETURN_IF_ERROR(zmq->SendTo(next, SetupFrame(kRingShmSetupTag, 0, own_name))
                      .WithContext(who + ": sending the segment name to " + Worker(next)));
  RETURN_IF_ERROR(zmq->SendTo(prev, SetupFrame(kRingShmSetupTag, 1, own_name))
                      .WithContext(who + ": sending the segment name to " + Worker(prev)));

  // 2. The neighbours' names (slot 0 from prev, 1 from next); map their segments.
  RingShmSegmentName names[2];
  for (uint32_t slot : {0u, 1u}) {
    const int from = slot == 0 ? prev : next;
    const std::string what = Worker(from) + "'s segment name";
    StatusOr<std::string> text = ReceiveText(*zmq, kRingShmSetupTag, slot, from, deadline, what,
                                             options.timeout_ms);
    if (!text.ok()) return text.status().WithContext(who);
    StatusOr<RingShmSegmentName> name = DecodeSegmentName(*text);
    if (!name.ok()) return name.status().WithContext(who + ": " + what);
    names[slot] = std::move(name).value();
  }
  std::unique_ptr<RingShm> shm;
  if (cannot.empty() && !names[0].name.empty() && !names[1].name.empty()) {
    auto attached = RingShm::Attach(rank, world, own, names[0], names[1], options.failures);
    if (attached.ok()) {
      shm = std::move(attached).value();
    } else {
      cannot = attached.status().message();
    }
  }

  // 3. Agree: every rank learns which ranks cannot, over the transport.
  RingCollectivesOptions agree;
  agree.rank = rank;
  agree.world_size = world;
  agree.channel = zmq;
  agree.timeout_ms = RemainingMs(deadline);
  ASSIGN_OR_RETURN(std::unique_ptr<RingCollectives> ring, RingCollectives::Create(agree));
  std::vector<float> unable(static_cast<size_t>(world), 0.0f);
  unable[static_cast<size_t>(rank)] = cannot.empty() ? 0.0f : 1.0f;
  RETURN_IF_ERROR(ring->AllReduce(unable.data(), unable.size(), DataType::kFloat32,
                                  ReduceOp::kMax, "ring-shm-setup", kRingShmAgreeTag)
                      .WithContext(who + ": agreeing whether every rank can use shared memory"));
  // Every rank has attached or given up: nobody opens the names any more. (Without a channel,
  // our segment goes, name and all, when `own` does, on return.)
  if (shm != nullptr) shm->UnlinkOwnSegment();

  std::string unable_ranks;
  for (int r = 0; r < world; ++r) {
    if (unable[static_cast<size_t>(r)] == 0.0f) continue;
    unable_ranks += (unable_ranks.empty() ? "" : ", ") + Worker(r);
  }
  if (!unable_ranks.empty()) {
    return FailedPreconditionError(who + ": not every rank can map its ring neighbours' "
                                   "shared memory (" + unable_ranks + " cannot)" +
                                   (cannot.empty() ? "" : "; this rank: " + cannot));
  }
  if (shm == nullptr) {  // a neighbour sent no name but did not report itself: a bug
    return InternalError(who + ": a neighbour has no segment but agreed to use shared memory");
  }
  const std::string bytes = MiB(shm->ring_bytes());
  return ConnectedRingChannel{std::move(shm),
                              "shm (shared-memory rings of " + bytes + " each way)"};
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
  ASSIGN_OR_RETURN(std::shared_ptr<RingZmq> zmq,
                   RingZmq::Create({options.rank, options.world_size, options.peer_addresses,
                                    options.transport, options.mailbox}));
  if (options.world_size < 2) return ConnectedRingChannel{zmq, "none (a world of 1)"};
  if (kind == "zmq") return ConnectedRingChannel{zmq, "zmq (through the transport)"};
  if (kind == "links") return ConnectLinks(options, *zmq, "");
  StatusOr<ConnectedRingChannel> shm = ConnectShm(options, zmq);
  if (shm.ok()) {
    if (kind == "auto") shm->description += ", chosen by auto";
    return shm;
  }
  // Every rank got the same verdict (the agreement is collective): all fall back alike.
  if (kind == "auto" && shm.status().code() == StatusCode::kFailedPrecondition) {
    return ConnectLinks(options, *zmq, ", chosen by auto: " + shm.status().message());
  }
  return shm.status().WithContext("--ring-transport " + kind);
}

}  // namespace tessera::worker
