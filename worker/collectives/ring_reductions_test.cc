// All-reduce and reduce-scatter for every dtype and reduce op (collectives.h's table) against
// the naive reference of ring_test_harness.h, and the corners of that table: integers wrap
// around, a bool sum is an or, NaN wins a max, and every rank rejects an average of integers.
// Over in-process transports (the zmq channel without sockets), which keeps the matrix fast:
// the arithmetic is the same whatever the channel, and ring_collectives_test.cc runs every
// dtype and op once over each real channel.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "worker/collectives/ring_collectives.h"
#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

TestRingOptions InProcess() {
  TestRingOptions options;
  options.in_process = true;
  return options;
}

// Whether collectives.h defines `op` for `dtype` (an average only for floating types).
bool Defined(DataType dtype, ReduceOp op) {
  return op != ReduceOp::kAverage || IsFloatingPoint(dtype);
}

// Every rank's buffer of `values` (one vector per rank) as `T`s.
template <typename T>
std::vector<Bytes> BuffersOf(const std::vector<std::vector<T>>& values) {
  std::vector<Bytes> buffers;
  for (const std::vector<T>& rank : values) {
    Bytes bytes(rank.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), rank.data(), bytes.size());
    buffers.push_back(std::move(bytes));
  }
  return buffers;
}

template <typename T>
std::vector<T> ValuesOf(const Bytes& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// All-reduces every rank's buffer of `buffers` in place; whether every rank succeeded.
bool AllReduce(TestRing& ring, std::vector<Bytes>& buffers, size_t count, DataType dtype,
               ReduceOp op) {
  const uint64_t tag = ring.NextTag();
  return AllOk(ring.RunAll([&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "t", tag);
  }), ring.AllRanks());
}

// ---------------------------------------------------------------------------------------------
// Every dtype x every op x lengths 0, 1, odd, large (several segments per block for every
// dtype), worlds 1, 2, 3, 5

class RingReductionsWorld : public ::testing::TestWithParam<int> {};

