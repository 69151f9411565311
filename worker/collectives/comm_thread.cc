#include "worker/collectives/comm_thread.h"

#include <exception>
#include <utility>

namespace tessera::worker {

CommThread::CommThread() : thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
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
  }
  cv_.notify_all();
  return done;
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
