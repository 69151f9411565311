#include "server/ps/request_ledger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera::server {
namespace {

TEST(RequestLedgerTest, ARepeatOfTheSameWorkersRequestIsNotNew) {
  RequestLedger ledger;
  EXPECT_TRUE(ledger.FirstTime(0, 5));
  EXPECT_FALSE(ledger.FirstTime(0, 5));
  EXPECT_TRUE(ledger.FirstTime(1, 5));  // another worker's id 5
  EXPECT_TRUE(ledger.FirstTime(0, 3));  // out of order is fine
  EXPECT_FALSE(ledger.FirstTime(0, 3));
}

TEST(RequestLedgerTest, IdsOlderThanTheWindowCountAsNew) {
  RequestLedger ledger;
  for (uint64_t id = 1; id <= RequestLedger::kWindow + 10; ++id) {
    EXPECT_TRUE(ledger.FirstTime(0, id));
  }
  EXPECT_FALSE(ledger.FirstTime(0, RequestLedger::kWindow + 10));
  EXPECT_FALSE(ledger.FirstTime(0, 11));  // the oldest remembered
  EXPECT_TRUE(ledger.FirstTime(0, 1));    // forgotten: never drops a real request
}

TEST(RequestLedgerTest, ConcurrentCopiesAreTakenOnce) {
  RequestLedger ledger;
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (uint64_t id = 1; id <= 200; ++id) {
        if (ledger.FirstTime(static_cast<int>(id % 3), id)) ++taken;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 200);
}

}  // namespace
}  // namespace tessera::server
