#include "server/ps/work_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::server {
namespace {

TEST(WorkQueueTest, RunsEveryPostedClosure) {
  std::atomic<int> ran{0};
  std::promise<void> all;
  {
    WorkQueue queue(2);
    for (int i = 0; i < 100; ++i) {
      queue.Post([&] {
        if (++ran == 100) all.set_value();
      });
    }
    all.get_future().wait();
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(WorkQueueTest, RunsAsManyAtOnceAsItHasThreads) {
  std::promise<void> first_started, second_started, release;
  std::shared_future<void> go = release.get_future().share();
  WorkQueue queue(2);  // destroyed first: its threads end before what they use
  queue.Post([&first_started, go] { first_started.set_value(); go.wait(); });
  queue.Post([&second_started, go] { second_started.set_value(); go.wait(); });
  // Both run although neither finished.
  EXPECT_EQ(first_started.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  EXPECT_EQ(second_started.get_future().wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  release.set_value();
}

// Urgent closures are taken before the others queued, in the order they were posted; a
// closure posted urgently while the other lane drains (from another thread) runs too.
TEST(WorkQueueTest, UrgentClosuresGoFirstInTheirOrder) {
  WorkQueue queue(1);
  std::promise<void> started, release;
  std::shared_future<void> go = release.get_future().share();
  queue.Post([&] { started.set_value(); go.wait(); });
  started.get_future().wait();
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&, name] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(name);
    };
  };
  queue.Post(record("plain 1"));
  queue.PostUrgent(record("urgent 1"));
  queue.Post(record("plain 2"));
  queue.PostUrgent(record("urgent 2"));
  release.set_value();
  std::promise<void> drained;
  std::thread poster([&] {
    for (int i = 0; i < 50; ++i) queue.PostUrgent(record("late"));
    queue.Post([&drained] { drained.set_value(); });
  });
  poster.join();
  ASSERT_EQ(drained.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), 54u);
  EXPECT_EQ(order[0], "urgent 1");
  EXPECT_EQ(order[1], "urgent 2");
  // The plain ones keep their order among themselves.
  const auto plain1 = std::find(order.begin(), order.end(), "plain 1");
  const auto plain2 = std::find(order.begin(), order.end(), "plain 2");
  EXPECT_LT(plain1, plain2);
}

TEST(WorkQueueTest, StopDropsWhatIsQueuedAndLaterPosts) {
  WorkQueue queue(1);
  std::promise<void> started, release;
  std::shared_future<void> go = release.get_future().share();
  queue.Post([&] { started.set_value(); go.wait(); });
  started.get_future().wait();
  auto owned = std::make_shared<int>(1);
  std::atomic<bool> ran{false};
  queue.Post([&ran, owned] { ran = true; });
  std::thread stopper([&] { queue.Stop(); });
  // Stop drops the queue at once, then waits for the running closure.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  release.set_value();
  stopper.join();
  queue.Post([&ran] { ran = true; });
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(owned.use_count(), 1);  // the queued closure was destroyed
  queue.Stop();                     // idempotent
}

}  // namespace
}  // namespace tessera::server
