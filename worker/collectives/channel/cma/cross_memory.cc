#include "worker/collectives/channel/cma/cross_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

namespace tessera::worker {
namespace {

std::string Hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string ErrnoName(int error) {
  switch (error) {
    case ESRCH: return "ESRCH";
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EFAULT: return "EFAULT";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    default: return "errno " + std::to_string(error);
  }
}

}  // namespace

Status ReadPeerMemory(const PeerMemory& from, void* into, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<uint8_t*>(into) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(from.address + done), bytes - done};
    const ssize_t got = process_vm_readv(from.pid, &local, 1, &remote, 1, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    // 0 bytes without an error: the next page is not readable (a partial read stops at it).
    const int error = got < 0 ? errno : EFAULT;
    if (error == EINTR) continue;
    const std::string what = "reading " + std::to_string(bytes) + " bytes at " +
                             Hex(from.address) + " of " + from.peer + " (pid " +
                             std::to_string(from.pid) + ")" +
                             (done > 0 ? " after " + std::to_string(done) : "") + ": ";
    const std::string code = " (" + ErrnoName(error) + ")";
    switch (error) {
      case ESRCH:
        return UnavailableError(what + "the process exited" + code);
      case EPERM:
      case ENOSYS:
        return FailedPreconditionError(what + "the kernel refused cross-memory attach: " +
                                       std::strerror(error) + code);
      case EFAULT:
        return InvalidArgumentError(what + "the range is not mapped" + code);
      default:
        return InternalError(what + std::strerror(error) + code);
    }
  }
  return OkStatus();
}

bool ProcessExited(pid_t pid) {
  // Address 0: the kernel looks the process up before it touches the range.
  uint8_t byte = 0;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) < 0 && errno == ESRCH;
}

ProbeBuffer::ProbeBuffer() : pid_(getpid()) {
  std::random_device random;
  value_ = (static_cast<uint64_t>(random()) << 32) ^ random();
}

Status CheckProbe(const PeerMemory& from, uint64_t value) {
  uint64_t got = 0;
  RETURN_IF_ERROR(ReadPeerMemory(from, &got, sizeof(got)));
  if (got != value) {
    return FailedPreconditionError("the probe value at " + Hex(from.address) + " of " +
                                   from.peer + " (pid " + std::to_string(from.pid) + ") is " +
                                   Hex(got) + ", not " + Hex(value) +
                                   ": that pid is another process here (another PID namespace?)");
  }
  return OkStatus();
}

}  // namespace tessera::worker
