// CollectiveMailbox: where ring frames that came through the transport wait for the collective
// that expects them (the inbox of RingZmq, ring_zmq.h).
//
//   auto mailbox = std::make_shared<CollectiveMailbox>(failures);
//   endpoint.SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(mailbox));
//   StatusOr<RingFrame> frame = mailbox->Pop(tag, slot, deadline);
//
// The transport's I/O thread delivers every frame as it arrives (Deliver never blocks beyond a
// short mutex); a collective pops the one it needs by (tag, slot), in whatever order they came.
// A frame may arrive before its collective has started: it waits here.
//
// The mailbox is bounded (max_queued_frames): a peer that floods it fails the process's
// FailureBus with an error naming that peer, rather than growing without limit or dropping
// frames silently. A failure on the bus (the root cause, e.g. the coordinator's notice that a
// worker died) wakes every waiter and fails every later Pop.
//
// Thread-safety: all methods are thread-safe.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/kept_frames.h"

namespace tessera::worker {

class CollectiveMailbox {
 public:
  explicit CollectiveMailbox(std::shared_ptr<FailureBus> failures,
                             size_t max_queued_frames = kMaxKeptFrames);

  // A MessageHandler for MessageType::kRingFrame that delivers to `mailbox` (a frame's
  // sender_rank is its header's); it shares ownership, so the mailbox lives as long as the
  // endpoint may call the handler. Frames from a sender that is not a worker are dropped with
  // a warning.
  static MessageHandler Handler(std::shared_ptr<CollectiveMailbox> mailbox);

  // Queues `frame` under (frame.tag, frame.slot). Never blocks beyond the mutex. Over the
  // bound, the bus fails (see the file comment) instead.
  void Deliver(RingFrame frame);

  // The oldest frame queued under (tag, slot). DeadlineExceeded (with a bare message: the
  // caller knows what it waited for and says so) once `deadline` passes, or the bus's failure.
  StatusOr<RingFrame> Pop(uint64_t tag, uint32_t slot, Deadline deadline);

  Status failure() const { return failures_->failure(); }

  // Drops every frame queued under `tag`.
  void Discard(uint64_t tag);
  size_t queued() const;

 private:
  const std::shared_ptr<FailureBus> failures_;
  const size_t max_queued_frames_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  KeptFrames frames_;  // guarded by mu_
  std::shared_ptr<void> subscription_;  // wakes waiters when the bus fails; last member
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
