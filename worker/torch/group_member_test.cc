#include "worker/torch/group_member.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTimeoutMs = 20000;

// torch's c10d::Store, as the ranks of one test see it: one map in memory.
class MemoryStore final : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
    return OkStatus();
  }
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.when(), [&] { return values_.count(key) > 0; })) {
      return DeadlineExceededError("key " + key + " was not set in time");
    }
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// Runs body(rank) on a thread per rank; the results by rank.
std::vector<Status> RunRanks(int world, const std::function<Status(int)>& body) {
  std::vector<Status> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] { results[static_cast<size_t>(rank)] = body(rank); });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// W members of one group, joined through one store.
class Group {
 public:
  explicit Group(int world, std::string ring_transport = "auto", int64_t timeout_ms = kTimeoutMs)
      : members_(static_cast<size_t>(world)) {
    std::vector<Status> joined = RunRanks(world, [&](int rank) -> Status {
      GroupMemberOptions options;
      options.rank = rank;
      options.world_size = world;
      options.store = &store_;
      options.ring_transport = ring_transport;
      options.timeout_ms = timeout_ms;
      options.segment_bytes = 4096;
      ASSIGN_OR_RETURN(members_[static_cast<size_t>(rank)], GroupMember::Join(options));
      return OkStatus();
    });
    for (const Status& status : joined) EXPECT_TRUE(status.ok()) << status;
  }
  GroupMember& at(int rank) { return *members_[static_cast<size_t>(rank)]; }
  int world() const { return static_cast<int>(members_.size()); }
  // Runs op(rank) on every rank's comm thread and waits for all.
  std::vector<Status> Collective(const std::function<Status(int)>& op) {
    std::vector<std::shared_future<Status>> done;
    for (int rank = 0; rank < world(); ++rank) {
      done.push_back(at(rank).Submit([op, rank] { return op(rank); }));
    }
    std::vector<Status> results;
    for (auto& future : done) results.push_back(future.get());
    return results;
  }

 private:
  MemoryStore store_;
  std::vector<std::unique_ptr<GroupMember>> members_;
};

void ExpectAllOk(const std::vector<Status>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
  }
}

TEST(GroupMemberTest, CollectivesOverEveryWorldSize) {
  for (int world : {1, 2, 3}) {
    Group group(world);
    const size_t n = 11;
    std::vector<std::vector<float>> data(world, std::vector<float>(n));
    for (int r = 0; r < world; ++r) std::iota(data[r].begin(), data[r].end(), 100.0f * r);
    ExpectAllOk(group.Collective([&](int r) {
      return group.at(r).AllReduce(data[r].data(), n, DataType::kFloat32, ReduceOp::kSum, "sum");
    }));
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(data[r][i], world * static_cast<float>(i) + 100.0f * (world * (world - 1) / 2))
            << "world " << world << " rank " << r << " element " << i;
      }
    }
    // All-gather: rank r contributes {r, r}; everyone gets 0,0,1,1,...
    std::vector<std::vector<int64_t>> gathered(world, std::vector<int64_t>(2 * world, -1));
    ExpectAllOk(group.Collective([&](int r) {
      const int64_t mine[2] = {r, r};
      return group.at(r).AllGather(mine, gathered[r].data(), 2, DataType::kInt64, "gather");
    }));
    for (int r = 0; r < world; ++r) {
      for (int q = 0; q < 2 * world; ++q) EXPECT_EQ(gathered[r][q], q / 2);
    }
    // Reduce-scatter: rank r gets the sum over ranks of block r.
    std::vector<std::vector<double>> out(world, std::vector<double>(3));
    ExpectAllOk(group.Collective([&](int r) {
      std::vector<double> in(3 * world);
      std::iota(in.begin(), in.end(), 1.0);
      return group.at(r).ReduceScatter(in.data(), out[r].data(), 3, DataType::kFloat64,
                                       ReduceOp::kSum, "reduce_scatter");
    }));
    for (int r = 0; r < world; ++r) EXPECT_EQ(out[r][0], world * (3.0 * r + 1));
    ExpectAllOk(group.Collective([&](int r) { return group.at(r).Barrier("barrier"); }));
  }
}

// Rank q receives send_counts[q] elements from each rank, in rank order.
TEST(GroupMemberTest, AllToAllWithUnevenCounts) {
  const int world = 3;
  Group group(world);
  // Rank r sends r + q + 1 elements of value 10 r + q to rank q.
  std::vector<std::vector<int32_t>> outputs(world);
  ExpectAllOk(group.Collective([&](int r) {
    std::vector<size_t> send, recv;
    std::vector<int32_t> input;
    for (int q = 0; q < world; ++q) {
      send.push_back(static_cast<size_t>(r + q + 1));
      recv.push_back(static_cast<size_t>(q + r + 1));
      input.insert(input.end(), static_cast<size_t>(r + q + 1), 10 * r + q);
    }
    size_t total = 0;
    for (size_t c : recv) total += c;
    outputs[r].assign(total, -1);
    return group.at(r).AllToAll(input.data(), send, outputs[r].data(), recv, sizeof(int32_t),
                                "alltoall");
  }));
  for (int r = 0; r < world; ++r) {
    std::vector<int32_t> want;
    for (int q = 0; q < world; ++q) want.insert(want.end(), static_cast<size_t>(q + r + 1), 10 * q + r);
    EXPECT_EQ(outputs[r], want) << "rank " << r;
  }
}

