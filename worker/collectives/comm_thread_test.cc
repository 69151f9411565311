#include "worker/collectives/comm_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tessera::worker {
namespace {

// Work that blocks the comm thread until Release(), so that tests can queue work behind it.
// Declared before the CommThread, so that it outlives the thread that waits on it.
class Gate {
 public:
  std::function<Status()> Work() {
    return [this] {
      started_.set_value();
      open_.wait();
      return OkStatus();
    };
  }
  void AwaitStarted() { started_.get_future().wait(); }
  void Release() { release_.set_value(); }

 private:
  std::promise<void> started_;
  std::promise<void> release_;
  std::shared_future<void> open_ = release_.get_future().share();
};

TEST(CommThreadTest, RunsWorkInSubmissionOrderAndReturnsItsStatus) {
  CommThread comm;
  std::vector<int> order;  // touched by the comm thread only, until the last future is ready
  std::vector<std::shared_future<Status>> done;
  for (int i = 0; i < 10; ++i) {
    done.push_back(comm.Submit([&order, i] {
      order.push_back(i);
      return i % 3 == 0 ? InternalError("work " + std::to_string(i)) : OkStatus();
    }));
  }
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(done[i].get(), i % 3 == 0 ? InternalError("work " + std::to_string(i)) : OkStatus());
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// The training thread keeps submitting while the comm thread takes work off the queue: both
// sides of the queue's lock are exercised (under ThreadSanitizer, a race between them shows).
TEST(CommThreadTest, SubmitsWhileTheQueueDrains) {
  constexpr int kWork = 2000;
  Gate gate;
  CommThread comm;
  std::vector<int> order;
  std::vector<std::shared_future<Status>> done;
  done.push_back(comm.Submit(gate.Work()));
  gate.AwaitStarted();
  for (int i = 0; i < kWork / 2; ++i) {
    done.push_back(comm.Submit([&order, i] {
      order.push_back(i);
      return OkStatus();
    }));
  }
  gate.Release();  // the comm thread drains the first half while the second half arrives
  for (int i = kWork / 2; i < kWork; ++i) {
    done.push_back(comm.Submit([&order, i] {
      order.push_back(i);
      return i == kWork - 1 ? AbortedError("last") : OkStatus();
    }));
  }
  for (size_t i = 0; i + 1 < done.size(); ++i) EXPECT_TRUE(done[i].get().ok()) << i;
  EXPECT_EQ(done.back().get(), AbortedError("last"));
  ASSERT_EQ(order.size(), static_cast<size_t>(kWork));
  for (int i = 0; i < kWork; ++i) ASSERT_EQ(order[i], i);
}

TEST(CommThreadTest, DestructorRunsTheWorkAlreadySubmitted) {
  std::atomic<int> ran{0};
  std::vector<std::shared_future<Status>> done;
  {
    Gate gate;
    CommThread comm;
    done.push_back(comm.Submit(gate.Work()));
    for (int i = 0; i < 5; ++i) {
      done.push_back(comm.Submit([&ran] {
        ++ran;
        return OkStatus();
      }));
    }
    gate.AwaitStarted();
    gate.Release();
  }
  EXPECT_EQ(ran.load(), 5);
  for (const auto& d : done) EXPECT_TRUE(d.get().ok());
}

TEST(CommThreadTest, CancelPendingDropsTheWorkNotStartedAndLetsTheRunningOneFinish) {
  Gate gate;
  CommThread comm;
  std::atomic<int> ran{0};
  std::shared_future<Status> running = comm.Submit(gate.Work());
  std::vector<std::shared_future<Status>> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(comm.Submit([&ran] {
      ++ran;
      return OkStatus();
    }));
  }
  gate.AwaitStarted();
  comm.CancelPending("engine shutting down");
  for (const auto& q : queued) {
    ASSERT_EQ(q.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    EXPECT_EQ(q.get(), CancelledError("engine shutting down: not started"));
  }
  EXPECT_NE(running.wait_for(std::chrono::milliseconds(10)), std::future_status::ready);
  gate.Release();
  EXPECT_TRUE(running.get().ok());

  // Work submitted afterwards runs as usual.
  std::shared_future<Status> later = comm.Submit([&ran] {
    ++ran;
    return OkStatus();
  });
  EXPECT_TRUE(later.get().ok());
  EXPECT_EQ(ran.load(), 1);
}

TEST(CommThreadTest, CancelPendingThenDestructorJoinsWithoutRunningTheDroppedWork) {
  std::atomic<int> ran{0};
  {
    Gate gate;
    CommThread comm;
    comm.Submit(gate.Work());
    for (int i = 0; i < 3; ++i) {
      comm.Submit([&ran] {
        ++ran;
        return OkStatus();
      });
    }
    gate.AwaitStarted();
    comm.CancelPending("stopping");
    gate.Release();
  }
  EXPECT_EQ(ran.load(), 0);
}

TEST(CommThreadTest, WhatTheWorkThrowsReachesTheFuture) {
  CommThread comm;
  std::shared_future<Status> done =
      comm.Submit([]() -> Status { throw std::runtime_error("collective threw"); });
  EXPECT_THROW(done.get(), std::runtime_error);
  EXPECT_TRUE(comm.Submit([] { return OkStatus(); }).get().ok());
}

// ---- Spin-then-wait (spin_us) ----

// The results and the order a sequence of work gives: submitted in bursts and one at a time
// (each waited for before the next, so that the comm thread is idle, spinning or asleep, at
// every submit).
std::pair<std::vector<Status>, std::vector<int>> RunSequence(int64_t spin_us) {
  CommThread comm(spin_us);
  std::vector<int> order;  // the comm thread's until the futures are ready
  std::vector<Status> results;
  auto work = [&order](int i) {
    return [&order, i] {
      order.push_back(i);
      return i % 4 == 0 ? InternalError("work " + std::to_string(i)) : OkStatus();
    };
  };
  for (int i = 0; i < 200; ++i) results.push_back(comm.Wait(comm.Submit(work(i))));
  std::vector<std::shared_future<Status>> burst;
  for (int i = 200; i < 400; ++i) burst.push_back(comm.Submit(work(i)));
  for (const auto& done : burst) results.push_back(comm.Wait(done));
  return {results, order};
}

TEST(CommThreadSpinTest, SpinOnAndOffGiveTheSameResultsInTheSameOrder) {
  const auto off = RunSequence(0);
  ASSERT_EQ(off.second.size(), 400u);
  for (int i = 0; i < 400; ++i) ASSERT_EQ(off.second[i], i);
  for (int64_t spin_us : {int64_t{1}, int64_t{50}, int64_t{2000}}) {
    const auto on = RunSequence(spin_us);
    EXPECT_EQ(on.first, off.first) << "spin_us " << spin_us;
    EXPECT_EQ(on.second, off.second) << "spin_us " << spin_us;
  }
}

// Whether work submitted to `comm` now runs.
bool RunsASubmit(CommThread& comm) {
  std::atomic<bool> ran{false};
  const bool ok = comm.Wait(comm.Submit([&ran] {
                        ran = true;
                        return OkStatus();
                      })).ok();
  return ok && ran.load();
}

TEST(CommThreadSpinTest, ASubmitWhileTheThreadSpinsRuns) {
  CommThread comm(kMaxCommSpinUs);  // idle, it polls for a second before it sleeps
  ASSERT_TRUE(comm.Wait(comm.Submit([] { return OkStatus(); })).ok());
  // Now it spins (for up to a second): this submit is seen by the poll.
  EXPECT_TRUE(RunsASubmit(comm));
}

TEST(CommThreadSpinTest, ASubmitWhileTheThreadSleepsRuns) {
  CommThread comm(/*spin_us=*/100);
  ASSERT_TRUE(comm.Wait(comm.Submit([] { return OkStatus(); })).ok());
  // 100 us of spinning are long over: the thread sleeps, and Submit's notify wakes it.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(RunsASubmit(comm));
}

// A thread that spins for a second stops at once when its CommThread goes: the destructor
// wakes the poll, it does not wait out the budget.
TEST(CommThreadSpinTest, DestructionWhileSpinningReturnsPromptly) {
  for (int round = 0; round < 5; ++round) {
    auto comm = std::make_unique<CommThread>(kMaxCommSpinUs);
    ASSERT_TRUE(comm->Wait(comm->Submit([] { return OkStatus(); })).ok());
    const auto start = std::chrono::steady_clock::now();
    comm.reset();  // the thread spins now (its budget: 1 s)
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300))
        << "round " << round;
  }
}

