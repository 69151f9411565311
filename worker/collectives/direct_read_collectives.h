// DirectReadCollectives: the Collectives backend for ranks that share a host, where each rank
// reads its peers' buffers where they lie (cross-memory attach, channel/cma/cross_memory.h):
// every byte is copied once, where the shared-memory ring copies it into the ring and out again.
// OpenMPI's vader transport moves large messages the same way.
//
//   DirectReadCollectivesOptions options;  // rank, world_size, control = the ring, timeout
//   ASSIGN_OR_RETURN(std::unique_ptr<DirectReadCollectives> direct,
//                    ConnectDirectReads(options, kSetupTag));  // collective; probes
//   // null: the kernel refused (logged once, with the reason); the ring carries everything
//
// The algorithms and their words (slice, chunk, phase, table) are defined in
// direct_read_collectives.cc above the code. In short: all-reduce is a reduce-scatter (rank r
// reduces its slice r by reading slice r of every peer's buffer, chunk by chunk, into a scratch
// buffer and combining into its own) then an all-gather (every rank reads each peer's reduced
// slice into place). The control collectives (the ring of the same ranks) carry each call's
// table of addresses and the phases' synchronisation, a few bytes per rank; Broadcast, Barrier
// and zero-length calls go to the ring whole.
//
// Every call combines exactly as collectives.h says (element_reduction.h, the ring's own
// kernels) and in the ring's order, so a float sum has the same bits whichever of the two runs
// it (when the ring visits the ranks in rank order, as it does on one host); a slice's
// combination is computed by one rank, so every rank gets the same bits.
// A call returns on any rank only after every rank has finished reading its buffers (the final
// phase), so the caller may change them at once.
//
// Errors name the call, the rank and the peer, as the ring's do; a peer that exits while this
// rank reads it:
//   allreduce tag=5 tensor=g rank=0: reducing its slice [0, 512): reading 1024 bytes at
//   0x7f..00 of worker 1 (pid 4242): the process exited (ESRCH)
// A rank that fails tells every other at the next phase, and they fail naming it; a rank that
// dies is named by the ring's channel (ring_shm.h) during the phases. Every phase is bounded by
// the control's timeout; reads never wait (they are the kernel's copies).
//
// Requires: every rank in one PID namespace of one host, and cross-memory attach allowed
// between them (ProbeDirectReads checks both).
//
// Thread-safety: thread-safe; concurrent calls need different tags (the control's).
#ifndef TESSERA_WORKER_COLLECTIVES_DIRECT_READ_COLLECTIVES_H_
#define TESSERA_WORKER_COLLECTIVES_DIRECT_READ_COLLECTIVES_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// The default of CommunicatorOptions::direct_read_min_bytes (communicator.h) and tessera-worker
// --direct-read-min-bytes: 3 MiB, measured with tessera-bench allreduce (float32 sum, direct
// reads for every size against the shared-memory ring, same run). At np 2 the ring is faster
// up to 2 MiB (direct reads 0.42x at 256 KiB, 0.47x at 1 MiB, 0.78x at 2 MiB: its segments stay
// in cache, and process_vm_readv pins pages) and slower from 3 MiB (direct reads 1.45x at
// 3 MiB, 1.58x at 4 MiB, 1.67x at 8-16 MiB). At np 4 on two cores (oversubscribed, noisy)
// direct reads win 1.2-1.35x from 256 KiB to 1 MiB, tie at 2 MiB and win 1.07-1.23x above: the
// threshold follows np 2's crossover, where the loss below it is largest.
inline constexpr size_t kDefaultDirectReadMinBytes = 3 * 1024 * 1024;

// What ProbeDirectReads agreed.
struct DirectReadProbe {
  bool usable = false;    // every rank can read every other's memory
  std::vector<pid_t> pids;  // every rank's, by rank
  // Empty if usable; else which ranks cannot and, if this is one, why: "worker 1 cannot read
  // its peers' memory; this rank: reading 8 bytes at 0x... of worker 0 (pid 12): the kernel
  // refused cross-memory attach: Operation not permitted (EPERM)".
  std::string refused;
};

// Collective over `control`'s ranks (every rank calls it with the same tag, unique as a
// collective's): each rank publishes its pid and the address of a random value only it holds
// (a ProbeBuffer), reads every peer's back, and the ranks agree whether all could, so that
// every rank decides alike. Errors only if the control collectives fail.
StatusOr<DirectReadProbe> ProbeDirectReads(Collectives& control, uint64_t tag);

struct DirectReadCollectivesOptions {
  int rank = 0;
  int world_size = 1;
  // The ring of the same ranks: carries each call's table and phases (a few bytes per rank)
  // and runs Broadcast, Barrier and zero-length calls. Not owned; must outlive this.
  Collectives* control = nullptr;
  std::vector<pid_t> pids;  // every rank's, by rank (DirectReadProbe::pids)
  // Bounds a call's reads (checked between chunks); every phase is bounded by the control's.
  int64_t timeout_ms = 30000;
  // The unit a rank reads and combines at a time: small enough to stay in cache between the
  // read and the combination, large enough to keep the kernel's per-call cost small.
  size_t chunk_bytes = 256 * 1024;
  // The process's; checked between chunks. May be null.
  std::shared_ptr<FailureBus> failures;
};

class DirectReadCollectives final : public Collectives {
 public:
  // InvalidArgument naming the field: rank outside [0, world_size), no control, pids not one
  // per rank, timeout_ms <= 0, chunk_bytes 0.
  static StatusOr<std::unique_ptr<DirectReadCollectives>> Create(
      DirectReadCollectivesOptions options);

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

  // One call's run (defined in the .cc).
  class Run;

 private:
  explicit DirectReadCollectives(DirectReadCollectivesOptions options);

  // A scratch buffer of chunk_bytes, reused across calls (a fresh one would fault its pages in
  // every call).
  std::unique_ptr<uint8_t[]> TakeScratch();
  void GiveScratch(std::unique_ptr<uint8_t[]> scratch);

  const DirectReadCollectivesOptions options_;
  std::mutex scratch_mu_;
  std::vector<std::unique_ptr<uint8_t[]>> scratch_;  // guarded by scratch_mu_
};

// ProbeDirectReads over options.control (collective, with `tag`), then DirectReadCollectives
// with the probe's pids if every rank can read every other. If not: null, after logging once
// (TLOG(WARNING)) which ranks cannot and why, and the ring carries everything. Errors only if
// the control collectives fail, or for options Create rejects.
StatusOr<std::unique_ptr<DirectReadCollectives>> ConnectDirectReads(
    DirectReadCollectivesOptions options, uint64_t tag);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_DIRECT_READ_COLLECTIVES_H_
