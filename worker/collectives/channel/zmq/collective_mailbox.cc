#include "worker/collectives/channel/zmq/collective_mailbox.h"

#include <string>
#include <utility>

#include "common/base/logging.h"

namespace tessera::worker {

CollectiveMailbox::CollectiveMailbox(std::shared_ptr<FailureBus> failures,
                                     size_t max_queued_frames)
    : failures_(std::move(failures)), max_queued_frames_(max_queued_frames) {
  // Taking the lock orders the wake-up after a waiter's check of the bus and before its wait.
  subscription_ = failures_->Subscribe([this] {
    { std::lock_guard<std::mutex> lock(mu_); }
    arrived_.notify_all();
  });
}

MessageHandler CollectiveMailbox::Handler(std::shared_ptr<CollectiveMailbox> mailbox) {
  return [mailbox](Envelope envelope) {
    RingFrame* frame = envelope.As<RingFrame>();
    if (envelope.header.sender_role != Role::kWorker) {
      TLOG(WARNING) << "dropped a ring frame (tag " << frame->tag << ") from "
                    << envelope.header.DescribeSender() << ": only workers take part in rings";
      return;
    }
    frame->sender_rank = envelope.header.sender_rank;
    mailbox->Deliver(std::move(*frame));
  };
}

void CollectiveMailbox::Deliver(RingFrame frame) {
  Status overflow;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (frames_.size() >= max_queued_frames_) {
      overflow = UnavailableError(
          "collective mailbox full (" + std::to_string(max_queued_frames_) +
          " frames waiting) when " + MemberName(Role::kWorker, frame.sender_rank) +
          " sent tag=" + std::to_string(frame.tag) + " slot " + std::to_string(frame.slot) +
          ": frames arrive for no running collective");
    } else {
      frames_.Keep(std::move(frame));
    }
  }
  if (!overflow.ok()) {
    TLOG(ERROR) << overflow.message();
    failures_->Fail(overflow);
    return;
  }
  arrived_.notify_all();
}

StatusOr<RingFrame> CollectiveMailbox::Pop(uint64_t tag, uint32_t slot, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (Status failed = failures_->failure(); !failed.ok()) return failed;
    if (frames_.Has(tag, slot)) return frames_.Take(tag, slot);
    if (arrived_.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
        !frames_.Has(tag, slot) && failures_->failure().ok()) {
      return DeadlineExceededError("deadline passed");
    }
  }
}

void CollectiveMailbox::Discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  frames_.Discard(tag);
}

size_t CollectiveMailbox::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frames_.size();
}

}  // namespace tessera::worker
