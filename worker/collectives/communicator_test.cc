// The communicator and its groups over real ZeroMQ endpoints on 127.0.0.1, one per rank (as
// tessera-worker wires its own), with the ranks on threads of this process: sub-communicators,
// a 2 x 2 mesh whose groups run at once, point-to-point messages, all-to-all with uneven
// sizes, errors that name the group and both ranks, a dead rank, and an abort. Each case runs
// over the ring channels a group can have: through the transport (zmq), shared memory and TCP
// links (a group of ranks on several hosts opens links of its own).
#include "worker/collectives/communicator.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/base/failure_bus.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/device_mesh.h"

namespace tessera::worker {
namespace {

constexpr int64_t kTimeoutMs = 20000;

// W ranks, each with its own endpoint, mailbox, failure bus and world communicator. With
// `hosts` > 1 the ranks are in that many blocks of consecutive ranks, each bound to its own
// loopback address (127.0.0.1, 127.0.0.2, ...): hosts, to the communicator.
class TestWorld {
 public:
  TestWorld(int world, const std::string& ring_transport, int64_t timeout_ms = kTimeoutMs,
            size_t direct_read_min_bytes = kDefaultDirectReadMinBytes, int hosts = 1)
      : ranks_(static_cast<size_t>(world)) {
    std::vector<std::string> addresses;
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      ZmqTransportOptions zmq;
      zmq.role = Role::kWorker;
      zmq.rank = r;
      zmq.bind_host = "127.0.0." + std::to_string(1 + r * hosts / world);
      auto endpoint = StartZmqEndpoint(zmq, nullptr);
      EXPECT_TRUE(endpoint.ok()) << endpoint.status();
      if (!endpoint.ok()) return;
      rank.endpoint = std::move(endpoint).value();
      rank.failures = std::make_shared<FailureBus>();
      rank.mailbox = std::make_shared<CollectiveMailbox>(rank.failures);
      rank.endpoint->SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(rank.mailbox));
      addresses.push_back(rank.endpoint->address());
    }
    RunAll([&](int r) -> Status {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      CommunicatorOptions options;
      options.rank = r;
      options.world_size = world;
      options.peer_addresses = addresses;
      options.transport = &rank.endpoint->transport();
      options.mailbox = rank.mailbox;
      options.failures = rank.failures;
      options.ring_transport = ring_transport;
      options.timeout_ms = timeout_ms;
      options.segment_bytes = 4096;
      options.direct_read_min_bytes = direct_read_min_bytes;
      ASSIGN_OR_RETURN(rank.world, Communicator::Connect(options));
      return OkStatus();
    });
  }

  int world() const { return static_cast<int>(ranks_.size()); }
  Communicator& at(int rank) { return *ranks_[static_cast<size_t>(rank)].world; }
  CollectiveMailbox& mailbox(int rank) { return *ranks_[static_cast<size_t>(rank)].mailbox; }
  // As when rank's process dies: its communicators and endpoint go.
  void Kill(int rank) {
    ranks_[static_cast<size_t>(rank)].world.reset();
    ranks_[static_cast<size_t>(rank)].endpoint.reset();
  }

  // Runs body(rank) for every rank at once, each on a thread; fails the test for each error.
  void RunAll(const std::function<Status(int)>& body) {
    std::vector<Status> results = Run(body);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    }
  }
  std::vector<Status> Run(const std::function<Status(int)>& body) {
    std::vector<Status> results(ranks_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < world(); ++r) {
      threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = body(r); });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  }

 private:
  struct Rank {
    std::unique_ptr<RpcEndpoint> endpoint;
    std::shared_ptr<FailureBus> failures;
    std::shared_ptr<CollectiveMailbox> mailbox;
    std::unique_ptr<Communicator> world;
  };
  std::vector<Rank> ranks_;
};

