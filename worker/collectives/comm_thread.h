// CommThread: one thread that runs communication work (collectives) in submission order, so
// that the training thread can compute while it runs and every rank issues its collectives in
// the same order (the ring matches them by tag, but one thread per rank does one at a time).
//
//   CommThread comm;
//   std::shared_future<Status> done = comm.Submit([&] { return collectives->AllGather(...); });
//   ... compute ...
//   Status status = comm.Wait(done);  // or done.wait_for with a deadline
//
// spin_us (spin_wait.h): once idle, the comm thread polls its queue for up to spin_us before it
// sleeps, and Wait polls the future as long before it blocks, so that an op submitted (or
// finished) within that time costs no wake-up. 0 (the default) sleeps at once.
//
// Thread-safety: Submit, Wait and CancelPending from any thread; the work runs on the comm
// thread.
#ifndef TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_
#define TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "worker/collectives/spin_wait.h"

namespace tessera::worker {

class CommThread {
 public:
  // REQUIRES: 0 <= spin_us <= kMaxCommSpinUs (the flags check it; here it is clamped).
  explicit CommThread(int64_t spin_us = kDefaultCommSpinUs);
  // Runs the work already submitted (none after CancelPending), then joins; a comm thread
  // that spins stops spinning at once.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `work`; the future holds what it returns once it has run.
  std::shared_future<Status> Submit(std::function<Status()> work);

  // done.get(), after polling it for up to spin_us: what `done` holds (what its work threw,
  // rethrown). For futures of this thread's Submit; any shared_future works.
  Status Wait(const std::shared_future<Status>& done) const;

  int64_t spin_us() const { return spin_us_; }

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

  const int64_t spin_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  // Bumped (under mu_) by every Submit and by the destructor, so that the comm thread, spinning
  // without mu_, sees that it has something to do.
  std::atomic<uint64_t> signals_{0};
  std::thread thread_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_COMM_THREAD_H_
