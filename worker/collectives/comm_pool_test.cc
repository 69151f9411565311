#include "worker/collectives/comm_pool.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

using std::chrono::milliseconds;

TEST(CommPoolTest, AStrandsWorkRunsInOrderOneAtATime) {
  CommPool pool;
  auto strand = pool.NewStrand();
  std::vector<int> order;
  std::atomic<int> running{0};
  std::vector<std::shared_future<Status>> done;
  for (int i = 0; i < 50; ++i) {
    done.push_back(pool.Submit(strand, [&, i] {
      if (running.fetch_add(1) != 0) return InternalError("two at once");
      order.push_back(i);
      running.fetch_sub(1);
      return OkStatus();
    }));
  }
  for (auto& future : done) EXPECT_TRUE(future.get().ok()) << future.get();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

// A's work waits until B's has started, as a collective of one group waits for peers that run
// another group's first: B gets a thread of its own instead of waiting behind A.
TEST(CommPoolTest, AStrandNeverWaitsBehindAnothersWork) {
  CommPool pool;
  auto a = pool.NewStrand();
  auto b = pool.NewStrand();
  std::atomic<bool> b_started{false};
  auto first = pool.Submit(a, [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!b_started.load()) {
      if (std::chrono::steady_clock::now() > deadline) return DeadlineExceededError("no B");
      std::this_thread::sleep_for(milliseconds(1));
    }
    return OkStatus();
  });
  auto second = pool.Submit(b, [&] {
    b_started = true;
    return OkStatus();
  });
  EXPECT_TRUE(first.get().ok()) << first.get();
  EXPECT_TRUE(second.get().ok());
  EXPECT_EQ(pool.threads(), 2u);
}

// Groups used one after the other (the usual program) share one thread, however many.
TEST(CommPoolTest, StrandsUsedOneAfterTheOtherShareOneThread) {
  CommPool pool;
  std::vector<std::shared_ptr<CommPool::Strand>> strands;
  for (int i = 0; i < 16; ++i) strands.push_back(pool.NewStrand());
  for (int round = 0; round < 3; ++round) {
    for (auto& strand : strands) {
      EXPECT_TRUE(pool.Submit(strand, [] { return OkStatus(); }).get().ok());
    }
  }
  EXPECT_EQ(pool.threads(), 1u);
}

TEST(CommPoolTest, CloseDropsWhatHasNotStartedAndWaitsForWhatRuns) {
  CommPool pool;
  auto strand = pool.NewStrand();
  auto other = pool.NewStrand();
  std::atomic<bool> started{false}, release{false}, ended{false};
  auto running = pool.Submit(strand, [&] {
    started = true;
    while (!release.load()) std::this_thread::sleep_for(milliseconds(1));
    ended = true;
    return OkStatus();
  });
  auto queued = pool.Submit(strand, [] { return InternalError("ran after Close"); });
  while (!started.load()) std::this_thread::sleep_for(milliseconds(1));
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(50));
    release = true;
  });
  pool.Close(*strand, "the group is being destroyed");
  EXPECT_TRUE(ended.load());  // Close returned only after the running work ended
  releaser.join();
  EXPECT_TRUE(running.get().ok());
  EXPECT_EQ(queued.get().code(), StatusCode::kCancelled);
  EXPECT_EQ(queued.get().message(), "the group is being destroyed: not started");
  EXPECT_EQ(pool.Submit(strand, [] { return OkStatus(); }).get().code(), StatusCode::kCancelled);
  // Other strands go on.
  EXPECT_TRUE(pool.Submit(other, [] { return OkStatus(); }).get().ok());
}

TEST(CommPoolTest, WhatWorkThrowsReachesItsFuture) {
  CommPool pool;
  auto strand = pool.NewStrand();
  auto thrown = pool.Submit(strand, []() -> Status { throw std::runtime_error("boom"); });
  EXPECT_THROW(thrown.get(), std::runtime_error);
  EXPECT_TRUE(pool.Submit(strand, [] { return OkStatus(); }).get().ok());
}

