#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/links/ring_links_testing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/failure_bus.h"
#include "common/metrics/metric_names.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "worker/collectives/channel/links/ring_link_handshake.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::KeyOf;
using testing::Listeners;
using testing::Pattern;

RingFrame Frame(int sender, uint64_t tag, uint32_t slot, std::vector<uint8_t> bytes = {}) {
  RingFrame frame;
  frame.kind = bytes.empty() ? RingFrameKind::kHandshake : RingFrameKind::kData;
  frame.sender_rank = sender;
  frame.tag = tag;
  frame.op = CollectiveOp::kAllReduce;
  frame.reduce_op = ReduceOp::kMax;
  frame.slot = slot;
  frame.block = 3;
  frame.dtype = DataType::kBFloat16;
  frame.element_offset = 17;
  frame.element_count = bytes.size() / 2;
  frame.buffer_elements = 1234;
  if (!bytes.empty()) frame.data = Payload::FromVector(std::move(bytes));
  return frame;
}

// Ranks 0 and 1 of a world of two over socket pairs.
struct Pair {
  Pair() {
    int zero_to_one[2], one_to_zero[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, zero_to_one), 0);
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, one_to_zero), 0);
    raw_to_one = zero_to_one[0];
    raw_to_zero = one_to_zero[0];
    links[0] = RingLinks::FromSockets(0, 2, zero_to_one[0], one_to_zero[1], "one", "one",
                                      nullptr, 1 << 24);
    links[1] = RingLinks::FromSockets(1, 2, one_to_zero[0], zero_to_one[1], "zero", "zero",
                                      nullptr, 1 << 24);
  }
  std::unique_ptr<RingLinks> links[2];
  int raw_to_one = -1;   // rank 0's socket to rank 1 (owned by links[0])
  int raw_to_zero = -1;  // rank 1's socket to rank 0 (owned by links[1])
};

TEST(RingLinksTest, FramesArriveByTagAndSlotInAnyOrder) {
  Pair pair;
  ASSERT_TRUE(pair.links[0]->Send(Frame(0, 5, 0, Pattern(8, 1))).ok());
  ASSERT_TRUE(pair.links[0]->Send(Frame(0, 6, 0, Pattern(4, 2))).ok());
  ASSERT_TRUE(pair.links[0]->Send(Frame(0, 5, 1)).ok());
  const Deadline deadline = Deadline::AfterMillis(5000);
  auto six = pair.links[1]->Recv(6, 0, deadline);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(std::vector<uint8_t>(six->data.data(), six->data.data() + six->data.size()),
            Pattern(4, 2));
  EXPECT_EQ(six->sender_rank, 0);
  EXPECT_EQ(pair.links[1]->kept(), 1u);  // (5, 0) was read on the way
  auto five_one = pair.links[1]->Recv(5, 1, deadline);
  ASSERT_TRUE(five_one.ok()) << five_one.status();
  EXPECT_TRUE(five_one->data.empty());
  auto five_zero = pair.links[1]->Recv(5, 0, deadline);
  ASSERT_TRUE(five_zero.ok()) << five_zero.status();
  EXPECT_EQ(five_zero->data.size(), 8u);
  EXPECT_EQ(pair.links[1]->kept(), 0u);
  EXPECT_TRUE(pair.links[0]->Flush(deadline).ok());
}

