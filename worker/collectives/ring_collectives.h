// RingCollectives: the Collectives backend for host memory, over the transport (ZeroMQ/TCP):
// the bandwidth-optimal ring of Patarasuk & Yuan, as in Gloo and NCCL, pipelined in segments.
//
//   RingCollectivesOptions options;
//   options.rank = rank;
//   options.world_size = world;
//   ASSIGN_OR_RETURN(options.peer_addresses, RingPeerAddresses(fleet_view));
//   options.transport = &endpoint.transport();
//   options.mailbox = mailbox.get();  // the endpoint's CollectiveChunk handler delivers to it
//   options.timeout_ms = config.request_timeout_ms;
//   ASSIGN_OR_RETURN(std::unique_ptr<RingCollectives> ring, RingCollectives::Create(options));
//   RETURN_IF_ERROR(ring->AllReduce(grads, n, DataType::kFloat32, ReduceOp::kAverage, "b3", 7));
//
// The algorithms and their words (ring, block, segment, step) are defined in
// ring_collectives.cc, above the code that uses them. In short: all-reduce is a reduce-scatter
// followed by an all-gather, W - 1 steps each; each rank's block is cut into segments of at
// most segment_bytes, and a segment is passed on as soon as it has been received and combined,
// so the transport's I/O thread sends and receives while this thread reduces.
//
// Two ways for segments to travel, the same on every rank:
//   - transport and mailbox (options.links null): each segment is a CollectiveChunk message;
//     four thread hand-offs per message (see docs/benchmarks.md).
//   - a direct channel (options.links, ring_channel.h): RingLinks (one TCP connection to next
//     and one from prev) or RingShm (shared-memory rings, same host), which the calling thread
//     writes and reads itself; the transport and mailbox only carry the setup and the
//     coordinator's failure notices. tessera-worker's default (--ring-transport auto: shm on
//     one host, else links); links are 2-5x faster than the transport at np=2 from 4 KiB to
//     1 MiB, shm faster still (docs/benchmarks.md).
// Both carry the same fields, checked the same way, and the same abort notices.
//
// Every call's deadline is options.timeout_ms from its start. When a rank fails (a timeout, a
// mismatch with its predecessor, bad arguments), it sends its successor an abort notice quoting
// the error, and each rank passes it on, so every rank of the ring fails promptly with the root
// cause instead of waiting for its own deadline:
//   allreduce tag=5 rank=1: worker 0 reported a failure: allreduce tag=5 rank=0: the chunk
//   from worker 2 (step 0) is for a buffer of 12 elements; this rank's has 10
//
// Staging: over the transport, outgoing segments are never sent from the caller's buffers
// (ZeroMQ may hold a frame after the call returns, and later steps overwrite the buffer): they
// are staged in buffers the object owns, reused once the transport has released them; received
// segments are forwarded without a copy. Over links, every frame is written by the call's
// final Flush (or copied, if the call fails), so segments are sent straight from the caller's
// buffers wherever the algorithm does not write them again during the call (all of an
// all-reduce, all-gather and broadcast; a reduce-scatter's first step), and received into
// them: "borrowing" in ring_collectives.cc.
//
// Thread-safety: thread-safe; concurrent calls need different tags.
#ifndef TESSERA_WORKER_COLLECTIVES_RING_COLLECTIVES_H_
#define TESSERA_WORKER_COLLECTIVES_RING_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

struct RingCollectivesOptions {
  int rank = 0;
  int world_size = 1;
  // The transport address of every worker, indexed by rank (this rank's own entry included),
  // in the order of the fleet view, so that every rank sees the same ring.
  std::vector<std::string> peer_addresses;
  Transport* transport = nullptr;        // sends segments; not owned; may be null if world is 1
  CollectiveMailbox* mailbox = nullptr;  // receives them; not owned; may be null if world is 1
  // Bounds every call, from its start.
  int64_t timeout_ms = 30000;
  // The largest piece of a buffer one message carries, and so the unit of pipelining: smaller
  // pieces overlap more, larger ones cost less per byte. Every rank must use the same value
  // (a rank that does not fails with an error naming its peer). 1 MiB: at np=2 on loopback,
  // 4-16 MiB all-reduces take ~1.3x less time than with 256 KiB (fewer messages, each costing
  // thread hand-offs and a ZeroMQ allocation), 64 KiB-1 MiB the same, 4 MiB segments worse.
  size_t segment_bytes = 1024 * 1024;
  // When set, segments travel over this channel to the neighbours (ring_channel.h: RingLinks'
  // TCP connections or RingShm's shared-memory rings, which the calling thread drives itself)
  // instead of transport and mailbox; the mailbox then only wakes waiters on failure notices.
  // Shared; must match rank and world_size. Every rank must choose the same.
  std::shared_ptr<RingChannel> links;
};

inline constexpr size_t kMaxSegmentBytes = 64u << 20;

// The workers' transport addresses by rank, from the coordinator's fleet view. Internal error
// if the view's worker ranks are not 0..W-1.
StatusOr<std::vector<std::string>> RingPeerAddresses(const FleetView& view);

class RingCollectives final : public Collectives {
 public:
  // InvalidArgument naming the field for options that cannot work: rank outside
  // [0, world_size), a peer list of another size, no transport or mailbox with world_size > 1,
  // timeout_ms <= 0, segment_bytes outside [1, kMaxSegmentBytes], links of another rank.
  static StatusOr<std::unique_ptr<RingCollectives>> Create(RingCollectivesOptions options);
  ~RingCollectives() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor, uint64_t tag) override;
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                       const std::string& tensor, uint64_t tag) override;
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t tag) override;
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& tensor,
                   uint64_t tag) override;
  Status Barrier(uint64_t tag) override;

  // Send buffers whose lifetime may outlast a call (defined in the .cc).
  class StagingPool;

 private:
  explicit RingCollectives(RingCollectivesOptions options);

  const RingCollectivesOptions options_;
  const std::unique_ptr<StagingPool> staging_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_RING_COLLECTIVES_H_