TEST_P(RingReductionsWorld, EveryDTypeAndOpMatchesTheReference) {
  const int world = GetParam();
  TestRing ring(world, InProcess());
  ASSERT_TRUE(ring.ok());
  for (size_t count : {size_t{0}, size_t{1}, size_t{97}, size_t{10007}}) {
    for (DataType dtype : kAllDTypes) {
      const size_t bytes = DataTypeSize(dtype);
      for (ReduceOp op : kAllOps) {
        if (!Defined(dtype, op)) continue;
        const std::string what = Describe(count, dtype, op);
        SCOPED_TRACE(what);
        const std::vector<Bytes> inputs = Inputs(dtype, world, count, ring.NextTag());

        std::vector<Bytes> reduced = inputs;
        ASSERT_TRUE(AllReduce(ring, reduced, count, dtype, op));
        ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, reduced[0].data(),
                                     "allreduce " + what));
        for (int rank = 1; rank < world; ++rank) {
          ASSERT_EQ(reduced[rank], reduced[0]) << "every rank gets the same bits; rank " << rank;
        }

        for (bool in_place : {false, true}) {
          const uint64_t tag = ring.NextTag();
          std::vector<Bytes> in = inputs;
          std::vector<Bytes> out(world);
          for (int rank = 0; rank < world; ++rank) {
            out[rank].assign(PartitionOf(count, world, rank).size * bytes, 0xab);
          }
          auto output = [&](int rank) {
            return in_place ? in[rank].data() + PartitionOf(count, world, rank).offset * bytes
                            : out[rank].data();
          };
          ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
            return ring.at(rank).ReduceScatter(in[rank].data(), output(rank), count, dtype, op,
                                               "t", tag);
          }), ring.AllRanks()));
          for (int rank = 0; rank < world; ++rank) {
            const Partition own = PartitionOf(count, world, rank);
            ASSERT_TRUE(MatchesReference(dtype, op, inputs, own.offset, own.size, output(rank),
                                         std::string("reducescatter ") +
                                             (in_place ? "in place " : "") + what + " rank " +
                                             std::to_string(rank)));
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

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingReductionsWorld, ::testing::Values(1, 2, 3, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// The one-shot all-reduce (small buffers) against the ring's reduce-scatter and all-gather: the
// same bits for every dtype and op, worlds 2 to 5, lengths that leave blocks empty or uneven,
// with the rings in a rank order of their own too (interleaved hosts: 0, 2, 4, 1, 3).

class OneShotWorld : public ::testing::TestWithParam<int> {};

TEST_P(OneShotWorld, GivesTheRingsBitsForEveryDTypeAndOp) {
  const int world = GetParam();
  for (bool interleaved : {false, true}) {
    TestRingOptions options = InProcess();
    options.segment_bytes = 1 << 20;  // a single segment per block for the ring too
    options.one_shot_max_bytes = 0;
    if (interleaved) {
      options.in_process = false;
      options.interleaved_hosts = true;
    }
    TestRing ring(world, options);
    options.one_shot_max_bytes = options.segment_bytes;
    TestRing one_shot(world, options);
    ASSERT_TRUE(ring.ok() && one_shot.ok());
    for (size_t count : {size_t{1}, static_cast<size_t>(world) - 1, size_t{97}, size_t{1009}}) {
      for (DataType dtype : kAllDTypes) {
        for (ReduceOp op : kAllOps) {
          if (!Defined(dtype, op)) continue;
          const std::string what = Describe(count, dtype, op) +
                                    (interleaved ? ", interleaved hosts" : "");
          SCOPED_TRACE(what);
          const std::vector<Bytes> inputs = Inputs(dtype, world, count, ring.NextTag());
          std::vector<Bytes> by_ring = inputs, by_one_shot = inputs;
          ASSERT_TRUE(AllReduce(ring, by_ring, count, dtype, op));
          ASSERT_TRUE(AllReduce(one_shot, by_one_shot, count, dtype, op));
          for (int rank = 0; rank < world; ++rank) {
            ASSERT_EQ(by_one_shot[rank], by_ring[rank]) << "rank " << rank;
          }
        }
      }
    }
    EXPECT_TRUE(NothingKept(one_shot));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, OneShotWorld, ::testing::Values(2, 3, 4, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// The corners

// Sums and products of integers wrap around (two's complement), as torch's do; max and min are
// exact at the ends of the range.
TEST(RingReductionsTest, IntegerSumsAndProductsWrapAround) {
  TestRing ring(3, InProcess());
  ASSERT_TRUE(ring.ok());
  {
    // Element by element: 127 + 1 + 0, 100 * 3, -128 - 1 + 0, 16 * 16 * 2, -128 * -1 * 1.
    std::vector<Bytes> sums = BuffersOf<int8_t>({{127, 100, -128}, {1, 100, -1}, {0, 100, 0}});
    ASSERT_TRUE(AllReduce(ring, sums, 3, DataType::kInt8, ReduceOp::kSum));
    EXPECT_EQ(ValuesOf<int8_t>(sums[1]), (std::vector<int8_t>{-128, 44, 127}));
    std::vector<Bytes> products = BuffersOf<int8_t>({{16, -128}, {16, -1}, {2, 1}});
    ASSERT_TRUE(AllReduce(ring, products, 2, DataType::kInt8, ReduceOp::kProduct));
    EXPECT_EQ(ValuesOf<int8_t>(products[2]), (std::vector<int8_t>{0, -128}));
  }
  {
    std::vector<Bytes> sums = BuffersOf<uint8_t>({{255, 200}, {1, 100}, {0, 0}});
    ASSERT_TRUE(AllReduce(ring, sums, 2, DataType::kUInt8, ReduceOp::kSum));
    EXPECT_EQ(ValuesOf<uint8_t>(sums[0]), (std::vector<uint8_t>{0, 44}));
    std::vector<Bytes> products = BuffersOf<uint8_t>({{16, 255}, {16, 255}, {1, 255}});
    ASSERT_TRUE(AllReduce(ring, products, 2, DataType::kUInt8, ReduceOp::kProduct));
    EXPECT_EQ(ValuesOf<uint8_t>(products[0]), (std::vector<uint8_t>{0, 255}));  // 255^3 mod 256
  }
  {
    constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
    constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
    std::vector<Bytes> sums = BuffersOf<int32_t>({{kMax, kMin}, {1, -1}, {0, 0}});
    ASSERT_TRUE(AllReduce(ring, sums, 2, DataType::kInt32, ReduceOp::kSum));
    EXPECT_EQ(ValuesOf<int32_t>(sums[0]), (std::vector<int32_t>{kMin, kMax}));
    std::vector<Bytes> products = BuffersOf<int32_t>({{65536, kMin}, {65536, -1}, {3, 1}});
    ASSERT_TRUE(AllReduce(ring, products, 2, DataType::kInt32, ReduceOp::kProduct));
    EXPECT_EQ(ValuesOf<int32_t>(products[0]), (std::vector<int32_t>{0, kMin}));
    std::vector<Bytes> maxima = BuffersOf<int32_t>({{kMin, -1}, {kMax, kMin}, {-1, -2}});
    ASSERT_TRUE(AllReduce(ring, maxima, 2, DataType::kInt32, ReduceOp::kMax));
    EXPECT_EQ(ValuesOf<int32_t>(maxima[1]), (std::vector<int32_t>{kMax, -1}));
    std::vector<Bytes> minima = BuffersOf<int32_t>({{kMin, 1}, {kMax, kMax}, {-1, 0}});
    ASSERT_TRUE(AllReduce(ring, minima, 2, DataType::kInt32, ReduceOp::kMin));
    EXPECT_EQ(ValuesOf<int32_t>(minima[1]), (std::vector<int32_t>{kMin, 0}));
  }
  {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    std::vector<Bytes> sums = BuffersOf<int64_t>({{kMax, kMin}, {1, -1}, {0, 0}});
    ASSERT_TRUE(AllReduce(ring, sums, 2, DataType::kInt64, ReduceOp::kSum));
    EXPECT_EQ(ValuesOf<int64_t>(sums[2]), (std::vector<int64_t>{kMin, kMax}));
    const int64_t two_to_32 = int64_t{1} << 32;
    std::vector<Bytes> products =
        BuffersOf<int64_t>({{two_to_32, kMax}, {two_to_32, kMax}, {3, 1}});
    ASSERT_TRUE(AllReduce(ring, products, 2, DataType::kInt64, ReduceOp::kProduct));
    EXPECT_EQ(ValuesOf<int64_t>(products[1]), (std::vector<int64_t>{0, 1}));  // (2^63 - 1)^2
  }
  EXPECT_TRUE(NothingKept(ring));
}

// bool: a sum or a max is an or, a product or a min an and (what torch's Gloo backend gives).
TEST(RingReductionsTest, BoolSumAndMaxAreOrProductAndMinAreAnd) {
  TestRing ring(3, InProcess());
  ASSERT_TRUE(ring.ok());
  // Element e holds bit q of e on rank q: every combination of three bools.
  std::vector<Bytes> inputs(3, Bytes(8));
  for (int q = 0; q < 3; ++q) {
    for (int e = 0; e < 8; ++e) inputs[q][e] = (e >> q) & 1;
  }
  const Bytes any = {0, 1, 1, 1, 1, 1, 1, 1}, all = {0, 0, 0, 0, 0, 0, 0, 1};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kMin}) {
    SCOPED_TRACE(ReduceOpName(op));
    std::vector<Bytes> buffers = inputs;
    ASSERT_TRUE(AllReduce(ring, buffers, 8, DataType::kBool, op));
    const Bytes& want = op == ReduceOp::kSum || op == ReduceOp::kMax ? any : all;
    for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(buffers[rank], want) << "rank " << rank;
  }
  EXPECT_TRUE(NothingKept(ring));
}

// A NaN on any rank wins a max and a min (and a sum and a product, as IEEE arithmetic does), in
// every floating dtype, whichever rank holds it.
TEST(RingReductionsTest, NaNWinsInEveryFloatingDType) {
  constexpr int kWorld = 3;
  TestRing ring(kWorld, InProcess());
  ASSERT_TRUE(ring.ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                         DataType::kBFloat16}) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(Describe(4, dtype, op));
      // Element e's NaN is on rank e (element 3 has none): 1, 2, 3 elsewhere.
      std::vector<Bytes> buffers(kWorld, Bytes(4 * DataTypeSize(dtype)));
      for (int q = 0; q < kWorld; ++q) {
        for (size_t e = 0; e < 4; ++e) {
          const double value = static_cast<int>(e) == q ? nan : q + 1;
          if (dtype == DataType::kFloat64) {
            std::memcpy(buffers[q].data() + 8 * e, &value, 8);
          } else {
            Set(dtype, buffers[q].data(), e, static_cast<float>(value));
          }
        }
      }
      ASSERT_TRUE(AllReduce(ring, buffers, 4, dtype, op));
      for (int rank = 0; rank < kWorld; ++rank) {
        for (size_t e = 0; e < 4; ++e) {
          double got;
          if (dtype == DataType::kFloat64) {
            std::memcpy(&got, buffers[rank].data() + 8 * e, 8);
          } else {
            got = Get(dtype, buffers[rank].data(), e);
          }
          EXPECT_EQ(std::isnan(got), e < 3) << "rank " << rank << " element " << e << ": " << got;
        }
      }
    }
  }
  EXPECT_TRUE(NothingKept(ring));
}

