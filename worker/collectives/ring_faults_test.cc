// The ring over RingZmq on in-process transports (no sockets: fast, and the same encoding and
// verification as ZeroMQ), and over FaultyTransports around them that lose, delay and repeat
// what a rank sends. Whatever the network does, every call must end in the right result or in
// an error that names the peer and the step it waited for: never a hang, never a wrong result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/collectives/channel/zmq/ring_zmq.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

using ::testing::MatchesRegex;

TestRingOptions InProcess(int64_t timeout_ms = kTestTimeoutMs) {
  TestRingOptions options;
  options.channel = "zmq";
  options.in_process = true;
  options.timeout_ms = timeout_ms;
  return options;
}

// Every rank's faults: `faults` with a seed of its own.
TestRingOptions WithFaults(TestRingOptions options, int world, FaultOptions faults) {
  for (int rank = 0; rank < world; ++rank) {
    faults.seed = 1000 + static_cast<uint64_t>(rank);
    options.faults.push_back(faults);
  }
  return options;
}

// One call of each collective on every rank, its inputs drawn from `salt`; what each rank ends
// up with, all outputs in a row, and each rank's result (a rank stops at its first failure).
// If every rank succeeded, the outputs are checked against the reference.
struct Outcome {
  std::vector<Bytes> outputs;
  std::vector<Status> results;
};

constexpr int kCallsPerRound = 6;

Outcome RunEveryCollective(TestRing& ring, size_t count, uint64_t salt) {
  const int world = ring.world();
  const std::vector<Bytes> sums = Inputs(DataType::kFloat16, world, count, salt);
  const std::vector<Bytes> averages = Inputs(DataType::kFloat32, world, count, salt + 1);
  const std::vector<Bytes> maxima = Inputs(DataType::kBFloat16, world, count, salt + 2);
  const Bytes gathered = Inputs(DataType::kInt32, 1, count, salt + 3)[0];
  const Bytes broadcast = Inputs(DataType::kFloat32, 1, count, salt + 4)[0];
  std::vector<uint64_t> tags;
  for (int i = 0; i < kCallsPerRound; ++i) tags.push_back(ring.NextTag());
  Outcome outcome;
  outcome.outputs.resize(world);
  outcome.results = ring.RunAll([&](int rank) -> Status {
    const Partition own = PartitionOf(count, world, rank);
    Bytes sum = sums[rank], average = averages[rank], scattered(own.size * 2);
    Bytes whole(count * 4), root(count * 4);
    if (rank == world - 1) root = broadcast;
    Collectives& c = ring.at(rank);
    RETURN_IF_ERROR(c.AllReduce(sum.data(), count, DataType::kFloat16, ReduceOp::kSum, "a",
                                tags[0]));
    RETURN_IF_ERROR(c.AllReduce(average.data(), count, DataType::kFloat32, ReduceOp::kAverage,
                                "b", tags[1]));
    RETURN_IF_ERROR(c.ReduceScatter(maxima[rank].data(), scattered.data(), count,
                                    DataType::kBFloat16, ReduceOp::kMax, "c", tags[2]));
    RETURN_IF_ERROR(c.AllGather(gathered.data() + own.offset * 4, whole.data(), count,
                                DataType::kInt32, "d", tags[3]));
    RETURN_IF_ERROR(c.Broadcast(root.data(), count, DataType::kFloat32, world - 1, "e", tags[4]));
    RETURN_IF_ERROR(c.Barrier(tags[5]));
    for (const Bytes* output : {&sum, &average, &scattered, &whole, &root}) {
      outcome.outputs[rank].insert(outcome.outputs[rank].end(), output->begin(), output->end());
    }
    return OkStatus();
  });
  for (const Status& result : outcome.results) {
    if (!result.ok()) return outcome;
  }
  // Against the reference (the 16-bit sums within their tolerance); the outputs' layout is
  // the order above.
  for (int rank = 0; rank < world; ++rank) {
    const Partition own = PartitionOf(count, world, rank);
    const uint8_t* at = outcome.outputs[rank].data();
    const std::string who = "rank " + std::to_string(rank);
    EXPECT_TRUE(MatchesReference(DataType::kFloat16, ReduceOp::kSum, sums, 0, count, at,
                                 who + " sum"));
    at += count * 2;
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kAverage, averages, 0, count, at,
                                 who + " average"));
    at += count * 4;
    EXPECT_TRUE(MatchesReference(DataType::kBFloat16, ReduceOp::kMax, maxima, own.offset,
                                 own.size, at, who + " max"));
    at += own.size * 2;
    EXPECT_TRUE(std::equal(gathered.begin(), gathered.end(), at)) << who << " gathered";
    at += count * 4;
    EXPECT_TRUE(std::equal(broadcast.begin(), broadcast.end(), at)) << who << " broadcast";
  }
  return outcome;
}

