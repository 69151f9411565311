#include "worker/collectives/ring_collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// BUILD runs these tests once per channel, with TESSERA_RING_TEST_CHANNEL set to zmq (frames
// through the transport, ZeroMQ on 127.0.0.1), links, links_encrypted (links under kEncrypt),
// shm or mixed (links to and from worker 1, shared memory elsewhere; at world 2 links
// throughout): every test runs over each, set up by ConnectRingChannel as tessera-worker sets
// up its own. What differs between channels (what the transport counts, a peer whose
// connection closes) says so where it is tested.
const std::string& Channel() {
  static const std::string channel = [] {
    const char* value = std::getenv("TESSERA_RING_TEST_CHANNEL");
    if (value == nullptr || *value == '\0') {
      std::cerr << "TESSERA_RING_TEST_CHANNEL is not set: BUILD sets it to zmq, links, "
                   "links_encrypted, shm or mixed\n";
      std::abort();
    }
    return std::string(value);
  }();
  return channel;
}
bool OverTheTransport() { return Channel() == "zmq"; }

// A ring of `world` ranks over this target's channel.
TestRingOptions Over(size_t segment_bytes = kTestSegmentBytes,
                     int64_t timeout_ms = kTestTimeoutMs) {
  TestRingOptions options;
  options.channel = Channel();
  options.segment_bytes = segment_bytes;
  options.timeout_ms = timeout_ms;
  return options;
}

// The same, and for the mixed channel also with each "host"'s ranks apart in rank order (even
// ranks on 127.0.0.1, odd on 127.0.0.2), so that the ring visits them in another order than
// the ranks' (0, 2, 4, 1, 3): the results must not depend on it. For the tests of results
// only (the others name ring neighbours as in rank order).
TestRingOptions OverAnyOrder() {
  TestRingOptions options = Over();
  options.interleaved_hosts = Channel() == "mixed";
  return options;
}

// ---------------------------------------------------------------------------------------------
// PartitionOf

static_assert(PartitionOf(10, 4, 0) == Partition{0, 3});
static_assert(PartitionOf(10, 4, 1) == Partition{3, 3});
static_assert(PartitionOf(10, 4, 2) == Partition{6, 2});
static_assert(PartitionOf(10, 4, 3) == Partition{8, 2});
static_assert(PartitionOf(2, 3, 2) == Partition{2, 0});

TEST(PartitionOfTest, TilesTheBufferInRankOrderAsEvenlyAsPossible) {
  for (size_t count = 0; count <= 100; ++count) {
    for (int world = 1; world <= 9; ++world) {
      size_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Partition p = PartitionOf(count, world, rank);
        ASSERT_EQ(p.offset, next) << count << " " << world << " " << rank;
        const size_t expected_size =
            count / world + (static_cast<size_t>(rank) < count % world ? 1 : 0);
        ASSERT_EQ(p.size, expected_size) << count << " " << world << " " << rank;
        next = p.end();
      }
      ASSERT_EQ(next, count) << count << " " << world;
    }
  }
  const size_t huge = std::numeric_limits<size_t>::max();
  EXPECT_EQ(PartitionOf(huge, 7, 6).end(), huge);
}

const DataType kDTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin};

// ---------------------------------------------------------------------------------------------
// Every collective against the naive reference, world sizes 1, 2, 3, 5 and 8 (one rank, the
// smallest rings, an odd one that divides no length evenly, the largest)

class RingCollectivesWorld : public ::testing::TestWithParam<int> {};

TEST_P(RingCollectivesWorld, AllReduceMatchesTheReference) {
  const int world = GetParam();
  TestRing ring(world, OverAnyOrder());
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        const std::string what = Describe(count, dtype, op);
        SCOPED_TRACE(what);
        const uint64_t tag = ring.NextTag();
        const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
        std::vector<Bytes> buffers = inputs;
        std::vector<Status> results = ring.RunAll([&](int rank) {
          return ring.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) {
          ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, buffers[rank].data(),
                                       what + " rank " + std::to_string(rank)));
          ASSERT_EQ(buffers[rank], buffers[0]) << "every rank gets the same bits; rank " << rank;
        }
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