// Rank w's input element i (world ranks), integers so that sums are exact in any order.
float Input(int world_rank, size_t i, int salt) {
  return static_cast<float>((world_rank * 7 + static_cast<int>(i) * 3 + salt) % 41 - 20);
}

// The naive reference: element i of the sum over `world_ranks`.
float NaiveSum(const std::vector<int>& world_ranks, size_t i, int salt) {
  float sum = 0;
  for (int w : world_ranks) sum += Input(w, i, salt);
  return sum;
}

// All-reduces `count` floats over `group` and checks them against the naive sum.
Status CheckedAllReduce(Communicator& group, size_t count, uint64_t tag, int salt) {
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = Input(group.world_rank(), i, salt);
  RETURN_IF_ERROR(group.AllReduce(data.data(), count, DataType::kFloat32, ReduceOp::kSum, "x",
                                  tag));
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != NaiveSum(group.world_ranks(), i, salt)) {
      return InternalError(group.name() + " element " + std::to_string(i) + ": " +
                           std::to_string(data[i]) + ", expected " +
                           std::to_string(NaiveSum(group.world_ranks(), i, salt)));
    }
  }
  return OkStatus();
}

class CommunicatorTest : public ::testing::TestWithParam<std::string> {};

// Ranks on one host (threads here): calls from direct_read_min_bytes on read the peers'
// buffers directly, in the world and in a group, smaller ones go round the ring, and the
// description says so; 0 turns direct reads off.
TEST_P(CommunicatorTest, LargeCallsReadDirectlyFromTheThreshold) {
  TestWorld world(4, GetParam(), kTimeoutMs, /*direct_read_min_bytes=*/4096);
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    const std::string& description = me.channel_description();
    if (description.find("direct reads (cross-memory attach) for all-reduce, reduce-scatter "
                         "and all-gather from 4096 bytes") == std::string::npos) {
      return InternalError("the description does not say direct reads: " + description);
    }
    RETURN_IF_ERROR(CheckedAllReduce(me, 100003, 1, 1));  // direct
    RETURN_IF_ERROR(CheckedAllReduce(me, 1000, 2, 2));    // 4000 bytes: the ring
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> odd, me.Split(r % 2 == 1 ? 0 : -1, 3));
    if (odd != nullptr) {
      if (odd->channel_description().find("from 4096 bytes") == std::string::npos) {
        return InternalError("the group's description: " + odd->channel_description());
      }
      RETURN_IF_ERROR(CheckedAllReduce(*odd, 20011, 4, 3));
    }
    return OkStatus();
  });
  TestWorld off(2, GetParam(), kTimeoutMs, /*direct_read_min_bytes=*/0);
  off.RunAll([&](int r) -> Status {
    if (off.at(r).channel_description().find("direct reads: off") == std::string::npos) {
      return InternalError("the description: " + off.at(r).channel_description());
    }
    return CheckedAllReduce(off.at(r), 100003, 1, 1);
  });
}

