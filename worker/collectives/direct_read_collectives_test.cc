// DirectReadCollectives with its ranks as threads of this process (cross-memory attach works
// between them as between processes), over the ring of in-process transports as its control:
// every collective, dtype and reduce op at worlds 1, 2, 3, 5 and 8 against the naive reference
// of ring_test_harness.h, lengths below, at and above the world size and several chunks long;
// and disagreements, which fail every rank. direct_read_process_test.cc runs separate
// processes.
#include "worker/collectives/direct_read_collectives.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

// Small chunks, so that a slice of a few hundred elements is read in several.
constexpr size_t kTestChunkBytes = 64;

bool Defined(DataType dtype, ReduceOp op) {
  return op != ReduceOp::kAverage || IsFloatingPoint(dtype);
}

// A TestRing (the control) and a DirectReadCollectives per rank over it, probed.
class DirectRing {
 public:
  explicit DirectRing(int world) : ring_(world, InProcess()), direct_(world) {
    if (!ring_.ok()) return;
    const uint64_t tag = ring_.NextTag();
    ok_ = AllOk(ring_.RunAll([&](int rank) {
      DirectReadCollectivesOptions options;
      options.rank = rank;
      options.world_size = world;
      options.control = &ring_.at(rank);
      options.chunk_bytes = kTestChunkBytes;
      options.timeout_ms = kTestTimeoutMs;
      ASSIGN_OR_RETURN(direct_[rank], ConnectDirectReads(options, tag));
      if (direct_[rank] == nullptr) return InternalError("direct reads refused in one process");
      return OkStatus();
    }), ring_.AllRanks());
  }

  bool ok() const { return ok_; }
  TestRing& ring() { return ring_; }
  Collectives& at(int rank) { return *direct_[rank]; }

 private:
  static TestRingOptions InProcess() {
    TestRingOptions options;
    options.in_process = true;
    return options;
  }

  TestRing ring_;
  std::vector<std::unique_ptr<DirectReadCollectives>> direct_;
  bool ok_ = false;
};

std::vector<size_t> Lengths(int world) {
  std::vector<size_t> lengths = AwkwardLengths(world);
  lengths.push_back(1000);  // dozens of chunks per slice
  return lengths;
}

class DirectReadWorld : public ::testing::TestWithParam<int> {};

TEST_P(DirectReadWorld, AllReduceMatchesTheReferenceForEveryDTypeAndOp) {
  const int world = GetParam();
  DirectRing direct(world);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  for (size_t count : Lengths(world)) {
    for (DataType dtype : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (!Defined(dtype, op)) continue;
        const std::string what = Describe(count, dtype, op) + ", world " + std::to_string(world);
        const std::vector<Bytes> inputs = Inputs(dtype, world, count, count + 7);
        std::vector<Bytes> buffers = inputs;
        const uint64_t tag = ring.NextTag();
        ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
          return direct.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "t", tag);
        }), ring.AllRanks())) << what;
        for (int rank = 0; rank < world; ++rank) {
          ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, buffers[rank].data(),
                                       what + ", rank " + std::to_string(rank)));
          ASSERT_EQ(buffers[rank], buffers[0]) << what << ": ranks differ";
        }
      }
    }
  }
}

TEST_P(DirectReadWorld, ReduceScatterMatchesTheReferenceForEveryDTypeAndOp) {
  const int world = GetParam();
  DirectRing direct(world);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  for (size_t count : Lengths(world)) {
    for (DataType dtype : kAllDTypes) {
      const size_t bytes = DataTypeSize(dtype);
      for (ReduceOp op : kAllOps) {
        if (!Defined(dtype, op)) continue;
        for (bool in_place : {false, true}) {
          const std::string what = Describe(count, dtype, op) + ", world " +
                                   std::to_string(world) + (in_place ? ", in place" : "");
          const std::vector<Bytes> inputs = Inputs(dtype, world, count, count + 11);
          std::vector<Bytes> buffers = inputs;
          std::vector<Bytes> outputs(world);
          const uint64_t tag = ring.NextTag();
          ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
            const Partition own = PartitionOf(count, world, rank);
            outputs[rank].assign(own.size * bytes + 1, 0);
            uint8_t* out = in_place ? buffers[rank].data() + own.offset * bytes
                                    : outputs[rank].data();
            return direct.at(rank).ReduceScatter(buffers[rank].data(), out, count, dtype, op,
                                                 "t", tag);
          }), ring.AllRanks())) << what;
          for (int rank = 0; rank < world; ++rank) {
            const Partition own = PartitionOf(count, world, rank);
            const uint8_t* got = in_place ? buffers[rank].data() + own.offset * bytes
                                          : outputs[rank].data();
            ASSERT_TRUE(MatchesReference(dtype, op, inputs, own.offset, own.size, got,
                                         what + ", rank " + std::to_string(rank)));
            if (!in_place) {
              ASSERT_EQ(buffers[rank], inputs[rank]) << what << ": input changed";
            }
          }
        }
      }
    }
  }
}

