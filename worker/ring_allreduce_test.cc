#include "worker/ring_allreduce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/rpc_endpoint.h"

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;

// W workers on loopback, each with its own RPC endpoint and mailbox, wired as in worker_main.
class Ring {
 public:
  explicit Ring(int world) {
    for (int rank = 0; rank < world; ++rank) {
      ZmqTransportOptions options;
      options.role = proto::Role::Worker;
      options.rank = rank;
      auto endpoint = RpcEndpoint::Start(options, nullptr);
      EXPECT_TRUE(endpoint.ok()) << endpoint.status();
      auto mailbox = std::make_shared<CollectiveMailbox>();
      (*endpoint)->SetHandler(proto::Body::CollectiveChunk, CollectiveMailbox::Handler(mailbox));
      addresses_.push_back((*endpoint)->address());
      endpoints_.push_back(std::move(endpoint).value());
      mailboxes_.push_back(std::move(mailbox));
    }
  }

  int world() const { return static_cast<int>(endpoints_.size()); }
  CollectiveMailbox& mailbox(int rank) { return *mailboxes_[rank]; }

  CollectiveContext Context(int rank, uint64_t tag, int64_t timeout_ms) {
    CollectiveContext context;
    context.rank = rank;
    context.world_size = world();
    context.peer_addresses = addresses_;
    context.transport = &endpoints_[rank]->transport();
    context.mailbox = mailboxes_[rank].get();
    context.deadline = Deadline::AfterMillis(timeout_ms);
    context.tag = tag;
    return context;
  }

  // Runs `count`-element all-reduces on the given ranks at once, each on its own thread.
  std::vector<Status> Run(const std::vector<int>& ranks, std::vector<std::vector<float>>* buffers,
                          uint64_t tag, int64_t timeout_ms) {
    std::vector<Status> results(world());
    std::vector<std::thread> threads;
    for (int rank : ranks) {
      threads.emplace_back([this, rank, buffers, tag, timeout_ms, &results] {
        std::vector<float>& buffer = (*buffers)[rank];
        results[rank] = RingAllReduce({buffer.data(), buffer.size(), "test.w"},
                                      Context(rank, tag, timeout_ms));
      });
    }
    for (auto& thread : threads) thread.join();
    return results;
  }

  std::vector<int> AllRanks() const {
    std::vector<int> ranks(endpoints_.size());
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
    return ranks;
  }

 private:
  std::vector<std::unique_ptr<RpcEndpoint>> endpoints_;
  std::vector<std::shared_ptr<CollectiveMailbox>> mailboxes_;
  std::vector<std::string> addresses_;
};

// Small integers, so that every float sum is exact whatever the order of additions.
float Input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 17 + 1) - static_cast<int>(i % 5));
}

// N of "... within N ms".
int64_t StatedTimeoutMs(const Status& status) {
  const std::string& message = status.message();
  size_t at = message.rfind(" within ");
  if (at == std::string::npos) return -1;
  return std::stoll(message.substr(at + 8));
}

class RingAllReduceSizes : public ::testing::TestWithParam<int> {};

TEST_P(RingAllReduceSizes, MatchesANaiveSumForEveryLength) {
  const int world = GetParam();
  Ring ring(world);
  uint64_t tag = 100;
  std::vector<size_t> lengths = {0, 1, static_cast<size_t>(world - 1), static_cast<size_t>(world),
                                 1000 + 1};
  for (size_t length : lengths) {
    SCOPED_TRACE("world " + std::to_string(world) + ", length " + std::to_string(length));
    std::vector<std::vector<float>> buffers(world, std::vector<float>(length));
    std::vector<float> expected(length, 0.0f);
    for (int rank = 0; rank < world; ++rank) {
      for (size_t i = 0; i < length; ++i) {
        buffers[rank][i] = Input(rank, i);
        expected[i] += Input(rank, i);
      }
    }
    std::vector<Status> results = ring.Run(ring.AllRanks(), &buffers, ++tag, 30000);
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
      ASSERT_EQ(buffers[rank], expected) << "rank " << rank;
    }
  }
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(ring.mailbox(rank).queued(), 0u);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingAllReduceSizes, ::testing::Values(1, 2, 3, 5, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

TEST(RingAllReduceTest, ConcurrentOperationsAreKeptApartByTag) {
  Ring ring(3);
  std::vector<std::vector<float>> a(3, std::vector<float>(10)), b(3, std::vector<float>(7));
  for (int rank = 0; rank < 3; ++rank) {
    for (float& x : a[rank]) x = static_cast<float>(rank + 1);
    for (float& x : b[rank]) x = static_cast<float>(10 * (rank + 1));
  }
  std::vector<Status> results_a, results_b;
  std::thread other([&] { results_b = ring.Run(ring.AllRanks(), &b, 2, 30000); });
  results_a = ring.Run(ring.AllRanks(), &a, 1, 30000);
  other.join();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(results_a[rank].ok()) << results_a[rank];
    EXPECT_TRUE(results_b[rank].ok()) << results_b[rank];
  }
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(a[rank], std::vector<float>(10, 6.0f));
    EXPECT_EQ(b[rank], std::vector<float>(7, 60.0f));
  }
}