TEST(CommThreadSpinTest, CancelPendingWhileSpinningDropsWhatWaitsAndTheThreadRunsOn) {
  Gate gate;
  CommThread comm(kMaxCommSpinUs);
  std::shared_future<Status> running = comm.Submit(gate.Work());
  std::shared_future<Status> queued = comm.Submit([] { return InternalError("ran"); });
  gate.AwaitStarted();
  comm.CancelPending("stopping");
  EXPECT_EQ(queued.get(), CancelledError("stopping: not started"));
  gate.Release();
  EXPECT_TRUE(comm.Wait(running).ok());
  EXPECT_TRUE(comm.Wait(comm.Submit([] { return OkStatus(); })).ok());
}

// Wait polls for at most spin_us, then blocks until the work ends; what the work throws
// reaches it as it does done.get().
TEST(CommThreadSpinTest, WaitBlocksPastItsSpinAndRethrows) {
  CommThread comm(/*spin_us=*/50);
  std::shared_future<Status> slow = comm.Submit([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return AbortedError("slow");
  });
  EXPECT_EQ(comm.Wait(slow), AbortedError("slow"));
  std::shared_future<Status> thrown =
      comm.Submit([]() -> Status { throw std::runtime_error("collective threw"); });
  EXPECT_THROW(comm.Wait(thrown), std::runtime_error);
}