TEST_P(RingCollectivesWorld, ReduceScatterMatchesTheReference) {
  const int world = GetParam();
  TestRing ring(world, OverAnyOrder());
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        for (bool in_place : {false, true}) {
          const std::string what =
              Describe(count, dtype, op) + (in_place ? ", in place" : ", out of place");
          SCOPED_TRACE(what);
          const size_t bytes = DataTypeSize(dtype);
          const uint64_t tag = ring.NextTag();
          const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
          std::vector<Bytes> in = inputs;
          std::vector<Bytes> out(world);
          for (int rank = 0; rank < world; ++rank) {
            out[rank].assign(PartitionOf(count, world, rank).size * bytes, 0xab);
          }
          std::vector<Status> results = ring.RunAll([&](int rank) {
            uint8_t* output = in_place ? in[rank].data() +
                                             PartitionOf(count, world, rank).offset * bytes
                                       : out[rank].data();
            return ring.at(rank).ReduceScatter(in[rank].data(), output, count, dtype, op,
                                               "test.w", tag);
          });
          ASSERT_TRUE(AllOk(results, ring.AllRanks()));
          for (int rank = 0; rank < world; ++rank) {
            const Partition own = PartitionOf(count, world, rank);
            const uint8_t* got =
                in_place ? in[rank].data() + own.offset * bytes : out[rank].data();
            ASSERT_TRUE(MatchesReference(dtype, op, inputs, own.offset, own.size, got,
                                         what + " rank " + std::to_string(rank)));
            if (!in_place) {
              ASSERT_EQ(in[rank], inputs[rank]) << "input untouched, rank " << rank;
            }
          }
        }
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

TEST_P(RingCollectivesWorld, AllGatherMatchesTheReference) {
  const int world = GetParam();
  TestRing ring(world, OverAnyOrder());
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::to_string(count) + " x " + std::string(DataTypeName(dtype)) +
                     (in_place ? ", in place" : ", out of place"));
        const size_t bytes = DataTypeSize(dtype);
        const uint64_t tag = ring.NextTag();
        // The gathered buffer, which rank q's share of comes from rank q.
        const Bytes whole = Inputs(dtype, 1, count, tag)[0];
        std::vector<Bytes> in(world), out(world, Bytes(count * bytes, 0xab));
        for (int rank = 0; rank < world; ++rank) {
          const Partition own = PartitionOf(count, world, rank);
          in[rank].assign(whole.begin() + own.offset * bytes, whole.begin() + own.end() * bytes);
          if (in_place) {
            std::copy(in[rank].begin(), in[rank].end(), out[rank].begin() + own.offset * bytes);
          }
        }
        std::vector<Status> results = ring.RunAll([&](int rank) {
          const uint8_t* input = in_place ? out[rank].data() +
                                                PartitionOf(count, world, rank).offset * bytes
                                          : in[rank].data();
          return ring.at(rank).AllGather(input, out[rank].data(), count, dtype, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) ASSERT_EQ(out[rank], whole) << "rank " << rank;
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

TEST_P(RingCollectivesWorld, BroadcastFromEveryRoot) {
  const int world = GetParam();
  TestRing ring(world, OverAnyOrder());
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      for (int root = 0; root < world; ++root) {
        SCOPED_TRACE(std::to_string(count) + " x " + std::string(DataTypeName(dtype)) +
                     " from root " + std::to_string(root));
        const uint64_t tag = ring.NextTag();
        const Bytes data = Inputs(dtype, 1, count, tag)[0];
        std::vector<Bytes> buffers(world, Bytes(data.size(), 0xab));
        buffers[root] = data;
        std::vector<Status> results = ring.RunAll([&](int rank) {
          return ring.at(rank).Broadcast(buffers[rank].data(), count, dtype, root, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) ASSERT_EQ(buffers[rank], data) << "rank " << rank;
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

// No rank leaves the barrier before the last one has entered it.
TEST_P(RingCollectivesWorld, BarrierWaitsForTheLastRank) {
  const int world = GetParam();
  TestRing ring(world, Over());
  for (int late = 0; late < world; ++late) {
    const uint64_t tag = ring.NextTag();
    std::vector<SteadyClock::time_point> left(world);
    SteadyClock::time_point late_entered;
    std::vector<Status> results = ring.RunAll([&](int rank) {
      if (rank == late) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        late_entered = SteadyClock::now();
      }
      Status status = ring.at(rank).Barrier(tag);
      left[rank] = SteadyClock::now();
      return status;
    });
    ASSERT_TRUE(AllOk(results, ring.AllRanks()));
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_GE(left[rank], late_entered) << "rank " << rank << " left before rank " << late
                                          << " entered";
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

// All-gathers and broadcasts move elements without looking at them, so every dtype goes.
TEST(RingCollectivesTest, AllGatherAndBroadcastMoveAnyDType) {
  constexpr int kWorld = 3;
  TestRing ring(kWorld, Over());
  for (DataType dtype : {DataType::kInt64, DataType::kInt32, DataType::kUInt8}) {
    const size_t bytes = DataTypeSize(dtype);
    for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{97}, size_t{1009}}) {
      SCOPED_TRACE(std::to_string(count) + " x " + std::string(DataTypeName(dtype)));
      const uint64_t tag = ring.NextTag();
      const Bytes whole = Inputs(dtype, 1, count, tag)[0];
      std::vector<Bytes> gathered(kWorld, Bytes(whole.size(), 0xab));
      std::vector<Bytes> broadcast(kWorld, Bytes(whole.size(), 0xab));
      broadcast[1] = whole;
      std::vector<Status> results = ring.RunAll([&](int rank) {
        const Partition own = PartitionOf(count, kWorld, rank);
        RETURN_IF_ERROR(ring.at(rank).AllGather(whole.data() + own.offset * bytes,
                                                gathered[rank].data(), count, dtype, "ids", tag));
        return ring.at(rank).Broadcast(broadcast[rank].data(), count, dtype, 1, "ids", tag + 1);
      });
      ring.NextTag();
      ASSERT_TRUE(AllOk(results, ring.AllRanks()));
      for (int rank = 0; rank < kWorld; ++rank) {
        ASSERT_EQ(gathered[rank], whole) << "allgather, rank " << rank;
        ASSERT_EQ(broadcast[rank], whole) << "broadcast, rank " << rank;
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

// Every dtype and reduce op over this channel (whose frames carry them: the direct channels'
// header checks their ranges); the full matrix is ring_reductions_test.cc's, in process.
TEST(RingCollectivesTest, EveryDTypeAndReduceOpTravels) {
  constexpr int kWorld = 3;
  TestRing ring(kWorld, Over());
  const size_t count = 1009;
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                         DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                         DataType::kInt32, DataType::kInt64, DataType::kBool}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin,
                        ReduceOp::kProduct}) {
      if (op == ReduceOp::kAverage && !IsFloatingPoint(dtype)) continue;
      const std::string what = Describe(count, dtype, op);
      SCOPED_TRACE(what);
      const size_t bytes = DataTypeSize(dtype);
      const uint64_t tag = ring.NextTag();
      const std::vector<Bytes> inputs = Inputs(dtype, kWorld, count, tag);
      std::vector<Bytes> reduced = inputs, scattered(kWorld);
      std::vector<Status> results = ring.RunAll([&](int rank) {
        scattered[rank].resize(PartitionOf(count, kWorld, rank).size * bytes);
        RETURN_IF_ERROR(ring.at(rank).ReduceScatter(inputs[rank].data(), scattered[rank].data(),
                                                    count, dtype, op, "w", tag));
        return ring.at(rank).AllReduce(reduced[rank].data(), count, dtype, op, "w", tag);
      });
      ASSERT_TRUE(AllOk(results, ring.AllRanks()));
      for (int rank = 0; rank < kWorld; ++rank) {
        const Partition own = PartitionOf(count, kWorld, rank);
        ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, reduced[rank].data(),
                                     "allreduce " + what));
        ASSERT_TRUE(MatchesReference(dtype, op, inputs, own.offset, own.size,
                                     scattered[rank].data(), "reducescatter " + what));
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

// Each rank's channel is the one this test target asked ConnectRingChannel for.
TEST(RingCollectivesTest, TheChannelIsTheOneAskedFor) {
  TestRing ring(2, Over());
  for (int rank = 0; rank < 2; ++rank) {
    // At world 2 mixed has no hop without worker 1: links throughout.
    EXPECT_THAT(ring.description(rank),
                StartsWith(Channel() == "mixed" || Channel() == "links_encrypted"
                               ? "links ("
                               : Channel() + " ("));
  }
}

// Ranks of two "hosts" interleaved in rank order: the ring visits each host's ranks together,
// says so, and (the tests above) still gives every rank its own partition.
TEST(RingCollectivesTest, InterleavedHostsAreRingedHostByHost) {
  if (Channel() != "mixed") GTEST_SKIP() << "the mixed channel's target tests the ring's order";
  TestRing ring(4, OverAnyOrder());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(ring.description(rank),
                AllOf(HasSubstr("chosen by auto per hop (0->2 shm, 2->1 links, 1->3 links, "
                                "3->0 shm)"),
                      HasSubstr("; ring order 0, 2, 1, 3 (each host's ranks next to each "
                                "other)")));
  }
}

// Buffers cut into default-size (1 MiB) segments: 4 MiB of float32 gives every block at least
// one whole segment up to 4 ranks. Beyond that a block is under one segment, which the other
// tests cover with small buffers, and the larger worlds only multiplied the time (world 5-8 took
// four fifths of this test's 100 s under TSan).
class RingCollectivesLargeBuffers : public ::testing::TestWithParam<int> {};

TEST_P(RingCollectivesLargeBuffers, LargeBuffersWithTheDefaultSegmentSize) {
  const int world = GetParam();
  TestRingOptions options = OverAnyOrder();
  options.segment_bytes = RingCollectivesOptions().segment_bytes;
  TestRing ring(world, options);
  const size_t count = (size_t{1} << 20) + 3;  // 4 MiB of float32, 2 MiB of float16
  for (auto [dtype, op] : {std::pair{DataType::kFloat32, ReduceOp::kAverage},
                           std::pair{DataType::kFloat16, ReduceOp::kSum}}) {
    const std::string what = Describe(count, dtype, op);
    SCOPED_TRACE(what);
    const uint64_t tag = ring.NextTag();
    const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
    std::vector<Bytes> buffers = inputs;
    std::vector<Status> results = ring.RunAll([&](int rank) {
      return ring.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "big", tag);
    });
    ASSERT_TRUE(AllOk(results, ring.AllRanks()));
    // Rank 0 against the reference, the others against rank 0: the reference costs W times
    // a comparison, which mattered under TSan.
    ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, buffers[0].data(), what));
    for (int rank = 1; rank < world; ++rank) {
      ASSERT_TRUE(buffers[rank] == buffers[0]) << "every rank gets the same bits; rank " << rank;
    }
  }
  // Reduce-scatter then all-gather of the same buffer: ZeRO's pattern.
  const uint64_t tag = ring.NextTag();
  const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, world, count, tag);
  std::vector<Bytes> buffers = inputs;
  std::vector<Status> results = ring.RunAll([&](int rank) {
    uint8_t* shard = buffers[rank].data() + PartitionOf(count, world, rank).offset * 4;
    RETURN_IF_ERROR(ring.at(rank).ReduceScatter(buffers[rank].data(), shard, count,
                                                DataType::kFloat32, ReduceOp::kSum, "big", tag));
    return ring.at(rank).AllGather(shard, buffers[rank].data(), count, DataType::kFloat32, "big",
                                   tag + 1);
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  ASSERT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count,
                               buffers[0].data(), "reducescatter + allgather"));
  for (int rank = 1; rank < world; ++rank) {
    ASSERT_TRUE(buffers[rank] == buffers[0]) << "every rank gets the same bits; rank " << rank;
  }
  EXPECT_TRUE(NothingKept(ring));
}

// World 8 in the default configuration: under a sanitizer its eight ranks' threads took 9 to 13 s
// a test in each of the five channels (TSan), and worlds 3 and 5 take the same paths.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TESSERA_RING_WORLD_SIZES 1, 2, 3, 5
#else
#define TESSERA_RING_WORLD_SIZES 1, 2, 3, 5, 8
#endif
INSTANTIATE_TEST_SUITE_P(WorldSizes, RingCollectivesWorld,
                         ::testing::Values(TESSERA_RING_WORLD_SIZES),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });
INSTANTIATE_TEST_SUITE_P(WorldSizes, RingCollectivesLargeBuffers, ::testing::Range(1, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Segments, staging, concurrency

// A block is cut into segments of at most segment_bytes, one message each: an all-reduce of
// 10000 float32 among 3 ranks has blocks of 3334 elements (13336 bytes), so 14 segments of at
// most 1024 bytes, and 2 (W - 1) steps x 14 messages reach every rank.
TEST(RingCollectivesTest, CutsBlocksIntoSegmentsOfAtMostSegmentBytes) {
  if (!OverTheTransport()) GTEST_SKIP() << "counts the frames the transport delivers";
  TestRing ring(3, Over());
  const size_t count = 10000;
  std::vector<Bytes> buffers = Inputs(DataType::kFloat32, 3, count, 1);
  ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), count, DataType::kFloat32,
                                   ReduceOp::kSum, "", 1);
  }), ring.AllRanks()));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ring.frames_delivered(rank), 2u * 2 * 14) << "rank " << rank;
    EXPECT_LE(ring.max_payload_bytes(rank), kTestSegmentBytes) << "rank " << rank;
    EXPECT_GT(ring.max_payload_bytes(rank), kTestSegmentBytes / 2) << "rank " << rank;
  }
}