// Worker 0 never takes part. In a ring only its successor, worker 1, waits on it directly;
// worker 2 waits on worker 1, which is stuck. Both must give up by the deadline, each naming
// the peer it waited for. (Telling worker 2 about worker 0 is the coordinator's job: see the
// next test.)
TEST(RingAllReduceTest, SilentPeerTimesOutNamingIt) {
  Ring ring(3);
  std::vector<std::vector<float>> buffers(3, std::vector<float>(100, 1.0f));
  constexpr int64_t kTimeoutMs = 500;
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({1, 2}, &buffers, 3, kTimeoutMs);
  auto waited = SteadyClock::now() - started;
  EXPECT_LT(waited, std::chrono::milliseconds(2 * kTimeoutMs + 1000));
  EXPECT_EQ(results[1].code(), StatusCode::kDeadlineExceeded) << results[1];
  EXPECT_EQ(results[1].message(), "allreduce tag=3 tensor=test.w rank=1: no chunk from worker 0 "
                                  "(step 0) within " + std::to_string(StatedTimeoutMs(results[1])) +
                                  " ms");
  EXPECT_EQ(results[2].code(), StatusCode::kDeadlineExceeded) << results[2];
  EXPECT_THAT(results[2].message(),
              HasSubstr("allreduce tag=3 tensor=test.w rank=2: no chunk from worker 1 (step 1)"));
  // The budget left when the operation started: a slow thread start (TSan) may cost a ms.
  for (int rank : {1, 2}) {
    EXPECT_GE(StatedTimeoutMs(results[rank]), kTimeoutMs - 50) << results[rank];
    EXPECT_LE(StatedTimeoutMs(results[rank]), kTimeoutMs) << results[rank];
  }
  // Nothing is left behind for the failed tag.
  EXPECT_EQ(ring.mailbox(1).queued(), 0u);
  EXPECT_EQ(ring.mailbox(2).queued(), 0u);
}

// The coordinator's failure notice reaches every survivor's mailbox (worker_main wires it
// through RendezvousClient::SetFailureCallback): all of them fail at once, quoting it.
TEST(RingAllReduceTest, FailureNoticeWakesEverySurvivorWithTheRootCause) {
  Ring ring(3);
  std::vector<std::vector<float>> buffers(3, std::vector<float>(100, 1.0f));
  auto started = SteadyClock::now();
  std::thread coordinator([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int rank : {1, 2}) {
      ring.mailbox(rank).Fail(
          AbortedError("worker 0 (tcp://127.0.0.1:1234) failed: no heartbeat for 10000 ms"));
    }
  });
  std::vector<Status> results = ring.Run({1, 2}, &buffers, 4, 60000);
  coordinator.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].code(), StatusCode::kAborted) << results[rank];
    EXPECT_THAT(results[rank].message(), HasSubstr("allreduce tag=4 tensor=test.w rank=" +
                                                   std::to_string(rank) + ": waiting for worker"));
    EXPECT_THAT(results[rank].message(), HasSubstr("worker 0 (tcp://127.0.0.1:1234) failed"));
  }
}

TEST(RingAllReduceTest, PeersWithAnotherLengthAreNamed) {
  Ring ring(2);
  std::vector<std::vector<float>> buffers = {std::vector<float>(10, 1.0f),
                                             std::vector<float>(12, 1.0f)};
  std::vector<Status> results = ring.Run(ring.AllRanks(), &buffers, 5, 30000);
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: the chunk from worker 1 (step 0) is for "
                                              "a buffer of 12 elements; this rank's has 10"));
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1];
  EXPECT_THAT(results[1].message(), HasSubstr("from worker 0"));
}

TEST(RingAllReduceTest, RejectsAnUnusableContext) {
  Ring ring(2);
  std::vector<float> buffer(4);
  CollectiveContext context = ring.Context(0, 6, 1000);
  context.peer_addresses.pop_back();
  Status status = RingAllReduce({buffer.data(), buffer.size(), ""}, context);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("1 peer addresses for a world of 2"));
  context = ring.Context(1, 6, 1000);
  context.rank = 2;
  EXPECT_THAT(RingAllReduce({buffer.data(), buffer.size(), ""}, context).message(),
              HasSubstr("rank 2 is not in [0, 2)"));
}

}  // namespace
}  // namespace tessera::worker
