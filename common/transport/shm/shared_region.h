// SharedRegion: memory one process creates and another process of the same user on the same
// host maps, to pass large buffers without the kernel's socket copies (the parameter-server
// path between a worker and a server on one host: worker/engines/ps_engine.h).
//
// The creator's region is an anonymous, sealed memfd (no name in /dev/shm to leak, guess or
// race for; its size cannot change, so a mapping never faults past its end); its first bytes
// hold a magic number, a random 128-bit token and the size. The creator tells the peer its
// pid, the fd and the token over an authenticated channel; the peer opens /proc/PID/fd/FD,
// which the kernel allows only to the same user (or root), and maps it after checking that it
// is a regular file of this user, sealed against growing and shrinking, of the expected size,
// holding the token. Anything else is refused, naming what differs: a process on another host
// or in another pid namespace finds no such file, or another file without the token.
//
// Thread-safety: const methods may be called from any thread, CloseFd by the creator only once
// no other thread reads fd(); what processes write into the
// bytes is theirs to order (the PS path orders it by request and reply).
#ifndef TESSERA_COMMON_TRANSPORT_SHM_SHARED_REGION_H_
#define TESSERA_COMMON_TRANSPORT_SHM_SHARED_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"

namespace tessera {

struct SharedRegionToken {
  uint64_t high = 0;
  uint64_t low = 0;
};

class SharedRegion {
 public:
  // Bytes before data(): the header (magic, token, size), a cache line.
  static constexpr size_t kHeaderBytes = 64;

  // A region of `bytes` usable bytes (zeroed), with a fresh random token.
  static StatusOr<std::shared_ptr<SharedRegion>> Create(size_t bytes);
  // Maps the region that process `pid` created as its fd `fd`, which must hold `bytes` usable
  // bytes and `token`.
  static StatusOr<std::shared_ptr<SharedRegion>> Open(int64_t pid, int64_t fd, size_t bytes,
                                                      const SharedRegionToken& token);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  uint8_t* data() const { return base_ + kHeaderBytes; }
  size_t size() const { return bytes_; }
  const SharedRegionToken& token() const { return token_; }
  // The creator's fd (-1 in a peer's mapping, or once closed): what a peer opens.
  int fd() const { return fd_; }
  // Closes the creator's fd once the peers that needed it have mapped the region; the mapping
  // stays.
  void CloseFd();

 private:
  SharedRegion(uint8_t* base, size_t bytes, int fd, const SharedRegionToken& token)
      : base_(base), bytes_(bytes), fd_(fd), token_(token) {}

  uint8_t* const base_;  // the mapping, header included
  const size_t bytes_;
  int fd_;
  const SharedRegionToken token_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_SHM_SHARED_REGION_H_
