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
// A frame the transport delivered twice is dropped (with a warning). Kept, it would wait under
// its (tag, slot) for the next call that uses the tag, which would take it for its own frame:
// another call's elements, a wrong result on every rank and no error. RingZmq numbers the frames
// it sends each peer (RingFrameNumber), and the mailbox remembers per sender and channel (a
// process may send through several: its ring's, its point-to-point channel, its groups') the
// newest number and which of the kRepeatWindow numbers below it it has had. A frame that
// arrives late (overtaken by later ones) is still taken, once; one further behind cannot be
// told from a repeat and is dropped too, so that nothing old is ever used (its call then fails at its
// deadline, naming the peer). The transports deliver each sender's messages in order, or
// nearly.
//
// The mailbox is bounded (max_queued_frames): a peer that floods it fails the process's
// FailureBus with an error naming that peer, rather than growing without limit or dropping
// frames silently. A failure on the bus (the root cause, e.g. the coordinator's notice that a
// worker died) wakes every waiter and fails every later Pop.
//
// Thread-safety: all methods are thread-safe.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_

#include <bitset>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <utility>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/kept_frames.h"

namespace tessera::worker {

// The number (RingFrame::sequence) of the `count`th frame (from 1, modulo 2^32) a RingZmq
// channel sends one peer. `channel` is drawn at random when the channel is made, so that a new one (e.g. of a
// restarted worker) counts afresh instead of looking like a repeat of the old one's frames.
inline uint64_t RingFrameNumber(uint32_t channel, uint32_t count) {
  return (uint64_t{channel} << 32) | count;
}

class CollectiveMailbox {
 public:
  // How far below the newest number from a channel a frame may arrive and still be taken.
  static constexpr size_t kRepeatWindow = 1024;

  explicit CollectiveMailbox(std::shared_ptr<FailureBus> failures,
                             size_t max_queued_frames = kMaxKeptFrames);

  // A MessageHandler for MessageType::kRingFrame that delivers to `mailbox` (a frame's
  // sender_rank is its header's); it shares ownership, so the mailbox lives as long as the
  // endpoint may call the handler. Frames from a sender that is not a worker are dropped with
  // a warning.
  static MessageHandler Handler(std::shared_ptr<CollectiveMailbox> mailbox);

  // Queues `frame` under (frame.tag, frame.slot), unless its sequence (RingFrameNumber; 0 for
  // none) shows it a repeat (see the file comment). Never blocks beyond the mutex. Over the
  // bound, the bus fails (see the file comment) instead.
  void Deliver(RingFrame frame);

  // The oldest frame queued under (tag, slot). DeadlineExceeded with an empty message (the
  // caller knows what it waited for and says so, as RingChannel::Recv promises) once
  // `deadline` passes, or the bus's failure, or `also`'s (a group's own bus, whose failure
  // calls WakeWaiters) if it is not null.
  StatusOr<RingFrame> Pop(uint64_t tag, uint32_t slot, Deadline deadline,
                          const FailureBus* also = nullptr);

  // Wakes every Pop to check its buses again.
  void WakeWaiters();

  Status failure() const { return failures_->failure(); }

  // Drops every frame queued under `tag`.
  void Discard(uint64_t tag);
  // A group (communicator_tags.h) is gone from this process: drops its frames kept here, and
  // every later one (a peer's send after the group's destruction, or a failed call's frames
  // still under way), which would otherwise wait for good and fill the mailbox. Group ids are
  // never given twice in a process.
  void ForgetGroup(uint32_t id);
  size_t queued() const;
  // Frames dropped as repeats.
  uint64_t repeats() const;

 private:
  // Which numbers one sender's channel has been seen to send.
  struct Seen {
    uint64_t newest = 0;  // a RingFrameNumber
    // Bit i: whether count(newest) - 1 - i was had.
    std::bitset<kRepeatWindow> below;
  };

  // Whether `number` is one `sender` had not sent before (see the file comment); records it.
  // REQUIRES mu_ held.
  bool IsNew(int32_t sender, uint64_t number);

  const std::shared_ptr<FailureBus> failures_;
  const size_t max_queued_frames_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  KeptFrames frames_;  // guarded by mu_
  std::set<uint32_t> forgotten_groups_;  // guarded by mu_
  // By sender rank and channel (RingFrameNumber's upper half): one process's channels (its
  // world's ring and point-to-point channels, its groups') count apart; guarded by mu_.
  std::map<std::pair<int32_t, uint32_t>, Seen> seen_;
  uint64_t repeats_ = 0;          // guarded by mu_
  std::shared_ptr<void> subscription_;  // wakes waiters when the bus fails; last member
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
