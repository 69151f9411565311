// RingShm: a rank's ring channel (ring_channel.h) to neighbours on the same host, over shared
// memory: one single-producer single-consumer byte ring per direction, in a POSIX shared
// memory segment, driven by the threads that run collectives.
//
//   ASSIGN_OR_RETURN(auto own, RingShm::Create(rank, ring_bytes));
//   ... tell both neighbours EncodeSegmentName(RingShm::NameOf(*own)), learn theirs ...
//   ASSIGN_OR_RETURN(auto shm, RingShm::Attach(rank, world, own, prev_name, next_name, failures));
//   ... once every rank has attached (ring_channel_setup.cc agrees on it): own->Unlink() ...
//
// Why: over loopback TCP a segment is copied into the kernel and out again, and each side
// sleeps in poll(). Here a segment is copied once per hop: the sender copies it from its
// buffer into the ring, and the receiver combines straight from the ring (Recv's payload
// aliases the ring; the space is freed when that payload is dropped), or copies it into its
// place (Recv's `into`).
//
// Segments: each rank creates one, "/tessera-ring-<pid>-<rank>-<random>", holding its ring to
// next (it is the producer, next the consumer) and its doorbell. The ring is mapped twice in a
// row, so every frame of at most the ring's size is contiguous in memory even where it wraps.
// A rank maps its own segment, prev's (its inbound ring) and the first page of next's (next's
// doorbell): a thread waits on one futex word, its own doorbell, which prev rings when it
// wrote a frame and next rings when it freed space. Space is reserved with posix_fallocate, so
// a full /dev/shm fails setup with ENOSPC instead of a SIGBUS later.
//
// Setup (ring_channel_setup.cc, every rank at once): each rank creates its segment and tells
// prev and next its name and a random token. It opens both neighbours' segments and checks the
// token (a segment with another token is not the neighbour's). Then every rank agrees whether
// every rank could map its neighbours; only then are the names unlinked, so nothing is left in
// /dev/shm whatever happens later.
//
// Who may map a segment: the job's processes run as one user, and nobody else. Create makes
// the segment with O_EXCL and mode 0600, its name ending in 64 bits from the kernel's random
// source (so nobody can guess it or create it first); the name and token reach the neighbours
// only through the setup messages (over the job's authenticated transport). Before mapping a
// neighbour's segment, Open checks (fstat) that this process's effective uid owns it and that
// its group and others have no permission bits, and refuses it otherwise, naming it:
//   worker 1's shared memory segment /tessera-ring-...: owned by uid 1001, not ours: refusing
//   to map it
//
// Wire: a frame is the 64-byte header of ring_frame_codec.h and the payload, padded to 64
// bytes. Every header is checked on receipt (magic, sender, size cap): a bad one fails the
// direction, naming the peer. A frame that fits the ring is written whole and read in place; a
// larger one is streamed through it and copied out piece by piece.
//
// Waiting (Recv, Flush): a thread makes progress (writes what is queued for next, takes what
// prev wrote), spins up to spin_us calling sched_yield(), then sleeps on its doorbell for at
// most kFailureCheckMs. Each time it wakes it checks the process's FailureBus (the
// coordinator's notice), the neighbours' processes (kill(pid, 0) and /proc: a dead peer never rings) and
// their closed flags (set by the destructor), and the call's deadline. Errors name the peer:
//   ring shm from worker 1 (pid 1234): the process exited
// A broken direction stays broken; the other keeps working, so an abort notice reaches next.
//
// Requires: the ranks run on one host with one /dev/shm and one PID namespace (setup checks
// that each neighbour's pid is alive here).
//
// Thread-safety: thread-safe. Payloads handed to Send must stay unchanged until written.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_SHM_RING_SHM_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_SHM_RING_SHM_H_

#include <sys/types.h>

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/payload.h"
#include "common/base/status.h"
#include "worker/collectives/channel/kept_frames.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/ring_frame_codec.h"

namespace tessera::worker {

// A segment as its creator announces it: the name to shm_open and the token inside.
struct RingShmSegmentName {
  std::string name;  // empty: the rank has no segment
  std::array<uint64_t, 2> token{};
};

// A name as text, for the setup messages, and back (InvalidArgument for malformed text).
std::string EncodeSegmentName(const RingShmSegmentName& name);
StatusOr<RingShmSegmentName> DecodeSegmentName(const std::string& text);

class RingShm final : public RingChannel {
 public:
  static constexpr int64_t kFailureCheckMs = 20;

  class Segment;  // one mapped segment (defined in the .cc)