// Every field of every kind of frame travels; the sender rank is the link's own.
TEST(RingLinksTest, EveryKindOfFrameArrivesWithEveryField) {
  Pair pair;
  RingFrame data = Frame(/*sender=*/5, 9, 0, Pattern(6, 3));  // Send sets the sender
  RingFrame abort = Frame(0, 9, 1);
  abort.kind = RingFrameKind::kAbort;
  abort.notice = AbortNotice{1, StatusCode::kDeadlineExceeded, "worker 1 timed out"};
  ASSERT_TRUE(pair.links[0]->Send(data).ok());
  ASSERT_TRUE(pair.links[0]->Send(Frame(0, 9, 2)).ok());
  ASSERT_TRUE(pair.links[0]->Send(abort).ok());
  const Deadline deadline = Deadline::AfterMillis(5000);
  auto got = pair.links[1]->Recv(9, 0, deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, RingFrameKind::kData);
  EXPECT_EQ(got->sender_rank, 0);
  EXPECT_EQ(got->op, CollectiveOp::kAllReduce);
  EXPECT_EQ(got->reduce_op, ReduceOp::kMax);
  EXPECT_EQ(got->dtype, DataType::kBFloat16);
  EXPECT_EQ(got->block, 3u);
  EXPECT_EQ(got->element_offset, 17u);
  EXPECT_EQ(got->element_count, 3u);
  EXPECT_EQ(got->buffer_elements, 1234u);
  EXPECT_EQ(std::vector<uint8_t>(got->data.data(), got->data.data() + got->data.size()),
            Pattern(6, 3));
  auto handshake = pair.links[1]->Recv(9, 2, deadline);
  ASSERT_TRUE(handshake.ok()) << handshake.status();
  EXPECT_EQ(handshake->kind, RingFrameKind::kHandshake);
  auto notice = pair.links[1]->Recv(9, 1, deadline);
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(notice->kind, RingFrameKind::kAbort);
  EXPECT_EQ(notice->notice.origin, 1);
  EXPECT_EQ(notice->notice.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(notice->notice.message, "worker 1 timed out");
}

// A frame not read yet when its Recv starts lands straight in the caller's buffer, if its size
// is the one asked for; others arrive in buffers of their own.
TEST(RingLinksTest, APayloadLandsInTheCallersBuffer) {
  Pair pair;
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(pair.links[0]->Send(Frame(0, 1, 0, Pattern(300000, 5))).ok());
    EXPECT_TRUE(pair.links[0]->Send(Frame(0, 1, 1, Pattern(100, 6))).ok());
    EXPECT_TRUE(pair.links[0]->Flush(Deadline::AfterMillis(5000)).ok());
  });
  std::vector<uint8_t> place(300000), other(99);
  auto landed = pair.links[1]->Recv(1, 0, Deadline::AfterMillis(5000), place.data(), place.size());
  auto wrong_size = pair.links[1]->Recv(1, 1, Deadline::AfterMillis(5000), other.data(), 99);
  sender.join();
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->data.data(), place.data());
  EXPECT_EQ(place, Pattern(300000, 5));
  ASSERT_TRUE(wrong_size.ok()) << wrong_size.status();
  EXPECT_NE(wrong_size->data.data(), other.data());
  EXPECT_EQ(wrong_size->data.size(), 100u);
}