// float64 is combined in double, never through float: values float cannot hold (beyond its
// range, or needing more than its 24 bits) come out exact.
TEST(RingReductionsTest, Float64IsCombinedInDouble) {
  TestRing ring(2, InProcess());
  ASSERT_TRUE(ring.ok());
  const double tiny = std::ldexp(1.0, -40);
  std::vector<Bytes> sums = BuffersOf<double>({{1e300, 1.0, 1e-300}, {1e300, tiny, 1e-300}});
  ASSERT_TRUE(AllReduce(ring, sums, 3, DataType::kFloat64, ReduceOp::kSum));
  EXPECT_EQ(ValuesOf<double>(sums[0]),
            (std::vector<double>{1e300 + 1e300, 1.0 + tiny, 1e-300 + 1e-300}));
  std::vector<Bytes> averages = BuffersOf<double>({{1e300, 1.0}, {3e300, tiny}});
  ASSERT_TRUE(AllReduce(ring, averages, 2, DataType::kFloat64, ReduceOp::kAverage));
  EXPECT_EQ(ValuesOf<double>(averages[1]),
            (std::vector<double>{(1e300 + 3e300) / 2, (1.0 + tiny) / 2}));
  std::vector<Bytes> products = BuffersOf<double>({{1e200, 1.0 + tiny}, {1e-250, 1.0 - tiny}});
  ASSERT_TRUE(AllReduce(ring, products, 2, DataType::kFloat64, ReduceOp::kProduct));
  EXPECT_EQ(ValuesOf<double>(products[0]),
            (std::vector<double>{1e200 * 1e-250, (1.0 + tiny) * (1.0 - tiny)}));
  EXPECT_TRUE(NothingKept(ring));
}

