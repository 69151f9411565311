#include "worker/collectives/channel/zmq/ring_zmq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/failure_bus.h"
#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/inproc/inproc_transport.h"
#include "common/transport/rpc_endpoint.h"

namespace tessera::worker {
namespace {

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  return out;
}

std::vector<uint8_t> Bytes(const Payload& payload) {
  return std::vector<uint8_t>(payload.data(), payload.data() + payload.size());
}

RingFrame Frame(uint64_t tag, uint32_t slot, std::vector<uint8_t> bytes = {}) {
  RingFrame frame;
  frame.kind = bytes.empty() ? RingFrameKind::kHandshake : RingFrameKind::kData;
  frame.sender_rank = 7;  // SendTo sets the channel's own
  frame.tag = tag;
  frame.slot = slot;
  frame.op = CollectiveOp::kAllGather;
  frame.dtype = DataType::kUInt8;
  frame.block = 2;
  frame.element_offset = 5;
  frame.element_count = bytes.size();
  frame.buffer_elements = 99;
  if (!bytes.empty()) frame.data = Payload::FromVector(std::move(bytes));
  return frame;
}

// W workers on in-process transports (optionally fault-injecting), each with its endpoint,
// FailureBus, mailbox and RingZmq, wired as tessera-worker wires them.
class Ring {
 public:
  explicit Ring(int world, std::vector<std::optional<FaultOptions>> faults = {}) {
    auto network = std::make_shared<InProcessNetwork>();
    for (int rank = 0; rank < world; ++rank) {
      auto created = InProcessTransport::Create(network, "worker" + std::to_string(rank));
      EXPECT_TRUE(created.ok()) << created.status();
      std::unique_ptr<Transport> transport = std::move(created).value();
      if (static_cast<size_t>(rank) < faults.size() && faults[rank].has_value()) {
        transport = std::make_unique<FaultyTransport>(std::move(transport), *faults[rank]);
      }
      auto endpoint = RpcEndpoint::Start(std::move(transport), Role::kWorker, rank, nullptr);
      EXPECT_TRUE(endpoint.ok()) << endpoint.status();
      failures.push_back(std::make_shared<FailureBus>());
      mailboxes.push_back(std::make_shared<CollectiveMailbox>(failures.back()));
      (*endpoint)->SetHandler(MessageType::kRingFrame,
                              CollectiveMailbox::Handler(mailboxes.back()));
      addresses.push_back((*endpoint)->address());
      endpoints.push_back(std::move(endpoint).value());
    }
    for (int rank = 0; rank < world; ++rank) channels.push_back(NewChannel(rank));
  }
  ~Ring() {
    channels.clear();
    for (auto& endpoint : endpoints) endpoint->Shutdown();
  }

  RingZmqOptions Options(int rank) {
    return RingZmqOptions{rank, static_cast<int>(endpoints.size()), addresses,
                          &endpoints[rank]->transport(), mailboxes[rank]};
  }
  std::unique_ptr<RingZmq> NewChannel(int rank) {
    auto channel = RingZmq::Create(Options(rank));
    EXPECT_TRUE(channel.ok()) << channel.status();
    return std::move(channel).value();
  }

  std::vector<std::unique_ptr<RpcEndpoint>> endpoints;
  std::vector<std::shared_ptr<FailureBus>> failures;
  std::vector<std::shared_ptr<CollectiveMailbox>> mailboxes;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<RingZmq>> channels;
};

TEST(RingZmqTest, FramesGoToTheSuccessorWithEveryField) {
  Ring ring(3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ring.channels[rank]->rank(), rank);
    ASSERT_TRUE(ring.channels[rank]->Send(Frame(4, 1, Pattern(100, rank))).ok());
    EXPECT_TRUE(ring.channels[rank]->Flush(Deadline::AfterMillis(0)).ok());  // nothing to wait for
  }
  for (int rank = 0; rank < 3; ++rank) {
    const int prev = (rank + 2) % 3;
    auto got = ring.channels[rank]->Recv(4, 1, Deadline::AfterMillis(10000));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->kind, RingFrameKind::kData);
    EXPECT_EQ(got->sender_rank, prev);
    EXPECT_EQ(got->op, CollectiveOp::kAllGather);
    EXPECT_EQ(got->dtype, DataType::kUInt8);
    EXPECT_EQ(got->block, 2u);
    EXPECT_EQ(got->element_offset, 5u);
    EXPECT_EQ(got->element_count, 100u);
    EXPECT_EQ(got->buffer_elements, 99u);
    EXPECT_EQ(Bytes(got->data), Pattern(100, static_cast<uint8_t>(prev)));
    EXPECT_EQ(ring.channels[rank]->kept(), 0u);
  }
}

