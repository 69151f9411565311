#include "common/transport/faulty/faulty_transport.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/transport/envelope_queue.h"
#include "common/transport/inproc/inproc_transport.h"

namespace tessera {
namespace {

// A sender (wrapped in faults) and a receiver on one in-process network.
struct Pair {
  explicit Pair(FaultOptions faults) {
    auto network = std::make_shared<InProcessNetwork>();
    auto inner = InProcessTransport::Create(network, "sender");
    auto receiver_transport = InProcessTransport::Create(network, "receiver");
    EXPECT_TRUE(inner.ok() && receiver_transport.ok());
    sender = std::make_unique<FaultyTransport>(std::move(inner).value(), faults);
    receiver = std::move(receiver_transport).value();
    EXPECT_TRUE(sender->Start([](Envelope) {}).ok());
    EXPECT_TRUE(receiver->Start(queue.Handler()).ok());
  }
  Status Send(uint64_t sequence) {
    return sender->Send(receiver->address(), OutgoingMessage{0, -1, Heartbeat{sequence}});
  }
  // The sequence numbers that arrive within `wait_ms` of each other.
  std::vector<uint64_t> Received(int64_t wait_ms = 500) {
    std::vector<uint64_t> got;
    while (true) {
      StatusOr<Envelope> next = queue.Pop(Deadline::AfterMillis(wait_ms), "a message");
      if (!next.ok()) return got;
      got.push_back(next->As<Heartbeat>()->sequence);
    }
  }

  EnvelopeQueue queue;
  std::unique_ptr<FaultyTransport> sender;
  std::unique_ptr<InProcessTransport> receiver;
};

// Delays never reorder what goes to one destination, even when a message sent later is due
// before the timer has forwarded an earlier one.
TEST(FaultyTransportTest, DelaysKeepEachDestinationsOrder) {
  FaultOptions faults;
  faults.seed = 11;
  faults.delay_probability = 0.3;
  faults.delay_ms = 1;
  Pair pair(faults);
  constexpr uint64_t kCount = 5000;
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(pair.Send(i).ok());
  std::vector<uint64_t> got = pair.Received();
  ASSERT_EQ(got.size(), kCount);
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], i) << "message " << i;
  EXPECT_GT(pair.sender->delayed(), kCount / 5);
}

TEST(FaultyTransportTest, LossesAndDuplicatesAreCountedAndDeliveredAsDrawn) {
  FaultOptions faults;
  faults.seed = 5;
  faults.drop_probability = 0.2;
  faults.duplicate_probability = 0.2;
  Pair pair(faults);
  constexpr uint64_t kCount = 1000;
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(pair.Send(i).ok());
  std::vector<uint64_t> got = pair.Received();
  EXPECT_EQ(got.size(), kCount - pair.sender->dropped() + pair.sender->duplicated());
  EXPECT_GT(pair.sender->dropped(), 0u);
  EXPECT_GT(pair.sender->duplicated(), 0u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LE(got[i - 1], got[i]);  // in order
}

TEST(FaultyTransportTest, ADisconnectedDestinationGetsNothingUntilReconnected) {
  Pair pair(FaultOptions{});
  pair.sender->Disconnect(pair.receiver->address());
  ASSERT_TRUE(pair.Send(1).ok());
  EXPECT_TRUE(pair.Received(100).empty());
  pair.sender->Reconnect(pair.receiver->address());
  ASSERT_TRUE(pair.Send(2).ok());
  EXPECT_EQ(pair.Received(), std::vector<uint64_t>{2});
  EXPECT_EQ(pair.sender->dropped(), 1u);
}

// Only the chosen sends are faulted; the others pass untouched, still in order behind a
// delayed message to the same destination.
TEST(FaultyTransportTest, SendsOfOtherTypesPassUntouchedAndInOrder) {
  FaultOptions faults;
  faults.seed = 3;
  faults.drop_probability = 1;  // every chosen send is lost
  faults.send_types = {MessageType::kPsPushPullRequest};
  Pair pair(faults);
  constexpr uint64_t kCount = 200;
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(pair.Send(i).ok());  // heartbeats
  ASSERT_TRUE(pair.sender->Send(pair.receiver->address(),
                                OutgoingMessage{0, 1, PsPushPullRequest{}}).ok());
  std::vector<uint64_t> got = pair.Received(200);
  ASSERT_EQ(got.size(), kCount);
  for (uint64_t i = 0; i < kCount; ++i) EXPECT_EQ(got[i], i);
  EXPECT_EQ(pair.sender->dropped(), 1u);

  faults.drop_probability = 0;
  faults.delay_probability = 1;
  faults.delay_ms = 50;
  Pair delayed(faults);
  ASSERT_TRUE(delayed.sender->Send(delayed.receiver->address(),
                                   OutgoingMessage{0, 1, PsPushPullRequest{}}).ok());
  ASSERT_TRUE(delayed.Send(7).ok());  // not delayed itself, but behind the push
  StatusOr<Envelope> first = delayed.queue.Pop(Deadline::AfterMillis(2000), "the push");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->type(), MessageType::kPsPushPullRequest);
  EXPECT_EQ(delayed.Received(), std::vector<uint64_t>{7});
}

TEST(FaultOptionsTest, ParsesEveryPartAndNamesAWrongOne) {
  StatusOr<FaultOptions> options =
      FaultOptions::Parse("seed=9,drop=0.05,duplicate=0.01,delay=0.2,delay_ms=30,sends=ps");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->seed, 9u);
  EXPECT_DOUBLE_EQ(options->drop_probability, 0.05);
  EXPECT_DOUBLE_EQ(options->duplicate_probability, 0.01);
  EXPECT_DOUBLE_EQ(options->delay_probability, 0.2);
  EXPECT_EQ(options->delay_ms, 30);
  EXPECT_EQ(options->send_types.count(MessageType::kPsPushPullRequest), 1u);
  EXPECT_EQ(options->send_types.count(MessageType::kHeartbeat), 0u);
  EXPECT_TRUE(FaultOptions::Parse("").ok());
  for (const char* wrong : {"drop=2", "drop=x", "drop=", "seed=-1", "delay_ms=99999999",
                            "sends=all", "lose=0.1", "drop"}) {
    StatusOr<FaultOptions> bad = FaultOptions::Parse(std::string("seed=1,") + wrong);
    ASSERT_FALSE(bad.ok()) << wrong;
    EXPECT_NE(bad.status().message().find(std::string("\"") + wrong + "\""), std::string::npos)
        << bad.status();
  }
}

}  // namespace
}  // namespace tessera
