#include "worker/collectives/channel/zmq/collective_mailbox.h"

#include <string>
#include <utility>

#include "common/base/logging.h"
#include "worker/collectives/channel/zmq/communicator_tags.h"

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

bool CollectiveMailbox::IsNew(int32_t sender, uint64_t number) {
  Seen& seen = seen_[{sender, static_cast<uint32_t>(number >> 32)}];
  if (seen.newest == 0) {  // a channel's first frame
    seen = Seen{number, {}};
    return true;
  }
  // Counts compare modulo 2^32, so that they may wrap.
  const int64_t ahead = static_cast<int32_t>(static_cast<uint32_t>(number) -
                                             static_cast<uint32_t>(seen.newest));
  if (ahead > 0) {
    seen.below <<= static_cast<size_t>(ahead);
    if (ahead <= static_cast<int64_t>(kRepeatWindow)) seen.below.set(ahead - 1);  // the old newest
    seen.newest = number;
    return true;
  }
  if (ahead == 0) return false;
  const size_t behind = static_cast<size_t>(-ahead - 1);
  if (behind >= kRepeatWindow || seen.below.test(behind)) return false;
  seen.below.set(behind);
  return true;
}

void CollectiveMailbox::Deliver(RingFrame frame) {
  const uint64_t number = frame.sequence;
  Status overflow;
  bool repeat = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!forgotten_groups_.empty() && (frame.tag >> 63) != 0 &&
        forgotten_groups_.count(static_cast<uint32_t>(frame.tag >> 32) & 0xffffffu) != 0) {
      return;  // a group this process has destroyed (ForgetGroup)
    }
    if (number != 0 && !IsNew(frame.sender_rank, number)) {
      repeat = true;
      ++repeats_;
    } else if (frames_.size() >= max_queued_frames_) {
      overflow = UnavailableError(
          "collective mailbox full (" + std::to_string(max_queued_frames_) +
          " frames waiting) when " + MemberName(Role::kWorker, frame.sender_rank) +
          " sent tag=" + std::to_string(frame.tag) + " slot " + std::to_string(frame.slot) +
          ": frames arrive for no running collective");
    } else {
      frames_.Keep(std::move(frame));
    }
  }
  if (repeat) {
    TLOG(WARNING) << "dropped a ring frame (tag=" << frame.tag << " slot " << frame.slot
                  << ") from " << MemberName(Role::kWorker, frame.sender_rank)
                  << ": its number came before (the transport delivered it twice) or is more "
                  << "than " << kRepeatWindow << " below the newest from that channel";
    return;
  }
  if (!overflow.ok()) {
    TLOG(ERROR) << overflow.message();
    failures_->Fail(overflow);
    return;
  }
  arrived_.notify_all();
}

StatusOr<RingFrame> CollectiveMailbox::Pop(uint64_t tag, uint32_t slot, Deadline deadline,
                                           const FailureBus* also) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto failed = [&] {
    Status failure = failures_->failure();
    return failure.ok() && also != nullptr ? also->failure() : failure;
  };
  while (true) {
    if (Status failure = failed(); !failure.ok()) return failure;
    if (frames_.Has(tag, slot)) return frames_.Take(tag, slot);
    if (arrived_.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
        !frames_.Has(tag, slot) && failed().ok()) {
      return DeadlineExceededError("");
    }
  }
}

void CollectiveMailbox::WakeWaiters() {
  // Taking the lock orders the wake-up after a waiter's check of its buses and before its wait.
  { std::lock_guard<std::mutex> lock(mu_); }
  arrived_.notify_all();
}

void CollectiveMailbox::Discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  frames_.Discard(tag);
}

void CollectiveMailbox::ForgetGroup(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  forgotten_groups_.insert(id);
  frames_.DiscardIf([id](uint64_t tag) { return IsGroupsWireTag(id, tag); });
}

size_t CollectiveMailbox::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frames_.size();
}

uint64_t CollectiveMailbox::repeats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return repeats_;
}

}  // namespace tessera::worker