// The transport carries an abort frame's notice as it is.
TEST(RingZmqTest, AnAbortNoticeArrivesWhole) {
  Ring ring(2);
  RingFrame abort = Frame(4, 0);
  abort.kind = RingFrameKind::kAbort;
  abort.notice = AbortNotice{1, StatusCode::kInvalidArgument, "rank=1: bad root"};
  ASSERT_TRUE(ring.channels[0]->Send(abort).ok());
  auto got = ring.channels[1]->Recv(4, 0, Deadline::AfterMillis(10000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, RingFrameKind::kAbort);
  EXPECT_EQ(got->notice.origin, 1);
  EXPECT_EQ(got->notice.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(got->notice.message, "rank=1: bad root");
}

// Ring channel setup tells its predecessor too; nobody outside the world.
TEST(RingZmqTest, SendToReachesAnyRankOfTheWorld) {
  Ring ring(3);
  ASSERT_TRUE(ring.channels[0]->SendTo(2, Frame(5, 0)).ok());
  auto got = ring.channels[2]->Recv(5, 0, Deadline::AfterMillis(10000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->sender_rank, 0);
  Status outside = ring.channels[0]->SendTo(3, Frame(5, 1));
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(outside.message(), "ring zmq: no worker 3 in a world of 3");
  EXPECT_EQ(ring.channels[0]->SendTo(-1, Frame(5, 1)).code(), StatusCode::kInvalidArgument);
}

// A payload that borrows the caller's memory (no owner) is copied at Send, so the caller may
// overwrite it at once, long before the transport has put it on the wire.
TEST(RingZmqTest, ABorrowedPayloadIsTheCallersAgainWhenSendReturns) {
  FaultOptions slow;
  slow.delay_probability = 1;
  slow.delay_ms = 100;
  Ring ring(2, {slow});
  std::vector<uint8_t> borrowed = Pattern(5000, 3);
  RingFrame frame = Frame(6, 0);
  frame.kind = RingFrameKind::kData;
  frame.element_count = borrowed.size();
  frame.data = Payload::Borrow(borrowed.data(), borrowed.size(), nullptr);
  ASSERT_TRUE(ring.channels[0]->Send(std::move(frame)).ok());
  std::fill(borrowed.begin(), borrowed.end(), 0xee);
  ring.channels[0]->CopyUnsentPayloads();  // nothing left to copy
  auto got = ring.channels[1]->Recv(6, 0, Deadline::AfterMillis(10000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Bytes(got->data), Pattern(5000, 3));
}

TEST(RingZmqTest, RecvTimesOutBareAtTheDeadline) {
  Ring ring(2);
  const auto started = SteadyClock::now();
  auto got = ring.channels[1]->Recv(1, 0, Deadline::AfterMillis(100));
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status().message(), "");  // the caller names what it waited for
  EXPECT_GE(SteadyClock::now() - started, std::chrono::milliseconds(100));
  EXPECT_TRUE(ring.channels[1]->failure().ok());
}

TEST(RingZmqTest, AFailureOnTheBusWakesAWaiterWithTheRootCause) {
  Ring ring(2);
  std::thread coordinator([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ring.failures[1]->Fail(AbortedError("worker 0 failed: no heartbeat"));
  });
  const auto started = SteadyClock::now();
  auto got = ring.channels[1]->Recv(1, 0, Deadline::AfterMillis(60000));
  coordinator.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  EXPECT_EQ(got.status(), AbortedError("worker 0 failed: no heartbeat"));
  EXPECT_EQ(ring.channels[1]->failure(), got.status());
}

TEST(RingZmqTest, DiscardDropsWhatArrivedUnderATag) {
  Ring ring(2);
  ASSERT_TRUE(ring.channels[0]->Send(Frame(8, 0)).ok());
  ASSERT_TRUE(ring.channels[0]->Send(Frame(8, 1)).ok());
  ASSERT_TRUE(ring.channels[0]->Send(Frame(9, 0)).ok());
  ASSERT_TRUE(ring.channels[1]->Recv(9, 0, Deadline::AfterMillis(10000)).ok());
  EXPECT_EQ(ring.channels[1]->kept(), 2u);  // delivered in order: tag 8's are in
  ring.channels[1]->Discard(8);
  EXPECT_EQ(ring.channels[1]->kept(), 0u);
}

// Every frame arrives twice; the mailbox takes each once, and a new channel of the same rank
// (a restarted worker) is not taken for the old one repeating itself.
TEST(RingZmqTest, FramesDeliveredTwiceAreTakenOnce) {
  FaultOptions twice;
  twice.duplicate_probability = 1;
  Ring ring(2, {twice});
  for (uint32_t slot = 0; slot < 10; ++slot) {
    ASSERT_TRUE(ring.channels[0]->Send(Frame(3, 0, Pattern(10, slot))).ok());
  }
  for (uint32_t slot = 0; slot < 10; ++slot) {
    auto got = ring.channels[1]->Recv(3, 0, Deadline::AfterMillis(10000));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Bytes(got->data), Pattern(10, slot)) << "call " << slot;
  }
  ring.channels[0] = ring.NewChannel(0);
  ASSERT_TRUE(ring.channels[0]->Send(Frame(3, 0, Pattern(10, 99))).ok());
  auto got = ring.channels[1]->Recv(3, 0, Deadline::AfterMillis(10000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Bytes(got->data), Pattern(10, 99));
  // The repeats of all 11 arrive right behind their originals.
  const Deadline deadline = Deadline::AfterMillis(10000);
  while (ring.mailboxes[1]->repeats() < 11 && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ring.mailboxes[1]->repeats(), 11u);
  EXPECT_EQ(ring.channels[1]->kept(), 0u);
}

TEST(RingZmqTest, CreateRejectsOptionsThatCannotWork) {
  Ring ring(2);
  auto error = [&](const std::function<void(RingZmqOptions&)>& change) {
    RingZmqOptions options = ring.Options(0);
    change(options);
    auto created = RingZmq::Create(options);
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
    return created.status().message();
  };
  EXPECT_EQ(error([](auto& o) { o.rank = 2; }), "ring zmq: rank 2 is not in a world of 2");
  EXPECT_EQ(error([](auto& o) { o.world_size = 0; }), "ring zmq: rank 0 is not in a world of 0");
  EXPECT_EQ(error([](auto& o) { o.peer_addresses.pop_back(); }),
            "ring zmq: 1 peer addresses for a world of 2");
  EXPECT_EQ(error([](auto& o) { o.transport = nullptr; }),
            "ring zmq: needs a transport and a mailbox");
  EXPECT_EQ(error([](auto& o) { o.mailbox = nullptr; }),
            "ring zmq: needs a transport and a mailbox");
}

}  // namespace
}  // namespace tessera::worker
