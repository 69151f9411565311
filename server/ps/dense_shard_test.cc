#include "server/ps/dense_shard.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/metrics/metrics.h"
#include "server/ps/pushes_around_a_copy.h"

namespace tessera::server {
namespace {

using Floats = std::vector<float>;

// 10 floats in chunks of 4 (sizes 4, 4, 2); SGD lr 0.5.
PsJobConfig Config(PsConsistency consistency, int num_workers) {
  PsJobConfig config;
  config.consistency = consistency;
  config.num_workers = num_workers;
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kSgd);
  config.optimizer.lr = 0.5f;
  config.dense_elements = 10;
  config.chunk_elements = 4;
  return config;
}

// The address a primary is told its backup has.
constexpr char kBackup[] = "tcp://10.0.0.2:5000";

// As Config, with momentum (lr 0.25): optimizer state that a copy must match too.
PsJobConfig MomentumConfig(PsConsistency consistency, int num_workers) {
  PsJobConfig config = Config(consistency, num_workers);
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
  config.optimizer.lr = 0.25f;
  return config;
}

TensorData Chunk(uint64_t key, Floats values) { return TensorData::Floats("chunk", key, values); }
TensorData Ask(uint64_t key) { return TensorData{"chunk", key, DataType::kFloat32, {}, Payload()}; }

// A reply, once it came.
struct Captured {
  std::shared_ptr<std::optional<PsPushPullReply>> reply =
      std::make_shared<std::optional<PsPushPullReply>>();
  DenseShard::ReplyCallback Callback() const {
    return [reply = reply](PsPushPullReply r) {
      ASSERT_FALSE(reply->has_value()) << "answered twice";
      *reply = std::move(r);
    };
  }
  bool came() const { return reply->has_value(); }
  Floats Values(size_t i) const { return (*reply)->tensors.at(i).Read<float>(); }
};

class DenseShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto metrics = PsMetrics::Register(&registry_);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(metrics).value();
  }

  // Server 0 of 1 (keys 0, 1, 2) with chunk c's values all c + 1.
  std::unique_ptr<DenseShard> Create(const PsJobConfig& config) {
    auto shard = DenseShard::Create(config, {0, 1, 100},
                                    {Chunk(0, Floats(4, 1)), Chunk(1, Floats(4, 2)),
                                     Chunk(2, Floats(2, 3))},
                                    metrics_.get());
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? std::move(shard).value() : nullptr;
  }

  // What a primary's Forwarder was given.
  struct Sent {
    std::string to;
    DenseShard::ForwardedStep step;
    std::function<void()> done;
  };
  // As Create, forwarding into sent_ (a range's primary, --replicas 2).
  std::unique_ptr<DenseShard> CreatePrimary(const PsJobConfig& config) {
    auto shard = DenseShard::Create(
        config, {0, 1, 100},
        {Chunk(0, Floats(4, 1)), Chunk(1, Floats(4, 2)), Chunk(2, Floats(2, 3))}, metrics_.get(),
        [this](const std::string& to, DenseShard::ForwardedStep step, std::function<void()> done) {
          sent_.push_back({to, std::move(step), std::move(done)});
        });
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? std::move(shard).value() : nullptr;
  }

  Captured Push(DenseShard& shard, int rank, int64_t step, std::vector<TensorData> grads,
                bool stop = false, int join = -1) {
    Captured captured;
    Status status = shard.PushPull(rank, step, grads, true, captured.Callback(), stop, join);
    EXPECT_TRUE(status.ok()) << status;
    return captured;
  }

  MetricsRegistry registry_;
  std::unique_ptr<PsMetrics> metrics_;
  std::vector<Sent> sent_;
};

TEST_F(DenseShardTest, CreateNeedsExactlyTheChunksOfThisServer) {
  const PsJobConfig config = Config(PsConsistency::kSync, 1);
  auto missing = DenseShard::Create(config, {0, 1, 100}, {Chunk(0, Floats(4)), Chunk(1, Floats(4))},
                                    metrics_.get());
  EXPECT_EQ(missing.status().message(),
            "init: chunk 2 (key 2, 2 floats) is missing or has the wrong size");
  auto short_chunk = DenseShard::Create(
      config, {0, 1, 100}, {Chunk(0, Floats(3)), Chunk(1, Floats(4)), Chunk(2, Floats(2))},
      metrics_.get());
  EXPECT_EQ(short_chunk.status().code(), StatusCode::kInvalidArgument);
  // Server 1 of 2 owns chunk 1 only (key 50).
  auto extra = DenseShard::Create(config, {1, 2, 100}, {Chunk(50, Floats(4)), Chunk(0, Floats(4))},
                                  metrics_.get());
  EXPECT_EQ(extra.status().message(), "init: 2 chunks sent, this server owns 1");
  auto mine = DenseShard::Create(config, {1, 2, 100}, {Chunk(50, Floats(4))}, metrics_.get());
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_EQ((*mine)->chunks().size(), 1u);
  EXPECT_EQ((*mine)->chunks()[0].index, 1u);
}

TEST_F(DenseShardTest, SyncRepliesOnceEveryWorkerPushedWithTheChunksInRequestOrder) {
  auto shard = Create(Config(PsConsistency::kSync, 2));
  Captured first = Push(*shard, 1, 1, {Chunk(2, {2, 2}), Chunk(0, {1, 1, 1, 1})});
  EXPECT_FALSE(first.came());
  EXPECT_EQ(shard->FirstBehind(1), "chunk 0");
  Captured second = Push(*shard, 0, 1, {Chunk(0, {3, 3, 3, 3}), Chunk(2, {0, 4})});
  ASSERT_TRUE(first.came());
  ASSERT_TRUE(second.came());
  EXPECT_EQ((*first.reply)->tensors[0].key, 2u);
  EXPECT_EQ((*first.reply)->tensors[0].name, "chunk2");
  EXPECT_EQ(first.Values(0), (Floats{2.5f, 1.5f}));   // 3 - 0.5 * mean(2, 0), mean(2, 4)
  EXPECT_EQ(first.Values(1), (Floats{0, 0, 0, 0}));   // 1 - 0.5 * 2
  EXPECT_EQ(second.Values(0), first.Values(1));
  EXPECT_EQ(shard->FirstBehind(1), "chunk 1");        // never pushed
}

TEST_F(DenseShardTest, RefusesBadPushesBeforeChangingAnything) {
  auto shard = Create(Config(PsConsistency::kAsync, 2));
  Captured never;
  Status early = shard->PushPull(0, 0, {Chunk(0, Floats(4))}, true, never.Callback());
  EXPECT_EQ(early.message(), "push of step 0; steps start at 1");
  Status size = shard->PushPull(0, 1, {Chunk(0, Floats(4)), Chunk(1, Floats(3))}, true,
                                never.Callback());
  EXPECT_EQ(size.message(), "chunk 1 has 4 floats; the push carries 12 bytes of float32");
  Status key = shard->PushPull(0, 1, {Chunk(7, Floats(4))}, true, never.Callback());
  EXPECT_EQ(key.code(), StatusCode::kNotFound);
  EXPECT_EQ(key.message(), "key 7 is not a chunk of this job on server 0 (3 chunks here)");
  EXPECT_FALSE(never.came());
  Captured pull;
  ASSERT_TRUE(shard->PushPull(0, 1, {Ask(0)}, false, pull.Callback()).ok());
  EXPECT_EQ(pull.Values(0), Floats(4, 1));  // chunk 0 took nothing

  // A gradient with a NaN or Inf anywhere, in any chunk of the request: nothing is applied,
  // the error names the worker, step, chunk, key and element, and the refusal is counted.
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    Status poisoned = shard->PushPull(
        1, 1, {Chunk(0, Floats(4, 0.25f)), Chunk(1, Floats{0.5f, 0.5f, bad, 0.5f})}, true,
        never.Callback());
    EXPECT_EQ(poisoned.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(poisoned.message(),
              "worker 1's push of step 1: the gradient of chunk 1 (key 1) holds " +
                  std::string(std::isnan(bad) ? "nan" : "inf") +
                  " at element 2; refused, nothing of this push was applied");
  }
  EXPECT_NE(registry_.RenderText().find("tessera_ps_nonfinite_pushes_total{kind=\"dense\"} 2"),
            std::string::npos);
  EXPECT_FALSE(never.came());
  Captured after;
  ASSERT_TRUE(shard->PushPull(1, 1, {Ask(0), Ask(1)}, false, after.Callback()).ok());
  EXPECT_EQ(after.Values(0), Floats(4, 1));  // neither chunk took anything
  EXPECT_EQ(after.Values(1), Floats(4, 2));

  auto other = DenseShard::Create(Config(PsConsistency::kAsync, 2), {1, 2, 100},
                                  {Chunk(50, Floats(4))}, metrics_.get());
  ASSERT_TRUE(other.ok());
  Status foreign = (*other)->PushPull(0, 1, {Ask(3)}, false, never.Callback());
  EXPECT_EQ(foreign.message(), "key 3 belongs to server 0, not server 1");
}

