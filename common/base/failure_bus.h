// FailureBus: where a process's fatal news is posted once and read everywhere: the
// coordinator's notice that a peer died, a channel that overflowed. Waiters on other things (a
// ring neighbour's frame, a queue) check it or subscribe to it, so they end with the root cause
// instead of waiting for their own deadline.
//
//   auto failures = std::make_shared<FailureBus>();
//   client->SetFailureCallback([failures](const Status& s) { failures->Fail(s); });
//   auto subscription = failures->Subscribe([&] { cv.notify_all(); });  // wake my waiters
//   if (Status failed = failures->failure(); !failed.ok()) return failed;
//
// Thread-safety: thread-safe. Subscribers are called on the failing thread, outside the bus's
// lock, once; they must not block.
#ifndef TESSERA_COMMON_BASE_FAILURE_BUS_H_
#define TESSERA_COMMON_BASE_FAILURE_BUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tessera {

class FailureBus : public std::enable_shared_from_this<FailureBus> {
 public:
  // Keeps the first failure as the root cause and wakes every subscriber; later calls are
  // ignored. REQUIRES: !status.ok() (an OK status becomes Internal).
  void Fail(const Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.ok()) return;
      failure_ = status.ok() ? InternalError("FailureBus::Fail called with OK") : status;
    }
    std::lock_guard<std::mutex> calling(calling_mu_);
    std::map<uint64_t, std::function<void()>> subscribers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      subscribers = subscribers_;
    }
    for (auto& [id, subscriber] : subscribers) subscriber();
  }

  // The root cause, or OK.
  Status failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  // Calls `wake` when the bus fails (at once if it has failed). The subscription ends when the
  // returned handle is destroyed, and `wake` is not called after that.
  std::shared_ptr<void> Subscribe(std::function<void()> wake) {
    uint64_t id;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = next_id_++;
      subscribers_[id] = wake;
      failed = !failure_.ok();
    }
    if (failed) wake();
    std::weak_ptr<FailureBus> bus = weak_from_this();
    return std::shared_ptr<void>(nullptr, [bus, id](void*) {
      if (auto alive = bus.lock()) alive->Unsubscribe(id);
    });
  }

 private:
  void Unsubscribe(uint64_t id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      subscribers_.erase(id);
    }
    // A Fail that copied the subscriber before the erase may be calling it: wait for it.
    std::lock_guard<std::mutex> calling(calling_mu_);
  }

  std::mutex calling_mu_;  // held while Fail calls subscribers
  mutable std::mutex mu_;
  Status failure_;                                        // guarded by mu_
  uint64_t next_id_ = 0;                                  // guarded by mu_
  std::map<uint64_t, std::function<void()>> subscribers_;  // guarded by mu_
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_FAILURE_BUS_H_
