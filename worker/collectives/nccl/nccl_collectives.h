// NcclCollectives: the Collectives backend for device memory, on NCCL. Every pointer passed to
// it is CUDA device memory on options.device; the contract of worker/collectives/collectives.h applies, with
// the differences listed below.
//
//   NcclCollectivesOptions options;
//   options.rank = rank;
//   options.world_size = world;
//   options.device = local_rank;
//   options.timeout_ms = config.request_timeout_ms;
//   ASSIGN_OR_RETURN(std::unique_ptr<Collectives> nccl, CreateNcclCollectives(options, ring));
//   RETURN_IF_ERROR(nccl->AllReduce(device_grads, n, DataType::kFloat32, ReduceOp::kAverage,
//                                   "bucket3", /*tag=*/next_tag++));
//
// Two implementations serve this header (see //third_party/cuda:cuda.bzl): nccl_collectives.cu,
// compiled by nvcc where the toolkit was found at build time, and nccl_collectives_cpu.cc, where
// it was not (or with --repo_env=TESSERA_DISABLE_CUDA=1), whose CreateNcclCollectives always
// returns UNAVAILABLE. The header names no CUDA or NCCL type. libnccl.so.2 is never linked: it
// is loaded with dlopen when the first communicator is created (see nccl_collectives.cu for why),
// so a binary that never creates one never loads it.
//
// Creating the communicator. NCCL's ranks find each other through an opaque ncclUniqueId that
// rank 0 makes (ncclGetUniqueId: it carries the address of a bootstrap socket NCCL opens on rank
// 0; NCCL_SOCKET_IFNAME chooses the interface) and every other rank must be given. The id
// travels over the workers' own transport: `host` is a host-memory Collectives (the
// RingCollectives of the job, whose peers were found through the coordinator's fleet view), and
// CreateNcclCollectives uses it for exactly one Broadcast from rank 0, with tag
// options.bootstrap_tag, of the id and rank 0's NCCL version (every rank must load the same
// one). Every rank takes part in that broadcast even when it has failed locally (no device, no
// libnccl), so rank 0's local failure reaches the others at once; another rank's local failure
// reaches rank 0 as its NCCL initialisation running into options.timeout_ms. Then every rank
// creates its communicator (ncclCommInitRankConfig, non-blocking, so that a rank that never
// joins cannot hang the others past the deadline) and its own CUDA stream, on which every
// operation runs.
//
// Differences from the ring backend that callers see:
//   - Order, not tags, matches operations: NCCL pairs the k-th operation of each rank. Calls
//     on one object are therefore serialised (a call waits for the one in progress, within its
//     own deadline), and every rank must issue its operations in the same order. Concurrent
//     callers on different threads must agree on that order among themselves; a rank whose k-th
//     operation has another tag than its peers' fails with INVALID_ARGUMENT (see agreement).
//   - Agreement check: before each operation the ranks all-gather a small descriptor of the
//     call (operation, tag, count, dtype, reduce op, root, and whether the rank's own argument
//     checks passed) and compare it, so a disagreement fails every rank with INVALID_ARGUMENT
//     naming the peer and what differs, and the communicator stays usable. It costs one
//     64-byte all-gather and a host round trip per operation (tens of microseconds; none in a
//     world of one). options.verify_agreement = false skips it: a disagreement is then undefined
//     (wrong results, or a hang that the deadline cuts short), as with plain NCCL, and a call
//     that fails its own argument checks aborts the communicator, since its peers' call is left
//     without a partner.
//   - Numerics are NCCL's: 16-bit sums are rounded to 16 bits at each step of NCCL's reduction
//     (its order depends on topology, not on rank order), and kAverage is ncclAvg, which for
//     floating types scales every input by 1/W before summing rather than dividing the sum once.
//     Whether a NaN wins a max or a min is NCCL's choice. Integer sums and products wrap around,
//     bool sums and products are ors and ands (ncclMax and ncclMin on the bytes), and an average
//     of a non-floating dtype is rejected, as in the ring. All ranks still get bit-identical
//     results.
//   - Padding: NCCL's reduce-scatter and all-gather give every rank an equal block, while
//     PartitionOf gives the first (count mod W) ranks one element more. When count is a multiple
//     of W the two agree and the caller's buffers go to NCCL directly (in place included).
//     Otherwise the operation runs on a device scratch buffer of ceil(count / W) * W elements,
//     owned by the object and grown as needed: rank q's partition is copied into block q
//     (ceil(count / W) elements, the tail zeroed), NCCL runs on the blocks in place, and the
//     PartitionOf-shaped slices are copied out (two copies each way, a contiguous one for the
//     ranks whose partitions are full blocks and a strided one for the rest).
//   - Deadlines and failures: every call waits for its work with a deadline of
//     options.timeout_ms from its start, polling cudaStreamQuery and ncclCommGetAsyncError.
//     When the deadline passes, or NCCL or CUDA reports an error once the ranks have agreed on
//     the call, the communicator is aborted (ncclCommAbort; NCCL's kernels then stop) and the
//     call fails: DEADLINE_EXCEEDED naming the operation, tag, tensor and rank (NCCL cannot say
//     which peer is missing), or the NCCL call and ncclGetErrorString. Every later call on the
//     object fails with FAILED_PRECONDITION quoting that root cause: NCCL cannot recover a
//     communicator, so the job must be restarted or the object recreated on every rank.
//
// Errors of CreateNcclCollectives: INVALID_ARGUMENT naming the field for options that cannot
// work (rank outside [0, world_size), timeout_ms <= 0, a negative device, no host collectives
// with world_size > 1, host collectives of another rank or world size) or a device index the
// machine does not have; UNAVAILABLE when this build has no CUDA, the runtime finds no driver or
// device, or libnccl.so.2 cannot be loaded or is older than 2.14; on the other ranks, rank 0's
// local failure with its code ("worker 0 could not set up NCCL"); FAILED_PRECONDITION when rank
// 0 loaded another NCCL version; DEADLINE_EXCEEDED when not every rank joined within
// timeout_ms; the host Broadcast's error if that failed; otherwise the NCCL or CUDA call that
// failed.
//
// Destruction finalises the communicator (waiting at most timeout_ms for its peers, then
// aborting it) and frees the stream and buffers.
//
// Thread-safety: thread-safe; calls are serialised (see above).
#ifndef TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_COLLECTIVES_H_
#define TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_COLLECTIVES_H_