// Sends leave at once; receives wait on their own thread, matched by (peer, tag) in order,
// and a receive never holds up a collective the sender needs first.
TEST(GroupMemberTest, SendAndRecvMatchByPeerAndTagInOrder) {
  Group group(2);
  std::vector<int64_t> got(4, 0);
  auto first = group.at(1).SubmitRecv([&] { return group.at(1).Recv(&got[0], 8, 0, 7, "recv a"); });
  auto second = group.at(1).SubmitRecv([&] { return group.at(1).Recv(&got[1], 8, 0, 7, "recv b"); });
  auto other_tag = group.at(1).SubmitRecv([&] { return group.at(1).Recv(&got[2], 8, 0, 9, "recv c"); });
  // A collective on both ranks between rank 1's receives and rank 0's sends.
  ExpectAllOk(group.Collective([&](int r) { return group.at(r).Barrier("barrier"); }));
  const int64_t values[3] = {11, 22, 33};
  ASSERT_TRUE(group.at(0).Send(&values[0], 8, 1, 7, "send a").ok());
  ASSERT_TRUE(group.at(0).Send(&values[2], 8, 1, 9, "send c").ok());
  ASSERT_TRUE(group.at(0).Send(&values[1], 8, 1, 7, "send b").ok());
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  EXPECT_TRUE(other_tag.get().ok());
  EXPECT_EQ(got[0], 11);
  EXPECT_EQ(got[1], 22);
  EXPECT_EQ(got[2], 33);
  // A size the receiver did not expect fails naming both.
  auto wrong = group.at(1).SubmitRecv([&] { return group.at(1).Recv(&got[3], 8, 0, 1, "recv d"); });
  ASSERT_TRUE(group.at(0).Send(values, 24, 1, 1, "send d").ok());
  Status status = wrong.get();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("rank 0 (worker 0) sent 24 bytes; this rank expects 8"));
}

// Mismatched collectives fail on every rank, naming what differs.
TEST(GroupMemberTest, RanksThatDisagreeAllFail) {
  Group group(2, "auto", 5000);
  std::vector<float> a(10), b(12);
  std::vector<Status> results = group.Collective([&](int r) {
    return r == 0 ? group.at(0).AllReduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum, "x")
                  : group.at(1).AllReduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum, "x");
  });
  for (const Status& status : results) {
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr("buffer of"));
  }
}

// Rank 0 names the rank that never arrives; the others are released once all have.
TEST(GroupMemberTest, MonitoredBarrierNamesTheMissingRank) {
  Group group(3);
  ExpectAllOk(group.Collective([&](int r) { return group.at(r).MonitoredBarrier(5000, false); }));
  // Rank 2 does not come.
  auto zero = group.at(0).Submit([&] { return group.at(0).MonitoredBarrier(300, true); });
  auto one = group.at(1).Submit([&] { return group.at(1).MonitoredBarrier(300, true); });
  Status status = zero.get();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("Rank 2 failed to pass monitoredBarrier"));
  EXPECT_FALSE(one.get().ok());
}

// A store that never gets a rank's address ends the join at its deadline, naming the rank.
TEST(GroupMemberTest, JoinWaitsForTheStoreUntilItsDeadline) {
  MemoryStore store;
  GroupMemberOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.store = &store;
  options.timeout_ms = 200;
  StatusOr<std::unique_ptr<GroupMember>> member = GroupMember::Join(options);
  EXPECT_EQ(member.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(member.status().message(), HasSubstr("worker 1's address"));
}

// A rank whose peer advertises a loopback address from another network namespace (or host)
// fails at once naming both and the fix, instead of waiting for the peer until the timeout;
// so does a rank that advertises its own loopback to such a peer.
TEST(GroupMemberTest, ALoopbackAddressFromAnotherNamespaceIsRefusedNamingTheFix) {
  for (const std::string peer_address : {"tcp://127.0.0.1:1", "tcp://10.77.0.2:1"}) {
    SCOPED_TRACE(peer_address);
    MemoryStore store;
    ASSERT_TRUE(store.Set("tessera/address/1", peer_address).ok());
    ASSERT_TRUE(store.Set("tessera/loopback_scope/1", "boot x netns 1:1|emulated-host-1").ok());
    GroupMemberOptions options;
    options.rank = 0;
    options.world_size = 2;
    options.store = &store;
    options.timeout_ms = kTimeoutMs;
    const auto started = std::chrono::steady_clock::now();
    StatusOr<std::unique_ptr<GroupMember>> member = GroupMember::Join(options);
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
    EXPECT_EQ(member.status().code(), StatusCode::kFailedPrecondition) << member.status();
    const std::string loopback = peer_address.find("127.0.0.1") != std::string::npos
                                     ? "worker 1 advertises tcp://127.0.0.1:1"
                                     : "worker 0 advertises tcp://127.0.0.1:";
    EXPECT_THAT(member.status().message(), HasSubstr(loopback));
    EXPECT_THAT(member.status().message(),
                HasSubstr("worker 1 (on emulated-host-1, boot x netns 1:1)"));
    EXPECT_THAT(member.status().message(), HasSubstr("TESSERA_SOCKET_IFNAME="));
  }
}

// The threads of this process (every rank's, here).
size_t Threads() {
  size_t count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task");
       it != std::filesystem::directory_iterator(); ++it) {
    ++count;
  }
  return count;
}

