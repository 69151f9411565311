#include "server/ps/work_queue.h"

#include <algorithm>
#include <utility>

namespace tessera::server {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkQueue::~WorkQueue() { Stop(); }

void WorkQueue::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void WorkQueue::PostUrgent(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    urgent_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void WorkQueue::Stop() {
  std::vector<std::thread> threads;
  std::deque<std::function<void()>> dropped, dropped_urgent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
    dropped.swap(queue_);
    dropped_urgent.swap(urgent_);
  }
  cv_.notify_all();
  for (std::thread& thread : threads) thread.join();
  // `dropped` goes here, outside the lock: a closure may own what posts to this queue.
}

void WorkQueue::Loop() {
  while (true) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !urgent_.empty() || !queue_.empty(); });
      if (stopping_) return;
      std::deque<std::function<void()>>& from = urgent_.empty() ? queue_ : urgent_;
      work = std::move(from.front());
      from.pop_front();
    }
    work();
  }
}

}  // namespace tessera::server
