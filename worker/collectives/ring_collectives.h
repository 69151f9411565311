// RingCollectives: the Collectives backend for host memory: the bandwidth-optimal ring of
// Patarasuk & Yuan, as in Gloo and NCCL, pipelined in segments, over one RingChannel.
//
//   ASSIGN_OR_RETURN(ConnectedRingChannel channel, ConnectRingChannel(setup));  // shm, links, zmq
//   RingCollectivesOptions options;
//   options.rank = rank;
//   options.world_size = world;
//   options.channel = channel.channel;
//   options.timeout_ms = config.request_timeout_ms;
//   ASSIGN_OR_RETURN(std::unique_ptr<RingCollectives> ring, RingCollectives::Create(options));
//   RETURN_IF_ERROR(ring->AllReduce(grads, n, DataType::kFloat32, ReduceOp::kAverage, "b3", 7));
//
// The algorithms and their words (ring, block, segment, step) are defined in
// ring_collectives.cc, above the code that uses them. In short: all-reduce is a reduce-scatter
// followed by an all-gather, W - 1 steps each; each rank's block is cut into segments of at
// most segment_bytes, and a segment is passed on as soon as it has been received and combined,
// so the channel moves one segment while this thread combines the next. Small all-reduces (up
// to one_shot_max_bytes) gather the whole buffers instead and combine them on every rank, in
// the ring's order (the one-shot algorithm): W - 1 steps, the same bits.
//
// The algorithm sees only its channel (channel/ring_channel.h): frames to the successor, frames
// from the predecessor. Which channel carries them (shared memory, TCP links, the transport) is
// ring channel setup's choice; every channel carries the same frames, checked the same way.
//
// Every call's deadline is options.timeout_ms from its start. When a rank fails (a timeout, a
// mismatch with its predecessor, bad arguments), it sends its successor an abort frame quoting
// the error, and each rank passes it on, so every rank of the ring fails promptly with the root
// cause instead of waiting for its own deadline:
//   allreduce tag=5 rank=1: worker 0 reported a failure: allreduce tag=5 rank=0: the frame
//   from worker 2 (step 0) is for a buffer of 12 elements; this rank's has 10
//
// Buffers: segments are sent straight from the caller's buffers wherever the algorithm does not
// write them again during the call (all of an all-reduce, all-gather and broadcast; a
// reduce-scatter's first step), and received into them; the call's final Flush hands every
// frame on before it returns (a failed call copies what is left): "borrowing" in
// ring_collectives.cc. All-reduces and reduce-scatters combine every dtype with every reduce
// op exactly as collectives.h's table says (bit for bit what Gloo computes for a combination in
// the ring's order; an average of a non-floating dtype is InvalidArgument on every rank);
// all-gathers and broadcasts move any dtype.
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
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// Measured with tessera-bench allreduce on 2 cores (docs/benchmarks.md): at np 2 a 4 KiB
// all-reduce takes 2.4 us one-shot against the ring's 3.5-3.7, 16 KiB the same either way, and
// 32-64 KiB longer one-shot; at np 4 one-shot is 7-20% faster up to 16 KiB and slower from 32
// KiB (each rank receives W - 1 whole buffers).
inline constexpr size_t kDefaultOneShotMaxBytes = 16u << 10;

struct RingCollectivesOptions {
  int rank = 0;
  int world_size = 1;
  // Carries the frames to next and from prev (ring_channel.h); must be this rank's, and every
  // rank's of the same kind. May be null if world_size is 1.
  std::shared_ptr<RingChannel> channel;
  // The ranks in the order the ring visits them (the channel's: ConnectedRingChannel::order),
  // the same on every rank; empty: 0, 1, ..., W-1. Only the path changes: every rank still
  // ends a reduce-scatter with its own partition, PartitionOf(count, W, rank).
  std::vector<int> ring_order;
  // Bounds every call, from its start.
  int64_t timeout_ms = 30000;
  // The largest piece of a buffer one frame carries, and so the unit of pipelining: smaller
  // pieces overlap more, larger ones cost less per byte. Every rank must use the same value
  // (a rank that does not fails with an error naming its peer). 1 MiB: at np=2 on loopback,
  // 4-16 MiB all-reduces take ~1.3x less time than with 256 KiB (fewer frames, each costing
  // thread hand-offs over the transport), 64 KiB-1 MiB the same, 4 MiB segments worse.
  size_t segment_bytes = 1024 * 1024;
  // All-reduces of at most this many bytes gather every rank's whole buffer and combine it on
  // each rank (the one-shot algorithm, ring_collectives.cc): the same bits as the ring's
  // reduce-scatter and all-gather, in half the steps. 0: never; above segment_bytes: up to
  // segment_bytes (a buffer per frame). Every rank must use the same value.
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
};

inline constexpr size_t kMaxSegmentBytes = 64u << 20;

class RingCollectives final : public Collectives {
 public:
  // InvalidArgument naming the field for options that cannot work: rank outside
  // [0, world_size), no channel with world_size > 1 or another rank's, timeout_ms <= 0,
  // segment_bytes outside [1, kMaxSegmentBytes].
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

  // Reduce-scatter's staging buffers, whose lifetime may outlast a call (defined in the .cc).
  class StagingPool;

 private:
  explicit RingCollectives(RingCollectivesOptions options);

  const RingCollectivesOptions options_;
  const std::unique_ptr<StagingPool> staging_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_RING_COLLECTIVES_H_
