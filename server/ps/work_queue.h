// WorkQueue: a fixed set of threads taking posted closures in the order they were posted (the
// urgent ones first) and running up to that many at once. The parameter server's handlers post
// to it, so the transport's I/O thread never waits for a lock or an optimizer step.
//
//   WorkQueue queue(2);
//   queue.Post([] { ... });
//   queue.PostUrgent([] { ... });  // taken before anything Post queued
//   queue.Stop();  // or the destructor
//
// Thread-safety: thread-safe. Closures must not call Stop.
#ifndef TESSERA_SERVER_PS_WORK_QUEUE_H_
#define TESSERA_SERVER_PS_WORK_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::server {

class WorkQueue {
 public:
  // Starts max(1, threads) threads.
  explicit WorkQueue(int threads);
  ~WorkQueue();  // Stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `work`; dropped if the queue is stopped.
  void Post(std::function<void()> work);
  // As Post, but ahead of everything Post queued (in order among PostUrgent's): work that
  // others wait for, such as a backup's acknowledgement of a forwarded update that holds the
  // primary's replies.
  void PostUrgent(std::function<void()> work);

  // Waits for the closures running now, then ends the threads; closures still queued are
  // dropped (destroyed here, on the caller's thread). Idempotent.
  void Stop();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> urgent_;  // guarded by mu_; taken before queue_
  std::deque<std::function<void()>> queue_;   // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;         // joined by the first Stop
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_WORK_QUEUE_H_
