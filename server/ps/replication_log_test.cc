#include "server/ps/replication_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"
#include "server/ps/dense_shard.h"
#include "server/ps/sparse_tables.h"

namespace tessera::server {
namespace {

// The log alone, with a string for what a push carries.
using Log = ReplicationLog<std::string>;

std::vector<std::string> Applied(const std::vector<Log::Next>& next,
                                 std::vector<int64_t>* updates = nullptr) {
  std::vector<std::string> payloads;
  for (const Log::Next& one : next) {
    payloads.push_back(one.parked.payload);
    if (updates != nullptr) updates->push_back(one.update);
  }
  return payloads;
}

TEST(ReplicationLogTest, ParkedPushesAreTakenInUpdateOrderEachOnce) {
  ConsistencyPolicy policy(PsConsistency::kAsync, 2, 0);
  Log log;
  // Updates 3 and 2 overtook update 1: parked, nothing to apply.
  ASSERT_TRUE(log.Park(3, policy, {0, 2, "c"}));
  EXPECT_TRUE(log.TakeNext(&policy, /*all=*/false).empty());
  ASSERT_TRUE(log.Park(2, policy, {1, 1, "b"}));
  ASSERT_TRUE(log.Park(2, policy, {1, 1, "b again"}));  // a copy of a parked one: the first kept
  EXPECT_TRUE(log.TakeNext(&policy, /*all=*/false).empty());
  EXPECT_TRUE(log.has_parked());
  ASSERT_TRUE(log.Park(1, policy, {0, 1, "a"}));
  std::vector<int64_t> updates;
  EXPECT_EQ(Applied(log.TakeNext(&policy, /*all=*/false), &updates),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(updates, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(policy.version(), 3);
  EXPECT_FALSE(log.has_parked());
  // Copies of applied ones are not parked.
  EXPECT_FALSE(log.Park(1, policy, {0, 1, "a"}));
  EXPECT_FALSE(log.Park(3, policy, {0, 2, "c"}));
  EXPECT_FALSE(log.has_parked());
  EXPECT_TRUE(log.TakeNext(&policy, /*all=*/false).empty());
}

TEST(ReplicationLogTest, TakingEveryParkedPushClosesTheGapsNumberedAsAppliedHere) {
  ConsistencyPolicy policy(PsConsistency::kSsp, 2, 1);
  Log log;
  ASSERT_TRUE(log.Park(5, policy, {1, 2, "e"}));
  ASSERT_TRUE(log.Park(3, policy, {0, 2, "c"}));
  EXPECT_TRUE(log.TakeNext(&policy, /*all=*/false).empty());
  // The primary is gone: updates 1, 2 and 4 will not come.
  std::vector<int64_t> updates;
  EXPECT_EQ(Applied(log.TakeNext(&policy, /*all=*/true), &updates),
            (std::vector<std::string>{"c", "e"}));
  EXPECT_EQ(updates, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(policy.clocks(), (std::vector<int64_t>{2, 2}));
}

TEST(ReplicationLogTest, APushItsWorkerMadeHereAlreadyIsDropped) {
  ConsistencyPolicy policy(PsConsistency::kAsync, 2, 0);
  Log log;
  // Worker 0's push of step 1 came here first: update 1 here.
  ASSERT_EQ(policy.Push(0, 1)->action, PushAction::kApplyNow);
  // Forwards that reach this copy later: worker 1's step 1, and worker 0's step 1 again (under
  // another update number), which the policy takes as a copy: it applies nothing.
  ASSERT_TRUE(log.Park(3, policy, {0, 1, "copy"}));
  ASSERT_TRUE(log.Park(2, policy, {1, 1, "b"}));
  EXPECT_EQ(Applied(log.TakeNext(&policy, /*all=*/false)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(policy.version(), 2);
  EXPECT_FALSE(log.has_parked());
}

TEST(ReplicationLogTest, AcknowledgementsWaitForTheUpdateHereAndAtTheCopiesAfterThisOne) {
  Log log;
  std::vector<Log::Ack> due;
  std::vector<std::string> called;
  auto ack = [&called](std::string name) { return [&called, name] { called.push_back(name); }; };
  log.AwaitCopies(2, "tcp://b2", ack("two"));
  log.AwaitCopies(3, "", ack("three"));
  log.TakeDue(/*version=*/1, &due);
  EXPECT_TRUE(due.empty());  // update 2 not applied here yet
  log.Sent(2);
  log.Sent(3);
  EXPECT_EQ(log.unacknowledged(), 2u);
  EXPECT_EQ(log.first_unacknowledged(), 2);
  EXPECT_TRUE(log.AcknowledgedThrough(1));
  EXPECT_FALSE(log.AcknowledgedThrough(2));
  log.TakeDue(3, &due);
  EXPECT_TRUE(due.empty());  // applied, not at the copies after this one
  log.Acknowledged(3);
  log.TakeDue(3, &due);
  EXPECT_TRUE(due.empty());  // update 2, before both, is not there yet
  log.Acknowledged(2);
  EXPECT_TRUE(log.AcknowledgedThrough(3));
  log.TakeDue(3, &due);
  for (const Log::Ack& one : due) one();
  EXPECT_EQ(called, (std::vector<std::string>{"two", "three"}));  // in the order they came
  due.clear();
  log.TakeDue(3, &due);
  EXPECT_TRUE(due.empty());  // each once
}

TEST(ReplicationLogTest, ParkedPushesGoOnAlongTheRequestsChainOrTheLastForwardsThenTheJoined) {
  Log log;
  EXPECT_EQ(log.ChainOfParked(""), "");
  log.AwaitCopies(1, "tcp://b2,tcp://b3", [] {});
  log.AwaitCopies(2, "", [] {});  // names no chain: the last one stays
  EXPECT_EQ(log.ChainOfParked(""), "tcp://b2,tcp://b3");
  EXPECT_EQ(log.ChainOfParked("tcp://b3"), "tcp://b3");
  log.CopiedTo("tcp://j");
  EXPECT_EQ(log.joined(), "tcp://j");
  EXPECT_EQ(log.ChainOfParked(""), "tcp://b2,tcp://b3,tcp://j");
  EXPECT_EQ(log.ChainOfParked("tcp://j"), "tcp://j");
}

TEST(ReplicationLogTest, ClearDropsTheParkedPushesAndHandsOutEveryAcknowledgement) {
  ConsistencyPolicy policy(PsConsistency::kAsync, 1, 0);
  Log log;
  ASSERT_TRUE(log.Park(2, policy, {0, 2, "b"}));
  log.Sent(1);
  int acknowledged = 0;
  log.AwaitCopies(1, "tcp://b2", [&acknowledged] { ++acknowledged; });
  log.AwaitCopies(4, "", [&acknowledged] { ++acknowledged; });
  log.CopiedTo("tcp://j");
  std::vector<Log::Ack> acks;
  log.Clear(&acks);
  for (const Log::Ack& ack : acks) ack();
  EXPECT_EQ(acknowledged, 2);
  EXPECT_FALSE(log.has_parked());
  EXPECT_EQ(log.unacknowledged(), 0u);
  EXPECT_EQ(log.ChainOfParked(""), "tcp://b2,tcp://j");  // the copies stay
}

TEST(ReplicationLogTest, AForwardOfAWorkerOutsideTheJobIsRefused) {
  EXPECT_TRUE(ReplicationLogBase::CheckPushedBy("w", 1, 2).ok());
  EXPECT_EQ(ReplicationLogBase::CheckPushedBy("worker 2's push of step 1, forwarded", 2, 2)
                .message(),
            "worker 2's push of step 1, forwarded: the job has workers 0 to 1");
  EXPECT_EQ(ReplicationLogBase::CheckPushedBy("w", -1, 2).code(), StatusCode::kInvalidArgument);
}

// The log's owners: a primary's pushes, forwarded, reach a copy (and a chain's last copy)
// out of order, duplicated and from several threads at once, and each copy ends bitwise the
// primary (momentum: each update's effect depends on the ones before it).

constexpr int kWorkers = 3;
constexpr int64_t kSteps = 12;
constexpr char kMiddle[] = "tcp://10.0.0.2:5000";
constexpr char kLast[] = "tcp://10.0.0.3:5000";

PsJobConfig AsyncMomentumConfig() {
  PsJobConfig config;
  config.consistency = PsConsistency::kAsync;
  config.num_workers = kWorkers;
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
  config.optimizer.lr = 0.25f;
  config.dense_elements = 10;  // chunks of 4, 4 and 2 floats
  config.chunk_elements = 4;
  config.tables = {{"emb.0", 100, 2, 42}};
  return config;
}

// Worker `rank`'s gradient of step `step` for element `i` of part `part`: distinct values.
float Gradient(int rank, int64_t step, int part, size_t i) {
  return 0.01f * static_cast<float>((step * 7 + rank * 3 + part * 5 + static_cast<int64_t>(i)) %
                                    13) -
         0.06f;
}

// Each of `forwards` `copies` times, shuffled.
template <typename Forward>
std::vector<Forward> Shuffled(const std::vector<Forward>& forwards, int copies, uint32_t seed) {
  std::vector<Forward> deliveries;
  for (int c = 0; c < copies; ++c) {
    deliveries.insert(deliveries.end(), forwards.begin(), forwards.end());
  }
  std::shuffle(deliveries.begin(), deliveries.end(), std::mt19937(seed));
  return deliveries;
}

// Runs `deliver(i)` for i in [0, count) split over `threads` threads, interleaved.
void DeliverOnThreads(int threads, size_t count, const std::function<void(size_t)>& deliver) {
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < count; i += static_cast<size_t>(threads)) {
        deliver(i);
      }
    });
  }
  for (std::thread& thread : running) thread.join();
}

class ReplicatedPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto metrics = PsMetrics::Register(&registry_);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(metrics).value();
  }