// The caller may overwrite its buffers as soon as a call returns, even while the network still
// holds frames the call sent from them: by the call's final Flush every channel has handed its
// frames on (RingZmq copies them at Send, the direct channels into the socket or the ring).
// Over the transport, everything rank 0 sends is held for 200 ms (a FaultyTransport that
// delays every message); in a reduce-scatter or an all-gather among 3 ranks, rank 0 returns
// long before its successor has received its first block. Each rank scribbles over its buffers
// at once, and every rank's result must still be right.
TEST(RingCollectivesTest, BuffersMayChangeAsSoonAsACallReturns) {
  constexpr int kWorld = 3;
  TestRingOptions options = Over();
  FaultOptions slow;
  slow.delay_probability = 1;
  slow.delay_ms = 200;
  options.faults = {slow};
  TestRing ring(kWorld, options);
  const size_t count = 3001;
  const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, kWorld, count, 1);
  std::vector<Bytes> reduced(kWorld), scattered(kWorld), gathered(kWorld);
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    const Partition own = PartitionOf(count, kWorld, rank);
    Bytes buffer = inputs[rank];
    RETURN_IF_ERROR(ring.at(rank).AllReduce(buffer.data(), count, DataType::kFloat32,
                                            ReduceOp::kSum, "", 1));
    reduced[rank] = buffer;
    std::fill(buffer.begin(), buffer.end(), 0xcd);

    buffer = inputs[rank];
    Bytes out(own.size * 4);
    RETURN_IF_ERROR(ring.at(rank).ReduceScatter(buffer.data(), out.data(), count,
                                                DataType::kFloat32, ReduceOp::kSum, "", 2));
    scattered[rank] = out;
    std::fill(buffer.begin(), buffer.end(), 0xcd);
    std::fill(out.begin(), out.end(), 0xcd);

    Bytes part(inputs[0].begin() + own.offset * 4, inputs[0].begin() + own.end() * 4);
    Bytes whole(count * 4);
    RETURN_IF_ERROR(ring.at(rank).AllGather(part.data(), whole.data(), count, DataType::kFloat32,
                                            "", 3));
    gathered[rank] = whole;
    std::fill(part.begin(), part.end(), 0xcd);
    std::fill(whole.begin(), whole.end(), 0xcd);
    return OkStatus();
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  for (int rank = 0; rank < kWorld; ++rank) {
    const Partition own = PartitionOf(count, kWorld, rank);
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count,
                                 reduced[rank].data(), "allreduce rank " + std::to_string(rank)));
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, own.offset,
                                 own.size, scattered[rank].data(),
                                 "reducescatter rank " + std::to_string(rank)));
    EXPECT_EQ(gathered[rank], inputs[0]) << "allgather rank " << rank;
  }
}