// Both ranks send far more than the socket buffers hold before either receives: waiting
// (Flush, Recv) reads as well as writes, so neither blocks the other.
TEST(RingLinksTest, LargeFramesBothWaysAtOnceDoNotDeadlock) {
  Pair pair;
  constexpr size_t kBytes = 8 << 20;
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      const Deadline deadline = Deadline::AfterMillis(20000);
      for (uint32_t slot = 0; slot < 4; ++slot) {
        Status sent = pair.links[rank]->Send(
            Frame(rank, 1, slot, Pattern(kBytes, static_cast<uint8_t>(rank + slot))));
        if (!sent.ok()) {
          results[rank] = sent;
          return;
        }
      }
      results[rank] = pair.links[rank]->Flush(deadline);
      for (uint32_t slot = 0; slot < 4 && results[rank].ok(); ++slot) {
        auto got = pair.links[rank]->Recv(1, slot, deadline);
        if (!got.ok()) {
          results[rank] = got.status();
        } else if (std::vector<uint8_t>(got->data.data(), got->data.data() + got->data.size()) !=
                   Pattern(kBytes, static_cast<uint8_t>(1 - rank + slot))) {
          results[rank] = InternalError("wrong bytes in slot " + std::to_string(slot));
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST(RingLinksTest, ASpinningWaiterReceivesAndTimesOut) {
  int a[2], b[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  auto zero = RingLinks::FromSockets(0, 2, a[0], b[1], "one", "one", nullptr, 1 << 20, 0);
  auto one = RingLinks::FromSockets(1, 2, b[0], a[1], "zero", "zero", nullptr, 1 << 20, 500);
  std::thread sender([&] {
    for (uint32_t slot = 0; slot < 100; ++slot) {
      EXPECT_TRUE(zero->Send(Frame(0, 1, slot, Pattern(4096, 1))).ok());
    }
    EXPECT_TRUE(zero->Flush(Deadline::AfterMillis(5000)).ok());  // what the socket did not take
  });
  for (uint32_t slot = 0; slot < 100; ++slot) {
    auto got = one->Recv(1, slot, Deadline::AfterMillis(5000));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->data.size(), 4096u);
  }
  sender.join();
  EXPECT_EQ(one->Recv(1, 100, Deadline::AfterMillis(100)).status().code(),
            StatusCode::kDeadlineExceeded);
}

// A frame that borrows its caller's memory (no owner) and is still queued when the call
// fails: once CopyUnsentPayloads ran, the caller may overwrite that memory and the frame
// still arrives whole and unchanged, including the part written before the copy.
TEST(RingLinksTest, CopyUnsentPayloadsLetsTheCallerReuseBorrowedMemory) {
  Pair pair;
  constexpr size_t kBytes = 8 << 20;  // far more than a socket pair buffers
  const std::vector<uint8_t> expected = Pattern(kBytes, 9);
  std::vector<uint8_t> borrowed = expected;
  RingFrame frame = Frame(0, 5, 0);
  frame.kind = RingFrameKind::kData;
  frame.data = Payload::Borrow(borrowed.data(), borrowed.size(), nullptr);
  frame.element_count = kBytes / 2;
  ASSERT_TRUE(pair.links[0]->Send(std::move(frame)).ok());
  // Nobody reads yet: most of it is still queued.
  EXPECT_EQ(pair.links[0]->Flush(Deadline::AfterMillis(20)).code(),
            StatusCode::kDeadlineExceeded);
  pair.links[0]->CopyUnsentPayloads();
  std::fill(borrowed.begin(), borrowed.end(), 0xee);
  borrowed.clear();
  borrowed.shrink_to_fit();
  Status flushed;
  std::thread sender([&] { flushed = pair.links[0]->Flush(Deadline::AfterMillis(10000)); });
  auto got = pair.links[1]->Recv(5, 0, Deadline::AfterMillis(10000));
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(flushed.ok()) << flushed;
  ASSERT_EQ(got->data.size(), kBytes);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got->data.data()));
}

// Odd sizes, sent in pieces with pauses, land whole: the reader resumes mid-header and
// mid-payload, spinning or sleeping.
TEST(RingLinksTest, FramesWrittenInOddPiecesArriveWhole) {
  for (int64_t spin_us : {int64_t{0}, int64_t{200}}) {
    int a[2], b[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    auto one = RingLinks::FromSockets(1, 2, b[0], a[1], "zero", "zero", nullptr, 1 << 20,
                                      spin_us);
    const size_t sizes[] = {1, 3, 63, 64, 65, 4097, 100003};
    std::thread writer([&] {
      uint32_t slot = 0;
      for (size_t size : sizes) {
        std::vector<uint8_t> bytes(kFrameHeaderBytes + size);
        EncodeFrameHeader(Frame(0, 2, slot++, Pattern(size, static_cast<uint8_t>(size))), size,
                          bytes.data());
        const std::vector<uint8_t> payload = Pattern(size, static_cast<uint8_t>(size));
        std::copy(payload.begin(), payload.end(), bytes.begin() + kFrameHeaderBytes);
        // Pieces of 7, 61 and 1000 bytes in turn, with a pause now and then.
        const size_t pieces[] = {7, 61, 1000};
        size_t at = 0;
        for (int i = 0; at < bytes.size(); ++i) {
          const size_t n = std::min(pieces[i % 3], bytes.size() - at);
          ASSERT_EQ(write(a[0], bytes.data() + at, n), static_cast<ssize_t>(n));
          at += n;
          if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
      }
    });
    uint32_t slot = 0;
    for (size_t size : sizes) {
      auto got = one->Recv(2, slot++, Deadline::AfterMillis(10000));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->data.size(), size);
      const std::vector<uint8_t> expected = Pattern(size, static_cast<uint8_t>(size));
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got->data.data()))
          << "size " << size << ", spin " << spin_us;
    }
    writer.join();
    close(a[0]);
    close(b[1]);
  }
}

TEST(RingLinksTest, RecvTimesOutBareAtTheDeadline) {
  Pair pair;
  const auto started = SteadyClock::now();
  auto got = pair.links[1]->Recv(1, 0, Deadline::AfterMillis(200));
  const auto waited = SteadyClock::now() - started;
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status().message(), "");  // the caller names what it waited for
  EXPECT_GE(waited, std::chrono::milliseconds(190));
  EXPECT_LT(waited, std::chrono::milliseconds(2000));
  EXPECT_TRUE(pair.links[1]->failure().ok());
}