TEST(CommPoolTest, StoppingCancelsWhatHasNotStarted) {
  std::shared_future<Status> queued;
  std::atomic<bool> started{false};
  {
    CommPool pool;
    auto strand = pool.NewStrand();
    pool.Submit(strand, [&] {
      started = true;
      std::this_thread::sleep_for(milliseconds(50));
      return OkStatus();
    });
    queued = pool.Submit(strand, [] { return InternalError("ran after the pool stopped"); });
    while (!started.load()) std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(queued.get().code(), StatusCode::kCancelled);
}

// Many threads submit to many strands at once, and strands close meanwhile: every future is
// set, each strand's work in order (for TSan: both sides of the pool's lock at once).
TEST(CommPoolTest, ConcurrentSubmitsAndClosesAllComplete) {
  CommPool pool;
  constexpr int kStrands = 8;
  std::vector<std::shared_ptr<CommPool::Strand>> strands;
  std::vector<std::vector<int>> seen(kStrands);
  for (int i = 0; i < kStrands; ++i) strands.push_back(pool.NewStrand());
  std::vector<std::thread> submitters;
  std::atomic<int> settled{0};
  for (int s = 0; s < kStrands; ++s) {
    submitters.emplace_back([&, s] {
      std::vector<std::shared_future<Status>> done;
      for (int i = 0; i < 200; ++i) {
        done.push_back(pool.Submit(strands[static_cast<size_t>(s)], [&, s, i] {
          seen[static_cast<size_t>(s)].push_back(i);
          return OkStatus();
        }));
      }
      if (s == 0) pool.Close(*strands[0], "closed");
      for (auto& future : done) {
        (void)future.get();
        ++settled;
      }
    });
  }
  for (std::thread& thread : submitters) thread.join();
  EXPECT_EQ(settled.load(), kStrands * 200);
  for (int s = 1; s < kStrands; ++s) {
    const std::vector<int>& order = seen[static_cast<size_t>(s)];
    ASSERT_EQ(order.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  }
  EXPECT_LE(pool.threads(), static_cast<size_t>(kStrands));
}

// ---- Spin-then-wait (spin_us) ----

// A spinning thread counts as idle: ops submitted one after the other, each while the thread
// that ran the last one spins, run in order on that one thread.
TEST(CommPoolSpinTest, OpsOneAfterTheOtherRunInOrderOnOneSpinningThread) {
  for (int64_t spin_us : {int64_t{0}, int64_t{50}, kMaxCommSpinUs}) {
    CommPool pool(spin_us);
    auto ops = pool.NewStrand();
    auto receives = pool.NewStrand();
    std::vector<int> order;
    for (int i = 0; i < 300; ++i) {
      auto& strand = i % 3 == 0 ? receives : ops;
      Status status = pool.Submit(strand, [&order, i] {
                            order.push_back(i);
                            return i % 5 == 0 ? AbortedError(std::to_string(i)) : OkStatus();
                          }).get();
      EXPECT_EQ(status, i % 5 == 0 ? AbortedError(std::to_string(i)) : OkStatus());
    }
    ASSERT_EQ(order.size(), 300u) << "spin_us " << spin_us;
    for (int i = 0; i < 300; ++i) ASSERT_EQ(order[static_cast<size_t>(i)], i);
    EXPECT_EQ(pool.threads(), 1u) << "spin_us " << spin_us;
  }
}

// A pool whose threads spin for a second stops at once: stopping wakes the poll.
TEST(CommPoolSpinTest, DestructionWhileSpinningReturnsPromptly) {
  for (int round = 0; round < 5; ++round) {
    auto pool = std::make_unique<CommPool>(kMaxCommSpinUs);
    auto a = pool->NewStrand();
    auto b = pool->NewStrand();
    std::atomic<bool> b_started{false};
    auto first = pool->Submit(a, [&] {  // two threads, both spinning once the work ends
      while (!b_started.load()) std::this_thread::sleep_for(milliseconds(1));
      return OkStatus();
    });
    auto second = pool->Submit(b, [&] {
      b_started = true;
      return OkStatus();
    });
    ASSERT_TRUE(first.get().ok());
    ASSERT_TRUE(second.get().ok());
    const auto start = std::chrono::steady_clock::now();
    pool.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(300)) << "round " << round;
  }
}

// Many submitters while the threads spin, poll and sleep (under ThreadSanitizer, a race
// between Submit and the poll shows); every strand's work runs in its order.
TEST(CommPoolSpinTest, ConcurrentSubmitsWhileThreadsSpin) {
  CommPool pool(/*spin_us=*/200);
  constexpr int kStrands = 4;
  std::vector<std::shared_ptr<CommPool::Strand>> strands;
  std::vector<std::vector<int>> seen(kStrands);
  for (int i = 0; i < kStrands; ++i) strands.push_back(pool.NewStrand());
  std::vector<std::thread> submitters;
  for (int s = 0; s < kStrands; ++s) {
    submitters.emplace_back([&, s] {
      for (int i = 0; i < 300; ++i) {
        auto done = pool.Submit(strands[static_cast<size_t>(s)], [&, s, i] {
          seen[static_cast<size_t>(s)].push_back(i);
          return OkStatus();
        });
        if (i % 2 == 0) {  // half waited for, half left queued
          EXPECT_TRUE(done.get().ok());
        }
      }
    });
  }
  for (std::thread& thread : submitters) thread.join();
  for (int s = 0; s < kStrands; ++s) {
    // What was left queued has run once an op submitted after it has.
    ASSERT_TRUE(pool.Submit(strands[static_cast<size_t>(s)], [] { return OkStatus(); })
                    .get()
                    .ok());
    const std::vector<int>& order = seen[static_cast<size_t>(s)];
    ASSERT_EQ(order.size(), 300u);
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(i));
  }
}

}  // namespace
}  // namespace tessera::worker