// ps-sync: a worker's skip of a step drops it for every worker: nothing applied, every reply
// goes with the values of the step before and names who skipped; the next step applies.
TEST_F(DenseShardTest, SyncSkipDropsTheStepForEveryWorkerAndNamesWhoSkipped) {
  auto shard = Create(Config(PsConsistency::kSync, 2));
  Captured pushed = Push(*shard, 0, 1, {Chunk(0, Floats(4, 1)), Chunk(2, Floats(2, 1))});
  Captured skipped;
  ASSERT_TRUE(shard->Skip(1, 1, {Ask(0), Ask(2)}, skipped.Callback()).ok());
  ASSERT_TRUE(pushed.came());
  ASSERT_TRUE(skipped.came());
  for (const Captured* reply : {&pushed, &skipped}) {
    EXPECT_EQ((*reply->reply)->skipped_by, 1);
    EXPECT_EQ(reply->Values(0), Floats(4, 1));  // as initialised: nothing applied
    EXPECT_EQ(reply->Values(1), Floats(2, 3));
  }
  EXPECT_EQ(shard->FirstBehind(1), "chunk 1");  // chunks 0 and 2 are at step 1
  Captured next = Push(*shard, 1, 2, {Chunk(0, Floats(4, 2))});
  Captured last = Push(*shard, 0, 2, {Chunk(0, Floats(4, 2))});
  ASSERT_TRUE(next.came());
  EXPECT_EQ((*next.reply)->skipped_by, -1);
  EXPECT_EQ(next.Values(0), Floats(4, 0));  // 1 - 0.5 * 2
  EXPECT_EQ(last.Values(0), next.Values(0));
}

// ps-sync: a push that asks to stop makes every reply with the values after its step name
// the lowest rank that asked, whichever push of the step came last; the pull of the next step
// (how a copy of an answered push is answered again) says the same; a later step without a
// stop request says nothing; a skip asks like a push.
TEST_F(DenseShardTest, SyncRepliesOfAStepNameTheLowestRankAskedToStopInIt) {
  auto shard = Create(Config(PsConsistency::kSync, 3));
  Captured first = Push(*shard, 0, 1, {Chunk(0, Floats(4, 1)), Chunk(2, Floats(2, 1))});
  Captured second = Push(*shard, 2, 1, {Chunk(0, Floats(4, 1)), Chunk(2, Floats(2, 1))},
                         /*stop=*/true);
  EXPECT_FALSE(second.came());
  Captured last = Push(*shard, 1, 1, {Chunk(0, Floats(4, 1)), Chunk(2, Floats(2, 1))},
                       /*stop=*/true);
  for (const Captured* reply : {&first, &second, &last}) {
    ASSERT_TRUE(reply->came());
    EXPECT_EQ((*reply->reply)->stopped_by, 1);
    EXPECT_EQ(reply->Values(0), Floats(4, 0.5f));  // applied as usual
  }
  Captured again;
  ASSERT_TRUE(shard->PushPull(0, 2, {Ask(0), Ask(2)}, false, again.Callback()).ok());
  ASSERT_TRUE(again.came());
  EXPECT_EQ((*again.reply)->stopped_by, 1);

  std::vector<Captured> next;
  for (int rank = 0; rank < 3; ++rank) next.push_back(Push(*shard, rank, 2, {Chunk(0, Floats(4))}));
  for (const Captured& reply : next) {
    ASSERT_TRUE(reply.came());
    EXPECT_EQ((*reply.reply)->stopped_by, -1);
  }
  Captured skipped;
  ASSERT_TRUE(shard->Skip(2, 3, {Ask(0)}, skipped.Callback(), /*stop=*/true).ok());
  Captured a = Push(*shard, 0, 3, {Chunk(0, Floats(4))});
  Captured b = Push(*shard, 1, 3, {Chunk(0, Floats(4))});
  for (const Captured* reply : {&skipped, &a, &b}) {
    ASSERT_TRUE(reply->came());
    EXPECT_EQ((*reply->reply)->stopped_by, 2);
    EXPECT_EQ((*reply->reply)->skipped_by, 2);
  }
}

// ps-sync: a server said to join (a replacement of a failed one) is named in every reply of the
// step the same way, the lowest rank when pushes disagree, beside a stop; the next step without
// one says nothing.
TEST_F(DenseShardTest, SyncRepliesOfAStepNameTheLowestServerSaidToJoinInIt) {
  auto shard = Create(Config(PsConsistency::kSync, 3));
  Captured first = Push(*shard, 0, 1, {Chunk(0, Floats(4, 1))});
  Captured second = Push(*shard, 1, 1, {Chunk(0, Floats(4, 1))}, /*stop=*/false, /*join=*/2);
  Captured last = Push(*shard, 2, 1, {Chunk(0, Floats(4, 1))}, /*stop=*/true, /*join=*/1);
  for (const Captured* reply : {&first, &second, &last}) {
    ASSERT_TRUE(reply->came());
    EXPECT_EQ((*reply->reply)->joining, 1);
    EXPECT_EQ((*reply->reply)->stopped_by, 2);
  }
  std::vector<Captured> next;
  for (int rank = 0; rank < 3; ++rank) next.push_back(Push(*shard, rank, 2, {Chunk(0, Floats(4))}));
  for (const Captured& reply : next) {
    ASSERT_TRUE(reply.came());
    EXPECT_EQ((*reply.reply)->joining, -1);
  }
}

