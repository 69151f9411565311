// RingChannel: how a rank's ring frames (common/messages/ring_frame.h) travel to its successor
// and from its predecessor: all that RingCollectives needs of a transport, and nothing else.
// Three implementations, which mirror each other's file names:
//   - RingShm (shm/ring_shm.h): one shared-memory byte ring each way; ranks on one host.
//   - RingLinks (links/ring_links.h): one TCP connection each way; works across hosts.
//   - RingZmq (zmq/ring_zmq.h): frames as messages through the process's transport (ZeroMQ).
// and MixedHopChannel (mixed_hop_channel.h), one of them to next and another from prev (a ring that
// crosses hosts: shared memory for the hops within one, TCP for the hops between).
// ConnectRingChannel (ring_channel_setup.h) picks one the same way on every rank
// (tessera-worker --ring-transport auto|shm|links|zmq).
//
// Every channel carries every field of a frame, checks every frame on receipt (a direct
// channel fails the direction for good on a bad one), names the peer in its errors, and wakes
// its waiters on the process's FailureBus (the coordinator's notice that a worker died).
//
// Thread-safety: implementations are thread-safe; concurrent calls use different tags.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_

#include <cstddef>
#include <cstdint>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"

namespace tessera::worker {

class RingChannel {
 public:
  virtual ~RingChannel() = default;

  // This rank; the successor is (rank + 1) % world, the predecessor (rank - 1) % world.
  virtual int rank() const = 0;

  // Queues `frame` for next (its sender_rank is set to this rank) and hands on as much as fits
  // now. Never blocks. Fails only if the direction to next is broken. A payload with an owner
  // is kept alive by it; one without (Payload::Borrow with a null owner) borrows the caller's
  // memory, which must stay unchanged until Flush returns OK or CopyUnsentPayloads has run.
  virtual Status Send(RingFrame frame) = 0;

  // Waits for prev's frame (tag, slot). DeadlineExceeded with an empty message once `deadline`
  // passes (the caller names what it waited for); otherwise the channel's failure or the
  // process's (FailureBus). `into`, if not null, is where the caller will copy the payload: a
  // channel may put a payload of exactly `into_bytes` there itself (before the caller checked
  // the frame: `into` may be written even if the frame then proves wrong), and the returned
  // frame's data then points there. REQUIRES: [into, into + into_bytes) is not touched by
  // anyone else during the call. The returned payload may alias the channel's own memory
  // (RingShm): drop it promptly, as the space it holds is the sender's.
  virtual StatusOr<RingFrame> Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                                   uint8_t* into = nullptr, size_t into_bytes = 0) = 0;

  // Waits until every queued frame is handed on to next. DeadlineExceeded naming next.
  virtual Status Flush(Deadline deadline) = 0;

  // Copies the payload of every queued frame that borrows its caller's memory into memory of
  // the channel's own, so that caller may change or free that memory now: for a call that
  // ends, failed, before its Flush succeeded.
  virtual void CopyUnsentPayloads() = 0;

  // How many frames handed to Send are still queued here (Flush would wait for them).
  virtual size_t unsent() const = 0;

  // Why Recv fails (the direction from prev broken, or the process failed); OK otherwise.
  virtual Status failure() const = 0;

  // Drops every received frame kept under `tag` (a failed call leaves its peers' frames
  // behind; the next call uses another tag).
  virtual void Discard(uint64_t tag) = 0;
  // How many received frames are kept for a later Recv.
  virtual size_t kept() const = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_