TEST(RingLinksTest, FlushTimesOutNamingAPeerThatDoesNotRead) {
  Pair pair;
  ASSERT_TRUE(pair.links[0]->Send(Frame(0, 1, 0, Pattern(32 << 20, 0))).ok());
  Status flushed = pair.links[0]->Flush(Deadline::AfterMillis(200));
  EXPECT_EQ(flushed.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(flushed.message(), StartsWith("ring link to worker 1 (one): "));
  EXPECT_THAT(flushed.message(), HasSubstr("bytes still unsent at the deadline"));
}

// A peer that dies in the middle of a frame: the waiting rank fails at once, naming it, and
// stays failed.
TEST(RingLinksTest, APeerThatClosesMidFrameFailsTheLinkNamingIt) {
  Pair pair;
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(Frame(0, 1, 0, Pattern(100, 0)), 100, header);
  ASSERT_EQ(write(pair.raw_to_one, header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  std::thread dies([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    shutdown(pair.raw_to_one, SHUT_RDWR);
  });
  const auto started = SteadyClock::now();
  auto got = pair.links[1]->Recv(1, 0, Deadline::AfterMillis(10000));
  dies.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(got.status().message(),
            "ring link from worker 0 (zero): closed by the peer in the middle of a frame");
  EXPECT_EQ(pair.links[1]->failure(), got.status());
  EXPECT_EQ(pair.links[1]->Recv(2, 0, Deadline::AfterMillis(10000)).status(), got.status());
  // The other direction still works: a failed rank can still tell its successor.
  EXPECT_TRUE(pair.links[1]->Send(Frame(1, 1, 0)).ok());
  EXPECT_TRUE(pair.links[0]->Recv(1, 0, Deadline::AfterMillis(5000)).ok());
}

TEST(RingLinksTest, AFrameFromAnotherSenderFailsTheLink) {
  Pair pair;
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(Frame(7, 1, 0), 0, header);
  ASSERT_EQ(write(pair.raw_to_one, header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
  auto got = pair.links[1]->Recv(1, 0, Deadline::AfterMillis(5000));
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(),
            "ring link from worker 0 (zero): a frame names sender rank 7");
}

// Bytes that are no ring frame (another program, a bug) fail the link for good, naming the
// peer: a byte stream cannot be resynchronised.
TEST(RingLinksTest, BytesThatAreNoFrameFailTheLinkNamingThePeer) {
  Pair pair;
  char request[kFrameHeaderBytes];
  std::memset(request, '.', sizeof(request));
  std::memcpy(request, "GET / HTTP/1.1\r\n", 16);
  ASSERT_EQ(write(pair.raw_to_one, request, sizeof(request)),
            static_cast<ssize_t>(sizeof(request)));
  auto got = pair.links[1]->Recv(1, 0, Deadline::AfterMillis(5000));
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(),
            "ring link from worker 0 (zero): a frame header starts with 0x20544547, not the ring "
            "frame magic (is another program connected?)");
  EXPECT_EQ(pair.links[1]->failure(), got.status());

  Pair short_notice;
  RingFrame abort = Frame(0, 1, 0);
  abort.kind = RingFrameKind::kAbort;
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(abort, 3, header);
  ASSERT_EQ(write(short_notice.raw_to_one, header, sizeof(header)),
            static_cast<ssize_t>(sizeof(header)));
  ASSERT_EQ(write(short_notice.raw_to_one, "abc", 3), 3);
  got = short_notice.links[1]->Recv(1, 0, Deadline::AfterMillis(5000));
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(),
            "ring link from worker 0 (zero): an abort frame's notice has 3 bytes, fewer than its "
            "fields need");
}

TEST(RingLinksTest, AFailureOnTheBusWakesAWaiterWithTheRootCause) {
  int a[2], b[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  auto failures = std::make_shared<FailureBus>();
  auto links = RingLinks::FromSockets(1, 2, a[0], b[1], "x", "y", failures);
  std::thread coordinator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    failures->Fail(AbortedError("worker 0 failed: no heartbeat"));
  });
  const auto started = SteadyClock::now();
  auto got = links->Recv(1, 0, Deadline::AfterMillis(10000));
  coordinator.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2000));
  EXPECT_EQ(got.status(), AbortedError("worker 0 failed: no heartbeat"));
  EXPECT_EQ(links->failure(), got.status());
  // A later wait fails at once, and so does Flush.
  EXPECT_EQ(links->Recv(1, 1, Deadline::AfterMillis(10000)).status(), got.status());
  ASSERT_TRUE(links->Send(Frame(1, 1, 0, Pattern(8 << 20, 1))).ok());
  EXPECT_EQ(links->Flush(Deadline::AfterMillis(10000)), got.status());
  links.reset();
  close(a[1]);
  close(b[0]);
}

// Connect: each rank runs on its own thread with a real loopback listener, as ring channel
// setup does once the ranks have swapped their listeners' addresses.
RingLinksOptions ConnectOptions(int rank, int world, std::string next_address,
                                int64_t timeout_ms = 10000) {
  RingLinksOptions options;
  options.rank = rank;
  options.world_size = world;
  options.next_address = std::move(next_address);
  options.timeout_ms = timeout_ms;
  return options;
}

