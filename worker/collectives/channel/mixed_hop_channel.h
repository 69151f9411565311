// MixedHopChannel: a rank's ring channel whose two hops travel differently: frames to next through
// one channel, frames from prev through another. ConnectRingChannel (ring_channel_setup.h)
// builds one for a rank whose neighbours are on different hosts' sides of it: shared memory
// (RingShm) to a neighbour on this host, a TCP link (RingLinks) to or from one on another.
// Each half is set up for its one direction only; the other direction of each is unused.
//
//   auto channel =
//       std::make_unique<MixedHopChannel>(std::move(shm_to_next), std::move(links_from_prev));
//
// Why it has a thread: RingShm and RingLinks hand on what a Send could not write at once (a
// full ring or socket buffer) only while a thread waits on that same channel, and here a Recv
// waits on the other half. Frames queued for next would then sit until the call's Flush, and
// around a ring of such ranks each can wait for a frame stuck in another's queue. So a pump
// thread flushes the outbound half whenever a Send leaves frames queued: large frames only;
// small ones go out at once on the sending thread and the pump stays asleep.
//
// Thread-safety: thread-safe, as its halves are.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_MIXED_HOP_CHANNEL_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_MIXED_HOP_CHANNEL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "worker/collectives/channel/ring_channel.h"

namespace tessera::worker {

class MixedHopChannel final : public RingChannel {
 public:
  // How long one flush of the pump waits before it looks whether it should stop.
  static constexpr int64_t kPumpSliceMs = 50;

  // REQUIRES: both halves are of the same rank, non-null.
  MixedHopChannel(std::unique_ptr<RingChannel> to_next, std::unique_ptr<RingChannel> from_prev);
  ~MixedHopChannel() override;
  MixedHopChannel(const MixedHopChannel&) = delete;
  MixedHopChannel& operator=(const MixedHopChannel&) = delete;

  int rank() const override { return to_next_->rank(); }
  Status Send(RingFrame frame) override;
  StatusOr<RingFrame> Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                           uint8_t* into = nullptr, size_t into_bytes = 0) override {
    return from_prev_->Recv(tag, slot, deadline, into, into_bytes);
  }
  Status Flush(Deadline deadline) override { return to_next_->Flush(deadline); }
  void CopyUnsentPayloads() override { to_next_->CopyUnsentPayloads(); }
  size_t unsent() const override { return to_next_->unsent(); }
  Status failure() const override { return from_prev_->failure(); }
  void Discard(uint64_t tag) override { from_prev_->Discard(tag); }
  size_t kept() const override { return from_prev_->kept(); }

 private:
  void Pump();

  const std::unique_ptr<RingChannel> to_next_;
  const std::unique_ptr<RingChannel> from_prev_;
  std::mutex mu_;
  std::condition_variable wanted_changed_;
  bool wanted_ = false;    // a Send left frames queued; guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::thread pump_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_MIXED_HOP_CHANNEL_H_