// ps-async and ps-ssp have no common step to stop after: a stop request changes no reply.
// Forwarded steps (--replicas 2): the primary sends each step it applies, with the averaged
// gradients and the step's notes, to the backup named with the pushes, and the step's replies
// (and pulls of its values) wait until the backup has it; the backup's ApplyForwarded then
// holds bitwise the primary's values and optimizer state, takes a copy of a step once, and
// refuses a step it cannot apply yet. Pushes naming no backup are answered at once.
TEST_F(DenseShardTest, SyncForwardsEachAppliedStepAndItsRepliesWaitForTheBackup) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kSync, 2);
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  auto backup = Create(config);
  const std::vector<TensorData> grads0 = {Chunk(0, {0.1f, 0.2f, 0.3f, 0.4f}),
                                          Chunk(1, {1, -1, 0.5f, 3})};
  const std::vector<TensorData> grads1 = {Chunk(0, {0.7f, 0.3f, -0.3f, 1e-3f}),
                                          Chunk(1, {0.25f, 2, 0, -7})};
  for (int64_t step = 1; step <= 2; ++step) {
    Captured first, last, pull;
    ASSERT_TRUE(
        primary->PushPull(0, step, grads0, true, first.Callback(), false, -1, kBackup).ok());
    ASSERT_TRUE(primary
                    ->PushPull(1, step, grads1, true, last.Callback(), /*stop=*/step == 2,
                               /*join=*/-1, kBackup)
                    .ok());
    ASSERT_TRUE(primary->PushPull(0, step + 1, {Ask(0)}, false, pull.Callback()).ok());
    // One forward for the chunks the last push completed, the primary's step applied.
    ASSERT_EQ(sent_.size(), static_cast<size_t>(step));
    const Sent& forwarded = sent_.back();
    EXPECT_EQ(forwarded.to, kBackup);
    EXPECT_EQ(forwarded.step.step, step);
    ASSERT_EQ(forwarded.step.gradients.size(), 2u);
    EXPECT_EQ(forwarded.step.gradients[0].key, 0u);
    EXPECT_EQ(forwarded.step.gradients[1].key, 1u);
    EXPECT_EQ(forwarded.step.gradients[0].Read<float>(),
              (Floats{(0.1f + 0.7f) * 0.5f, (0.2f + 0.3f) * 0.5f, (0.3f - 0.3f) * 0.5f,
                      (0.4f + 1e-3f) * 0.5f}));
    EXPECT_EQ(forwarded.step.stopped_by, step == 2 ? 1 : -1);
    EXPECT_EQ(forwarded.step.dropped_by, -1);
    EXPECT_FALSE(first.came());
    EXPECT_FALSE(last.came());
    EXPECT_FALSE(pull.came());
    int taken = 0;
    ASSERT_TRUE(backup->ApplyForwarded(forwarded.step, [&taken] { ++taken; }).ok());
    EXPECT_EQ(taken, 1);
    forwarded.done();
    ASSERT_TRUE(first.came());
    ASSERT_TRUE(last.came());
    ASSERT_TRUE(pull.came());
    EXPECT_EQ((*first.reply)->stopped_by, step == 2 ? 1 : -1);
    const auto theirs = primary->Snapshot();
    const auto ours = backup->Snapshot();
    for (uint64_t c : {0, 1, 2}) {
      EXPECT_EQ(ours.at(c).values, theirs.at(c).values) << "chunk " << c << " after step " << step;
      EXPECT_EQ(ours.at(c).state, theirs.at(c).state) << "chunk " << c << " after step " << step;
    }
    EXPECT_EQ(first.Values(0), theirs.at(0).values);
  }
  // A copy of a forward (resent) is acknowledged again and changes nothing; a step ahead of
  // the copy is refused, unacknowledged.
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  const auto before = backup->Snapshot();
  ASSERT_TRUE(backup->ApplyForwarded(sent_.back().step, take).ok());
  EXPECT_EQ(taken, 1);
  EXPECT_EQ(backup->Snapshot().at(0).values, before.at(0).values);
  DenseShard::ForwardedStep ahead = sent_.back().step;
  ahead.step = 4;
  const Status refused = backup->ApplyForwarded(ahead, take);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "forwarded step 4 of chunk 0: this copy is at step 2, and a forwarded step applies "
            "to the one before it");
  ahead.step = 3;
  ahead.gradients = {Chunk(0, {1, 2})};
  EXPECT_EQ(backup->ApplyForwarded(ahead, take).message(),
            "chunk 0 has 4 floats; the forwarded step carries 8 bytes of float32");
  ahead.gradients = {Chunk(7, {1, 2})};
  EXPECT_EQ(backup->ApplyForwarded(ahead, take).code(), StatusCode::kNotFound);
  EXPECT_EQ(taken, 1);
  // Without a backup named, the step's replies go at once and nothing is forwarded.
  Captured first, last;
  ASSERT_TRUE(primary->PushPull(0, 3, grads0, true, first.Callback()).ok());
  ASSERT_TRUE(primary->PushPull(1, 3, grads1, true, last.Callback()).ok());
  EXPECT_TRUE(first.came());
  EXPECT_TRUE(last.came());
  EXPECT_EQ(sent_.size(), 2u);
}

// After the primary failed, the workers push its step again to the backup: one that took the
// step already answers each worker once with its values; a push of the step held there when
// the step's forward arrives is answered by it (a dropped step names who skipped it); a step
// the backup never got completes there from the pushes.
TEST_F(DenseShardTest, ABackupAnswersPushesOfAForwardedStepWithItsValues) {
  auto backup = Create(Config(PsConsistency::kSync, 2));
  DenseShard::ForwardedStep one;
  one.step = 1;
  one.gradients = {Chunk(0, {2, 2, 2, 2})};
  one.joining = 2;
  ASSERT_TRUE(backup->ApplyForwarded(one, [] {}).ok());
  Captured late = Push(*backup, 0, 1, {Chunk(0, {9, 9, 9, 9})});
  ASSERT_TRUE(late.came());
  EXPECT_EQ(late.Values(0), (Floats{0, 0, 0, 0}));  // 1 - 0.5 * 2: the forwarded gradient's
  EXPECT_EQ((*late.reply)->joining, 2);
  Captured held = Push(*backup, 1, 2, {Chunk(0, {1, 1, 1, 1})});
  EXPECT_FALSE(held.came());
  DenseShard::ForwardedStep two;
  two.step = 2;
  two.gradients = {Ask(0)};
  two.dropped_by = 0;
  ASSERT_TRUE(backup->ApplyForwarded(two, [] {}).ok());
  ASSERT_TRUE(held.came());
  EXPECT_EQ(held.Values(0), (Floats{0, 0, 0, 0}));
  EXPECT_EQ((*held.reply)->skipped_by, 0);
  Captured after = Push(*backup, 0, 2, {Chunk(0, {5, 5, 5, 5})});
  ASSERT_TRUE(after.came());
  EXPECT_EQ((*after.reply)->skipped_by, 0);
  Captured a = Push(*backup, 0, 3, {Chunk(0, {1, 1, 1, 1})});
  Captured b = Push(*backup, 1, 3, {Chunk(0, {3, 3, 3, 3})});
  ASSERT_TRUE(b.came());
  EXPECT_EQ(b.Values(0), (Floats{-1, -1, -1, -1}));  // 0 - 0.5 * 2
}

// ps-async with two copies: each push the primary applies goes to the backup with its update
// number per chunk, and its reply waits until the backup has every update of its chunks up to
// it. Forwards that overtake one another are parked and applied in the primary's order, so the
// backup holds bitwise the primary's values and optimizer state; a copy changes nothing.
TEST_F(DenseShardTest, AsyncForwardsEachPushAndTheBackupAppliesThemInThePrimarysOrder) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  auto backup = Create(config);
  auto push = [&](int rank, int64_t step, std::vector<TensorData> grads) {
    Captured captured;
    EXPECT_TRUE(
        primary->PushPull(rank, step, grads, true, captured.Callback(), false, -1, kBackup).ok());
    return captured;
  };
  Captured a = push(0, 1, {Chunk(0, {0.1f, 0.2f, 0.3f, 0.4f}), Chunk(1, {1, -1, 0.5f, 3})});
  Captured b = push(1, 1, {Chunk(0, {0.7f, 0.3f, -0.3f, 1e-3f}), Chunk(1, {0.25f, 2, 0, -7})});
  Captured c = push(0, 2, {Chunk(0, {-2, 1, 1e-4f, 5})});
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[1].step.pushed_by, 1);
  EXPECT_EQ(sent_[1].step.step, 1);
  EXPECT_EQ(sent_[1].step.updates, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(sent_[2].step.updates, (std::vector<int64_t>{3}));
  EXPECT_EQ(sent_[2].step.gradients.at(0).Read<float>(), (Floats{-2, 1, 1e-4f, 5}));
  for (const Captured* reply : {&a, &b, &c}) EXPECT_FALSE(reply->came());
  // Delivered last first: parked (and acknowledged) until the first one comes.
  const auto initial = backup->Snapshot();
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  ASSERT_TRUE(backup->ApplyForwarded(sent_[2].step, take).ok());
  ASSERT_TRUE(backup->ApplyForwarded(sent_[1].step, take).ok());
  EXPECT_EQ(taken, 2);
  EXPECT_EQ(backup->Snapshot().at(0).values, initial.at(0).values);
  ASSERT_TRUE(backup->ApplyForwarded(sent_[0].step, take).ok());
  const auto theirs = primary->Snapshot();
  for (uint64_t chunk : {0, 1, 2}) {
    EXPECT_EQ(backup->Snapshot().at(chunk).values, theirs.at(chunk).values) << "chunk " << chunk;
    EXPECT_EQ(backup->Snapshot().at(chunk).state, theirs.at(chunk).state) << "chunk " << chunk;
  }
  // Worker 1's reply needs updates 1 and 2 of chunk 0 acknowledged.
  sent_[1].done();
  EXPECT_FALSE(b.came());
  sent_[0].done();
  EXPECT_TRUE(a.came());
  EXPECT_TRUE(b.came());
  EXPECT_FALSE(c.came());
  sent_[2].done();
  ASSERT_TRUE(c.came());
  EXPECT_EQ(c.Values(0), theirs.at(0).values);
  // A copy of a forward is acknowledged and changes nothing.
  ASSERT_TRUE(backup->ApplyForwarded(sent_[1].step, take).ok());
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(backup->Snapshot().at(0).state, theirs.at(0).state);
  // Malformed forwards are refused unacknowledged.
  DenseShard::ForwardedStep bad = sent_[0].step;
  bad.pushed_by = 2;
  EXPECT_EQ(backup->ApplyForwarded(bad, take).message(),
            "worker 2's push of step 1, forwarded: the job has workers 0 to 1");
  bad = sent_[0].step;
  bad.updates = {4};
  EXPECT_EQ(backup->ApplyForwarded(bad, take).message(),
            "worker 0's push of step 1, forwarded: 2 chunks and 1 update numbers");
  EXPECT_EQ(taken, 4);
}