  // A forward as a Forwarder was given it, with its acknowledgement-done callback.
  template <typename Forward>
  struct Sent {
    std::string to;
    Forward forward;
    std::function<void()> done;
  };
  // Forwards captured from any thread.
  template <typename Forward>
  struct Captured {
    std::mutex mu;
    std::vector<Sent<Forward>> sent;  // guarded by mu
    void Add(const std::string& to, Forward forward, std::function<void()> done) {
      std::lock_guard<std::mutex> lock(mu);
      sent.push_back({to, std::move(forward), std::move(done)});
    }
    std::vector<Forward> Forwards() {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<Forward> forwards;
      for (const auto& one : sent) forwards.push_back(one.forward);
      return forwards;
    }
    void AcknowledgeAll() {
      std::vector<std::function<void()>> done;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& one : sent) done.push_back(std::move(one.done));
        sent.clear();
      }
      for (const auto& one : done) one();
    }
  };
  using DenseSent = Captured<DenseShard::ForwardedStep>;
  using RowsSent = Captured<SparseTables::ForwardedRows>;

  std::unique_ptr<DenseShard> CreateDense(DenseSent* sent) {
    const PsJobConfig config = AsyncMomentumConfig();
    DenseShard::Forwarder forwarder;
    if (sent != nullptr) {
      forwarder = [sent](const std::string& to, DenseShard::ForwardedStep step,
                         std::function<void()> done) {
        sent->Add(to, std::move(step), std::move(done));
      };
    }
    auto shard = DenseShard::Create(config, {0, 1, 100},
                                    {TensorData::Floats("c0", 0, std::vector<float>(4, 1)),
                                     TensorData::Floats("c1", 1, std::vector<float>(4, 2)),
                                     TensorData::Floats("c2", 2, std::vector<float>(2, 3))},
                                    metrics_.get(), std::move(forwarder));
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? std::move(shard).value() : nullptr;
  }

  // Every worker's pushes of steps 1 to kSteps, each to some of the chunks, at `primary`
  // naming `chain`: the forwards it sent.
  std::vector<DenseShard::ForwardedStep> PushDense(DenseShard* primary, DenseSent* sent,
                                                   const std::string& chain) {
    const std::vector<size_t> sizes = {4, 4, 2};
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (int rank = 0; rank < kWorkers; ++rank) {
        std::vector<TensorData> grads;
        for (int chunk = 0; chunk < 3; ++chunk) {
          if ((step + rank + chunk) % 3 == 0) continue;  // not every chunk in every push
          std::vector<float> grad(sizes[chunk]);
          for (size_t i = 0; i < grad.size(); ++i) grad[i] = Gradient(rank, step, chunk, i);
          grads.push_back(TensorData::Floats("chunk", static_cast<uint64_t>(chunk), grad));
        }
        Status status =
            primary->PushPull(rank, step, grads, true, [](PsPushPullReply) {}, false, -1, chain);
        EXPECT_TRUE(status.ok()) << status;
      }
    }
    std::vector<DenseShard::ForwardedStep> forwards = sent->Forwards();
    EXPECT_EQ(forwards.size(), static_cast<size_t>(kSteps * kWorkers));
    return forwards;
  }

  static void ExpectAlike(const DenseShard& copy, const DenseShard& primary,
                          const std::string& what) {
    const auto ours = copy.Snapshot();
    const auto theirs = primary.Snapshot();
    for (uint64_t chunk : {0, 1, 2}) {
      EXPECT_EQ(ours.at(chunk).values, theirs.at(chunk).values) << what << ", chunk " << chunk;
      EXPECT_EQ(ours.at(chunk).state, theirs.at(chunk).state) << what << ", chunk " << chunk;
    }
    EXPECT_EQ(copy.AppliedUpdates(), primary.AppliedUpdates()) << what;
  }

  std::unique_ptr<SparseTables> CreateTables(RowsSent* sent) {
    SparseTables::Forwarder forwarder;
    if (sent != nullptr) {
      forwarder = [sent](const std::string& to, SparseTables::ForwardedRows rows,
                         std::function<void()> done) {
        sent->Add(to, std::move(rows), std::move(done));
      };
    }
    // Server 1 of 2.
    return std::make_unique<SparseTables>(AsyncMomentumConfig(), 1, 2, metrics_.get(),
                                          std::move(forwarder));
  }

  // Every worker's row pushes of steps 1 to kSteps at `primary` naming `chain`, some rows
  // twice in a push: the forwards it sent.
  std::vector<SparseTables::ForwardedRows> PushRows(SparseTables* primary, RowsSent* sent,
                                                    const std::string& chain) {
    std::vector<int64_t> owned;  // rows of server 1
    for (int64_t id = 0; owned.size() < 6; ++id) {
      if (SparseRowOwner(0, id, 2) == 1) owned.push_back(id);
    }
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (int rank = 0; rank < kWorkers; ++rank) {
        std::vector<int64_t> ids = {owned[(step + rank) % 6], owned[(step * 2 + rank) % 6]};
        std::vector<float> grads;
        for (size_t i = 0; i < 4; ++i) grads.push_back(Gradient(rank, step, 0, i));
        Status status = primary->Push("emb.0", rank, step, TensorData::Int64s("row_ids", ids),
                                      TensorData::Floats("values", 0, grads), chain);
        EXPECT_TRUE(status.ok()) << status;
      }
    }
    std::vector<SparseTables::ForwardedRows> forwards = sent->Forwards();
    EXPECT_EQ(forwards.size(), static_cast<size_t>(kSteps * kWorkers));
    return forwards;
  }

  static void ExpectAlike(const SparseTables& copy, const SparseTables& primary,
                          const std::string& what) {
    const TableRows ours = copy.Snapshot().at("emb.0");
    const TableRows theirs = primary.Snapshot().at("emb.0");
    EXPECT_EQ(ours.ids, theirs.ids) << what;
    EXPECT_EQ(ours.values, theirs.values) << what;
    EXPECT_EQ(ours.state, theirs.state) << what;
  }

  MetricsRegistry registry_;
  std::unique_ptr<PsMetrics> metrics_;
};