// Back-to-back calls on one buffer: each call's frames borrow the buffer, which the next call
// writes at once.
TEST(RingCollectivesTest, BackToBackCallsOnOneBuffer) {
  TestRing ring(4, Over());
  const size_t count = 3001;
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    Bytes buffer;
    for (uint64_t round = 0; round < 20; ++round) {
      const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, 4, count, round);
      buffer = inputs[rank];
      RETURN_IF_ERROR(ring.at(rank).AllReduce(buffer.data(), count, DataType::kFloat32,
                                              ReduceOp::kSum, "", 1000 + round));
      if (!MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count, buffer.data(),
                            "round " + std::to_string(round))) {
        return InternalError("wrong sum in round " + std::to_string(round));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(AllOk(results, ring.AllRanks()));
  EXPECT_TRUE(NothingKept(ring));
}

// Operations with different tags run at the same time on every rank without mixing up.
TEST(RingCollectivesTest, ConcurrentOperationsAreKeptApartByTag) {
  constexpr int kWorld = 4;
  TestRing ring(kWorld, Over());
  const size_t count = 2053;
  const std::vector<Bytes> sum_inputs = Inputs(DataType::kFloat32, kWorld, count, 1);
  const std::vector<Bytes> max_inputs = Inputs(DataType::kBFloat16, kWorld, count, 2);
  const Bytes gathered = Inputs(DataType::kFloat16, 1, count, 3)[0];
  const Bytes broadcast = Inputs(DataType::kFloat32, 1, count, 4)[0];
  std::vector<Bytes> sums = sum_inputs, scattered(kWorld), gather_out(kWorld),
                     broadcast_out(kWorld, Bytes(broadcast.size()));
  broadcast_out[2] = broadcast;
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    const Partition own = PartitionOf(count, kWorld, rank);
    scattered[rank].resize(own.size * 2);
    gather_out[rank].resize(count * 2);
    Status statuses[5];
    std::vector<std::thread> threads;
    threads.emplace_back([&] {
      statuses[0] = ring.at(rank).AllReduce(sums[rank].data(), count, DataType::kFloat32,
                                            ReduceOp::kSum, "a", 1);
    });
    threads.emplace_back([&] {
      statuses[1] = ring.at(rank).ReduceScatter(max_inputs[rank].data(), scattered[rank].data(),
                                                count, DataType::kBFloat16, ReduceOp::kMax, "b",
                                                2);
    });
    threads.emplace_back([&] {
      statuses[2] = ring.at(rank).AllGather(gathered.data() + own.offset * 2,
                                            gather_out[rank].data(), count, DataType::kFloat16,
                                            "c", 3);
    });
    threads.emplace_back([&] {
      statuses[3] = ring.at(rank).Broadcast(broadcast_out[rank].data(), count,
                                            DataType::kFloat32, 2, "d", 4);
    });
    threads.emplace_back([&] { statuses[4] = ring.at(rank).Barrier(5); });
    for (auto& thread : threads) thread.join();
    for (const Status& status : statuses) RETURN_IF_ERROR(status);
    return OkStatus();
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  for (int rank = 0; rank < kWorld; ++rank) {
    const Partition own = PartitionOf(count, kWorld, rank);
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, sum_inputs, 0, count,
                                 sums[rank].data(), "allreduce"));
    EXPECT_TRUE(MatchesReference(DataType::kBFloat16, ReduceOp::kMax, max_inputs, own.offset,
                                 own.size, scattered[rank].data(), "reducescatter"));
    EXPECT_EQ(gather_out[rank], gathered) << "rank " << rank;
    EXPECT_EQ(broadcast_out[rank], broadcast) << "rank " << rank;
  }
  EXPECT_TRUE(NothingKept(ring));
}