// ps-async with three copies: the primary forwards each push along the chain "middle,last";
// the middle applies the forwards in the primary's order (parking one that overtook the one
// before it), passes each on to the last as it applies it, and acknowledges a forward only
// once the last has each of its updates (a resend of one, once the first is). All three end
// bitwise alike. Then the primary fails with a forward parked at the middle behind one lost
// with it: the lost push, asked again of the middle, applies the parked one first, both go on
// to the last numbered as the middle applied them, and the last stays bitwise the middle.
TEST_F(DenseShardTest, AsyncChainOfThreeCopiesPassesUpdatesOnAndAcknowledgesFromTheEnd) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  constexpr char kLast[] = "tcp://10.0.0.3:5000";
  const std::string chain = std::string(kBackup) + "," + kLast;
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  std::vector<Sent> onward;  // the middle's forwards
  auto middle = DenseShard::Create(
      config, {0, 1, 100}, {Chunk(0, Floats(4, 1)), Chunk(1, Floats(4, 2)), Chunk(2, Floats(2, 3))},
      metrics_.get(),
      [&onward](const std::string& to, DenseShard::ForwardedStep step, std::function<void()> done) {
        onward.push_back({to, std::move(step), std::move(done)});
      });
  ASSERT_TRUE(middle.ok()) << middle.status();
  auto last = Create(config);
  auto push = [&](DenseShard& shard, int rank, int64_t step, std::vector<TensorData> grads,
                  const std::string& forward_to) {
    Captured captured;
    EXPECT_TRUE(
        shard.PushPull(rank, step, grads, true, captured.Callback(), false, -1, forward_to).ok());
    return captured;
  };
  // The middle's forward of worker `rank`'s push of `step`.
  auto passed_on = [&onward](int rank, int64_t step) -> Sent& {
    for (Sent& sent : onward) {
      if (sent.step.pushed_by == rank && sent.step.step == step) return sent;
    }
    ADD_FAILURE() << "worker " << rank << "'s push of step " << step << " was not passed on";
    return onward.front();
  };
  auto expect_alike = [](DenseShard& a, DenseShard& b, const std::string& what) {
    const auto ours = a.Snapshot();
    const auto theirs = b.Snapshot();
    for (uint64_t chunk : {0, 1, 2}) {
      EXPECT_EQ(ours.at(chunk).values, theirs.at(chunk).values) << what << ", chunk " << chunk;
      EXPECT_EQ(ours.at(chunk).state, theirs.at(chunk).state) << what << ", chunk " << chunk;
    }
  };
  Captured a =
      push(*primary, 0, 1, {Chunk(0, {0.1f, 0.2f, 0.3f, 0.4f}), Chunk(1, {1, -1, 0.5f, 3})}, chain);
  Captured b = push(*primary, 1, 1, {Chunk(0, {0.7f, 0.3f, -0.3f, 1e-3f})}, chain);
  Captured c = push(*primary, 0, 2, {Chunk(0, {-2, 1, 1e-4f, 5})}, chain);
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[0].to, chain);  // StepForwarder sends it to the first, naming the rest
  for (Sent& sent : sent_) sent.step.forward_to = kLast;
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  // c's forward (update 3 of chunk 0) overtook b's: parked, not passed on, not acknowledged.
  ASSERT_TRUE((*middle)->ApplyForwarded(sent_[2].step, take).ok());
  EXPECT_TRUE(onward.empty());
  ASSERT_TRUE((*middle)->ApplyForwarded(sent_[0].step, take).ok());
  ASSERT_EQ(onward.size(), 1u);
  EXPECT_EQ(onward[0].to, kLast);
  EXPECT_EQ(onward[0].step.updates, (std::vector<int64_t>{1, 1}));
  ASSERT_TRUE((*middle)->ApplyForwarded(sent_[1].step, take).ok());
  ASSERT_EQ(onward.size(), 3u);  // b's, and c's once b's was applied
  EXPECT_EQ(passed_on(1, 1).step.updates, (std::vector<int64_t>{2}));
  EXPECT_EQ(passed_on(0, 2).step.updates, (std::vector<int64_t>{3}));
  ASSERT_TRUE((*middle)->ApplyForwarded(sent_[0].step, take).ok());  // a resend of a's
  EXPECT_EQ(onward.size(), 3u);
  EXPECT_EQ(taken, 0);  // the last copy has none of them yet
  // The last copy takes them in another order.
  for (Sent* sent : {&passed_on(0, 2), &passed_on(0, 1), &passed_on(1, 1)}) {
    ASSERT_TRUE(last->ApplyForwarded(sent->step, [] {}).ok());
  }
  passed_on(0, 1).done();
  EXPECT_EQ(taken, 2);  // a's forward and its resend
  passed_on(0, 2).done();
  EXPECT_EQ(taken, 2);  // c's update 3 needs b's update 2 there too
  passed_on(1, 1).done();
  EXPECT_EQ(taken, 4);
  expect_alike(**middle, *primary, "the middle copy");
  expect_alike(*last, *primary, "the last copy");
  for (Sent& sent : sent_) sent.done();
  for (const Captured* reply : {&a, &b, &c}) EXPECT_TRUE(reply->came());

  // Two more pushes; the primary fails with d's forward lost and e's taken by the middle.
  Captured d = push(*primary, 1, 2, {Chunk(0, {3, 3, -1, 0.5f})}, chain);
  Captured e = push(*primary, 0, 3, {Chunk(0, {0.25f, 1, 2, -3}), Chunk(1, {1, 1, 1, 1})}, chain);
  ASSERT_EQ(sent_.size(), 5u);
  sent_[4].step.forward_to = kLast;
  ASSERT_TRUE((*middle)->ApplyForwarded(sent_[4].step, take).ok());  // chunk 0 parked
  ASSERT_EQ(onward.size(), 4u);                                      // chunk 1's update 2, applied
  // Worker 1 asks the middle again (the primary's address for the range now), naming the last.
  Captured again = push(**middle, 1, 2, {Chunk(0, {3, 3, -1, 0.5f})}, kLast);
  ASSERT_EQ(onward.size(), 6u);
  EXPECT_EQ(onward[4].step.pushed_by, 0);  // e's chunk 0, applied first: update 4 here
  EXPECT_EQ(onward[4].step.updates, (std::vector<int64_t>{4}));
  EXPECT_EQ(onward[5].step.pushed_by, 1);  // d: update 5 here
  EXPECT_EQ(onward[5].step.updates, (std::vector<int64_t>{5}));
  EXPECT_FALSE(again.came());  // until the last copy has it
  for (size_t i = 3; i < onward.size(); ++i) {
    ASSERT_TRUE(last->ApplyForwarded(onward[i].step, [] {}).ok());
    onward[i].done();
  }
  ASSERT_TRUE(again.came());
  expect_alike(*last, **middle, "the last copy after the primary failed");
  EXPECT_EQ(again.Values(0), last->Snapshot().at(0).values);
}