// ---------------------------------------------------------------------------------------------
// In-process transports, no faults

TEST(RingOverInProcessTransportsTest, EveryCollectiveMatchesTheReference) {
  for (int world : {1, 2, 3, 5, 8}) {
    TestRing ring(world, InProcess());
    ASSERT_TRUE(ring.ok());
    for (size_t count : AwkwardLengths(world)) {
      SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(count) +
                   " elements");
      ASSERT_TRUE(AllOk(RunEveryCollective(ring, count, count).results, ring.AllRanks()));
    }
    EXPECT_TRUE(NothingKept(ring));
  }
}

// ---------------------------------------------------------------------------------------------
// Delayed frames

// Frames held back at random change when each rank computes, never what: the results are bit
// for bit those of a ring without delays, 16-bit sums and averages included.
TEST(RingFaultsTest, DelayedFramesGiveBitIdenticalResults) {
  FaultOptions late;
  late.delay_probability = 0.3;
  late.delay_ms = 5;
  for (int world : {2, 3, 5}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TestRing faithful(world, InProcess());
    TestRing delaying(world, WithFaults(InProcess(), world, late));
    ASSERT_TRUE(faithful.ok() && delaying.ok());
    for (size_t count : {size_t{1}, size_t{997}, size_t{4099}}) {
      const Outcome want = RunEveryCollective(faithful, count, count);
      ASSERT_TRUE(AllOk(want.results, faithful.AllRanks()));
      const Outcome got = RunEveryCollective(delaying, count, count);
      ASSERT_TRUE(AllOk(got.results, delaying.AllRanks()));
      for (int rank = 0; rank < world; ++rank) {
        EXPECT_TRUE(got.outputs[rank] == want.outputs[rank])
            << count << " elements, rank " << rank << ": not the bits of the undelayed ring";
      }
    }
    uint64_t delayed = 0;
    for (int rank = 0; rank < world; ++rank) delayed += delaying.faults(rank)->delayed();
    EXPECT_GT(delayed, 0u);
    EXPECT_TRUE(NothingKept(delaying));
  }
}

// ---------------------------------------------------------------------------------------------
// Lost frames

// Everything worker 0 sends worker 1 is lost (worker 0 works on). Worker 1 waits for worker 0's
// first frame until its deadline and names it and the step; the abort notice it sends on then
// reaches worker 2 and, through it, worker 0, both long before their own deadlines: every rank
// ends with the root cause.
TEST(RingFaultsTest, ALostFrameFailsEveryRankNamingThePeerAndTheStep) {
  constexpr int64_t kShortMs = 300;
  TestRingOptions options = InProcess();
  options.faults = {FaultOptions()};  // rank 0's, which the test cuts off from rank 1
  TestRing ring(3, options);
  ASSERT_TRUE(ring.ok());
  ring.Remake(1, kTestSegmentBytes, kShortMs);
  ring.faults(0)->Disconnect(ring.address(1));
  std::vector<Bytes> buffers(3, Bytes(4 * 3000));
  const auto started = SteadyClock::now();
  std::vector<Status> results = ring.RunAll([&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 3000, DataType::kFloat32,
                                   ReduceOp::kSum, "layer1.b", 7);
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 2000));
  EXPECT_GT(ring.faults(0)->dropped(), 0u);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].code(), StatusCode::kDeadlineExceeded) << results[rank];
  }
  EXPECT_EQ(results[1].message(),
            "allreduce tag=7 tensor=layer1.b rank=1: no frame from worker 0 (step 0, segment 0 "
            "of 4) within 300 ms");
  EXPECT_EQ(results[2].message(), "allreduce tag=7 tensor=layer1.b rank=2: worker 1 reported a "
                                  "failure: " + results[1].message());
  EXPECT_EQ(results[0].message(), "allreduce tag=7 tensor=layer1.b rank=0: worker 2 reported a "
                                  "failure: " + results[1].message());
}