TEST_F(ReplicatedPartsTest, ADenseCopyAppliesShuffledDuplicatedForwardsOnceInTheirOrder) {
  DenseSent sent;
  auto primary = CreateDense(&sent);
  auto backup = CreateDense(nullptr);
  ASSERT_NE(primary, nullptr);
  ASSERT_NE(backup, nullptr);
  const auto deliveries = Shuffled(PushDense(primary.get(), &sent, kMiddle), 2, 7);
  int taken = 0;
  for (const DenseShard::ForwardedStep& forward : deliveries) {
    ASSERT_TRUE(backup->ApplyForwarded(forward, [&taken] { ++taken; }).ok());
  }
  EXPECT_EQ(taken, static_cast<int>(deliveries.size()));  // each delivery acknowledged
  ExpectAlike(*backup, *primary, "the backup");
}

TEST_F(ReplicatedPartsTest, ADenseCopyTakesForwardsFromSeveralThreadsAtOnce) {
  DenseSent sent;
  auto primary = CreateDense(&sent);
  auto backup = CreateDense(nullptr);
  ASSERT_NE(primary, nullptr);
  ASSERT_NE(backup, nullptr);
  const auto deliveries = Shuffled(PushDense(primary.get(), &sent, kMiddle), 3, 11);
  std::atomic<int> taken{0};
  DeliverOnThreads(4, deliveries.size(), [&](size_t i) {
    Status status = backup->ApplyForwarded(deliveries[i], [&taken] { ++taken; });
    EXPECT_TRUE(status.ok()) << status;
  });
  EXPECT_EQ(taken.load(), static_cast<int>(deliveries.size()));
  ExpectAlike(*backup, *primary, "the backup");
}

