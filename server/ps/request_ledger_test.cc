#include "server/ps/request_ledger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera::server {
namespace {

TEST(RequestLedgerTest, ARepeatOfTheSameWorkersRequestIsNotNew) {
  RequestLedger ledger;
  EXPECT_EQ(ledger.Take(0, 5), RequestLedger::kNew);
  EXPECT_EQ(ledger.Take(0, 5), RequestLedger::kTaken);
  EXPECT_EQ(ledger.Take(1, 5), RequestLedger::kNew);  // another worker's id 5
  EXPECT_EQ(ledger.Take(0, 3), RequestLedger::kNew);  // out of order is fine
  EXPECT_EQ(ledger.Take(0, 3), RequestLedger::kTaken);
}

TEST(RequestLedgerTest, ACopyOfAnAnsweredRequestIsAnsweredAgainWithTheKeptReply) {
  RequestLedger ledger;
  EXPECT_EQ(ledger.Take(0, 7), RequestLedger::kNew);
  ledger.Answered(0, 7, MessageBody(Ack{}));
  EXPECT_EQ(ledger.Take(0, 7), RequestLedger::kAnswered);
  std::optional<MessageBody> reply = ledger.ReplyOf(0, 7);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(TypeOf(*reply), MessageType::kAck);

  EXPECT_EQ(ledger.Take(0, 8), RequestLedger::kNew);
  ledger.Answered(0, 8);  // answered anew each time
  EXPECT_EQ(ledger.Take(0, 8), RequestLedger::kAnswered);
  EXPECT_FALSE(ledger.ReplyOf(0, 8).has_value());
  ledger.Answered(1, 8);  // never taken: nothing recorded
  EXPECT_EQ(ledger.Take(1, 8), RequestLedger::kNew);
}

TEST(RequestLedgerTest, IdsOlderThanTheWindowCountAsNew) {
  RequestLedger ledger;
  for (uint64_t id = 1; id <= RequestLedger::kWindow + 10; ++id) {
    EXPECT_EQ(ledger.Take(0, id), RequestLedger::kNew);
  }
  EXPECT_EQ(ledger.Take(0, RequestLedger::kWindow + 10), RequestLedger::kTaken);
  EXPECT_EQ(ledger.Take(0, 11), RequestLedger::kTaken);  // the oldest remembered
  EXPECT_EQ(ledger.Take(0, 1), RequestLedger::kNew);     // forgotten: never drops a request
}

// Both sides of the lock at once: copies taken while their originals are answered.
TEST(RequestLedgerTest, ConcurrentCopiesAreTakenOnceWhileOthersAreAnswered) {
  RequestLedger ledger;
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (uint64_t id = 1; id <= 200; ++id) {
        const int rank = static_cast<int>(id % 3);
        if (ledger.Take(rank, id) == RequestLedger::kNew) {
          ++taken;
          ledger.Answered(rank, id, MessageBody(Ack{}));
        } else {
          (void)ledger.ReplyOf(rank, id);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 200);
  for (uint64_t id = 1; id <= 200; ++id) {
    EXPECT_EQ(ledger.Take(static_cast<int>(id % 3), id), RequestLedger::kAnswered);
  }
}

}  // namespace
}  // namespace tessera::server
