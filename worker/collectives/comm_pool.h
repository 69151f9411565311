// CommPool: runs the communication work of many queues ("strands": one per process group and
// kind, e.g. a group's collectives and its receives) on threads they share. Each strand's work
// runs in submission order, one at a time, as on a CommThread (comm_thread.h) of its own; the
// pool starts a thread whenever a strand has work and no thread is free, so no strand ever
// waits behind another's (a collective blocked on its peers never holds up another group's,
// which those peers may be running first), and threads are as many as the most strands that
// were ever busy at once. A process that makes 16 groups and uses them one after the other
// runs them all on one thread; Gloo starts threads per group.
//
//   CommPool pool;
//   std::shared_ptr<CommPool::Strand> group = pool.NewStrand();
//   std::shared_future<Status> done = pool.Submit(group, [&] { return comm->AllReduce(...); });
//   pool.Close(*group, "the group is being destroyed");  // drops what has not started
//
// spin_us (spin_wait.h): a thread that has run a task and finds nothing runnable polls for up
// to spin_us before it sleeps, so that work submitted within that time costs no wake-up (as
// CommThread's spin_us). 0 (the default) sleeps at once.
//
// Thread-safety: thread-safe. Work may Submit more work (to any strand), but must not Close
// its own strand.
#ifndef TESSERA_WORKER_COLLECTIVES_COMM_POOL_H_
#define TESSERA_WORKER_COLLECTIVES_COMM_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "worker/collectives/spin_wait.h"

namespace tessera::worker {

class CommPool {
 public:
  class Strand;

  // REQUIRES: 0 <= spin_us <= kMaxCommSpinUs (the flags check it; here it is clamped).
  explicit CommPool(int64_t spin_us = kDefaultCommSpinUs);
  // What has not started never runs (CANCELLED); waits for what runs, and joins. Threads that
  // spin stop spinning at once.
  ~CommPool();
  CommPool(const CommPool&) = delete;
  CommPool& operator=(const CommPool&) = delete;

  // A new strand of this pool.
  std::shared_ptr<Strand> NewStrand();

  // Queues `work` on `strand`; the future holds what it returns once it has run (what it
  // throws, rethrown), or CANCELLED if the strand is closed first.
  std::shared_future<Status> Submit(const std::shared_ptr<Strand>& strand,
                                    std::function<Status()> work);

  // Drops the strand's work that has not started (its futures hold CANCELLED, "<reason>: not
  // started") and later submissions alike, then waits until the work it runs now, if any, has
  // ended.
  void Close(Strand& strand, const std::string& reason);

  // How many threads the pool has started.
  size_t threads() const;

  int64_t spin_us() const { return spin_us_; }

 private:
  struct Task {
    std::function<Status()> work;
    std::promise<Status> done;
  };

  void Loop();

  const int64_t spin_us_;
  mutable std::mutex mu_;
  std::condition_variable work_;   // a strand became runnable, or stopping_
  std::condition_variable ended_;  // a strand's running work ended
  // Strands with work and none running, each bound to be taken by a thread counted in idle_
  // or started for it; guarded by mu_.
  std::deque<std::shared_ptr<Strand>> runnable_;
  std::vector<std::thread> threads_;  // guarded by mu_
  size_t idle_ = 0;  // threads that will look at runnable_ before they wait; guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  // Bumped (under mu_) whenever a strand becomes runnable and when the pool stops, so that a
  // thread spinning without mu_ sees it.
  std::atomic<uint64_t> signals_{0};
};

class CommPool::Strand {
 private:
  friend class CommPool;
  std::deque<Task> queue;     // guarded by the pool's mu_
  bool running = false;       // guarded by the pool's mu_
  bool closed = false;        // guarded by the pool's mu_
  std::string closed_reason;  // guarded by the pool's mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_COMM_POOL_H_