// Frames lost at random, abort notices included, over many calls. A call in which nothing was
// lost gives the right result on every rank (RunEveryCollective checks); a call in which
// anything was lost fails on at least one rank, and every rank that fails does so within its
// deadline (or soon after, through a notice) with an error that names the peer and the step
// it waited for, its own or the one quoted from the rank that failed first.
TEST(RingFaultsTest, RandomlyLostFramesEndInTheRightResultOrAnErrorNamingThePeer) {
  constexpr int64_t kShortMs = 300;
  constexpr int kWorld = 3;
  FaultOptions lossy;
  lossy.drop_probability = 0.004;
  TestRing ring(kWorld, WithFaults(InProcess(kShortMs), kWorld, lossy));
  ASSERT_TRUE(ring.ok());
  // "...: no frame from worker 2 (step 3, segment 1 of 2) within 300 ms", at the end of the
  // message: the waiting rank's own words, or quoted after "worker N reported a failure: ".
  const std::string waited_for =
      ".*rank=[0-2]: no frame from worker [0-2] \\(step [0-9]+(, segment [0-9]+ of [0-9]+)?\\) "
      "within 300 ms";
  int failed_rounds = 0;
  uint64_t dropped_before = 0;
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto started = SteadyClock::now();
    const Outcome outcome = RunEveryCollective(ring, 1009, round);
    // Each call ends within its deadline, plus a notice's trip; six calls at most.
    EXPECT_LT(SteadyClock::now() - started,
              std::chrono::milliseconds(kCallsPerRound * (kShortMs + 1000)));
    uint64_t dropped = 0;
    for (int rank = 0; rank < kWorld; ++rank) dropped += ring.faults(rank)->dropped();
    bool any_failed = false;
    for (int rank = 0; rank < kWorld; ++rank) {
      if (outcome.results[rank].ok()) continue;
      any_failed = true;
      EXPECT_EQ(outcome.results[rank].code(), StatusCode::kDeadlineExceeded)
          << outcome.results[rank];
      EXPECT_THAT(outcome.results[rank].message(), MatchesRegex(waited_for));
    }
    EXPECT_EQ(any_failed, dropped > dropped_before)
        << "a lost frame must fail its call, and only a lost frame may";
    failed_rounds += any_failed ? 1 : 0;
    dropped_before = dropped;
  }
  // The seeds lose frames in some rounds and not in others: both outcomes were seen.
  EXPECT_GT(failed_rounds, 0);
  EXPECT_LT(failed_rounds, 12);
}

// ---------------------------------------------------------------------------------------------
// Duplicated frames