// Both sides of the lock at once, with the spin on: a second thread submits while the first
// submits and waits op by op (the comm thread spinning between them), so that Submit, the
// poll and the sleep race (under ThreadSanitizer, a race between them shows). Each
// submitter's work runs in its order.
TEST(CommThreadSpinTest, TwoSubmittersAndASpinningThread) {
  constexpr int kWork = 1000;
  for (int64_t spin_us : {int64_t{0}, int64_t{20}, int64_t{500}}) {
    CommThread comm(spin_us);
    std::vector<int> a_order;
    std::vector<int> b_order;  // each the comm thread's until its futures are ready
    std::thread other([&] {
      std::vector<std::shared_future<Status>> done;
      for (int i = 0; i < kWork; ++i) {
        done.push_back(comm.Submit([&b_order, i] {
          b_order.push_back(i);
          return OkStatus();
        }));
        if (i % 64 == 0) std::this_thread::yield();
      }
      for (const auto& d : done) EXPECT_TRUE(comm.Wait(d).ok());
    });
    for (int i = 0; i < kWork; ++i) {
      ASSERT_TRUE(comm.Wait(comm.Submit([&a_order, i] {
                        a_order.push_back(i);
                        return OkStatus();
                      })).ok());
    }
    other.join();
    ASSERT_EQ(a_order.size(), static_cast<size_t>(kWork));
    ASSERT_EQ(b_order.size(), static_cast<size_t>(kWork));
    for (int i = 0; i < kWork; ++i) {
      ASSERT_EQ(a_order[i], i);
      ASSERT_EQ(b_order[i], i);
    }
  }
}

TEST(SpinUntilTest, NeverPollsPastItsBudget) {
  int polls = 0;
  EXPECT_FALSE(SpinUntil([&] { return ++polls, false; }, 0));
  EXPECT_EQ(polls, 1);  // 0: one look, no spin
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(SpinUntil([] { return false; }, 2000));
  const auto spent = std::chrono::steady_clock::now() - start;
  EXPECT_GE(spent, std::chrono::microseconds(2000));
  EXPECT_LT(spent, std::chrono::milliseconds(500));  // 2 ms and one yield's worth of slack
  polls = 0;
  EXPECT_TRUE(SpinUntil([&] { return ++polls == 3; }, kMaxCommSpinUs));
  EXPECT_EQ(polls, 3);
}

}  // namespace
}  // namespace tessera::worker
