#include "common/transport/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace tessera {
namespace {

constexpr uint64_t kMagic = 0x314e4f4947455254;  // "TREGION1"
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

struct Header {
  uint64_t magic;
  uint64_t token_high;
  uint64_t token_low;
  uint64_t bytes;
};
static_assert(sizeof(Header) <= SharedRegion::kHeaderBytes);

std::string Errno(int error) { return std::strerror(error); }

}  // namespace

StatusOr<std::shared_ptr<SharedRegion>> SharedRegion::Create(size_t bytes) {
  const std::string where = "shared region of " + std::to_string(bytes) + " bytes: ";
  const int fd = memfd_create("tessera-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return FailedPreconditionError(where + "memfd_create: " + Errno(errno));
  const size_t total = kHeaderBytes + bytes;
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(total)) != 0 ||
      fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    const int error = errno;
    close(fd);
    return ResourceExhaustedError(where + Errno(error));
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return ResourceExhaustedError(where + "mmap: " + Errno(error));
  }
  std::random_device random;
  auto draw = [&random] { return (uint64_t{random()} << 32) ^ random(); };
  const SharedRegionToken token{draw(), draw()};
  Header header{kMagic, token.high, token.low, bytes};
  std::memcpy(base, &header, sizeof(header));
  return std::shared_ptr<SharedRegion>(
      new SharedRegion(static_cast<uint8_t*>(base), bytes, fd, token));
}

StatusOr<std::shared_ptr<SharedRegion>> SharedRegion::Open(int64_t pid, int64_t fd, size_t bytes,
                                                           const SharedRegionToken& token) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const std::string where = "shared region " + path + ": ";
  if (pid <= 0 || fd < 0) return InvalidArgumentError(where + "not a process's descriptor");
  const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0) {
    return NotFoundError(where + Errno(errno) +
                         " (the creator is on another host, in another pid namespace, of "
                         "another user, or gone)");
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{opened};
  struct stat info {};
  if (fstat(opened, &info) != 0) return FailedPreconditionError(where + "fstat: " + Errno(errno));
  if (!S_ISREG(info.st_mode)) return FailedPreconditionError(where + "not a regular file");
  if (info.st_uid != geteuid()) {
    return FailedPreconditionError(where + "owned by uid " + std::to_string(info.st_uid) +
                                 ", not this process's " + std::to_string(geteuid()));
  }
  const size_t total = kHeaderBytes + bytes;
  if (static_cast<uint64_t>(info.st_size) != total) {
    return FailedPreconditionError(where + "holds " + std::to_string(info.st_size) +
                                   " bytes, not the expected " + std::to_string(total));
  }
  const int seals = fcntl(opened, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return FailedPreconditionError(where + "not sealed against resizing");
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
  if (base == MAP_FAILED) return ResourceExhaustedError(where + "mmap: " + Errno(errno));
  Header header{};
  std::memcpy(&header, base, sizeof(header));
  if (header.magic != kMagic || header.token_high != token.high ||
      header.token_low != token.low || header.bytes != bytes) {
    munmap(base, total);
    return FailedPreconditionError(where + "does not hold the expected token");
  }
  return std::shared_ptr<SharedRegion>(
      new SharedRegion(static_cast<uint8_t*>(base), bytes, -1, token));
}

SharedRegion::~SharedRegion() {
  CloseFd();
  munmap(base_, kHeaderBytes + bytes_);
}

void SharedRegion::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace tessera