// Every frame may arrive twice. A duplicate must change nothing: not this call's result, not a
// later call's under the same tag (a tag may be used again once its call has ended), and it
// must not be left behind for no call to take. (Kept, a duplicate waited under its (tag, slot)
// for the next call under the tag, which took it for its own: every rank returned OK with a
// wrong sum, or failed on a mismatch if that call was another collective.) The mailboxes drop
// every one of them by the number RingZmq gives each frame.
TEST(RingFaultsTest, DuplicatedFramesChangeNothing) {
  constexpr int kWorld = 3;
  FaultOptions twice;
  twice.duplicate_probability = 0.2;
  TestRing ring(kWorld, WithFaults(InProcess(), kWorld, twice));
  ASSERT_TRUE(ring.ok());
  // Calls under new tags.
  for (size_t count : {size_t{1}, size_t{2}, size_t{1009}}) {
    ASSERT_TRUE(AllOk(RunEveryCollective(ring, count, count).results, ring.AllRanks()));
  }
  // The same tag again and again: an all-reduce and a barrier under one tag per round.
  const size_t count = 1009;
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, kWorld, count, round);
    std::vector<Bytes> buffers = inputs;
    std::vector<Status> results = ring.RunAll([&](int rank) {
      RETURN_IF_ERROR(ring.at(rank).AllReduce(buffers[rank].data(), count, DataType::kFloat32,
                                              ReduceOp::kSum, "w", 7));
      return ring.at(rank).Barrier(7);
    });
    ASSERT_TRUE(AllOk(results, ring.AllRanks()));
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count,
                                   buffers[rank].data(), "rank " + std::to_string(rank)));
    }
  }
  uint64_t duplicated = 0;
  for (int rank = 0; rank < kWorld; ++rank) duplicated += ring.faults(rank)->duplicated();
  EXPECT_GT(duplicated, 0u);
  // The last repeats may still be on their way (behind the frames that ended the calls).
  uint64_t repeats = 0;
  for (const Deadline deadline = Deadline::AfterMillis(10000); !deadline.Expired();) {
    repeats = 0;
    for (int rank = 0; rank < kWorld; ++rank) repeats += ring.mailbox(rank).repeats();
    if (repeats >= duplicated) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(repeats, duplicated);
  EXPECT_TRUE(NothingKept(ring));
}

// ---------------------------------------------------------------------------------------------
// Frames from the wrong rank

// Worker 1's mailbox takes frames from anyone; its collective takes them only from worker 0,
// its predecessor. A frame from worker 2 under the call's tag fails the call, naming both, and
// the others hear of it.
TEST(RingFaultsTest, AFrameFromAnotherRankFailsTheCallNamingBoth) {
  constexpr int kWorld = 3;
  TestRingOptions options = InProcess();
  // The ring's steps: in a one-shot all-reduce worker 2 has sent worker 0 everything it needs
  // before it hears of worker 1's failure, so worker 0 completes (rightly).
  options.one_shot_max_bytes = 0;
  TestRing ring(kWorld, options);
  ASSERT_TRUE(ring.ok());
  // A second channel of worker 2's, over its transport, whose frames go to worker 1.
  std::vector<std::string> addresses;
  for (int rank = 0; rank < kWorld; ++rank) addresses.push_back(ring.address(rank));
  auto stray = RingZmq::Create({2, kWorld, addresses, &ring.transport(2),
                                std::make_shared<CollectiveMailbox>(
                                    std::make_shared<FailureBus>())});
  ASSERT_TRUE(stray.ok()) << stray.status();
  RingFrame frame;
  frame.kind = RingFrameKind::kHandshake;
  frame.tag = 8;
  ASSERT_TRUE((*stray)->SendTo(1, frame).ok());
  // It is there before worker 1 starts, so that worker 1 takes it first.
  const Deadline deadline = Deadline::AfterMillis(10000);
  while (ring.mailbox(1).queued() == 0 && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<Bytes> buffers(kWorld, Bytes(4 * 30));
  std::vector<Status> results = ring.RunAll([&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 30, DataType::kFloat32, ReduceOp::kSum,
                                   "w", 8);
  });
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1];
  EXPECT_EQ(results[1].message(),
            "allreduce tag=8 tensor=w rank=1: the frame from worker 0 (step 0) came from worker "
            "2, not from worker 0, this rank's predecessor in the ring");
  EXPECT_EQ(results[2].message(),
            "allreduce tag=8 tensor=w rank=2: worker 1 reported a failure: " +
                results[1].message());
  EXPECT_EQ(results[0].message(),
            "allreduce tag=8 tensor=w rank=0: worker 2 reported a failure: " +
                results[1].message());
}

}  // namespace
}  // namespace tessera::worker