TEST(RingLinksConnectTest, ListenReportsTheAddressToConnectTo) {
  auto listener = RingLinks::Listen("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_THAT((*listener)->address, StartsWith("tcp://127.0.0.1:"));
  EXPECT_NE((*listener)->address, "tcp://127.0.0.1:0");
  // An address of another machine: nothing to bind to here.
  EXPECT_EQ(RingLinks::Listen("192.0.2.1").status().message(),
            "ring links: listening on 192.0.2.1: Cannot assign requested address");
}

// Three ranks connect at once and pass a frame round the ring; each names its peers.
TEST(RingLinksConnectTest, ConnectBuildsTheRingOverTcp) {
  constexpr int kWorld = 3;
  Listeners listeners(kWorld);
  std::vector<std::unique_ptr<RingLinks>> links(kWorld);
  std::vector<Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      RingLinksOptions options =
          ConnectOptions(rank, kWorld, listeners.addresses[(rank + 1) % kWorld]);
      options.failures = std::make_shared<FailureBus>();
      auto connected = RingLinks::Connect(options, std::move(listeners.listeners[rank]));
      if (!connected.ok()) {
        results[rank] = connected.status();
        return;
      }
      links[rank] = std::move(connected).value();
      const Deadline deadline = Deadline::AfterMillis(10000);
      results[rank] = links[rank]->Send(Frame(rank, 4, 0, Pattern(1000, rank)));
      if (!results[rank].ok()) return;
      auto got = links[rank]->Recv(4, 0, deadline);
      if (!got.ok()) {
        results[rank] = got.status();
      } else if (got->sender_rank != (rank + kWorld - 1) % kWorld ||
                 std::vector<uint8_t>(got->data.data(), got->data.data() + got->data.size()) !=
                     Pattern(1000, static_cast<uint8_t>(got->sender_rank))) {
        results[rank] = InternalError("wrong frame");
      } else {
        results[rank] = links[rank]->Flush(deadline);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    EXPECT_EQ(links[rank]->rank(), rank);
    EXPECT_EQ(links[rank]->next(), (rank + 1) % kWorld);
    EXPECT_EQ(links[rank]->prev(), (rank + kWorld - 1) % kWorld);
    EXPECT_EQ(links[rank]->kept(), 0u);
  }
  // Errors name the peer by its link address (to next) or where it connected from (from prev).
  links[2].reset();
  auto closed = links[0]->Recv(4, 1, Deadline::AfterMillis(10000));
  EXPECT_THAT(closed.status().message(),
              AllOf(StartsWith("ring link from worker 2 (tcp://127.0.0.1:"),
                    HasSubstr("closed by the peer")));
}

TEST(RingLinksConnectTest, RejectsOptionsThatCannotWork) {
  Listeners listeners(1);
  auto connected = RingLinks::Connect(ConnectOptions(0, 1, listeners.addresses[0]),
                                      std::move(listeners.listeners[0]));
  EXPECT_EQ(connected.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(connected.status().message(),
            "ring links rank=0: needs world_size >= 2, a rank in it, a listener or next's "
            "address, and a positive timeout");
  auto listener = RingLinks::Listen("127.0.0.1");
  ASSERT_TRUE(listener.ok());
  connected = RingLinks::Connect(ConnectOptions(0, 2, "127.0.0.1:1"), std::move(listener).value());
  EXPECT_EQ(connected.status().message(),
            "ring links rank=0: worker 1's link address: address 127.0.0.1:1 is not "
            "tcp://HOST:PORT");
}

TEST(RingLinksConnectTest, ASuccessorThatDoesNotListenFailsNamingIt) {
  std::string gone;
  {
    Listeners closed(1);
    gone = closed.addresses[0];
  }  // nobody listens there any more
  Listeners listeners(1);
  auto connected = RingLinks::Connect(ConnectOptions(0, 2, gone),
                                      std::move(listeners.listeners[0]));
  EXPECT_EQ(connected.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(connected.status().message(),
            "ring links rank=0: cannot connect to worker 1 at " + gone + ": Connection refused");
}

// The successor listens (its kernel accepts the connection) but its predecessor, worker 1,
// never connects to us: Connect ends at its timeout naming the rank it waited for.
TEST(RingLinksConnectTest, ConnectTimesOutNamingASilentPredecessor) {
  Listeners listeners(2);
  const auto started = SteadyClock::now();
  auto connected = RingLinks::Connect(ConnectOptions(0, 2, listeners.addresses[1], 200),
                                      std::move(listeners.listeners[0]));
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  EXPECT_EQ(connected.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(connected.status().message(),
            "ring links rank=0: worker 1 did not connect within 200 ms");
}

// Rank 0 of three expects worker 2's connection; worker 1 connects instead (as if it had the
// wrong successor address): its hello gives it away.
TEST(RingLinksConnectTest, AConnectionFromAnotherRankIsRejected) {
  Listeners listeners(3);
  Status one_result;
  std::thread one([&] {
    // Worker 1 takes rank 0's listener for its successor's; it waits for its own predecessor
    // in vain, briefly.
    one_result = RingLinks::Connect(ConnectOptions(1, 3, listeners.addresses[0], 300),
                                    std::move(listeners.listeners[1]))
                     .status();
  });
  auto connected = RingLinks::Connect(ConnectOptions(0, 3, listeners.addresses[2], 10000),
                                      std::move(listeners.listeners[0]));
  one.join();
  EXPECT_EQ(connected.status().code(), StatusCode::kInternal);
  EXPECT_THAT(connected.status().message(),
              AllOf(StartsWith("ring links rank=0: the connection from 127.0.0.1:"),
                    HasSubstr("is not from worker 2 (hello names rank 1)")));
  EXPECT_EQ(one_result.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(one_result.message(), "ring links rank=1: worker 0 did not connect within 300 ms");
}

// ---------------------------------------------------------------------------------------------
// Authenticated links (Credentials kAuthenticate): ring_link_handshake.h has the wire.

double HandshakeFailures(MetricsRegistry& registry) {
  auto family = registry.RegisterCounter(metric_names::kAuthFailuresTotal.name,
                                         metric_names::kAuthFailuresTotal.help, {"reason"});
  EXPECT_TRUE(family.ok()) << family.status();
  auto counter = (*family)->WithLabels({"handshake"});
  EXPECT_TRUE(counter.ok()) << counter.status();
  return (*counter)->Value();
}

// Connects `rank` of a ring whose listeners are `listeners` and passes a frame round: OK, or
// why not. `links` receives the links.
Status ConnectAndPassAFrame(int rank, int world, Listeners& listeners, const JobKey& key,
                            MetricsRegistry* metrics, int64_t timeout_ms,
                            std::unique_ptr<RingLinks>* links) {
  RingLinksOptions options = ConnectOptions(rank, world, listeners.addresses[(rank + 1) % world],
                                            timeout_ms);
  options.credentials = Credentials::Authenticate(key);
  options.metrics = metrics;
  auto connected = RingLinks::Connect(options, std::move(listeners.listeners[rank]));
  if (!connected.ok()) return connected.status();
  *links = std::move(connected).value();
  const Deadline deadline = Deadline::AfterMillis(10000);
  RETURN_IF_ERROR((*links)->Send(Frame(rank, 4, 0, Pattern(1000, static_cast<uint8_t>(rank)))));
  auto got = (*links)->Recv(4, 0, deadline);
  if (!got.ok()) return got.status();
  const int prev = (rank + world - 1) % world;
  if (got->sender_rank != prev ||
      std::vector<uint8_t>(got->data.data(), got->data.data() + got->data.size()) !=
          Pattern(1000, static_cast<uint8_t>(prev))) {
    return InternalError("wrong frame");
  }
  return (*links)->Flush(deadline);
}

TEST(RingLinksAuthTest, AnAuthenticatedRingOfTwoOrThreeExchangesFrames) {
  for (int world : {2, 3}) {
    Listeners listeners(world);
    MetricsRegistry registry;
    std::vector<std::unique_ptr<RingLinks>> links(world);
    std::vector<Status> results(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        results[rank] = ConnectAndPassAFrame(rank, world, listeners, KeyOf(7), &registry, 10000,
                                             &links[rank]);
      });
    }
    for (auto& thread : threads) thread.join();
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(results[rank].ok()) << "world " << world << " rank " << rank << ": "
                                      << results[rank];
      EXPECT_EQ(links[rank]->prev(), (rank + world - 1) % world);
    }
    EXPECT_EQ(HandshakeFailures(registry), 0);
  }
}

// A raw TCP client of `address`, blocking, with reads bounded by a 5 s timeout.
int ConnectRaw(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)), 0)
      << std::strerror(errno);
  return fd;
}

