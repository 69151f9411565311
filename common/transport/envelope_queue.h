// EnvelopeQueue: hands inbound Envelopes from the transport's I/O thread to a worker thread.
//
//   EnvelopeQueue queue;
//   transport = ZmqTransport::Start(options, queue.Handler(), &metrics);
//   StatusOr<Envelope> next = queue.Pop(Deadline::AfterMillis(100), "a heartbeat");
//
// Thread-safety: all methods are thread-safe.
#ifndef TESSERA_COMMON_TRANSPORT_ENVELOPE_QUEUE_H_
#define TESSERA_COMMON_TRANSPORT_ENVELOPE_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/transport/transport.h"

namespace tessera {

class EnvelopeQueue {
 public:
  // A MessageHandler that appends to this queue. The queue must outlive the transport.
  MessageHandler Handler() {
    return [this](Envelope envelope) { Push(std::move(envelope)); };
  }

  void Push(Envelope envelope) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(envelope));
    }
    cv_.notify_one();
  }

  // The oldest envelope, or DeadlineExceeded naming `waiting_for` once `deadline` passes, or
  // Cancelled after Close().
  StatusOr<Envelope> Pop(Deadline deadline, std::string_view waiting_for) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.when(), [this] { return closed_ || !queue_.empty(); })) {
      return DeadlineExceededError("no " + std::string(waiting_for) + " arrived before the deadline");
    }
    if (queue_.empty()) return CancelledError("queue closed while waiting for " + std::string(waiting_for));
    Envelope envelope = std::move(queue_.front());
    queue_.pop_front();
    return envelope;
  }

  // Wakes every waiter; later Pops on an empty queue return Cancelled at once.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Envelope> queue_;  // guarded by mu_
  bool closed_ = false;         // guarded by mu_
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_ENVELOPE_QUEUE_H_
