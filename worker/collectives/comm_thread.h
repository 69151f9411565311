// CommThread: one thread that runs communication work (collectives) in submission order, so
// that the training thread can compute while it runs and every rank issues its collectives in
// the same order (the ring matches them by tag, but one thread per rank does one at a time).
//
//   CommThread comm;
//   std::shared_future<Status> done = comm.Submit([&] { return collectives->AllGather(...); });
//   ... compute ...
//   Status status = done.get();  // or wait_for with a deadline
//
// Thread-safety: Submit and CancelPending from any thread; the work runs on the comm thread.
#ifndef TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_
#define TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/status.h"

namespace tessera::worker {

class CommThread {
 public:
  CommThread();
  // Runs the work already submitted (none after CancelPending), then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `work`; the future holds what it returns once it has run.
  std::shared_future<Status> Submit(std::function<Status()> work);

  // Drops the work submitted but not started: it never runs, and its futures hold CANCELLED,
  // "<reason>: not started". The work running now, if any, runs to its end; work submitted
  // later runs as usual. For an owner going away whose queued collectives could only wait for
  // peers that will not join them.
  void CancelPending(const std::string& reason);

 private:
  struct Task {
    std::function<Status()> work;
    std::promise<Status> done;
  };

  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_