// A tag may be used again once the operation that used it has ended everywhere.
TEST(RingCollectivesTest, ATagMayBeReusedSequentially) {
  TestRing ring(3, Over());
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    for (int i = 0; i < 10; ++i) {
      float value = static_cast<float>(rank + i);
      RETURN_IF_ERROR(ring.at(rank).AllReduce(&value, 1, DataType::kFloat32, ReduceOp::kMax,
                                              "", 7));
      if (value != static_cast<float>(2 + i)) return InternalError("wrong max");
      RETURN_IF_ERROR(ring.at(rank).Barrier(7));
    }
    return OkStatus();
  });
  EXPECT_TRUE(AllOk(results, ring.AllRanks()));
  EXPECT_TRUE(NothingKept(ring));
}

// ---------------------------------------------------------------------------------------------
// Disagreements: every rank fails, naming the peer, long before the deadline

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

// Runs body(rank) on every rank of `ring` and checks that each one failed with `code` well
// before the 30 s deadline.
std::vector<Status> RunExpectingFailures(TestRing& ring, StatusCode code,
                                         const std::function<Status(int)>& body) {
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.RunAll(body);
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(10000))
      << "the failure must travel round the ring, not wait for the deadline";
  for (int rank = 0; rank < ring.world(); ++rank) {
    EXPECT_EQ(results[rank].code(), code) << "rank " << rank << ": " << results[rank];
  }
  return results;
}

// Ranks 0 and 1 all-reduce 10 elements, rank 2 12. Rank 0 and rank 2 see the difference in
// their predecessor's frames; rank 1, whose predecessor agrees with it, hears of it from rank 0.
TEST(RingCollectivesMismatchTest, AnotherCountFailsEveryRankNamingThePeer) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers = {Bytes(40), Bytes(40), Bytes(48)};
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), buffers[rank].size() / 4,
                                   DataType::kFloat32, ReduceOp::kSum, "layer3.w", 5);
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("allreduce tag=5 tensor=layer3.w rank=0: the frame from worker 2 (step 0) "
                        "is for a buffer of 12 elements; this rank's has 10"));
  EXPECT_THAT(results[2].message(),
              HasSubstr("allreduce tag=5 tensor=layer3.w rank=2: the frame from worker 1 (step 0) "
                        "is for a buffer of 10 elements; this rank's has 12"));
  EXPECT_THAT(results[1].message(),
              StartsWith("allreduce tag=5 tensor=layer3.w rank=1: worker 0 reported a failure: "
                         "allreduce tag=5 tensor=layer3.w rank=0: the frame from worker 2"));
}