// ps-async: a range's copy for a server that joined (CopyTo) holds each chunk's version and
// clocks, and every later update goes there although the pushes name no backup: the copy and
// the forwards after it give the joined server bitwise the primary's chunks, and a worker's
// push it took already (by copy or forward) is answered there as a copy.
TEST_F(DenseShardTest, AsyncCopyForAJoinedServerAndTheUpdatesAfterItAreOneCut) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  // The range lives on the primary alone (its backup failed): nothing is forwarded.
  EXPECT_TRUE(
      Push(*primary, 0, 1, {Chunk(0, {0.1f, 0.2f, 0.3f, 0.4f}), Chunk(1, {1, 2, 3, 4})}).came());
  EXPECT_TRUE(Push(*primary, 1, 1, {Chunk(0, {0.7f, 0.3f, -0.3f, 1e-3f})}).came());
  EXPECT_TRUE(sent_.empty());
  auto copy = primary->CopyTo(kBackup);
  EXPECT_EQ(copy.at(0).version, 2);
  EXPECT_EQ(copy.at(0).clocks, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(copy.at(1).version, 1);
  EXPECT_EQ(copy.at(1).clocks, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(copy.at(2).version, 0);
  Captured after = Push(*primary, 0, 2, {Chunk(0, {-2, 1, 1e-4f, 5}), Chunk(2, {1, 1})});
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(sent_[0].to, kBackup);
  EXPECT_EQ(sent_[0].step.updates, (std::vector<int64_t>{3, 1}));
  EXPECT_FALSE(after.came());  // until the joined server acknowledged it
  sent_[0].done();
  ASSERT_TRUE(after.came());
  EXPECT_EQ((*after.reply)->copied_to, kBackup);
  // A push still naming the range's failed former backup (sent before it failed, or queued
  // here) goes on to the joined server too (the forwarder passes over the failed one): else
  // the copy would wait for its update forever.
  Captured stale;
  ASSERT_TRUE(primary
                  ->PushPull(1, 2, {Chunk(1, {1, 1, 1, 1})}, true, stale.Callback(), false, -1,
                             "tcp://10.0.0.9:5000")
                  .ok());
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[1].to, "tcp://10.0.0.9:5000," + std::string(kBackup));
  sent_[1].done();
  ASSERT_TRUE(stale.came());
  auto joined = Create(config);
  joined->Restore(std::move(copy), 1);
  ASSERT_TRUE(joined->ApplyForwarded(sent_[0].step, [] {}).ok());
  ASSERT_TRUE(joined->ApplyForwarded(sent_[1].step, [] {}).ok());
  const auto theirs = primary->Snapshot();
  for (uint64_t chunk : {0, 1, 2}) {
    EXPECT_EQ(joined->Snapshot().at(chunk).values, theirs.at(chunk).values) << "chunk " << chunk;
    EXPECT_EQ(joined->Snapshot().at(chunk).state, theirs.at(chunk).state) << "chunk " << chunk;
  }
  // The primary failed: the workers' pushes again at the joined server are copies.
  Captured again = Push(*joined, 0, 2, {Chunk(0, {9, 9, 9, 9})});
  ASSERT_TRUE(again.came());
  EXPECT_EQ(again.Values(0), theirs.at(0).values);
  Captured first = Push(*joined, 1, 1, {Chunk(0, {9, 9, 9, 9})});
  ASSERT_TRUE(first.came());
  EXPECT_EQ(first.Values(0), theirs.at(0).values);
  EXPECT_EQ(joined->Snapshot().at(0).state, theirs.at(0).state);
}

// The cut under concurrency: CopyTo while two workers push on their own threads. Whatever the
// copy holds of each chunk and whatever was forwarded after it give the joined server bitwise
// the primary's values and state (each update in one of the two, none in both or neither).
TEST_F(DenseShardTest, AsyncCopyWhilePushesAreInFlightIsACut) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  std::mutex sent_mu;
  std::vector<DenseShard::ForwardedStep> forwards;
  auto created = DenseShard::Create(
      config, {0, 1, 100}, {Chunk(0, Floats(4, 1)), Chunk(1, Floats(4, 2)), Chunk(2, Floats(2, 3))},
      metrics_.get(),
      [&](const std::string& to, DenseShard::ForwardedStep step, std::function<void()> done) {
        EXPECT_EQ(to, kBackup);
        {
          std::lock_guard<std::mutex> lock(sent_mu);
          forwards.push_back(std::move(step));
        }
        done();
      });
  ASSERT_TRUE(created.ok()) << created.status();
  DenseShard& primary = **created;
  std::map<uint64_t, ChunkState> copy;
  PushAroundACopy(
      /*workers=*/2, /*steps=*/200,
      [&](int rank, int64_t step) {
        const float g = 0.01f * static_cast<float>(rank + 1) * static_cast<float>(step % 7);
        EXPECT_TRUE(
            primary
                .PushPull(rank, step,
                          {Chunk(0, Floats(4, g)), Chunk(1, Floats(4, -g)), Chunk(2, Floats(2, g))},
                          true, [](PsPushPullReply) {})
                .ok());
      },
      [&] { copy = primary.CopyTo(kBackup); });
  auto joined = Create(config);
  joined->Restore(std::move(copy), 1);
  for (const DenseShard::ForwardedStep& forward : forwards) {
    ASSERT_TRUE(joined->ApplyForwarded(forward, [] {}).ok());
  }
  const auto theirs = primary.Snapshot();
  for (uint64_t chunk : {0, 1, 2}) {
    EXPECT_EQ(joined->Snapshot().at(chunk).values, theirs.at(chunk).values) << "chunk " << chunk;
    EXPECT_EQ(joined->Snapshot().at(chunk).state, theirs.at(chunk).state) << "chunk " << chunk;
  }
  EXPECT_FALSE(forwards.empty());
}

// A worker's region, as the copies map it: views of memory the worker writes again once its
// reply came.
struct Region {
  std::map<uint64_t, std::shared_ptr<Floats>> chunks;
  TensorData View(uint64_t key, Floats values) {
    auto& floats = chunks[key];
    floats = std::make_shared<Floats>(std::move(values));
    return TensorData::Floats("chunk", key, floats->data(), floats->size(), floats);
  }
  TensorData Again(uint64_t key) const {
    const auto& floats = chunks.at(key);
    return TensorData::Floats("chunk", key, floats->data(), floats->size(), floats);
  }
};

// ps-async with the worker's gradients in its shared region, which the backup mapped too: the
// primary's forward names the chunks without their bytes (the backup takes them from the
// region), and the backup acknowledges it only once applied: a forward parked behind an update
// that has not come yet waits unacknowledged (the worker, waiting for its reply, leaves the
// region alone until then). Both copies end bitwise alike. A forward to a chain or to a joined
// server carries the bytes.
TEST_F(DenseShardTest, AsyncForwardsOfPushesInARegionNameTheChunksAndAreAcknowledgedOnceApplied) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  auto backup = Create(config);
  Region worker0, worker1;
  auto push = [&](int rank, std::vector<TensorData> grads, const std::string& to) {
    Captured captured;
    EXPECT_TRUE(primary
                    ->PushPull(rank, 1, grads, true, captured.Callback(), false, -1, to,
                               /*in_region=*/true)
                    .ok());
    return captured;
  };
  Captured a =
      push(0, {worker0.View(0, {0.1f, 0.2f, 0.3f, 0.4f}), worker0.View(1, {1, -1, 0.5f, 3})},
           kBackup);
  Captured b = push(1, {worker1.View(0, {0.7f, 0.3f, -0.3f, 1e-3f})}, kBackup);
  ASSERT_EQ(sent_.size(), 2u);
  for (const Sent& forward : sent_) {
    EXPECT_TRUE(forward.step.in_region);
    for (const TensorData& gradient : forward.step.gradients) {
      EXPECT_TRUE(gradient.bytes.empty()) << "chunk key " << gradient.key;
    }
  }
  // The backup's service hands it views of the same regions.
  DenseShard::ForwardedStep first = sent_[0].step, second = sent_[1].step;
  first.gradients = {worker0.Again(0), worker0.Again(1)};
  second.gradients = {worker1.Again(0)};
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  ASSERT_TRUE(backup->ApplyForwarded(second, take).ok());
  EXPECT_EQ(taken, 0);  // parked: its gradient is still the worker's
  ASSERT_TRUE(backup->ApplyForwarded(first, take).ok());
  EXPECT_EQ(taken, 2);
  // The workers write their regions again once their replies came: the backup has applied.
  sent_[0].done();
  sent_[1].done();
  ASSERT_TRUE(a.came());
  ASSERT_TRUE(b.came());
  std::fill(worker0.chunks[0]->begin(), worker0.chunks[0]->end(), 99.0f);
  std::fill(worker1.chunks[0]->begin(), worker1.chunks[0]->end(), 99.0f);
  const auto theirs = primary->Snapshot();
  for (uint64_t chunk : {0, 1, 2}) {
    EXPECT_EQ(backup->Snapshot().at(chunk).values, theirs.at(chunk).values) << "chunk " << chunk;
    EXPECT_EQ(backup->Snapshot().at(chunk).state, theirs.at(chunk).state) << "chunk " << chunk;
  }
  // A resend of an applied forward is acknowledged and reads nothing.
  ASSERT_TRUE(backup->ApplyForwarded(second, take).ok());
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(backup->Snapshot().at(0).values, theirs.at(0).values);

  // Along a chain of copies the worker named, the names go too (the middle passes them on:
  // AsyncChainInARegionPassesTheNamesOn); a joined server the worker has not taken in gets
  // the bytes (CopyTo).
  Captured chained = push(0, {worker0.View(2, {1, 2})}, std::string(kBackup) + ",tcp://c:1");
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_TRUE(sent_[2].step.in_region);
  EXPECT_TRUE(sent_[2].step.gradients.at(0).bytes.empty());
  sent_[2].done();
  EXPECT_TRUE(chained.came());
  primary->CopyTo("tcp://joined:1");
  Captured joined = push(1, {worker1.View(2, {3, 4})}, kBackup);
  ASSERT_EQ(sent_.size(), 4u);
  EXPECT_EQ(sent_[3].to, std::string(kBackup) + ",tcp://joined:1");
  EXPECT_FALSE(sent_[3].step.in_region);
  EXPECT_EQ(sent_[3].step.gradients.at(0).Read<float>(), (Floats{3, 4}));
  // A copy of the bytes, not a view of the region, which the worker writes again once answered
  // (a resend may leave after that).
  EXPECT_NE(sent_[3].step.gradients.at(0).bytes.data(),
            reinterpret_cast<const uint8_t*>(worker1.chunks[2]->data()));
  sent_[3].done();
  EXPECT_TRUE(joined.came());
  // Once the worker took the joined server in (its backup failed), offered it its region and
  // names it, the forwards name the chunks again.
  Captured named;
  ASSERT_TRUE(primary
                  ->PushPull(1, 2, {worker1.View(2, {5, 6})}, true, named.Callback(), false, -1,
                             "tcp://joined:1", /*in_region=*/true)
                  .ok());
  ASSERT_EQ(sent_.size(), 5u);
  EXPECT_EQ(sent_[4].to, "tcp://joined:1");
  EXPECT_TRUE(sent_[4].step.in_region);
  EXPECT_TRUE(sent_[4].step.gradients.at(0).bytes.empty());
  sent_[4].done();
  EXPECT_TRUE(named.came());
}

