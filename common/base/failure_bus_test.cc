#include "common/base/failure_bus.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera {
namespace {

TEST(FailureBusTest, KeepsTheFirstFailureAndWakesSubscribersOnce) {
  auto bus = std::make_shared<FailureBus>();
  EXPECT_TRUE(bus->failure().ok());
  int woken = 0;
  auto subscription = bus->Subscribe([&] { ++woken; });
  bus->Fail(AbortedError("worker 1 failed"));
  bus->Fail(AbortedError("a consequence"));
  EXPECT_EQ(bus->failure(), AbortedError("worker 1 failed"));
  EXPECT_EQ(woken, 1);
}

TEST(FailureBusTest, ALateSubscriberIsWokenAtOnceAndAnEndedOneNever) {
  auto bus = std::make_shared<FailureBus>();
  int ended = 0;
  bus->Subscribe([&] { ++ended; }).reset();
  bus->Fail(UnavailableError("coordinator lost"));
  EXPECT_EQ(ended, 0);
  int late = 0;
  auto subscription = bus->Subscribe([&] { ++late; });
  EXPECT_EQ(late, 1);
}

// Subscriptions end while another thread fails the bus: once a handle is gone, its callback is
// not running and never runs again (ThreadSanitizer drives both locks at once).
TEST(FailureBusTest, UnsubscribingWhileFailingIsSafe) {
  for (int round = 0; round < 50; ++round) {
    auto bus = std::make_shared<FailureBus>();
    std::vector<std::unique_ptr<std::atomic<int>>> counters;
    std::vector<std::shared_ptr<void>> handles;
    for (int i = 0; i < 8; ++i) {
      counters.push_back(std::make_unique<std::atomic<int>>(0));
      std::atomic<int>* counter = counters.back().get();
      handles.push_back(bus->Subscribe([counter] { counter->fetch_add(1); }));
    }
    std::thread failer([&] { bus->Fail(AbortedError("stop")); });
    for (auto& handle : handles) handle.reset();
    failer.join();
    for (auto& counter : counters) EXPECT_LE(counter->load(), 1);
  }
}

}  // namespace
}  // namespace tessera
