#include "worker/collectives/channel/mixed_hop_channel.h"

#include <utility>

namespace tessera::worker {

MixedHopChannel::MixedHopChannel(std::unique_ptr<RingChannel> to_next,
                                 std::unique_ptr<RingChannel> from_prev)
    : to_next_(std::move(to_next)), from_prev_(std::move(from_prev)) {
  pump_ = std::thread([this] { Pump(); });
}

MixedHopChannel::~MixedHopChannel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wanted_changed_.notify_all();
  pump_.join();  // within a slice
}

Status MixedHopChannel::Send(RingFrame frame) {
  Status sent = to_next_->Send(std::move(frame));
  if (sent.ok() && to_next_->unsent() > 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      wanted_ = true;
    }
    wanted_changed_.notify_one();
  }
  return sent;
}

void MixedHopChannel::Pump() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wanted_changed_.wait(lock, [this] { return wanted_ || stopping_; });
    if (stopping_) return;
    wanted_ = false;
    lock.unlock();
    const Status flushed = to_next_->Flush(Deadline::AfterMillis(kPumpSliceMs));
    lock.lock();
    // Still queued (next is slow): keep at it. Any other failure (the direction broke, the
    // process failed) is the caller's to see, on its next Send or Flush.
    if (flushed.code() == StatusCode::kDeadlineExceeded) wanted_ = true;
  }
}

}  // namespace tessera::worker