TEST(RingCollectivesMismatchTest, AnotherReduceOpFailsEveryRankNamingThePeer) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   rank == 1 ? ReduceOp::kMax : ReduceOp::kSum, "w", 6);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("rank=1: the frame from worker 0 (step 0) reduces with sum; this rank "
                        "with max"));
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the frame from worker 1 (step 0) reduces with max; this rank "
                        "with sum"));
  EXPECT_THAT(results[0].message(),
              AllOf(StartsWith("allreduce tag=6 tensor=w rank=0: worker 2 reported a failure: "),
                    HasSubstr("rank=2: the frame from worker 1")));
}

TEST(RingCollectivesMismatchTest, AnotherDTypeFailsEveryRankNamingThePeer) {
  TestRing ring(2, Over());
  std::vector<Bytes> buffers(2, Bytes(4 * 64));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 64,
                                   rank == 0 ? DataType::kFloat16 : DataType::kFloat32,
                                   ReduceOp::kSum, "", 7);
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("allreduce tag=7 rank=0: the frame from worker 1 (step 0) holds float32 "
                        "elements; this rank's are float16"));
  EXPECT_THAT(results[1].message(), HasSubstr("rank=1: the frame from worker 0"));
}

TEST(RingCollectivesMismatchTest, AnotherCollectiveUnderTheSameTagFailsEveryRank) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    if (rank == 1) {
      return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32, 0, "w", 8);
    }
    return ring.at(rank).AllReduce(buffers[rank].data(), 30, DataType::kFloat32, ReduceOp::kSum,
                                   "w", 8);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("broadcast tag=8 tensor=w rank=1: the frame from worker 0 (step 0) comes "
                        "from a call of allreduce; this rank calls broadcast"));
  EXPECT_THAT(results[2].message(), HasSubstr("rank=2: worker 1 reported a failure: broadcast"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure: broadcast"));
}

TEST(RingCollectivesMismatchTest, AnotherBroadcastRootFailsEveryRankTheRootIncluded) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32,
                                   rank == 2 ? 1 : 0, "w", 9);
  });
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the frame from worker 1 (step 0) is root worker 0's elements "
                        "[0, 30), expected root worker 1's elements [0, 30): do all ranks "
                        "broadcast from the same root?"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure"));
  EXPECT_THAT(results[1].message(), HasSubstr("rank=1: worker 0 reported a failure"));
}

TEST(RingCollectivesMismatchTest, AnotherCountInABroadcastFailsTheRootToo) {
  TestRing ring(4, Over());
  std::vector<Bytes> buffers(4, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), rank == 2 ? 29 : 30, DataType::kFloat32,
                                   0, "w", 10);
  });
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the frame from worker 1 (step 0) is for a buffer of 30 "
                        "elements; this rank's has 29"));
  EXPECT_THAT(results[3].message(),
              HasSubstr("rank=3: worker 2 reported a failure: broadcast tag=10 tensor=w rank=2"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 3 reported a failure"));
}

TEST(RingCollectivesMismatchTest, AnotherSegmentSizeFailsEveryRank) {
  TestRing ring(3, Over());
  ring.Remake(1, 512, kTestTimeoutMs);
  std::vector<Bytes> buffers(3, Bytes(4 * 3000));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 3000, DataType::kFloat32,
                                   ReduceOp::kSum, "w", 11);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("rank=1: the frame from worker 0 (step 0, segment 0 of 8) is block 2 "
                        "elements [2000, 2250), expected block 2 elements [2000, 2125): do all "
                        "ranks use the same segment_bytes and one_shot_max_bytes?"));
  EXPECT_THAT(results[2].message(), HasSubstr("rank=2: the frame from worker 1"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure"));
}

// Rank 1 all-reduces a small buffer by the ring's steps, its peers by the one-shot algorithm:
// every rank fails, the ranks that see the other algorithm's frames naming the setting.
TEST(RingCollectivesMismatchTest, AnotherOneShotThresholdFailsEveryRank) {
  TestRing ring(3, Over());
  RingCollectivesOptions options = ring.Options(1, kTestSegmentBytes, kTestTimeoutMs);
  options.one_shot_max_bytes = 0;
  auto ring_only = RingCollectives::Create(options);
  ASSERT_TRUE(ring_only.ok()) << ring_only.status();
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    Collectives& collectives = rank == 1 ? **ring_only : ring.at(rank);
    return collectives.AllReduce(buffers[rank].data(), 30, DataType::kFloat32, ReduceOp::kSum,
                                 "w", 12);
  });
  for (int rank : {1, 2}) {
    EXPECT_THAT(results[rank].message(),
                HasSubstr("do all ranks use the same segment_bytes and one_shot_max_bytes?"));
  }
}

// Every rank rejects an average of integers itself, before it sends a byte.
TEST(RingCollectivesMismatchTest, AnAverageOfIntegersFailsOnEveryRank) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 30, DataType::kInt32,
                                   ReduceOp::kAverage, "steps", 13);
  });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].message(),
              "allreduce tag=13 tensor=steps rank=" + std::to_string(rank) +
                  ": average needs a floating-point dtype (float32, float64, float16 or "
                  "bfloat16), not int32");
  }
}

// A rank that rejects its own arguments tells the others rather than leaving them to time out.
TEST(RingCollectivesMismatchTest, BadArgumentsOnOneRankFailEveryRank) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32,
                                   rank == 1 ? 7 : 0, "w", 12);
  });
  EXPECT_EQ(results[1].message(),
            "broadcast tag=12 tensor=w rank=1: root 7 is not a rank in [0, 3)");
  EXPECT_EQ(results[2].message(),
            "broadcast tag=12 tensor=w rank=2: worker 1 reported a failure: " +
                results[1].message());
  EXPECT_EQ(results[0].message(),
            "broadcast tag=12 tensor=w rank=0: worker 2 reported a failure: " +
                results[1].message());
}