#include <cstdint>
#include <memory>

#include "common/base/status.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// Default tag of the host Broadcast that carries the NCCL id (below the tags AllReduceEngine
// uses, 1 << 40 and up).
inline constexpr uint64_t kNcclBootstrapTag = uint64_t{1} << 39;

struct NcclCollectivesOptions {
  int rank = 0;
  int world_size = 1;
  // CUDA runtime ordinal (after CUDA_VISIBLE_DEVICES) of this rank's GPU. NCCL requires every
  // rank of a communicator to have a GPU of its own: two ranks on one GPU fail to initialise.
  int device = 0;
  // Bounds every call from its start, and the communicator's initialisation.
  int64_t timeout_ms = 30000;
  // The tag of the one host Broadcast CreateNcclCollectives makes; distinct from the tags of
  // the host operations that may run at the same time. Every rank must use the same value.
  uint64_t bootstrap_tag = kNcclBootstrapTag;
  // The per-call agreement check described above.
  bool verify_agreement = true;
};

// Creates this rank's communicator; every rank of the world must call it at about the same
// time (within timeout_ms). `host` is used for the id broadcast only and not retained; it may
// be null when world_size is 1. Errors: see above.
StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(const NcclCollectivesOptions& options,
                                                             Collectives* host);

// Whether `pointer` addresses CUDA device (or managed) memory, which NcclCollectives takes and
// the host ring does not: how a Communicator (communicator.h) picks the backend per buffer.
// False for host memory, for null, and always in a build without CUDA.
bool IsDeviceMemory(const void* pointer);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_COLLECTIVES_H_