// Ranks on two hosts, two on each: all-reduces from direct_read_min_bytes on are hierarchical
// (within each host, across them, within again), of sums and averages, under the world's large
// tags too (as the native modes' buckets), and give every rank the naive result; smaller ones
// go round the flat ring. Three ranks on two hosts (2 + 1) keep the flat ring for all.
TEST_P(CommunicatorTest, AllReducesAcrossHostsAreHierarchicalFromTheThreshold) {
  TestWorld world(4, GetParam(), kTimeoutMs, /*direct_read_min_bytes=*/4096, /*hosts=*/2);
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    const std::string& description = me.channel_description();
    if (description.find("hierarchical all-reduce from 4096 bytes: 2 ranks within each of 2 "
                         "hosts (") == std::string::npos ||
        description.find("direct reads (cross-memory attach)") == std::string::npos) {
      return InternalError("the description does not say hierarchical: " + description);
    }
    RETURN_IF_ERROR(CheckedAllReduce(me, 100003, 1, 1));                      // hierarchical
    RETURN_IF_ERROR(CheckedAllReduce(me, 1000, 2, 2));                        // the flat ring
    RETURN_IF_ERROR(CheckedAllReduce(me, 5001, (uint64_t{1} << 41) + 7, 3));  // a large tag
    std::vector<float> data(20011);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Input(r, i, 4);
    RETURN_IF_ERROR(me.AllReduce(data.data(), data.size(), DataType::kFloat32,
                                 ReduceOp::kAverage, "avg", 5));
    for (size_t i = 0; i < data.size(); ++i) {
      // Sums of 2 and of 4 small integers, halved: exact in float either way.
      if (data[i] != NaiveSum(me.world_ranks(), i, 4) / 4) {
        return InternalError("average element " + std::to_string(i) + ": " +
                             std::to_string(data[i]));
      }
    }
    return OkStatus();
  });
  TestWorld uneven(3, GetParam(), kTimeoutMs, /*direct_read_min_bytes=*/4096, /*hosts=*/2);
  uneven.RunAll([&](int r) -> Status {
    const std::string& description = uneven.at(r).channel_description();
    if (description.find("hierarchical all-reduce: no (not the same number of ranks") ==
        std::string::npos) {
      return InternalError("the description: " + description);
    }
    return CheckedAllReduce(uneven.at(r), 100003, 1, 1);
  });
}

TEST_P(CommunicatorTest, SubCommunicatorsOfEvenAndOddRanks) {
  TestWorld world(4, GetParam());
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    // Every rank takes part in both splits; each gets the group it is in.
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> even, me.Split(std::vector<int>{0, 2}, 1));
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> odd, me.Split(std::vector<int>{1, 3}, 2));
    Communicator* mine = r % 2 == 0 ? even.get() : odd.get();
    if (mine == nullptr || (r % 2 == 0 ? odd : even) != nullptr) {
      return InternalError("rank " + std::to_string(r) + " got the wrong groups");
    }
    if (mine->world_size() != 2 || mine->rank() != r / 2 || mine->world_rank() != r ||
        mine->id() == kWorldCommunicator) {
      return InternalError(mine->name() + ": rank " + std::to_string(mine->rank()));
    }
    // A group's ring is of the world's kind (links included: they are the group's own).
    if (mine->channel_description().rfind(GetParam(), 0) != 0) {
      return InternalError(mine->name() + "'s ring: " + mine->channel_description());
    }
    // 10000 floats: several segments of the ring; and the world still works beside them.
    RETURN_IF_ERROR(CheckedAllReduce(*mine, 10000, 1, 4));
    RETURN_IF_ERROR(CheckedAllReduce(*mine, 3, 2, 0));
    return CheckedAllReduce(me, 1000, 3, 5);
  });
}

TEST_P(CommunicatorTest, AMeshsRowsAndColumnsAllReduceAtOnce) {
  TestWorld world(4, GetParam());
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(world.at(r), {2, 2}, {"dp", "tp"}, 10));
    if (mesh.coordinate() != std::vector<int>{r / 2, r % 2}) {
      return InternalError("rank " + std::to_string(r) + " at the wrong place");
    }
    ASSIGN_OR_RETURN(Communicator * tp, mesh.along("tp"));
    Communicator& dp = mesh.along(0);
    if (tp->world_ranks() != std::vector<int>{r / 2 * 2, r / 2 * 2 + 1} ||
        dp.world_ranks() != std::vector<int>{r % 2, r % 2 + 2}) {
      return InternalError("rank " + std::to_string(r) + ": wrong rows or columns");
    }
    if (mesh.along("pp").ok()) return InternalError("an axis that is not there");
    // Rows and columns at once, from two threads, under the same tag numbers: each
    // communicator's tags are its own.
    Status row, column;
    std::thread other([&] {
      for (int round = 0; round < 5 && row.ok(); ++round) {
        row = CheckedAllReduce(*tp, 5000, 100 + round, round);
      }
    });
    for (int round = 0; round < 5 && column.ok(); ++round) {
      column = CheckedAllReduce(dp, 7000, 100 + round, 50 + round);
    }
    other.join();
    RETURN_IF_ERROR(row);
    return column;
  });
}