// new_group()'s members join over the default group's host: the right ranks and results, and
// 16 groups add no thread (nor endpoint: they have none to add), as torch's processes see
// (tests/torch/subgroups_test.py counts sockets too). A group's destruction fails its own
// waits alone.
TEST(GroupMemberTest, SubgroupsShareTheDefaultGroupsHost) {
  Group world(4, "auto");
  const size_t threads_before = Threads();
  std::vector<std::vector<std::unique_ptr<GroupMember>>> groups(4);
  // Every rank joins {0, 2} or {1, 3}, then 15 groups of all four ranks, each through its
  // own store (torch's prefix store per group).
  const std::vector<std::vector<int>> evens_odds = {{0, 2}, {1, 3}};
  std::vector<MemoryStore> stores(2 + 15);
  std::vector<Status> joined = RunRanks(4, [&](int rank) -> Status {
    for (size_t g = 0; g < stores.size(); ++g) {
      std::vector<int> members = g < 2 ? evens_odds[g] : std::vector<int>{0, 1, 2, 3};
      const auto at = std::find(members.begin(), members.end(), rank);
      if (at == members.end()) continue;
      GroupMemberOptions options;
      options.rank = static_cast<int>(at - members.begin());
      options.world_size = static_cast<int>(members.size());
      options.store = &stores[g];
      options.host = world.at(rank).host();
      options.global_ranks = members;
      options.timeout_ms = kTimeoutMs;
      ASSIGN_OR_RETURN(std::unique_ptr<GroupMember> member, GroupMember::Join(options));
      groups[static_cast<size_t>(rank)].push_back(std::move(member));
    }
    return OkStatus();
  });
  ExpectAllOk(joined);
  EXPECT_EQ(Threads(), threads_before);
  // Each rank's pair and its last all-rank group all-reduce, on the shared comm thread.
  std::vector<std::shared_future<Status>> done;
  std::vector<std::vector<float>> pair(4, std::vector<float>(1000)), all(4, std::vector<float>(10));
  for (int rank = 0; rank < 4; ++rank) {
    for (size_t i = 0; i < 1000; ++i) pair[rank][i] = static_cast<float>(rank * 1000 + i);
    for (size_t i = 0; i < 10; ++i) all[rank][i] = static_cast<float>(rank + i);
    GroupMember& mine = *groups[rank].front();
    GroupMember& everyone = *groups[rank].back();
    done.push_back(mine.Submit([&, rank] {
      return mine.AllReduce(pair[rank].data(), 1000, DataType::kFloat32, ReduceOp::kSum, "pair");
    }));
    done.push_back(everyone.Submit([&, rank] {
      return everyone.AllReduce(all[rank].data(), 10, DataType::kFloat32, ReduceOp::kSum, "all");
    }));
  }
  for (auto& future : done) EXPECT_TRUE(future.get().ok()) << future.get();
  for (int rank = 0; rank < 4; ++rank) {
    const int other = rank ^ 2;
    EXPECT_EQ(pair[rank][7], static_cast<float>(rank * 1000 + other * 1000 + 14)) << rank;
    EXPECT_EQ(all[rank][3], static_cast<float>(0 + 1 + 2 + 3 + 4 * 3)) << rank;
  }
  // Rank 0 waits in its pair for a message; destroying that group ends the wait, and the
  // world goes on.
  std::vector<uint8_t> byte(1);
  GroupMember* pair0 = groups[0].front().get();
  auto waiting = pair0->SubmitRecv([&] { return pair0->Recv(byte.data(), 1, 1, 0, "never"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  groups[0].erase(groups[0].begin());
  EXPECT_EQ(waiting.get().code(), StatusCode::kCancelled);
  groups.clear();
  ExpectAllOk(world.Collective([&](int rank) {
    float one = 1;
    return world.at(rank).AllReduce(&one, 1, DataType::kFloat32, ReduceOp::kSum, "after");
  }));
}

}  // namespace
}  // namespace tessera::worker
