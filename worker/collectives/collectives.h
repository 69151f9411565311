// Collectives: the operations the workers of a job run together on a buffer each (all-reduce,
// reduce-scatter, all-gather, broadcast, barrier), behind one interface that every backend
// implements: RingCollectives (ring_collectives.h) over the transport for host memory; an NCCL
// backend for device memory.
//
//   std::unique_ptr<Collectives> collectives = ...;  // one per worker, built at start
//   RETURN_IF_ERROR(collectives->AllReduce(grads.data(), grads.size(), DataType::kFloat32,
//                                          ReduceOp::kAverage, "bucket3", /*tag=*/next_tag++));
//
// The contract, for every backend and every operation:
//   - Every rank of the world calls the operation with the same tag, the same operation, the
//     same count, dtype, reduce op and root. A rank whose peers disagree fails with
//     InvalidArgument naming the peer and what differs, and so do the others: never a hang, never
//     a wrong result. (Backends detect what they can see on the wire; the tensor name is for
//     messages only and is not compared.)
//   - `tag` is unique among the operations that may run at the same time on these workers.
//     Operations with different tags may run concurrently (from different threads) on
//     non-overlapping buffers. A tag may be used again by a later call (calls under one tag are
//     matched in the order each rank makes them), but not after a call under it failed (its
//     peers' messages may still arrive).
//   - Every call is bounded by the backend's deadline (its options' timeout_ms, counted from the
//     call's start). An error names the operation, tag, tensor, this rank and the peer that was
//     waited for or that disagreed, e.g.
//       allreduce tag=42 tensor=layer3.w rank=2: no chunk from worker 1 (step 4) within 30000 ms
//     A failure caused by another rank's failure says so and quotes it (the root cause).
//   - After a failure, the contents of the output buffer are unspecified.
//   - `count` is the number of elements of the whole buffer (not bytes, not per rank). Length 0
//     is valid; every rank still takes part. Pointers may be null only where they would address
//     zero elements.
//   - Memory: host memory for RingCollectives; device memory for the NCCL backend. The buffers
//     must stay valid and (inputs) unchanged until the call returns; nothing is retained after.
//
// Thread-safety: implementations are thread-safe for calls with different tags.
#ifndef TESSERA_WORKER_COLLECTIVES_COLLECTIVES_H_
#define TESSERA_WORKER_COLLECTIVES_COLLECTIVES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/data_type.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"

namespace tessera::worker {

// DataType (common/base/data_type.h) and ReduceOp (common/messages/ring_frame.h, as ring
// frames carry it) are tessera:: types. Every operation takes every dtype; AllReduce and
// ReduceScatter combine two elements a and b as PyTorch's Gloo backend does on the CPU (what
// torch.distributed users expect):
//
//   dtype               combined in         sum       product    max, min       average
//   float32, float64    float, double       a + b     a * b      a NaN wins     sum / W
//   float16, bfloat16   float32, rounded back to 16 bits (to nearest, ties to even) wherever a
//                       partial result is stored; travel in their 16-bit form
//   int8, uint8,        the type, wrapping  a + b     a * b      exact          InvalidArgument
//   int32, int64        around (two's complement, modulo 2^bits)
//   bool (0 or 1)       logical             a or b    a and b    or, and        InvalidArgument
//
// A NaN wins a max or a min whichever rank holds it (like torch.maximum; Gloo's std::max keeps
// or drops it depending on the operand order). An average divides the sum by the world size W
// once, at the end; it is defined for floating dtypes only, and every rank rejects one of
// another dtype itself (InvalidArgument naming the dtype) before it sends anything. Float sums
// and products depend on the backend's order of combination (every rank still gets the same
// bits); NcclCollectives differs in places (nccl_collectives.h).

// A contiguous range of elements: [offset, offset + size).
struct Partition {
  size_t offset = 0;
  size_t size = 0;

  constexpr size_t end() const { return offset + size; }
  constexpr bool operator==(const Partition& other) const {
    return offset == other.offset && size == other.size;
  }
};

// The share of rank `rank` when `count` elements are split among `world` ranks: contiguous, in
// rank order, as even as possible, the first (count mod world) ranks one element more than the
// rest. With base = count / world and rem = count % world:
//   offset = rank * base + min(rank, rem),   size = base + (rank < rem ? 1 : 0).
// The partitions of ranks 0..world-1 tile [0, count) exactly; some are empty when count < world.
// E.g. count 10, world 4: [0,3) [3,6) [6,8) [8,10).
//
// ReduceScatter and AllGather partition their buffers with it, and so does ZeRO for its
// parameter, gradient and optimizer-state shards, so the two always agree.
// REQUIRES: world >= 1 and 0 <= rank < world.
constexpr Partition PartitionOf(size_t count, int world, int rank) {
  const size_t w = static_cast<size_t>(world);
  const size_t r = static_cast<size_t>(rank);
  const size_t base = count / w;
  const size_t rem = count % w;
  return Partition{r * base + std::min(r, rem), base + (r < rem ? 1 : 0)};
}

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Combines the `count` elements of `data` across all ranks with `op`, in place: afterwards
  // every rank's data[i] = op over ranks q of (rank q's data[i]). Every rank gets bit-identical
  // results.
  virtual Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                           const std::string& tensor, uint64_t tag) = 0;

  // `input` holds `count` elements on every rank. Afterwards `output` holds this rank's
  // partition p = PartitionOf(count, world_size(), rank()) of the combination:
  //   output[j] = op over ranks q of (rank q's input[p.offset + j]),  0 <= j < p.size.
  // `output` has room for p.size elements. It may be exactly input + p.offset (in place);
  // otherwise the buffers must not overlap. `input` is not modified (in place: only its
  // partition p is).
  virtual Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                               ReduceOp op, const std::string& tensor, uint64_t tag) = 0;

  // The inverse layout: `input` holds this rank's partition PartitionOf(count, world_size(),
  // rank()) (its size elements); afterwards `output` holds all `count` elements, rank q's input
  // at PartitionOf(count, world_size(), q).offset. `input` may be exactly output + that offset
  // (in place); otherwise the buffers must not overlap.
  virtual Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                           const std::string& tensor, uint64_t tag) = 0;

  // Afterwards every rank's `data` (count elements) holds rank `root`'s. The call returns on
  // any rank only once every rank has received the data, so a disagreement anywhere (count,
  // root, dtype) fails every rank, the root included.
  virtual Status Broadcast(void* data, size_t count, DataType dtype, int root,
                           const std::string& tensor, uint64_t tag) = 0;

  // Returns on any rank only after every rank has entered the barrier with this tag.
  virtual Status Barrier(uint64_t tag) = 0;
};

// A 64-bit value as 4 floats of 16 bits each (exact in float32), so that it can travel through
// a float32 collective (fingerprints, file sizes, checksums), and back.
inline void Put64(uint64_t value, float* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<float>((value >> (16 * i)) & 0xffff);
}
inline uint64_t Get64(const float* in) {
  uint64_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint64_t>(in[i]) << (16 * i);
  return value;
}

// A collective: whether `mine` is true on any rank (a max all-reduce of one float with `tag`).
// `what` names the question in errors.
inline StatusOr<bool> AnyRank(Collectives* collectives, bool mine, const std::string& what,
                              uint64_t tag) {
  float flag = mine ? 1.0f : 0.0f;
  RETURN_IF_ERROR(collectives->AllReduce(&flag, 1, DataType::kFloat32, ReduceOp::kMax, what, tag)
                      .WithContext("asking every rank " + what));
  return flag > 0.0f;
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_COLLECTIVES_H_
