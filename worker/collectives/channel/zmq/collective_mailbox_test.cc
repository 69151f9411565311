#include "worker/collectives/channel/zmq/collective_mailbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;

ReceivedChunk Chunk(uint64_t tag, uint32_t step, int32_t sender = 1) {
  ReceivedChunk chunk;
  chunk.sender_role = proto::Role::Worker;
  chunk.sender_rank = sender;
  chunk.tag = tag;
  chunk.step = step;
  return chunk;
}

TEST(CollectiveMailboxTest, PopsByTagAndStepWhateverTheArrivalOrder) {
  CollectiveMailbox mailbox;
  mailbox.Deliver(Chunk(2, 1));
  mailbox.Deliver(Chunk(1, 3));
  mailbox.Deliver(Chunk(1, 0));
  auto first = mailbox.Pop(1, 0, Deadline::AfterMillis(1000));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->tag, 1u);
  EXPECT_EQ(first->step, 0u);
  EXPECT_EQ(mailbox.Pop(2, 1, Deadline::AfterMillis(1000))->tag, 2u);
  EXPECT_EQ(mailbox.Pop(1, 3, Deadline::AfterMillis(1000))->step, 3u);
  EXPECT_EQ(mailbox.queued(), 0u);
}

TEST(CollectiveMailboxTest, WaitsForAChunkThatArrivesLater) {
  CollectiveMailbox mailbox;
  std::thread sender([&mailbox] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    mailbox.Deliver(Chunk(7, 2));
  });
  auto chunk = mailbox.Pop(7, 2, Deadline::AfterMillis(10000));
  sender.join();
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->sender_rank, 1);
}

TEST(CollectiveMailboxTest, PopEndsAtTheDeadline) {
  CollectiveMailbox mailbox;
  mailbox.Deliver(Chunk(1, 1));  // another step: not what we wait for
  auto started = SteadyClock::now();
  auto chunk = mailbox.Pop(1, 0, Deadline::AfterMillis(100));
  auto waited = SteadyClock::now() - started;
  EXPECT_EQ(chunk.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::milliseconds(5000));
}

TEST(CollectiveMailboxTest, FailWakesEveryWaiterWithTheRootCause) {
  CollectiveMailbox mailbox;
  std::vector<std::thread> waiters;
  std::vector<Status> results(3);
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&mailbox, &results, i] {
      results[i] = mailbox.Pop(1, static_cast<uint32_t>(i), Deadline::AfterMillis(60000)).status();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  mailbox.Fail(AbortedError("worker 0 (tcp://127.0.0.1:5000) failed: no heartbeat"));
  mailbox.Fail(AbortedError("a later failure caused by the first"));
  for (auto& waiter : waiters) waiter.join();
  for (const Status& result : results) {
    EXPECT_EQ(result.code(), StatusCode::kAborted);
    EXPECT_THAT(result.message(), HasSubstr("worker 0"));
  }
  // Later pops fail at once with the same root cause; later deliveries are ignored.
  mailbox.Deliver(Chunk(1, 5));
  EXPECT_THAT(mailbox.Pop(1, 5, Deadline::AfterMillis(60000)).status().message(),
              HasSubstr("worker 0"));
}

TEST(CollectiveMailboxTest, OverflowFailsNamingTheSender) {
  CollectiveMailbox mailbox(/*max_queued_chunks=*/2);
  mailbox.Deliver(Chunk(1, 0));
  mailbox.Deliver(Chunk(1, 1));
  mailbox.Deliver(Chunk(9, 0, /*sender=*/4));
  Status failure = mailbox.failure();
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_THAT(failure.message(), HasSubstr("worker 4 sent tag=9"));
  EXPECT_EQ(mailbox.Pop(1, 0, Deadline::AfterMillis(1000)).status(), failure);
}

TEST(CollectiveMailboxTest, DiscardDropsOneTagOnly) {
  CollectiveMailbox mailbox;
  mailbox.Deliver(Chunk(3, 0));
  mailbox.Deliver(Chunk(3, 4));
  mailbox.Deliver(Chunk(4, 0));
  mailbox.Discard(3);
  EXPECT_EQ(mailbox.queued(), 1u);
  EXPECT_EQ(mailbox.Pop(3, 0, Deadline::AfterMillis(10)).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(mailbox.Pop(4, 0, Deadline::AfterMillis(1000)).ok());
}

}  // namespace
}  // namespace tessera::worker