// An average of integers or bools is no average torch offers: every rank rejects it itself,
// naming the dtype, at once (before it sends anything), in every world.
TEST(RingReductionsTest, AnAverageOfANonFloatingDTypeFailsOnEveryRank) {
  for (int world : {1, 3}) {
    TestRing ring(world, InProcess());
    ASSERT_TRUE(ring.ok());
    for (DataType dtype : kAllDTypes) {
      if (IsFloatingPoint(dtype)) continue;
      for (CollectiveOp collective : {CollectiveOp::kAllReduce, CollectiveOp::kReduceScatter}) {
        SCOPED_TRACE(std::string(CollectiveOpName(collective)) + " world " +
                     std::to_string(world) + " " + std::string(DataTypeName(dtype)));
        const uint64_t tag = ring.NextTag();
        std::vector<Bytes> buffers = Inputs(dtype, world, 30, tag);
        const auto started = SteadyClock::now();
        std::vector<Status> results = ring.RunAll([&](int rank) {
          uint8_t* data = buffers[rank].data();
          if (collective == CollectiveOp::kAllReduce) {
            return ring.at(rank).AllReduce(data, 30, dtype, ReduceOp::kAverage, "steps", tag);
          }
          uint8_t* own = data + PartitionOf(30, world, rank).offset * DataTypeSize(dtype);
          return ring.at(rank).ReduceScatter(data, own, 30, dtype, ReduceOp::kAverage, "steps",
                                             tag);
        });
        EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
        for (int rank = 0; rank < world; ++rank) {
          EXPECT_EQ(results[rank].code(), StatusCode::kInvalidArgument) << results[rank];
          EXPECT_EQ(results[rank].message(),
                    std::string(CollectiveOpName(collective)) + " tag=" + std::to_string(tag) +
                        " tensor=steps rank=" + std::to_string(rank) +
                        ": average needs a floating-point dtype (float32, float64, float16 or "
                        "bfloat16), not " + std::string(DataTypeName(dtype)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::worker