TEST_P(CommunicatorTest, PointToPointAroundARingAndBetweenAnyPair) {
  TestWorld world(4, GetParam());
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> odd, me.Split(std::vector<int>{3, 1}, 1));
    // Around the world's ring, three messages under one tag, taken in order.
    for (int i = 0; i < 3; ++i) {
      const int64_t value = r * 100 + i;
      RETURN_IF_ERROR(me.Send(&value, sizeof(value), (r + 1) % 4, 7, "ring"));
    }
    for (int i = 0; i < 3; ++i) {
      int64_t got = -1;
      RETURN_IF_ERROR(me.Recv(&got, sizeof(got), (r + 3) % 4, 7, "ring"));
      if (got != (r + 3) % 4 * 100 + i) return InternalError("ring: got " + std::to_string(got));
    }
    // Every pair, each way, the tag naming the receiver: senders' messages apart by sender.
    for (int q = 0; q < 4; ++q) {
      if (q == r) continue;
      const int32_t value = 10 * r + q;
      RETURN_IF_ERROR(me.Send(&value, sizeof(value), q, static_cast<uint32_t>(q), "pair"));
    }
    for (int q = 0; q < 4; ++q) {
      if (q == r) continue;
      int32_t got = -1;
      RETURN_IF_ERROR(me.Recv(&got, sizeof(got), q, static_cast<uint32_t>(r), "pair"));
      if (got != 10 * q + r) return InternalError("pair: got " + std::to_string(got));
    }
    // Within a group, by group rank (world ranks 3 and 1 are its ranks 0 and 1), under the
    // world's tag 7 again; and RecvAny names the sender.
    if (odd != nullptr) {
      const int32_t value = r;
      RETURN_IF_ERROR(odd->Send(&value, sizeof(value), 1 - odd->rank(), 7, "group"));
      int32_t got = -1;
      ASSIGN_OR_RETURN(const int from, odd->RecvAny(&got, sizeof(got), 7, "group"));
      if (from != 1 - odd->rank() || got != 4 - r) {
        return InternalError("group: got " + std::to_string(got) + " from rank " +
                             std::to_string(from));
      }
    }
    // A size other than the sender's fails, naming both.
    if (r == 0) {
      const int64_t value = 1;
      RETURN_IF_ERROR(me.Send(&value, sizeof(value), 1, 9, "sized"));
    } else if (r == 1) {
      int32_t small = 0;
      Status wrong = me.Recv(&small, sizeof(small), 0, 9, "sized");
      if (wrong.code() != StatusCode::kInvalidArgument ||
          wrong.message().find("sent 8 bytes; this rank expects 4") == std::string::npos) {
        return InternalError("a wrong size: " + wrong.ToString());
      }
    }
    return OkStatus();
  });
}

TEST_P(CommunicatorTest, AllToAllWithUnevenSizes) {
  TestWorld world(4, GetParam());
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> trio, me.Split(std::vector<int>{0, 1, 3}, 1));
    for (Communicator* comm : {&me, trio.get()}) {
      if (comm == nullptr) continue;
      const int w = comm->world_size();
      // Rank p sends rank q (p + 2q) % 3 elements (some none), each 1000 * p + 10 * q + k.
      const auto count = [](int p, int q) { return static_cast<size_t>((p + 2 * q) % 3); };
      std::vector<size_t> send(static_cast<size_t>(w)), recv(static_cast<size_t>(w));
      std::vector<int32_t> input, expected;
      for (int q = 0; q < w; ++q) {
        send[static_cast<size_t>(q)] = count(comm->rank(), q);
        recv[static_cast<size_t>(q)] = count(q, comm->rank());
        for (size_t k = 0; k < count(comm->rank(), q); ++k) {
          input.push_back(1000 * comm->rank() + 10 * q + static_cast<int32_t>(k));
        }
        for (size_t k = 0; k < count(q, comm->rank()); ++k) {
          expected.push_back(1000 * q + 10 * comm->rank() + static_cast<int32_t>(k));
        }
      }
      std::vector<int32_t> output(expected.size(), -1);
      RETURN_IF_ERROR(comm->AllToAll(input.data(), send, output.data(), recv, sizeof(int32_t),
                                     "uneven", 3));
      if (output != expected) return InternalError(comm->name() + ": wrong all-to-all");
    }
    return OkStatus();
  });
}

