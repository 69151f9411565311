// RingChannel: how a rank's ring segments travel to its successor and from its predecessor
// when they bypass the transport and mailbox: what RingCollectives needs of a channel, and
// nothing else. Two implementations:
//   - RingLinks (ring_links.h): one TCP connection each way; works across hosts.
//   - RingShm (ring_shm.h): one shared-memory byte ring each way; ranks on one host only.
// tessera-worker picks one (--ring-transport auto|shm|links|zmq; worker/collectives/channel/ring_channel_setup.h).
//
// A frame is a ReceivedChunk: the fields of a CollectiveChunk plus its payload. Both channels
// carry every field, check every header on receipt and fail the direction for good on a bad one,
// name the peer in their errors, and wake waiters on the mailbox's failure (the coordinator's
// notice that a worker died).
//
// Thread-safety: implementations are thread-safe; concurrent calls use different tags.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_

#include <cstddef>
#include <cstdint>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"

namespace tessera::worker {

class RingChannel {
 public:
  virtual ~RingChannel() = default;

  // This rank; the successor is (rank + 1) % world, the predecessor (rank - 1) % world.
  virtual int rank() const = 0;

  // Queues `frame` (its fields and data) for next and hands on as much as fits now. Never
  // blocks. Fails only if the direction to next is broken. The payload must stay unchanged
  // until handed on (it is shared_ptr-owned).
  virtual Status Send(ReceivedChunk frame) = 0;

  // Waits for prev's frame (tag, slot). DeadlineExceeded with an empty message once `deadline`
  // passes (the caller names what it waited for); otherwise the channel's or the mailbox's
  // failure. `into`, if not null, is where the caller will copy the payload: a channel may put
  // a payload of exactly `into_bytes` there itself (before the caller checked the header:
  // `into` may be written even if the frame then proves wrong), and the returned frame's data
  // then points there. REQUIRES: [into, into + into_bytes) is not touched by anyone else
  // during the call. The returned payload may alias the channel's own memory (RingShm): drop
  // it promptly, as the space it holds is the sender's.
  virtual StatusOr<ReceivedChunk> Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                                       uint8_t* into = nullptr, size_t into_bytes = 0) = 0;

  // Waits until every queued frame is handed on to next. DeadlineExceeded naming next.
  virtual Status Flush(Deadline deadline) = 0;

  // Copies the payload of every queued frame that has no owner (one that borrows its caller's
  // memory) into memory of the channel's own, so that caller may change or free that memory
  // now: for a call that ends, failed, before its Flush succeeded.
  virtual void CopyUnsentPayloads() = 0;

  // Why Recv fails (the direction from prev broken, or the mailbox failed); OK otherwise.
  virtual Status failure() const = 0;

  // Drops every received frame kept under `tag` (see CollectiveMailbox::Discard).
  virtual void Discard(uint64_t tag) = 0;
  // How many received frames are kept for a later Recv.
  virtual size_t kept() const = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_CHANNEL_H_
