#include "worker/collectives/comm_pool.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

namespace tessera::worker {

CommPool::CommPool(int64_t spin_us) : spin_us_(std::clamp<int64_t>(spin_us, 0, kMaxCommSpinUs)) {}

CommPool::~CommPool() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    signals_.fetch_add(1, std::memory_order_release);
    threads.swap(threads_);
  }
  work_.notify_all();
  for (std::thread& thread : threads) thread.join();
  // What the threads left: the strands that still had work when they stopped.
  std::vector<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::shared_ptr<Strand>& strand : runnable_) {
      for (Task& task : strand->queue) dropped.push_back(std::move(task));
      strand->queue.clear();
    }
    runnable_.clear();
  }
  for (Task& task : dropped) {
    task.done.set_value(CancelledError("the communication pool is stopping: not started"));
  }
}

std::shared_ptr<CommPool::Strand> CommPool::NewStrand() { return std::make_shared<Strand>(); }

std::shared_future<Status> CommPool::Submit(const std::shared_ptr<Strand>& strand,
                                            std::function<Status()> work) {
  Task task{std::move(work), std::promise<Status>()};
  std::shared_future<Status> done = task.done.get_future().share();
  std::unique_lock<std::mutex> lock(mu_);
  if (strand->closed || stopping_) {
    const std::string reason =
        strand->closed ? strand->closed_reason : "the communication pool is stopping";
    lock.unlock();
    task.done.set_value(CancelledError(reason + ": not started"));
    return done;
  }
  const bool waiting = !strand->queue.empty() || strand->running;  // it has a thread's turn
  strand->queue.push_back(std::move(task));
  if (waiting) return done;
  runnable_.push_back(strand);
  signals_.fetch_add(1, std::memory_order_release);
  if (runnable_.size() > idle_) {
    // Every thread is busy (or taken): this strand gets one of its own rather than wait
    // behind work that may wait for it. The new thread counts as idle from now, not from
    // when it first takes the lock: otherwise submits in between each start another.
    ++idle_;
    threads_.emplace_back([this] { Loop(); });
  } else {
    work_.notify_one();
  }
  return done;
}

void CommPool::Close(Strand& strand, const std::string& reason) {
  std::deque<Task> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    strand.closed = true;
    strand.closed_reason = reason;
    dropped.swap(strand.queue);
    runnable_.erase(std::remove_if(runnable_.begin(), runnable_.end(),
                                   [&](const auto& s) { return s.get() == &strand; }),
                    runnable_.end());
    ended_.wait(lock, [&] { return !strand.running; });
  }
  for (Task& task : dropped) task.done.set_value(CancelledError(reason + ": not started"));
}

size_t CommPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void CommPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<Task> finished;  // the last task run, whose future is set next
  Status status;
  std::exception_ptr thrown;
  while (true) {  // idle_ counts this thread already (Submit counted it as it started it)
    if (finished.has_value()) {
      // Counted idle before the future is set, so that a caller who waits for it and submits
      // again finds this thread rather than starting another.
      lock.unlock();
      if (thrown) {
        finished->done.set_exception(thrown);  // as a packaged_task would
      } else {
        finished->done.set_value(std::move(status));
      }
      finished.reset();
      thrown = nullptr;
      lock.lock();
    }
    if (spin_us_ > 0 && runnable_.empty() && !stopping_) {
      // Idle (and counted so: a Submit now finds this thread rather than starting another):
      // poll for a runnable strand before sleeping. Submit bumps signals_ under mu_, so what
      // is read here, under it, misses none that came after.
      const uint64_t seen = signals_.load(std::memory_order_relaxed);
      lock.unlock();
      SpinUntil([&] { return signals_.load(std::memory_order_acquire) != seen; }, spin_us_);
      lock.lock();
    }
    work_.wait(lock, [this] { return stopping_ || !runnable_.empty(); });
    --idle_;
    if (stopping_) return;
    std::shared_ptr<Strand> strand = std::move(runnable_.front());
    runnable_.pop_front();
    finished.emplace(std::move(strand->queue.front()));
    strand->queue.pop_front();
    strand->running = true;
    lock.unlock();
    try {
      status = finished->work();
    } catch (...) {
      thrown = std::current_exception();
    }
    lock.lock();
    strand->running = false;
    // The strand's next task, if any, is runnable; this thread, idle again, will look.
    if (!strand->queue.empty()) runnable_.push_back(std::move(strand));
    ++idle_;
    ended_.notify_all();
  }
}

}  // namespace tessera::worker