// A chain's middle copy passes each update on as it applies it, and acknowledges a forward
// only once the last copy has it; delivered concurrently and duplicated at both copies.
TEST_F(ReplicatedPartsTest, ADenseChainPassesEachUpdateOnOnce) {
  DenseSent sent;
  DenseSent onward;
  auto primary = CreateDense(&sent);
  auto middle = CreateDense(&onward);
  auto last = CreateDense(nullptr);
  ASSERT_NE(primary, nullptr);
  ASSERT_NE(middle, nullptr);
  ASSERT_NE(last, nullptr);
  auto forwards = PushDense(primary.get(), &sent, std::string(kMiddle) + "," + kLast);
  for (DenseShard::ForwardedStep& forward : forwards) forward.forward_to = kLast;
  const auto deliveries = Shuffled(forwards, 2, 13);
  std::atomic<int> taken{0};
  DeliverOnThreads(3, deliveries.size(), [&](size_t i) {
    Status status = middle->ApplyForwarded(deliveries[i], [&taken] { ++taken; });
    EXPECT_TRUE(status.ok()) << status;
  });
  EXPECT_EQ(taken.load(), 0);  // the last copy has none of them yet
  ExpectAlike(*middle, *primary, "the middle copy");
  const auto passed_on = Shuffled(onward.Forwards(), 2, 17);
  int64_t updates = 0;
  for (const auto& forward : onward.Forwards()) {
    updates += static_cast<int64_t>(forward.updates.size());
  }
  EXPECT_EQ(updates, primary->AppliedUpdates());  // each update passed on once
  DeliverOnThreads(3, passed_on.size(), [&](size_t i) {
    Status status = last->ApplyForwarded(passed_on[i], [] {});
    EXPECT_TRUE(status.ok()) << status;
  });
  ExpectAlike(*last, *primary, "the last copy");
  onward.AcknowledgeAll();
  EXPECT_EQ(taken.load(), static_cast<int>(deliveries.size()));
}