// ---------------------------------------------------------------------------------------------
// Silent and failed peers

// Worker 0 never takes part. Its successor, worker 1, waits for it until its deadline and says
// so; worker 2, which waits for worker 1, hears of it from worker 1 (its own deadline is later,
// so that the test is deterministic) and quotes the root cause.
TEST(RingCollectivesFailureTest, SilentPeerTimesOutNamingIt) {
  TestRing ring(3, Over());
  constexpr int64_t kShortMs = 500;
  ring.Remake(1, kTestSegmentBytes, kShortMs);
  ring.Remake(2, kTestSegmentBytes, 20000);
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 3);
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[1].code(), StatusCode::kDeadlineExceeded) << results[1];
  EXPECT_EQ(results[1].message(),
            "allreduce tag=3 tensor=test.w rank=1: no frame from worker 0 (step 0) within 500 ms");
  EXPECT_EQ(results[2].code(), StatusCode::kDeadlineExceeded) << results[2];
  EXPECT_EQ(results[2].message(),
            "allreduce tag=3 tensor=test.w rank=2: worker 1 reported a failure: " +
                results[1].message());
  // Both dropped what the other sent under the failed tag.
  EXPECT_EQ(ring.channel(1).kept(), 0u);
  EXPECT_EQ(ring.channel(2).kept(), 0u);
}

// The same with equal deadlines: worker 2 either times out itself or hears from worker 1 first;
// either way within the deadline, naming worker 1.
TEST(RingCollectivesFailureTest, SilentPeerWithEqualDeadlines) {
  constexpr int64_t kShortMs = 300;
  TestRing ring(4, Over(kTestSegmentBytes, kShortMs));
  std::vector<Bytes> buffers(4, Bytes(4 * 5000));
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({0, 1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 5000, DataType::kFloat32,
                                   ReduceOp::kSum, "", 4);
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[0].message(),
            "allreduce tag=4 rank=0: no frame from worker 3 (step 0, segment 0 of 5) within "
            "300 ms");
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].code(), StatusCode::kDeadlineExceeded) << results[rank];
    EXPECT_THAT(results[rank].message(), HasSubstr("worker " + std::to_string(rank - 1)));
  }
}

TEST(RingCollectivesFailureTest, SilentBroadcastRootTimesOutNamingIt) {
  constexpr int64_t kShortMs = 300;
  TestRing ring(3, Over(kTestSegmentBytes, kShortMs));
  ring.Remake(2, kTestSegmentBytes, 20000);
  std::vector<Bytes> buffers(3, Bytes(4 * 10));
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 10, DataType::kFloat32, 0, "p", 5);
  });
  EXPECT_EQ(results[1].message(),
            "broadcast tag=5 tensor=p rank=1: no frame from worker 0 (step 0) within 300 ms");
  EXPECT_EQ(results[2].message(),
            "broadcast tag=5 tensor=p rank=2: worker 1 reported a failure: " +
                results[1].message());
}

// Worker 2 never enters. Worker 0, its successor, times out naming it; worker 1 (a later
// deadline) hears of it from worker 0.
TEST(RingCollectivesFailureTest, SilentPeerInABarrier) {
  constexpr int64_t kShortMs = 300;
  TestRing ring(3, Over(kTestSegmentBytes, kShortMs));
  ring.Remake(1, kTestSegmentBytes, 20000);
  auto started = SteadyClock::now();
  std::vector<Status> results =
      ring.Run({0, 1}, [&](int rank) { return ring.at(rank).Barrier(6); });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[0].message(),
            "barrier tag=6 rank=0: no frame from worker 2 (step 0) within 300 ms");
  EXPECT_EQ(results[1].message(),
            "barrier tag=6 rank=1: worker 0 reported a failure: " + results[0].message());
}

// The coordinator's failure notice reaches every survivor's FailureBus (worker_main wires it
// through RendezvousClient::SetFailureCallback), which wakes the channel's waiters: all of them
// fail at once, quoting it. (Worker 2's bus fails first: otherwise worker 1's abort notice may
// reach worker 2 before the coordinator's does, and worker 2 quotes the same root cause through
// worker 1.)
TEST(RingCollectivesFailureTest, FailureNoticeWakesEverySurvivorWithTheRootCause) {
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  auto started = SteadyClock::now();
  std::thread coordinator([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int rank : {2, 1}) {
      ring.failures(rank).Fail(
          AbortedError("worker 0 (tcp://127.0.0.1:1234) failed: no heartbeat for 10000 ms"));
    }
  });
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 4);
  });
  coordinator.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].code(), StatusCode::kAborted) << results[rank];
    EXPECT_THAT(results[rank].message(), HasSubstr("allreduce tag=4 tensor=test.w rank=" +
                                                   std::to_string(rank) + ": waiting for worker"));
    EXPECT_THAT(results[rank].message(), HasSubstr("worker 0 (tcp://127.0.0.1:1234) failed"));
  }
}