// --replicas 3 in a region: the middle copy applies a named forward from the worker's region,
// passes it on to the last named again (its own update number), and acknowledges it once the
// last has it; a parked one goes on named too once its turn comes, and to a chain other than
// the one its forward named (a joined server's) with a copy of its bytes.
TEST_F(DenseShardTest, AsyncChainInARegionPassesTheNamesOn) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kAsync, 2);
  auto middle = CreatePrimary(config);  // its Forwarder is the onward one
  ASSERT_NE(middle, nullptr);
  Region worker0, worker1;
  DenseShard::ForwardedStep first;
  first.step = 1;
  first.pushed_by = 0;
  first.gradients = {worker0.View(0, {0.1f, 0.2f, 0.3f, 0.4f})};
  first.updates = {1};
  first.in_region = true;
  first.forward_to = "tcp://last:1";
  DenseShard::ForwardedStep second = first;
  second.pushed_by = 1;
  second.gradients = {worker1.View(0, {-1, 2, 0.5f, 1e-3f})};
  second.updates = {2};
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  ASSERT_TRUE(middle->ApplyForwarded(second, take).ok());  // parked behind update 1
  EXPECT_TRUE(sent_.empty());
  ASSERT_TRUE(middle->ApplyForwarded(first, take).ok());
  ASSERT_EQ(sent_.size(), 2u);
  for (const Sent& onward : sent_) {
    EXPECT_EQ(onward.to, "tcp://last:1");
    EXPECT_TRUE(onward.step.in_region);
    EXPECT_TRUE(onward.step.gradients.at(0).bytes.empty());
  }
  EXPECT_EQ(taken, 0);  // until the last has them
  auto last = Create(config);
  for (Sent& onward : sent_) {
    DenseShard::ForwardedStep named = onward.step;
    named.gradients = {(named.pushed_by == 0 ? worker0 : worker1).Again(0)};
    int last_taken = 0;
    ASSERT_TRUE(last->ApplyForwarded(named, [&last_taken] { ++last_taken; }).ok());
    EXPECT_EQ(last_taken, 1);
    onward.done();
  }
  EXPECT_EQ(taken, 2);
  EXPECT_EQ(last->Snapshot().at(0).values, middle->Snapshot().at(0).values);
  EXPECT_EQ(last->Snapshot().at(0).state, middle->Snapshot().at(0).state);

  // Update 4 parked (3 never comes: the primary failed); a worker's request here, naming a
  // joined server beyond the chain, applies it and passes it on with a copy of its bytes.
  DenseShard::ForwardedStep fourth = first;
  fourth.step = 3;
  fourth.gradients = {worker0.View(0, {1, 1, 1, 1})};
  fourth.updates = {4};
  ASSERT_TRUE(middle->ApplyForwarded(fourth, take).ok());
  Captured asked;
  ASSERT_TRUE(middle
                  ->PushPull(1, 2, {Ask(0)}, false, asked.Callback(), false, -1,
                             "tcp://last:1,tcp://joined:1")
                  .ok());
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[2].to, "tcp://last:1,tcp://joined:1");
  EXPECT_FALSE(sent_[2].step.in_region);
  EXPECT_EQ(sent_[2].step.gradients.at(0).Read<float>(), (Floats{1, 1, 1, 1}));
  EXPECT_NE(sent_[2].step.gradients.at(0).bytes.data(),
            reinterpret_cast<const uint8_t*>(worker0.chunks[0]->data()));
  sent_[2].done();
}

// ps-sync: a step whose every gradient came in its worker's region goes to the backup named
// (no bytes), and the backup averages the workers' gradients in their regions as the primary
// did, then acknowledges: bitwise the primary's values and state. A step one worker pushed in
// frames travels as its average, bytes and all, acknowledged before it is applied.
TEST_F(DenseShardTest, SyncStepsPushedInRegionsGoNamedAndTheBackupAveragesTheRegions) {
  const PsJobConfig config = MomentumConfig(PsConsistency::kSync, 2);
  auto primary = CreatePrimary(config);
  ASSERT_NE(primary, nullptr);
  auto backup = Create(config);
  Region worker0, worker1;
  Captured a, b;
  ASSERT_TRUE(primary
                  ->PushPull(0, 1, {worker0.View(0, {0.1f, 0.2f, 0.3f, 0.4f})}, true,
                             a.Callback(), false, -1, kBackup, /*in_region=*/true)
                  .ok());
  ASSERT_TRUE(primary
                  ->PushPull(1, 1, {worker1.View(0, {0.7f, 0.3f, -0.3f, 1e-3f})}, true,
                             b.Callback(), false, -1, kBackup, /*in_region=*/true)
                  .ok());
  ASSERT_EQ(sent_.size(), 1u);
  DenseShard::ForwardedStep step = sent_[0].step;
  EXPECT_TRUE(step.in_region);
  ASSERT_EQ(step.gradients.size(), 1u);
  EXPECT_TRUE(step.gradients[0].bytes.empty());
  EXPECT_EQ(step.gradients[0].key, 0u);
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  // Every worker's gradient of each named chunk, or the forward is refused unacknowledged.
  EXPECT_EQ(backup->ApplyForwarded(step, take).code(), StatusCode::kInvalidArgument);
  step.by_worker = {{worker0.Again(0)}};
  EXPECT_EQ(backup->ApplyForwarded(step, take).message(),
            "forwarded step 1 of chunk 0: 1 workers' gradients, the job has 2");
  EXPECT_EQ(taken, 0);
  step.by_worker = {{worker0.Again(0), worker1.Again(0)}};
  ASSERT_TRUE(backup->ApplyForwarded(step, take).ok());
  EXPECT_EQ(taken, 1);
  sent_[0].done();
  ASSERT_TRUE(a.came());
  ASSERT_TRUE(b.came());
  EXPECT_EQ(backup->Snapshot().at(0).values, primary->Snapshot().at(0).values);
  EXPECT_EQ(backup->Snapshot().at(0).state, primary->Snapshot().at(0).state);

  // Step 2: worker 1 pushes in frames.
  Captured c, d;
  ASSERT_TRUE(primary
                  ->PushPull(0, 2, {worker0.View(0, {1, 2, 3, 4})}, true, c.Callback(), false,
                             -1, kBackup, /*in_region=*/true)
                  .ok());
  ASSERT_TRUE(primary
                  ->PushPull(1, 2, {Chunk(0, {-1, 0.5f, 0.25f, 8})}, true, d.Callback(), false,
                             -1, kBackup)
                  .ok());
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_FALSE(sent_[1].step.in_region);
  EXPECT_EQ(sent_[1].step.gradients.at(0).Read<float>(),
            (Floats{(1 - 1) * 0.5f, (2 + 0.5f) * 0.5f, (3 + 0.25f) * 0.5f, (4 + 8) * 0.5f}));
  ASSERT_TRUE(backup->ApplyForwarded(sent_[1].step, take).ok());
  EXPECT_EQ(taken, 2);
  sent_[1].done();
  EXPECT_TRUE(d.came());
  EXPECT_EQ(backup->Snapshot().at(0).values, primary->Snapshot().at(0).values);
  EXPECT_EQ(backup->Snapshot().at(0).state, primary->Snapshot().at(0).state);
}

