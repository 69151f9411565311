#include "worker/collectives/channel/mixed_hop_channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/failure_bus.h"
#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/shm/ring_shm.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {
namespace {

// A ring of `world` (even) ranks in this process, as on world / 2 hosts of two ranks each:
// hop h (h -> h + 1) over shared memory for even h (within a "host"), a socket pair for odd h
// (between). So every rank is a MixedHopChannel: even ranks send over shm and receive over a link,
// odd ranks the other way round.
class MixedRing {
 public:
  explicit MixedRing(int world, int socket_buffer_bytes = 0) : world_(world) {
    failures_ = std::make_shared<FailureBus>();
    std::vector<std::shared_ptr<RingShm::Segment>> segments;
    for (int rank = 0; rank < world; ++rank) {
      auto created = RingShm::Create(rank, size_t{4} << 20);
      EXPECT_TRUE(created.ok()) << created.status();
      segments.push_back(std::move(created).value());
    }
    std::vector<std::unique_ptr<RingChannel>> to_next(world), from_prev(world);
    for (int h = 0; h < world; ++h) {
      const int from = h;
      const int to = (h + 1) % world;
      if (h % 2 == 0) {
        auto bell = RingShm::OpenBell(RingShm::NameOf(*segments[to]), to);
        auto ring = RingShm::OpenRing(RingShm::NameOf(*segments[from]), from);
        EXPECT_TRUE(bell.ok() && ring.ok());
        auto out = RingShm::FromSegments(from, to, (from + world - 1) % world, segments[from],
                                         nullptr, *bell, failures_);
        auto in = RingShm::FromSegments(to, (to + 1) % world, from, segments[to], *ring, nullptr,
                                        failures_);
        EXPECT_TRUE(out.ok() && in.ok());
        to_next[from] = std::move(out).value();
        from_prev[to] = std::move(in).value();
      } else {
        int pair[2];
        EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
        if (socket_buffer_bytes > 0) {
          for (int fd : pair) {
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &socket_buffer_bytes, sizeof(int));
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &socket_buffer_bytes, sizeof(int));
          }
        }
        to_next[from] = RingLinks::FromSockets(from, world, pair[0], -1, "next", "", failures_);
        from_prev[to] = RingLinks::FromSockets(to, world, -1, pair[1], "", "prev", failures_);
      }
    }
    for (int rank = 0; rank < world; ++rank) {
      channels.push_back(
          std::make_shared<MixedHopChannel>(std::move(to_next[rank]), std::move(from_prev[rank])));
    }
  }

  // Runs `call(rank)` on a thread per rank.
  std::vector<Status> RunAll(const std::function<Status(int)>& call) {
    std::vector<Status> results(world_);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world_; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = call(rank); });
    }
    for (auto& thread : threads) thread.join();
    return results;
  }

  std::vector<std::shared_ptr<MixedHopChannel>> channels;

 private:
  const int world_;
  std::shared_ptr<FailureBus> failures_;
};

RingFrame Data(uint64_t tag, std::vector<uint8_t> bytes) {
  RingFrame frame;
  frame.kind = RingFrameKind::kData;
  frame.tag = tag;
  frame.op = CollectiveOp::kAllReduce;
  frame.dtype = DataType::kUInt8;
  frame.element_count = bytes.size();
  frame.buffer_elements = bytes.size();
  frame.data = Payload::FromVector(std::move(bytes));
  return frame;
}

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  return out;
}

// A frame larger than the shared-memory ring and than the socket buffers: a Send leaves most of
// it queued, and nobody on the sending side ever waits (no Recv, no Flush) — only the pump can
// hand it on. Both kinds of outbound half.
TEST(MixedHopChannelTest, ThePumpHandsOnWhatASendLeftQueued) {
  MixedRing ring(2, /*socket_buffer_bytes=*/64 << 10);
  const size_t bytes = size_t{16} << 20;
  for (int sender : {0, 1}) {  // 0 sends over shm, 1 over its link
    SCOPED_TRACE("sender " + std::to_string(sender));
    const int receiver = 1 - sender;
    ASSERT_TRUE(ring.channels[sender]->Send(Data(7, Pattern(bytes, sender))).ok());
    EXPECT_GT(ring.channels[sender]->unsent(), 0u) << "the frame fit at once: test nothing";
    auto got = ring.channels[receiver]->Recv(7, 0, Deadline::AfterMillis(20000));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->sender_rank, sender);
    ASSERT_EQ(got->data.size(), bytes);
    EXPECT_TRUE(std::equal(got->data.data(), got->data.data() + bytes,
                           Pattern(bytes, sender).begin()));
    EXPECT_EQ(ring.channels[sender]->unsent(), 0u);
  }
}

// All-reduces over the mixed ring, large enough that every hop's ring or socket fills, with
// the default segment size, against the sum: the pump, Sends and the call's Flush together.
TEST(MixedHopChannelTest, AllReduceOverAMixedRingIsExact) {
  constexpr int kWorld = 4;
  MixedRing ring(kWorld);
  std::vector<std::unique_ptr<RingCollectives>> collectives;
  for (int rank = 0; rank < kWorld; ++rank) {
    RingCollectivesOptions options;
    options.rank = rank;
    options.world_size = kWorld;
    options.channel = ring.channels[rank];
    auto created = RingCollectives::Create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    collectives.push_back(std::move(created).value());
  }
  const size_t count = (size_t{4} << 20) + 5;  // 16 MiB of float32
  for (uint64_t tag = 1; tag <= 3; ++tag) {
    std::vector<std::vector<float>> buffers(kWorld, std::vector<float>(count));
    for (int rank = 0; rank < kWorld; ++rank) {
      for (size_t i = 0; i < count; ++i) {
        buffers[rank][i] = static_cast<float>((i * 7 + rank * 13 + tag) % 1000);
      }
    }
    std::vector<Status> results = ring.RunAll([&](int rank) {
      return collectives[rank]->AllReduce(buffers[rank].data(), count, DataType::kFloat32,
                                          ReduceOp::kSum, "w", tag);
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < kWorld; ++r) want += static_cast<float>((i * 7 + r * 13 + tag) % 1000);
        ASSERT_EQ(buffers[rank][i], want) << "rank " << rank << " element " << i;
      }
    }
  }
}

// A channel whose next never reads goes away promptly, its pump stopped mid-flush.
TEST(MixedHopChannelTest, DestroyingItStopsThePumpWithinASlice) {
  MixedRing ring(2, /*socket_buffer_bytes=*/64 << 10);
  ASSERT_TRUE(ring.channels[1]->Send(Data(1, Pattern(size_t{8} << 20, 1))).ok());
  ASSERT_GT(ring.channels[1]->unsent(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the pump is flushing now
  const auto started = SteadyClock::now();
  ring.channels[1].reset();
  EXPECT_LT(SteadyClock::now() - started,
            std::chrono::milliseconds(MixedHopChannel::kPumpSliceMs + 1000));
}

}  // namespace
}  // namespace tessera::worker