TEST_P(DirectReadWorld, AllGatherPutsEveryRanksSliceInPlace) {
  const int world = GetParam();
  DirectRing direct(world);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  for (size_t count : Lengths(world)) {
    for (DataType dtype : kAllDTypes) {
      const size_t bytes = DataTypeSize(dtype);
      for (bool in_place : {false, true}) {
        const std::string what = std::to_string(count) + " x " +
                                 std::string(DataTypeName(dtype)) + ", world " +
                                 std::to_string(world) + (in_place ? ", in place" : "");
        // The expected whole: rank q's slice from rank q's inputs.
        const std::vector<Bytes> inputs = Inputs(dtype, world, count, count + 13);
        Bytes expected(count * bytes);
        std::vector<Bytes> outputs(world, Bytes(count * bytes, 0xee));
        std::vector<Bytes> slices(world);
        for (int q = 0; q < world; ++q) {
          const Partition p = PartitionOf(count, world, q);
          if (p.size == 0) continue;
          std::memcpy(expected.data() + p.offset * bytes, inputs[q].data() + p.offset * bytes,
                      p.size * bytes);
          slices[q].assign(inputs[q].begin() + p.offset * bytes,
                           inputs[q].begin() + p.end() * bytes);
          if (in_place) {
            std::memcpy(outputs[q].data() + p.offset * bytes, slices[q].data(), p.size * bytes);
          }
        }
        const uint64_t tag = ring.NextTag();
        ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
          const Partition own = PartitionOf(count, world, rank);
          const uint8_t* in = in_place ? outputs[rank].data() + own.offset * bytes
                                       : slices[rank].data();
          return direct.at(rank).AllGather(in, outputs[rank].data(), count, dtype, "t", tag);
        }), ring.AllRanks())) << what;
        for (int rank = 0; rank < world; ++rank) {
          ASSERT_EQ(outputs[rank], expected) << what << ", rank " << rank;
        }
      }
    }
  }
}

// Sums whose rounding depends on the order of combination (16-bit floats, float32 fractions):
// direct reads give the ring's bits exactly, so a threshold never changes a result.
TEST_P(DirectReadWorld, SumsHaveTheRingsBits) {
  const int world = GetParam();
  DirectRing direct(world);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  const size_t count = 1001;
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kProduct}) {
      std::vector<Bytes> inputs = Inputs(dtype, world, count, 3);
      if (dtype == DataType::kFloat32) {
        for (int q = 0; q < world; ++q) {
          for (size_t i = 0; i < count; ++i) {
            Set(dtype, inputs[q].data(), i, 1.0f + static_cast<float>((q * 7919 + i * 104729) %
                                                                      1000) / 997.0f);
          }
        }
      }
      std::vector<Bytes> by_ring = inputs, by_reads = inputs;
      const uint64_t tag = ring.NextTag();
      ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) -> Status {
        RETURN_IF_ERROR(ring.at(rank).AllReduce(by_ring[rank].data(), count, dtype, op, "r", tag));
        return direct.at(rank).AllReduce(by_reads[rank].data(), count, dtype, op, "d", tag);
      }), ring.AllRanks()));
      for (int rank = 0; rank < world; ++rank) {
        ASSERT_EQ(by_reads[rank], by_ring[rank])
            << Describe(count, dtype, op) << ", world " << world << ", rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DirectReadWorld, ::testing::Values(1, 2, 3, 5, 8));

// A rank that calls with another count fails, and so does every other, naming it.
TEST(DirectReadTest, ACountMismatchFailsEveryRankNamingThePeer) {
  DirectRing direct(3);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  std::vector<std::vector<float>> buffers(3, std::vector<float>(64, 1.0f));
  const uint64_t tag = ring.NextTag();
  std::vector<Status> results = ring.RunAll([&](int rank) {
    const size_t count = rank == 2 ? 63 : 64;
    return direct.at(rank).AllReduce(buffers[rank].data(), count, DataType::kFloat32,
                                      ReduceOp::kSum, "w", tag);
  });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].code(), StatusCode::kInvalidArgument) << results[rank];
  }
  EXPECT_NE(results[0].message().find("worker 2 calls allreduce of 63 x float32"),
            std::string::npos) << results[0];
}

// An average of integers: every rank rejects it itself, and a rank whose arguments alone are
// wrong fails its peers at once (not at their deadline).
TEST(DirectReadTest, ARankThatRejectsItsArgumentsFailsThePeersToo) {
  DirectRing direct(2);
  ASSERT_TRUE(direct.ok());
  TestRing& ring = direct.ring();
  std::vector<std::vector<int32_t>> buffers(2, std::vector<int32_t>(16, 3));
  const uint64_t tag = ring.NextTag();
  std::vector<Status> results = ring.RunAll([&](int rank) {
    const ReduceOp op = rank == 1 ? ReduceOp::kAverage : ReduceOp::kSum;
    return direct.at(rank).AllReduce(buffers[rank].data(), 16, DataType::kInt32, op, "w", tag);
  });
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1];
  EXPECT_NE(results[1].message().find("average needs a floating-point dtype"),
            std::string::npos) << results[1];
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument) << results[0];
  EXPECT_NE(results[0].message().find("worker 1 rejected its arguments"), std::string::npos)
      << results[0];
}

// Create rejects options that cannot work, naming the field.
TEST(DirectReadTest, CreateRejectsBadOptions) {
  DirectRing direct(1);
  ASSERT_TRUE(direct.ok());
  DirectReadCollectivesOptions options;
  options.control = &direct.ring().at(0);
  options.pids = {1};
  options.timeout_ms = 0;
  EXPECT_NE(DirectReadCollectives::Create(options).status().message().find("timeout_ms"),
            std::string::npos);
  options.timeout_ms = 1000;
  options.pids = {};
  EXPECT_NE(DirectReadCollectives::Create(options).status().message().find("pids"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::worker