TEST_P(CommunicatorTest, AnErrorNamesTheGroupItsRankAndTheWorldRank) {
  TestWorld world(4, GetParam());
  std::vector<Status> results = world.Run([&](int r) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> odd,
                     world.at(r).Split(std::vector<int>{1, 3}, 1));
    if (odd == nullptr) return OkStatus();
    // World rank 3 (the group's rank 1) passes a buffer of another size.
    std::vector<float> data(r == 3 ? 12 : 10, 1.0f);
    return odd->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, "w", 1);
  });
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[2].ok());
  for (int r : {1, 3}) {
    ASSERT_EQ(results[static_cast<size_t>(r)].code(), StatusCode::kInvalidArgument)
        << results[static_cast<size_t>(r)];
    const std::string& message = results[static_cast<size_t>(r)].message();
    EXPECT_NE(message.find("(world ranks 1, 3) rank " + std::to_string(r / 2) +
                           " (world rank " + std::to_string(r) + ")"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("12"), std::string::npos) << message;
  }
}

TEST_P(CommunicatorTest, ADeadRankFailsEveryGroupItIsInAndNoOther) {
  constexpr int64_t kShortMs = 1500;
  TestWorld world(4, GetParam(), kShortMs);
  std::vector<std::unique_ptr<Communicator>> pairs(4);
  std::vector<std::unique_ptr<Communicator>> low(4);
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(pairs[static_cast<size_t>(r)], world.at(r).Split(r / 2, 1));
    ASSIGN_OR_RETURN(low[static_cast<size_t>(r)], world.at(r).Split(r < 3 ? 0 : -1, 2));
    return OkStatus();
  });
  pairs[3].reset();
  world.Kill(3);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> data(100, 1.0f);
      Status& result = results[static_cast<size_t>(r)];
      // {0, 1, 2} works (first, while every rank is there at once); groups with rank 3 fail.
      Status in_low = CheckedAllReduce(*low[static_cast<size_t>(r)], 100, 5, 0);
      Status in_world = world.at(r).AllReduce(data.data(), data.size(), DataType::kFloat32,
                                              ReduceOp::kSum, "w", 5);
      Status in_pair = pairs[static_cast<size_t>(r)]->AllReduce(
          data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, "p", 5);
      const bool pair_has_3 = r == 2;
      if (in_world.ok()) result = InternalError("the world's all-reduce passed without rank 3");
      else if (in_pair.ok() == pair_has_3) result = InternalError("pair: " + in_pair.ToString());
      else if (!in_low.ok()) result = in_low;
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok()) << "rank " << r << ": "
                                                      << results[static_cast<size_t>(r)];
  }
  // Each failing call waits at most its timeout (two in a row on rank 2), never for ever.
  EXPECT_LT(seconds, 3 * kShortMs / 1000.0 + 5);
}

