// Cross-memory attach: reading another process's memory on this host with one copy, the
// kernel's process_vm_readv (what OpenMPI's vader transport uses for large messages). The
// bytes go straight from the peer's pages into ours: no shared segment, no copy in between.
//
//   ASSIGN_OR_RETURN(... peer's pid and address, learnt over the job's authenticated ring ...);
//   RETURN_IF_ERROR(ReadPeerMemory({pid, address, "worker 1"}, scratch, bytes));
//
// Who may read whom: the kernel allows it only where this process could ptrace the peer
// (same user, not set-uid, no Yama restriction, no seccomp filter against it), so only the
// job's own processes, which learn each other's pids and addresses only through the ring's
// setup (over the job's authenticated transport). Where the kernel refuses, ProbeBuffer's
// read fails at setup and the ring carries everything (direct_read_collectives.h).
//
// Thread-safety: plain functions; a ProbeBuffer is immutable.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CROSS_MEMORY_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CROSS_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tessera::worker {

// Where a peer's bytes lie: its process, an address in it, and its name for errors.
struct PeerMemory {
  pid_t pid = 0;
  uint64_t address = 0;
  std::string peer;  // "worker 1"
};

// Copies `bytes` from the peer's `address` to `into`, looping over partial reads. Errors name
// the peer, its pid, the address and the errno:
//   UNAVAILABLE          ESRCH: the process exited
//   FAILED_PRECONDITION  EPERM, ENOSYS: the kernel refused (ptrace rules, seccomp, no support)
//   INVALID_ARGUMENT     EFAULT: the address range is not (all) mapped in the peer or here
//   INTERNAL             anything else
// e.g. "reading 4096 bytes at 0x7f..10 of worker 1 (pid 1234): the process exited (ESRCH)".
// REQUIRES: `into` has room for `bytes`. Never blocks on the peer (the copy is the kernel's).
Status ReadPeerMemory(const PeerMemory& from, void* into, size_t bytes);

// Whether process `pid` has exited (a zombie not yet reaped included): a one-byte read of it
// fails with ESRCH. A pid reused since by another process reads as not exited.
bool ProcessExited(pid_t pid);

// What a rank publishes at setup so its peers can check that they may read it: its pid and
// the address of a value only it knows (random per buffer). A peer reads the value back with
// ReadPeerMemory; a refusal, or a different value (another PID namespace: the pid is someone
// else's), means no direct reads.
class ProbeBuffer {
 public:
  ProbeBuffer();
  pid_t pid() const { return pid_; }
  uint64_t address() const { return reinterpret_cast<uint64_t>(&value_); }
  uint64_t value() const { return value_; }

 private:
  pid_t pid_;
  uint64_t value_;
};

// Reads a peer's ProbeBuffer: OK if `value` is there; the refusal otherwise (FAILED_PRECONDITION
// for a different value, naming both).
Status CheckProbe(const PeerMemory& from, uint64_t value);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CROSS_MEMORY_H_
