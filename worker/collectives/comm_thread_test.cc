#include "worker/collectives/comm_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
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

}  // namespace
}  // namespace tessera::worker