TEST_P(CommunicatorTest, AbortEndsAGroupsWaitAtOnceAndLeavesTheWorld) {
  TestWorld world(2, GetParam());
  std::vector<std::unique_ptr<Communicator>> groups(2);
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(groups[static_cast<size_t>(r)], world.at(r).Split(0, 1));
    return OkStatus();
  });
  // Rank 0 waits for a message that never comes; aborting its group ends the wait.
  const auto start = std::chrono::steady_clock::now();
  std::thread abort([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    groups[0]->Abort(CancelledError("the group is being destroyed"));
  });
  int32_t got = 0;
  Status waited = groups[0]->Recv(&got, sizeof(got), 1, 0, "never");
  abort.join();
  EXPECT_EQ(waited.code(), StatusCode::kCancelled) << waited;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  groups[0].reset();
  groups[1].reset();
  world.RunAll([&](int r) { return CheckedAllReduce(world.at(r), 100, 1, 0); });
}

// A group of ranks on two hosts, two on each, all-reduces hierarchically; aborting it ends a
// hierarchical all-reduce that waits (in the group's own groups) at once.
TEST_P(CommunicatorTest, AbortEndsAHierarchicalAllReducesWait) {
  TestWorld world(4, GetParam(), kTimeoutMs, /*direct_read_min_bytes=*/4096, /*hosts=*/2);
  std::vector<std::unique_ptr<Communicator>> groups(4);
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(groups[static_cast<size_t>(r)], world.at(r).Split(0, 1));
    if (groups[static_cast<size_t>(r)]->channel_description().find("hierarchical all-reduce "
                                                                   "from 4096 bytes") ==
        std::string::npos) {
      return InternalError("not hierarchical: " +
                           groups[static_cast<size_t>(r)]->channel_description());
    }
    return OkStatus();
  });
  // Only rank 0 calls: it waits for its host's other rank.
  const auto start = std::chrono::steady_clock::now();
  std::thread abort([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    groups[0]->Abort(CancelledError("the group is being destroyed"));
  });
  std::vector<float> data(10000, 1.0f);
  Status waited = groups[0]->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                       ReduceOp::kSum, "x", 2);
  abort.join();
  EXPECT_EQ(waited.code(), StatusCode::kCancelled) << waited;
  EXPECT_NE(waited.message().find("hierarchical all-reduce: within the host"), std::string::npos)
      << waited;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Rank 0 queues group A's all-reduce before B's, rank 1 B's before A's: each group's queue
// gets a thread, so neither waits behind the other (one shared thread would deadlock). And a
// receive queued before the message is sent returns at once.
TEST_P(CommunicatorTest, QueuedOpsOfTwoGroupsNeverWaitBehindEachOther) {
  TestWorld world(2, GetParam());
  std::vector<std::unique_ptr<Communicator>> a(2), b(2);
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(a[static_cast<size_t>(r)], world.at(r).Split(0, 1));
    ASSIGN_OR_RETURN(b[static_cast<size_t>(r)], world.at(r).Split(0, 2));
    return OkStatus();
  });
  std::vector<std::shared_future<Status>> done;
  for (int r = 0; r < 2; ++r) {
    Communicator* mine_a = a[static_cast<size_t>(r)].get();
    Communicator* mine_b = b[static_cast<size_t>(r)].get();
    Communicator* first = r == 0 ? mine_a : mine_b;
    Communicator* second = r == 0 ? mine_b : mine_a;
    for (Communicator* group : {first, second}) {
      done.push_back(group->Enqueue([group] { return CheckedAllReduce(*group, 5000, 1, 3); }));
    }
  }
  int32_t got = 0;
  std::shared_future<Status> received = world.at(1).RecvAsync(&got, sizeof(got), 0, 4, "async");
  const int32_t sent = 42;
  ASSERT_TRUE(world.at(0).Send(&sent, sizeof(sent), 1, 4, "async").ok());
  for (auto& future : done) EXPECT_TRUE(future.get().ok()) << future.get();
  EXPECT_TRUE(received.get().ok()) << received.get();
  EXPECT_EQ(got, 42);
}