// Over a direct channel: worker 0's process dies (its sockets close, or its shared-memory
// channel is marked closed) while workers 1 and 2 are in a call. Worker 1 fails at once naming
// it; worker 2 hears of it from worker 1.
TEST(RingCollectivesFailureTest, APeerThatDiesMidCallFailsEverySurvivorNamingIt) {
  if (OverTheTransport()) GTEST_SKIP() << "the transport has no connection to lose";
  TestRing ring(3, Over());
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  std::thread dies([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ring.CloseChannel(0);
  });
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 4);
  });
  dies.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  EXPECT_EQ(results[1].code(), StatusCode::kUnavailable) << results[1];
  EXPECT_THAT(results[1].message(),
              AllOf(StartsWith(std::string("allreduce tag=4 tensor=test.w rank=1: waiting for "
                                           "worker 0 (step 0): ") +
                               (Channel() == "shm" ? "ring shm from worker 0 (pid "
                                        : "ring link from worker 0 (tcp://127.0.0.1:")),
                    HasSubstr("closed by the peer")));
  EXPECT_EQ(results[2].code(), StatusCode::kUnavailable) << results[2];
  EXPECT_EQ(results[2].message(),
            "allreduce tag=4 tensor=test.w rank=2: worker 1 reported a failure: " +
                results[1].message());
}

// ---------------------------------------------------------------------------------------------
// Options and arguments

TEST(RingCollectivesTest, RejectsOptionsThatCannotWork) {
  TestRing ring(2, Over());
  auto error = [&](const std::function<void(RingCollectivesOptions&)>& change) {
    RingCollectivesOptions options = ring.Options(0, kTestSegmentBytes, 1000);
    change(options);
    auto created = RingCollectives::Create(options);
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
    return created.status().message();
  };
  EXPECT_EQ(error([](auto& o) { o.rank = 2; }), "ring collectives: rank 2 is not in [0, 2)");
  EXPECT_EQ(error([](auto& o) { o.rank = -1; }), "ring collectives: rank -1 is not in [0, 2)");
  EXPECT_EQ(error([](auto& o) { o.world_size = 0; }),
            "ring collectives: world_size 0 is not at least 1");
  EXPECT_EQ(error([](auto& o) { o.channel = nullptr; }), "ring collectives: channel is null");
  EXPECT_EQ(error([&](auto& o) { o.channel = ring.Options(1, 1, 1).channel; }),
            "ring collectives: the channel is rank 1's, not rank 0's");
  EXPECT_EQ(error([](auto& o) { o.timeout_ms = 0; }),
            "ring collectives: timeout_ms 0 is not positive");
  EXPECT_EQ(error([](auto& o) { o.segment_bytes = 0; }),
            "ring collectives: segment_bytes 0 is not in [1, 67108864]");
  EXPECT_EQ(error([](auto& o) { o.segment_bytes = kMaxSegmentBytes + 1; }),
            "ring collectives: segment_bytes 67108865 is not in [1, 67108864]");
  // A world of one needs no channel.
  EXPECT_TRUE(RingCollectives::Create(RingCollectivesOptions()).ok());
}

TEST(RingCollectivesTest, RejectsBadArguments) {
  auto alone = RingCollectives::Create(RingCollectivesOptions());
  ASSERT_TRUE(alone.ok()) << alone.status();
  RingCollectives& c = **alone;
  std::vector<float> buffer(8);
  EXPECT_EQ(c.AllReduce(nullptr, 3, DataType::kFloat32, ReduceOp::kSum, "w", 1).message(),
            "allreduce tag=1 tensor=w rank=0: data is null but should hold 3 elements");
  EXPECT_TRUE(c.AllReduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum, "w", 1).ok());
  EXPECT_EQ(c.AllReduce(buffer.data(), 8, static_cast<DataType>(9), ReduceOp::kSum, "", 2)
                .message(),
            "allreduce tag=2 rank=0: unknown dtype 9");
  EXPECT_EQ(c.ReduceScatter(buffer.data(), buffer.data(), 8, DataType::kFloat32,
                            static_cast<ReduceOp>(7), "", 3)
                .message(),
            "reducescatter tag=3 rank=0: unknown reduce op 7");
  // Averages are of floating-point elements only, whatever the world.
  EXPECT_EQ(c.AllReduce(buffer.data(), 8, DataType::kInt32, ReduceOp::kAverage, "", 2).message(),
            "allreduce tag=2 rank=0: average needs a floating-point dtype (float32, float64, "
            "float16 or bfloat16), not int32");
  EXPECT_EQ(c.ReduceScatter(buffer.data(), buffer.data(), 32, DataType::kBool,
                            ReduceOp::kAverage, "", 3)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.ReduceScatter(buffer.data(), buffer.data(), 32, DataType::kUInt8, ReduceOp::kMax,
                              "", 3)
                  .ok());
  EXPECT_EQ(c.Broadcast(buffer.data(), 8, DataType::kFloat32, 1, "", 4).message(),
            "broadcast tag=4 rank=0: root 1 is not a rank in [0, 1)");
  EXPECT_EQ(c.AllGather(buffer.data() + 1, buffer.data(), 4, DataType::kFloat32, "", 5).message(),
            "allgather tag=5 rank=0: input and output overlap, but not in place (this rank's "
            "partition of 4 elements starts at element 0 of the whole buffer)");
  // In place is fine, and a world of one copies.
  EXPECT_TRUE(c.AllGather(buffer.data(), buffer.data(), 8, DataType::kFloat32, "", 6).ok());
  std::vector<float> in = {1, 2, 3}, out(3);
  EXPECT_TRUE(c.ReduceScatter(in.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kAverage,
                              "", 7).ok());
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace tessera::worker