TEST_F(ReplicatedPartsTest, ATableCopyAppliesShuffledDuplicatedForwardsOnceInTheirOrder) {
  RowsSent sent;
  auto primary = CreateTables(&sent);
  auto backup = CreateTables(nullptr);
  const auto deliveries = Shuffled(PushRows(primary.get(), &sent, kMiddle), 2, 19);
  int taken = 0;
  for (const SparseTables::ForwardedRows& forward : deliveries) {
    ASSERT_TRUE(backup->ApplyForwarded(forward, [&taken] { ++taken; }).ok());
  }
  EXPECT_EQ(taken, static_cast<int>(deliveries.size()));
  ExpectAlike(*backup, *primary, "the backup");
}

TEST_F(ReplicatedPartsTest, ATableCopyTakesForwardsFromSeveralThreadsAtOnce) {
  RowsSent sent;
  auto primary = CreateTables(&sent);
  auto backup = CreateTables(nullptr);
  const auto deliveries = Shuffled(PushRows(primary.get(), &sent, kMiddle), 3, 23);
  std::atomic<int> taken{0};
  DeliverOnThreads(4, deliveries.size(), [&](size_t i) {
    Status status = backup->ApplyForwarded(deliveries[i], [&taken] { ++taken; });
    EXPECT_TRUE(status.ok()) << status;
  });
  EXPECT_EQ(taken.load(), static_cast<int>(deliveries.size()));
  ExpectAlike(*backup, *primary, "the backup");
}

TEST_F(ReplicatedPartsTest, ATableChainPassesEachUpdateOnOnce) {
  RowsSent sent;
  RowsSent onward;
  auto primary = CreateTables(&sent);
  auto middle = CreateTables(&onward);
  auto last = CreateTables(nullptr);
  auto forwards = PushRows(primary.get(), &sent, std::string(kMiddle) + "," + kLast);
  for (SparseTables::ForwardedRows& forward : forwards) forward.forward_to = kLast;
  const auto deliveries = Shuffled(forwards, 2, 29);
  std::atomic<int> taken{0};
  DeliverOnThreads(3, deliveries.size(), [&](size_t i) {
    Status status = middle->ApplyForwarded(deliveries[i], [&taken] { ++taken; });
    EXPECT_TRUE(status.ok()) << status;
  });
  EXPECT_EQ(taken.load(), 0);
  ExpectAlike(*middle, *primary, "the middle copy");
  EXPECT_EQ(onward.Forwards().size(), forwards.size());  // each update passed on once
  const auto passed_on = Shuffled(onward.Forwards(), 2, 31);
  DeliverOnThreads(3, passed_on.size(), [&](size_t i) {
    Status status = last->ApplyForwarded(passed_on[i], [] {});
    EXPECT_TRUE(status.ok()) << status;
  });
  ExpectAlike(*last, *primary, "the last copy");
  onward.AcknowledgeAll();
  EXPECT_EQ(taken.load(), static_cast<int>(deliveries.size()));
}

}  // namespace
}  // namespace tessera::server