TEST_P(CommunicatorTest, AGroupTakesTheFramesItLeftWithIt) {
  TestWorld world(2, GetParam());
  std::vector<std::unique_ptr<Communicator>> groups(2);
  world.RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(groups[static_cast<size_t>(r)], world.at(r).Split(0, 1));
    return OkStatus();
  });
  // Messages nobody receives wait in rank 1's mailbox, which the world shares.
  const int64_t value = 7;
  for (uint32_t tag = 0; tag < 3; ++tag) {
    ASSERT_TRUE(groups[0]->Send(&value, sizeof(value), 1, tag, "unread").ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (world.mailbox(1).queued() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(world.mailbox(1).queued(), 3u);
  groups[1].reset();
  EXPECT_EQ(world.mailbox(1).queued(), 0u);
  // A message rank 0's group sends after rank 1's is gone is dropped on arrival: the world's
  // message behind it (one sender's messages arrive in order) finds the mailbox empty.
  ASSERT_TRUE(groups[0]->Send(&value, sizeof(value), 1, 0, "late").ok());
  ASSERT_TRUE(world.at(0).Send(&value, sizeof(value), 1, 0, "behind it").ok());
  int64_t got = 0;
  ASSERT_TRUE(world.at(1).Recv(&got, sizeof(got), 0, 0, "behind it").ok());
  EXPECT_EQ(world.mailbox(1).queued(), 0u);
  groups[0].reset();
  world.RunAll([&](int r) { return CheckedAllReduce(world.at(r), 10, 1, 0); });
}

INSTANTIATE_TEST_SUITE_P(Channels, CommunicatorTest, ::testing::Values("zmq", "shm", "links"),
                         [](const auto& info) { return info.param; });

// The NCCL backend is reachable through the communicator; on this machine (no GPU, or a build
// without CUDA) UseDevice says why it cannot be had, and host buffers go round the ring as
// before. On a GPU machine, device buffers then take NCCL (nccl_collectives_test covers it).
TEST(CommunicatorDeviceTest, WithoutAGpuUseDeviceSaysWhyAndTheRingCarriesOn) {
  TestWorld world(2, "zmq");
  world.RunAll([&](int r) -> Status {
    Status device = world.at(r).UseDevice(NcclCollectivesOptions{});
    if (device.ok()) {
      std::printf("rank %d: a GPU is here; the device path is nccl_collectives_test's\n", r);
    } else if (device.code() != StatusCode::kUnavailable ||
               device.message().find("rank " + std::to_string(r)) == std::string::npos) {
      return InternalError("UseDevice: " + device.ToString());
    }
    return CheckedAllReduce(world.at(r), 100, 1, 0);
  });
  std::vector<float> host(4);
  EXPECT_FALSE(IsDeviceMemory(host.data()));
  EXPECT_FALSE(IsDeviceMemory(nullptr));
}

TEST(CommunicatorGroupIdTest, MembersAgreeOnIdsAndRefuseOneInUse) {
  TestWorld world(2, "zmq");
  world.RunAll([&](int r) -> Status {
    Communicator& me = world.at(r);
    // Rank 1 has made a group of its own first: its next id is ahead of rank 0's.
    std::unique_ptr<Communicator> alone;
    if (r == 1) {
      ASSIGN_OR_RETURN(alone, me.Group({1}, me.NextGroupId(), kTimeoutMs));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> both, me.Split(0, 1));
    if (both->id() != 2) return InternalError("the id is " + std::to_string(both->id()));
    Status again = me.Group({0, 1}, both->id(), kTimeoutMs).status();
    if (again.code() != StatusCode::kAlreadyExists) {
      return InternalError("the same id twice: " + again.ToString());
    }
    if (me.Group({0, 0}, 9, kTimeoutMs).status().code() != StatusCode::kInvalidArgument) {
      return InternalError("a rank named twice was taken");
    }
    return CheckedAllReduce(*both, 100, 1, 0);
  });
}

}  // namespace
}  // namespace tessera::worker