// After the primary failed, a worker's push at the backup first applies every parked forward
// (nothing fills their gaps any more), then is applied, or answered as a copy when the backup
// took it already.
TEST_F(DenseShardTest, AsyncBackupAppliesParkedForwardsWhenAWorkerAsksIt) {
  auto backup = Create(Config(PsConsistency::kAsync, 2));
  DenseShard::ForwardedStep second;  // update 1 (worker 0's push) never came
  second.step = 1;
  second.pushed_by = 1;
  second.gradients = {Chunk(0, {2, 2, 2, 2})};
  second.updates = {2};
  ASSERT_TRUE(backup->ApplyForwarded(second, [] {}).ok());
  EXPECT_EQ(backup->Snapshot().at(0).values, Floats(4, 1));
  // Worker 1 lost its reply with the primary and asks again: a copy, answered.
  Captured again = Push(*backup, 1, 1, {Chunk(0, {9, 9, 9, 9})});
  ASSERT_TRUE(again.came());
  EXPECT_EQ(again.Values(0), Floats(4, 0));  // 1 - 0.5 * 2: the forwarded gradient only
  // Worker 0's push, which the primary applied first, comes now: applied once.
  Captured late = Push(*backup, 0, 1, {Chunk(0, {1, 1, 1, 1})});
  ASSERT_TRUE(late.came());
  EXPECT_EQ(late.Values(0), Floats(4, -0.5f));
  EXPECT_EQ(Push(*backup, 0, 1, {Chunk(0, {1, 1, 1, 1})}).Values(0), Floats(4, -0.5f));
}

TEST_F(DenseShardTest, AsyncIgnoresStopRequests) {
  auto shard = Create(Config(PsConsistency::kAsync, 2));
  Captured pushed = Push(*shard, 1, 1, {Chunk(1, Floats(4, 2))}, /*stop=*/true);
  ASSERT_TRUE(pushed.came());
  EXPECT_EQ((*pushed.reply)->stopped_by, -1);
}

// ps-async: a skip applies nothing; the reply goes at once with the current values.
TEST_F(DenseShardTest, AsyncSkipAppliesNothing) {
  auto shard = Create(Config(PsConsistency::kAsync, 2));
  Captured skipped;
  ASSERT_TRUE(shard->Skip(1, 1, {Ask(1)}, skipped.Callback()).ok());
  ASSERT_TRUE(skipped.came());
  EXPECT_EQ(skipped.Values(0), Floats(4, 2));
  EXPECT_EQ((*skipped.reply)->skipped_by, -1);
}

// A reply held past the limit is described once, a line per chunk, with what holds it: a step
// some worker has not pushed (ps-sync), ps-ssp's bound and the workers behind it, or the
// backup's acknowledgement of the update it carries.
TEST_F(DenseShardTest, LongWaitsAreDescribedOnceWithWhatHoldsThem) {
  using std::chrono::milliseconds;
  const auto described = [](DenseShard& shard) {
    std::string lines;
    for (const std::string& line : shard.DescribeLongWaits(milliseconds(0))) {
      // The time waited varies: "... has waited 0.0 s" becomes "... has waited T".
      const size_t at = line.find("has waited ");
      const size_t end = line.find(" s", at);
      EXPECT_NE(end, std::string::npos) << line;
      lines += line.substr(0, at) + "has waited T" + line.substr(end + 2) + "\n";
    }
    return lines;
  };
  {
    auto shard = Create(Config(PsConsistency::kSync, 3));
    Captured first = Push(*shard, 1, 1, {Chunk(0, {1, 1, 1, 1})});
    Captured second = Push(*shard, 2, 1, {Chunk(0, {1, 1, 1, 1}), Chunk(2, {1, 1})});
    EXPECT_TRUE(shard->DescribeLongWaits(milliseconds(60000)).empty());
    EXPECT_EQ(described(*shard),
              "chunk 0: worker 1's push of step 1 has waited T (and 1 more reply here): it "
              "waits for step 1 to be applied; the chunk is at step 0, and worker 0 has not "
              "pushed step 1 here\n"
              "chunk 2: worker 2's push of step 1 has waited T: it waits for step 1 to be "
              "applied; the chunk is at step 0, and workers 0 and 1 have not pushed step 1 "
              "here\n");
    EXPECT_EQ(described(*shard), "");  // once
  }
  {
    PsJobConfig config = Config(PsConsistency::kSsp, 3);
    config.staleness = 1;
    auto shard = Create(config);
    for (int64_t step = 1; step <= 3; ++step) Push(*shard, 0, step, {Chunk(1, {1, 1, 1, 1})});
    Push(*shard, 2, 1, {Chunk(1, {1, 1, 1, 1})});
    EXPECT_EQ(described(*shard),
              "chunk 1: worker 0's push of step 2 has waited T (and 1 more reply here): ps-ssp "
              "holds it until every worker reached step 1 (--staleness 1); behind it here: "
              "worker 1 at step 0\n");
    Captured caught_up = Push(*shard, 1, 2, {Chunk(1, {1, 1, 1, 1})});
    EXPECT_TRUE(caught_up.came());
    Push(*shard, 0, 4, {Chunk(1, {1, 1, 1, 1})});
    EXPECT_EQ(described(*shard),
              "chunk 1: worker 0's push of step 4 has waited T: ps-ssp holds it until every "
              "worker reached step 3 (--staleness 1); behind it here: worker 1 at step 2, "
              "worker 2 at step 1\n");
  }
  {
    auto primary = CreatePrimary(Config(PsConsistency::kAsync, 1));
    Captured pushed;
    ASSERT_TRUE(primary
                    ->PushPull(0, 1, {Chunk(0, {1, 1, 1, 1})}, true, pushed.Callback(), false, -1,
                               kBackup)
                    .ok());
    EXPECT_EQ(described(*primary),
              "chunk 0: worker 0's push of step 1 has waited T: it carries update 1, which the "
              "range's backup has not acknowledged (1 forwarded and unacknowledged here)\n");
    ASSERT_EQ(sent_.size(), 1u);
    sent_[0].done();
    EXPECT_TRUE(pushed.came());
  }
}

TEST_F(DenseShardTest, APullWaitsForTheStepBeforeItsOwn) {
  auto shard = Create(Config(PsConsistency::kSync, 1));
  Captured pull;
  ASSERT_TRUE(shard->PushPull(0, 2, {Ask(1)}, false, pull.Callback()).ok());
  EXPECT_FALSE(pull.came());
  Captured push = Push(*shard, 0, 1, {Chunk(1, {2, 2, 2, 2})});
  ASSERT_TRUE(pull.came());
  EXPECT_EQ(pull.Values(0), Floats(4, 1));  // 2 - 0.5 * 2
  Captured empty;
  ASSERT_TRUE(shard->PushPull(0, 5, {}, false, empty.Callback()).ok());
  ASSERT_TRUE(empty.came());
  EXPECT_TRUE((*empty.reply)->tensors.empty());
}

