#include "worker/collectives/comm_thread.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

namespace tessera::worker {

CommThread::CommThread(int64_t spin_us)
    : spin_us_(std::clamp<int64_t>(spin_us, 0, kMaxCommSpinUs)), thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    signals_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<Status> CommThread::Submit(std::function<Status()> work) {
  Task task{std::move(work), std::promise<Status>()};
  std::shared_future<Status> done = task.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    signals_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();  // with no sleeper (the comm thread spins) a load, no system call
  return done;
}

Status CommThread::Wait(const std::shared_future<Status>& done) const {
  SpinUntil([&] { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
            spin_us_);
  return done.get();
}

void CommThread::CancelPending(const std::string& reason) {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(queue_);
  }
  for (Task& task : dropped) task.done.set_value(CancelledError(reason + ": not started"));
}

void CommThread::Loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (spin_us_ > 0 && queue_.empty() && !stopping_) {
        // Idle: poll for the next Submit (or the destructor) before sleeping. Submit bumps
        // signals_ under mu_, so what is read here, under it, misses none that came after.
        const uint64_t seen = signals_.load(std::memory_order_relaxed);
        lock.unlock();
        SpinUntil([&] { return signals_.load(std::memory_order_acquire) != seen; }, spin_us_);
        lock.lock();
      }
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // As a packaged_task would: what the work throws reaches the future's reader.
    try {
      task.done.set_value(task.work());
    } catch (...) {
      task.done.set_exception(std::current_exception());
    }
  }
}

}  // namespace tessera::worker