  // Create makes this rank's segment (its name is linked until UnlinkOwnSegment or the
  // destructor); Attach opens the neighbours' (at world 2 both are the same) and checks their
  // tokens: FailedPrecondition naming the neighbour if that fails. `failures` may be null.
  // One direction only (a ring whose other hop is another channel, mixed_hop_channel.h): an empty
  // `prev` name leaves out the ring from prev (Recv fails FailedPrecondition), an empty `next`
  // the ring to next (Send fails so). Our own segment is needed either way: its doorbell wakes
  // our waiters.
  static StatusOr<std::shared_ptr<Segment>> Create(int rank, size_t ring_bytes);
  static RingShmSegmentName NameOf(const Segment& segment);
  static StatusOr<std::unique_ptr<RingShm>> Attach(int rank, int world_size,
                                                   std::shared_ptr<Segment> own,
                                                   const RingShmSegmentName& prev,
                                                   const RingShmSegmentName& next,
                                                   std::shared_ptr<FailureBus> failures,
                                                   size_t max_payload_bytes = (64u << 20) + 4096,
                                                   int64_t spin_us = 50);
  // The same in two steps, so that the setup can learn which neighbour this rank can map
  // before it decides: OpenRing maps prev's segment whole (its ring to us), OpenBell the first
  // page of next's (its doorbell), each FailedPrecondition saying why it cannot; FromSegments
  // makes the channel of those opened (either may be null, not both).
  static StatusOr<std::shared_ptr<Segment>> OpenRing(const RingShmSegmentName& prev, int prev_rank);
  static StatusOr<std::shared_ptr<Segment>> OpenBell(const RingShmSegmentName& next, int next_rank);
  // `next` and `prev` are the neighbours' ranks (the ring's order need not be the ranks').
  static StatusOr<std::unique_ptr<RingShm>> FromSegments(
      int rank, int next, int prev, std::shared_ptr<Segment> own,
      std::shared_ptr<Segment> prev_ring, std::shared_ptr<Segment> next_bell,
      std::shared_ptr<FailureBus> failures, size_t max_payload_bytes = (64u << 20) + 4096,
      int64_t spin_us = 50);

  ~RingShm() override;
  RingShm(const RingShm&) = delete;
  RingShm& operator=(const RingShm&) = delete;

  // Removes this rank's segment name from /dev/shm (the mappings stay). Once both neighbours
  // have attached.
  void UnlinkOwnSegment();

  int rank() const override { return rank_; }
  int next() const { return next_; }
  int prev() const { return prev_; }
  // The bytes of each direction's ring.
  size_t ring_bytes() const;

  Status Send(RingFrame frame) override;
  StatusOr<RingFrame> Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                               uint8_t* into = nullptr, size_t into_bytes = 0) override;
  Status Flush(Deadline deadline) override;
  void CopyUnsentPayloads() override;
  size_t unsent() const override;
  Status failure() const override;
  void Discard(uint64_t tag) override;
  size_t kept() const override;

  class Inbound;  // the consumer's side of prev's ring (defined in the .cc)

 private:
  struct OutFrame {
    uint8_t header[kFrameHeaderBytes];
    Payload payload;
    uint64_t total = 0;    // header and padded payload
    uint64_t written = 0;  // of total
  };
  // A frame larger than the ring, being copied out.
  struct Streaming {
    RingFrame frame;
    uint64_t payload_bytes = 0;
    uint64_t total = 0;
    uint64_t got = 0;  // of total, header included
    std::shared_ptr<uint8_t> buffer;  // null when landing in a Recv's `into`
    uint8_t* target = nullptr;
  };

  RingShm(int rank, int next, int prev, std::shared_ptr<Segment> own,
          std::shared_ptr<Segment> prev_ring, std::shared_ptr<Segment> next_bell,
          std::shared_ptr<FailureBus> failures, size_t max_payload_bytes, int64_t spin_us);

  // Both REQUIRE mu_ held. WriteSome writes queued frames while they fit; ReadSome takes every
  // complete frame prev wrote (and what there is of a streamed one) into kept_.
  void WriteSome();
  void ReadSome();
  // Whether prev (for_recv) or next has closed its channel or exited. REQUIRES mu_ held.
  Status PeerStatus(bool for_recv);
  // Makes progress until `done()` (called under mu_), a failure of the direction (for_recv:
  // from prev, else to next) or the deadline. REQUIRES `lock` holds mu_.
  Status Wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
              bool for_recv, Deadline deadline);
  // "ring shm to worker 1 (pid 1234)", "ring shm from ...".
  std::string To() const;
  std::string From() const;

  const int rank_;
  const int next_;
  const int prev_;
  const std::shared_ptr<Segment> own_;        // our ring to next, our doorbell
  const std::shared_ptr<Segment> next_bell_;  // next's doorbell (prev_segment at world 2)
  const std::shared_ptr<Inbound> inbound_;    // prev's ring to us
  const std::shared_ptr<FailureBus> failures_;
  const size_t max_payload_bytes_;
  const int64_t spin_us_;
  const pid_t next_pid_;
  const pid_t prev_pid_;

  mutable std::mutex mu_;
  std::deque<OutFrame> out_;  // guarded by mu_
  Status send_failure_;       // guarded by mu_
  Status recv_failure_;       // guarded by mu_
  KeptFrames kept_;  // guarded by mu_
  // Where waiting Recv calls want their frames: (tag, slot) -> (into, into_bytes); guarded by
  // mu_. A frame someone waits for is kept in place; others are copied out of the ring.
  std::map<std::pair<uint64_t, uint32_t>, std::pair<uint8_t*, size_t>> waiting_;
  std::unique_ptr<Streaming> streaming_;  // guarded by mu_
  uint64_t read_pos_ = 0;                 // bytes of prev's ring taken, ever; guarded by mu_
  SteadyClock::time_point next_peer_check_{};  // guarded by mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_SHM_RING_SHM_H_