TEST_F(DenseShardTest, RestoreReplacesValuesDropsHeldGradientsAndReleasesWaiters) {
  auto shard = Create(Config(PsConsistency::kSync, 2));
  Captured held = Push(*shard, 0, 1, {Chunk(0, Floats(4, 100))});
  Captured pull;
  ASSERT_TRUE(shard->PushPull(1, 6, {Ask(0)}, false, pull.Callback()).ok());
  std::map<uint64_t, ChunkState> saved = shard->Snapshot();
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved.at(2).values, Floats(2, 3));
  EXPECT_TRUE(saved.at(2).state.empty());  // SGD keeps none
  saved.at(0).values = Floats(4, 9);
  shard->Restore(saved, 5);
  ASSERT_TRUE(pull.came());  // step 6 needs step 5: restored
  EXPECT_EQ(pull.Values(0), Floats(4, 9));
  // The held push's step was dropped, and its reply (it waited for version 1) carries the
  // restored values: it was a push of a step the checkpoint already holds.
  ASSERT_TRUE(held.came());
  EXPECT_EQ(held.Values(0), Floats(4, 9));
  EXPECT_EQ(shard->FirstBehind(5), "");
  // Step 6 goes on from the restored values, with worker 0's gradient of step 1 gone.
  Captured a = Push(*shard, 0, 6, {Chunk(0, Floats(4, 2))});
  Captured b = Push(*shard, 1, 6, {Chunk(0, Floats(4, 4))});
  ASSERT_TRUE(b.came());
  EXPECT_EQ(b.Values(0), Floats(4, 7.5f));
}

TEST_F(DenseShardTest, ConcurrentPushesToOneChunkAreEachAppliedOnce) {
  // ps-async: every push is one update; lr 0.5 and gradients of 1 keep the sums exact.
  auto shard = Create(Config(PsConsistency::kAsync, 4));
  std::atomic<int> replies{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = 1; step <= 200; ++step) {
        Status status = shard->PushPull(w, step, {Chunk(0, Floats(4, 1)), Chunk(1, Floats(4, 1))},
                                        true, [&](PsPushPullReply) { ++replies; });
        EXPECT_TRUE(status.ok()) << status;
        if (step % 50 == 0) shard->Snapshot();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(replies.load(), 800);
  std::map<uint64_t, ChunkState> saved = shard->Snapshot();
  EXPECT_EQ(saved.at(0).values, Floats(4, 1 - 0.5f * 800));
  EXPECT_EQ(saved.at(1).values, Floats(4, 2 - 0.5f * 800));
}

// Replies carry the chunk's values without a copy; an update while a reply still holds them
// writes to a fresh copy, so what the reply carries never changes.
TEST_F(DenseShardTest, RepliesShareTheValuesUntilAnUpdateCopiesThem) {
  auto copies = [this] {
    const std::string text = registry_.RenderText();
    const std::string name = "tessera_ps_values_copies_total ";
    const size_t at = text.find("\n" + name);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + 1 + name.size()));
  };
  auto shard = Create(Config(PsConsistency::kAsync, 1));
  Captured first = Push(*shard, 0, 1, {Chunk(0, Floats(4, 1))});  // 1 - 0.5 * 1
  Captured pull;
  ASSERT_TRUE(shard->PushPull(0, 2, {Ask(0)}, false, pull.Callback()).ok());
  ASSERT_TRUE(first.came() && pull.came());
  EXPECT_EQ((*first.reply)->tensors.at(0).bytes.data(), (*pull.reply)->tensors.at(0).bytes.data());
  EXPECT_EQ(copies(), 0);

  Captured second = Push(*shard, 0, 2, {Chunk(0, Floats(4, 1))});  // while both hold 0.5
  EXPECT_EQ(copies(), 1);
  EXPECT_EQ(first.Values(0), Floats(4, 0.5f));
  EXPECT_EQ(pull.Values(0), Floats(4, 0.5f));
  EXPECT_EQ(second.Values(0), Floats(4, 0.0f));

  first.reply->reset();
  pull.reply->reset();
  second.reply->reset();
  Captured third = Push(*shard, 0, 3, {Chunk(0, Floats(4, 1))});  // nothing held: in place
  EXPECT_EQ(copies(), 1);
  EXPECT_EQ(third.Values(0), Floats(4, -0.5f));
}

// Two workers update a chunk while the replies of earlier updates are held or dropped (their
// leases end on the pushing threads, beside the other's update): each held reply keeps the
// values of its own update.
TEST_F(DenseShardTest, HeldRepliesKeepTheirValuesWhileOtherWorkersUpdate) {
  auto shard = Create(Config(PsConsistency::kAsync, 2));
  std::mutex mu;
  std::vector<std::pair<PsPushPullReply, float>> kept;  // with the value read when it came
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = 1; step <= 200; ++step) {
        Status status = shard->PushPull(
            w, step, {Chunk(0, Floats(4, 1))}, true, [&, step](PsPushPullReply reply) {
              const float value = reply.tensors.at(0).Read<float>().at(0);
              if (step % 2 == 0) return;  // dropped here: its lease ends at once
              std::lock_guard<std::mutex> lock(mu);
              kept.emplace_back(std::move(reply), value);
            });
        EXPECT_TRUE(status.ok()) << status;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(kept.size(), 200u);
  std::set<float> values;
  for (const auto& [reply, value] : kept) {
    EXPECT_EQ(reply.tensors.at(0).Read<float>(), Floats(4, value));
    values.insert(value);
  }
  EXPECT_EQ(values.size(), 200u);  // each reply has the values of its own update
  for (float value : values) {
    const float updates = (1 - value) / 0.5f;
    EXPECT_EQ(updates, std::round(updates)) << value;
  }
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

// Elastic jobs (issue 47): a worker that leaves stops counting at once, and the step it held
// up is the average of the pushes that came: bitwise what a job of the workers that stayed
// computes (here: a 2-worker shard given the same two pushes).
TEST_F(DenseShardTest, RemoveWorkerCompletesTheStepWithThePushesThatCame) {
  std::unique_ptr<DenseShard> elastic = Create(Config(PsConsistency::kSync, 3));
  std::unique_ptr<DenseShard> reference = Create(Config(PsConsistency::kSync, 2));
  ASSERT_NE(elastic, nullptr);
  ASSERT_NE(reference, nullptr);
  const Floats g0 = {0.1f, 0.2f, 0.3f, 0.7f};
  const Floats g1 = {0.4f, 0.5f, 0.6f, 0.9f};
  Captured a = Push(*elastic, 0, 1, {Chunk(0, g0)});
  Captured b = Push(*elastic, 1, 1, {Chunk(0, g1)});
  EXPECT_FALSE(a.came());  // worker 2 has not pushed step 1
  elastic->RemoveWorker(2);
  ASSERT_TRUE(a.came());
  ASSERT_TRUE(b.came());
  Push(*reference, 0, 1, {Chunk(0, g0)});
  Captured want = Push(*reference, 1, 1, {Chunk(0, g1)});
  ASSERT_TRUE(want.came());
  EXPECT_EQ(a.Values(0), want.Values(0));
  EXPECT_EQ(b.Values(0), want.Values(0));
  // Step 2 needs only the two; worker 2's late push is refused, naming it.
  Captured refused;
  Status late = elastic->PushPull(2, 2, {Chunk(0, g0)}, true, refused.Callback());
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("worker 2 pushed step 2"), std::string::npos) << late;
  Push(*elastic, 0, 2, {Chunk(0, g1)});
  EXPECT_TRUE(Push(*elastic, 1, 2, {Chunk(0, g0)}).came());
}

TEST_F(DenseShardTest, AddWorkerCountsTheJoinerFromItsFirstStep) {
  std::unique_ptr<DenseShard> shard = Create(Config(PsConsistency::kSync, 3));
  ASSERT_NE(shard, nullptr);
  shard->RemoveWorker(2);
  const Floats g = {1, 1, 1, 1};
  Push(*shard, 0, 1, {Chunk(0, g)});
  EXPECT_TRUE(Push(*shard, 1, 1, {Chunk(0, g)}).came());
  Status applied = shard->AddWorker(2, 1);
  EXPECT_EQ(applied.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(applied.message().find("chunk 0: "), std::string::npos) << applied;
  ASSERT_TRUE(shard->AddWorker(2, 2).ok());
  Push(*shard, 0, 2, {Chunk(0, g)});
  Captured waits = Push(*shard, 1, 2, {Chunk(0, g)});
  EXPECT_FALSE(waits.came());  // the joiner counts for step 2
  EXPECT_TRUE(Push(*shard, 2, 2, {Chunk(0, g)}).came());
  EXPECT_TRUE(waits.came());
}

}  // namespace
}  // namespace tessera::server