void WriteRaw(int fd, const std::string& bytes) {
  EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Exactly `bytes` bytes, or fewer if the peer closes (or 5 s pass).
std::string ReadRaw(int fd, size_t bytes) {
  std::string got;
  char buffer[256];
  while (got.size() < bytes) {
    const ssize_t n = recv(fd, buffer, std::min(sizeof(buffer), bytes - got.size()), 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

// Whether the peer closed the connection (within 5 s) without sending anything: a close, or
// a reset (a close with our bytes unread).
bool ClosedByPeer(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// A foreign client connects to rank 0's listener first (while rank 0 waits in Connect, before
// rank 1 connects) and does `attack`; then rank 1 connects. The ring connects and passes its
// frames all the same, the foreign connection is closed and counted once.
void ExpectTheRingSurvives(const std::function<void(int fd)>& attack) {
  Listeners listeners(2);
  MetricsRegistry registry;
  std::unique_ptr<RingLinks> links[2];
  Status results[2];
  const std::string zero_address = listeners.addresses[0];
  std::thread zero([&] {
    results[0] = ConnectAndPassAFrame(0, 2, listeners, KeyOf(7), &registry, 10000, &links[0]);
  });
  const int foreign = ConnectRaw(zero_address);
  attack(foreign);
  const auto one_started = SteadyClock::now();
  results[1] = ConnectAndPassAFrame(1, 2, listeners, KeyOf(7), nullptr, 10000, &links[1]);
  const auto one_took = SteadyClock::now() - one_started;
  zero.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  // Not held up by the foreign connection's handshake time (kLinkHandshakeMs).
  EXPECT_LT(one_took, std::chrono::milliseconds(kLinkHandshakeMs / 2));
  EXPECT_TRUE(ClosedByPeer(foreign));
  close(foreign);
  EXPECT_EQ(HandshakeFailures(registry), 1);
}

TEST(RingLinksAuthTest, ASilentForeignConnectionDoesNotDisturbTheRing) {
  ExpectTheRingSurvives([](int) {});
}

TEST(RingLinksAuthTest, AForeignConnectionSendingGarbageDoesNotDisturbTheRing) {
  ExpectTheRingSurvives([](int fd) {
    WriteRaw(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(100, 'x'));
    EXPECT_TRUE(ClosedByPeer(fd));  // refused at once
  });
}

TEST(RingLinksAuthTest, AForeignConnectionWithAnotherKeysProofDoesNotDisturbTheRing) {
  ExpectTheRingSurvives([](int fd) {
    LinkNonce nonce_c;
    nonce_c.fill(5);
    WriteRaw(fd, EncodeLinkHello(1, 0, nonce_c));  // as worker 1 to worker 0
    const std::string challenge = ReadRaw(fd, kLinkChallengeBytes);
    ASSERT_EQ(challenge.size(), kLinkChallengeBytes);
    LinkNonce nonce_a;
    std::memcpy(nonce_a.data(), challenge.data() + 8, nonce_a.size());
    const KeyBytes wrong = RingLinkKey(KeyOf(8));
    WriteRaw(fd, EncodeLinkProof(LinkMac(wrong, "connector", 1, 0, nonce_c, nonce_a)));
    EXPECT_TRUE(ClosedByPeer(fd));
  });
}

// A recorded valid handshake (worker 1 to worker 0, same key, through a relay) replayed to a
// later Connect: worker 0's fresh nonce makes the recorded proof worthless.
TEST(RingLinksAuthTest, AReplayedHandshakeDoesNotDisturbTheRing) {
  std::string recorded_hello, recorded_proof;
  {
    // Worker 0 listens only; worker 1 connects only, through a relay that records its bytes.
    Listeners zero(1);
    auto relay = RingLinks::Listen("127.0.0.1");
    ASSERT_TRUE(relay.ok()) << relay.status();
    Status zero_result, one_result;
    std::thread zero_thread([&] {
      RingLinksOptions options = ConnectOptions(0, 2, "", 10000);
      options.credentials = Credentials::Authenticate(KeyOf(7));
      zero_result = RingLinks::Connect(options, std::move(zero.listeners[0])).status();
    });
    std::thread one_thread([&] {
      RingLinksOptions options = ConnectOptions(1, 2, (*relay)->address, 10000);
      options.credentials = Credentials::Authenticate(KeyOf(7));
      one_result = RingLinks::Connect(options, nullptr).status();
    });
    const int from_one = accept((*relay)->fd, nullptr, nullptr);
    ASSERT_GE(from_one, 0);
    timeval timeout{5, 0};
    setsockopt(from_one, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    const int to_zero = ConnectRaw(zero.addresses[0]);
    recorded_hello = ReadRaw(from_one, kLinkHelloBytes);
    WriteRaw(to_zero, recorded_hello);
    WriteRaw(from_one, ReadRaw(to_zero, kLinkChallengeBytes));
    recorded_proof = ReadRaw(from_one, kLinkProofBytes);
    WriteRaw(to_zero, recorded_proof);
    zero_thread.join();
    one_thread.join();
    ASSERT_TRUE(zero_result.ok()) << zero_result;  // the transcript was a valid handshake
    ASSERT_TRUE(one_result.ok()) << one_result;
    close(from_one);
    close(to_zero);
  }
  ASSERT_EQ(recorded_hello.size(), kLinkHelloBytes);
  ASSERT_EQ(recorded_proof.size(), kLinkProofBytes);
  ExpectTheRingSurvives([&](int fd) {
    WriteRaw(fd, recorded_hello);
    EXPECT_EQ(ReadRaw(fd, kLinkChallengeBytes).size(), kLinkChallengeBytes);
    WriteRaw(fd, recorded_proof);
    EXPECT_TRUE(ClosedByPeer(fd));
  });
}

// Worker 1 holds another key: both fail at once, naming their successor. Whichever checks
// its successor's proof first says the key is wrong; the other may find its connection
// closed first (its successor gave up on Connect already) and says that.
TEST(RingLinksAuthTest, ARankWithAnotherKeyFailsNamingThePeer) {
  Listeners listeners(2);
  MetricsRegistry registry;
  std::unique_ptr<RingLinks> links[2];
  Status results[2];
  const auto started = SteadyClock::now();
  std::thread one([&] {
    results[1] = ConnectAndPassAFrame(1, 2, listeners, KeyOf(8), nullptr, 5000, &links[1]);
  });
  results[0] = ConnectAndPassAFrame(0, 2, listeners, KeyOf(7), &registry, 5000, &links[0]);
  one.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2500));
  int wrong_key = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string link = "ring links rank=" + std::to_string(rank) + ": ring link to worker " +
                             std::to_string(1 - rank) + " (" + listeners.addresses[1 - rank] +
                             "): ";
    if (results[rank].code() == StatusCode::kFailedPrecondition) {
      ++wrong_key;
      EXPECT_EQ(results[rank].message(),
                link + "the peer did not prove it holds the job key (is it this job's worker?)");
    } else {
      EXPECT_EQ(results[rank].code(), StatusCode::kUnavailable) << results[rank];
      EXPECT_THAT(results[rank].message(),
                  StartsWith(link + "closed by the peer during the handshake (its log says why: "
                                    "a worker of another job, one holding another key"));
    }
  }
  EXPECT_GE(wrong_key, 1);
}

// The listener holds another key (one direction, 1 -> 0): the connector refuses its proof at
// once; the listener refuses the closed connection and fails at its deadline saying why.
TEST(RingLinksAuthTest, AListenerWithAnotherKeyFailsBothEndsClearly) {
  Listeners zero(1);
  Status zero_result;
  std::thread zero_thread([&] {
    RingLinksOptions options = ConnectOptions(0, 2, "", 1500);
    options.credentials = Credentials::Authenticate(KeyOf(8));
    zero_result = RingLinks::Connect(options, std::move(zero.listeners[0])).status();
  });
  RingLinksOptions options = ConnectOptions(1, 2, zero.addresses[0], 1500);
  options.credentials = Credentials::Authenticate(KeyOf(7));
  const auto started = SteadyClock::now();
  Status one_result = RingLinks::Connect(options, nullptr).status();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(1000));
  zero_thread.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(4000));
  EXPECT_EQ(one_result.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(one_result.message(),
            "ring links rank=1: ring link to worker 0 (" + zero.addresses[0] +
                "): the peer did not prove it holds the job key (is it this job's worker?)");
  EXPECT_EQ(zero_result.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(zero_result.message(),
              AllOf(StartsWith("ring links rank=0: worker 1 did not connect within 1500 ms; "
                               "refused 1 connection that did not complete the job-key "
                               "handshake, the last from 127.0.0.1:"),
                    HasSubstr(": closed the connection after our challenge: it did not accept "
                              "our proof of the job key (do both hold the same key?)")));
}

// A worker run with --insecure (the bare hello) is refused by one with a key, which says why.
TEST(RingLinksAuthTest, AnUnauthenticatedConnectorIsRefusedSayingWhy) {
  Listeners zero(1);
  Status zero_result;
  std::thread zero_thread([&] {
    RingLinksOptions options = ConnectOptions(0, 2, "", 1000);
    options.credentials = Credentials::Authenticate(KeyOf(7));
    zero_result = RingLinks::Connect(options, std::move(zero.listeners[0])).status();
  });
  auto insecure = RingLinks::Connect(ConnectOptions(1, 2, zero.addresses[0], 1000), nullptr);
  zero_thread.join();
  EXPECT_EQ(zero_result.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(zero_result.message(),
              HasSubstr("sent a hello without authentication (does it run with --insecure "
                        "while this job has a key?)"));
}

}  // namespace
}  // namespace tessera::worker
