// PsService under faults and load: replies lost and requests duplicated by a FaultyTransport,
// and many workers' threads on one chunk while checkpoints are written.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/training/checkpoint.h"
#include "server/ps/ps_test_fleet.h"

namespace tessera::server {
namespace {

TEST_F(PsServiceTest, ALostReplyFailsTheCallAtItsDeadlineAndTheServerStaysCorrect) {
  Fleet fleet;
  fleet.server_faults = FaultOptions{};
  ASSERT_NO_FATAL_FAILURE(Start(fleet));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 2);
  const ByKey initial = InitialValues(config);
  ASSERT_TRUE(Init(config, initial).ok());
  Reference reference(config, initial);
  std::mt19937 random(6);
  std::vector<ByKey> grads = {RandomGrads(random, initial), RandomGrads(random, initial)};
  server_faults_->Disconnect(workers_[0]->address());  // every reply to worker 0 is lost
  const auto started = std::chrono::steady_clock::now();
  Reply lost = PushPull(0, 1, grads[0], /*timeout_ms=*/400);
  Reply answered = PushPull(1, 1, grads[1]);
  reference.ApplyStep(1, grads);
  EXPECT_EQ(ValuesOf(answered), reference.values());
  const Status status = lost.get().status();
  const auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("push-pull of step 1 by worker 0"), std::string::npos) << status;
  EXPECT_NE(status.message().find(server_->address()), std::string::npos) << status;
  EXPECT_GE(waited, std::chrono::milliseconds(400));
  EXPECT_LT(waited, std::chrono::milliseconds(800));  // within twice the deadline
  EXPECT_EQ(server_faults_->dropped(), 1u);

  // The push was applied once: worker 0 catches up with a pull and both go on.
  server_faults_->Reconnect(workers_[0]->address());
  EXPECT_EQ(ValuesOf(Pull(0, 2, {50})), reference.values());
  grads = {RandomGrads(random, initial), RandomGrads(random, initial)};
  Reply r0 = PushPull(0, 2, grads[0]);
  Reply r1 = PushPull(1, 2, grads[1]);
  reference.ApplyStep(2, grads);
  EXPECT_EQ(ValuesOf(r0), reference.values());
  EXPECT_EQ(ValuesOf(r1), reference.values());
  EXPECT_EQ(DenseUpdates(), 2);
}

// Requests that arrive twice (the same request id) or not at all, and replies lost: the model
// must be the reference's (no gradient applied twice, no step applied early) and every call
// answered with its own reply.
class RepeatTest : public PsServiceTest {
 protected:
  // Every request every worker sends arrives twice, the init included.
  static Fleet Duplicated(int num_workers) {
    Fleet fleet;
    fleet.num_workers = num_workers;
    fleet.worker_faults = FaultOptions{};
    fleet.worker_faults->duplicate_probability = 1.0;
    return fleet;
  }
  // A fifth of the requests and of the replies lost, a tenth of the requests twice: the
  // workers resend what is not answered within 20 ms, and every call is answered.
  static Fleet Lossy(int num_workers, uint64_t seed) {
    Fleet fleet;
    fleet.num_workers = num_workers;
    fleet.worker_faults = FaultOptions{};
    fleet.worker_faults->seed = seed;
    fleet.worker_faults->drop_probability = 0.2;
    fleet.worker_faults->duplicate_probability = 0.1;
    fleet.server_faults = FaultOptions{};
    fleet.server_faults->seed = seed + 1;
    fleet.server_faults->drop_probability = 0.2;
    fleet.resend_ms = 20;
    return fleet;
  }

  void Run(PsConsistency consistency, Fleet fleet) {
    const int num_workers = fleet.num_workers;
    ASSERT_NO_FATAL_FAILURE(Start(fleet));
    const PsJobConfig config = TestConfig(consistency, num_workers);
    const ByKey initial = InitialValues(config);
    ASSERT_TRUE(Init(config, initial).ok());
    Reference reference(config, initial);
    const Ids rows = RowsOwnedBy(1, 2);
    std::mt19937 random(7);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<ByKey> grads;
      std::vector<Ids> ids;
      std::vector<Floats> row_grads;
      for (int w = 0; w < num_workers; ++w) {
        grads.push_back(RandomGrads(random, initial));
        ids.push_back(rows);  // every worker touches the same rows
        row_grads.push_back(RandomFloats(random, 4));
      }
      // ps-sync: once worker 0 pushed its rows, a pull of the next step still waits for the
      // others' rows, then sees all of them.
      std::optional<Reply> early_pull;
      for (int w = 0; w < num_workers; ++w) {
        auto ack = SparsePush(w, step, ids[w], row_grads[w]).get();
        EXPECT_TRUE(ack.ok()) << "step " << step << " worker " << w << ": " << ack.status();
        if (consistency != PsConsistency::kSync) reference.ApplyRowPush(ids[w], row_grads[w]);
        if (consistency == PsConsistency::kSync && w == 0 && num_workers > 1) {
          early_pull = SparsePull(0, step + 1, rows);
          EXPECT_EQ(early_pull->wait_for(std::chrono::milliseconds(100)),
                    std::future_status::timeout)
              << "step " << step << " was applied before every worker pushed its rows";
        }
      }
      if (consistency == PsConsistency::kSync) reference.ApplyRows(step, ids, row_grads);
      if (early_pull.has_value()) {
        EXPECT_EQ(RowsOf(*early_pull), reference.Rows(rows));
      }
      std::vector<Reply> replies;
      for (int w = 0; w < num_workers; ++w) {
        replies.push_back(PushPull(w, step, grads[w]));
        if (consistency != PsConsistency::kSync) {
          reference.ApplyOne(grads[w]);
          EXPECT_EQ(ValuesOf(replies.back()), reference.values()) << "step " << step;
        }
      }
      if (consistency == PsConsistency::kSync) {
        reference.ApplyStep(step, grads);
        for (const Reply& reply : replies) EXPECT_EQ(ValuesOf(reply), reference.values());
      }
      EXPECT_EQ(RowsOf(SparsePull(0, step + 1, rows)), reference.Rows(rows)) << "step " << step;
    }
    const double expected_updates = consistency == PsConsistency::kSync ? 3 : 3 * num_workers;
    EXPECT_EQ(DenseUpdates(), expected_updates);
    // A checkpoint and its restore, both duplicated, leave the model as it is.
    const std::string root = TempRoot("duplicated-" + std::to_string(num_workers) + "-" +
                                      std::string(PsModeName(consistency)));
    auto saved = Checkpoint(root, 3, /*restore=*/false).get();
    ASSERT_TRUE(saved.ok()) << saved.status();
    const CheckpointReply* written = saved->As<CheckpointReply>();
    ASSERT_NE(written, nullptr);
    CheckpointManifest manifest;
    manifest.step = 3;
    manifest.layout_fingerprint = config.layout_fingerprint;
    manifest.dense_elements = config.dense_elements;
    manifest.num_servers = 2;
    manifest.chunk_elements = config.chunk_elements;
    manifest.files = {{written->files[0], written->bytes[0], written->checksums[0]}};
    ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
    auto restored = Checkpoint(root, 3, /*restore=*/true).get();
    EXPECT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(ValuesOf(Pull(0, 4, {50})), reference.values());
    if (fleet.worker_faults->duplicate_probability == 1.0) {
      for (const FaultyTransport* faults : worker_faults_) EXPECT_GE(faults->duplicated(), 6u);
    } else {
      uint64_t dropped = server_faults_->dropped();
      for (const FaultyTransport* faults : worker_faults_) dropped += faults->dropped();
      EXPECT_GT(dropped, 0u);
      auto repeated = metrics_.RegisterCounter(metric_names::kPsRepeatedRequestsTotal.name,
                                               metric_names::kPsRepeatedRequestsTotal.help);
      ASSERT_TRUE(repeated.ok()) << repeated.status();
      EXPECT_GT((*repeated)->WithLabels({}).value()->Value(), 0);
    }
  }
};

TEST_F(RepeatTest, SyncWithOneWorkerAppliesEachStepOnce) {
  Run(PsConsistency::kSync, Duplicated(1));
}
TEST_F(RepeatTest, SyncWithTwoWorkersAppliesEachStepOnce) {
  Run(PsConsistency::kSync, Duplicated(2));
}
TEST_F(RepeatTest, AsyncAppliesEachPushOnce) { Run(PsConsistency::kAsync, Duplicated(2)); }
TEST_F(RepeatTest, SyncThroughLostRequestsAndRepliesAppliesEachStepOnce) {
  Run(PsConsistency::kSync, Lossy(2, 1));
}
TEST_F(RepeatTest, SyncThroughLostRequestsAndRepliesWithAnotherSeed) {
  Run(PsConsistency::kSync, Lossy(3, 2));
}
TEST_F(RepeatTest, AsyncThroughLostRequestsAndRepliesAppliesEachPushOnce) {
  Run(PsConsistency::kAsync, Lossy(2, 7));
}

// ---- Threads -------------------------------------------------------------------------------

// Four workers, each on its own thread, push to the same chunk and rows while a fifth thread
// copies the live state for checkpoints: both sides of every chunk's and table's lock at once.
TEST_F(PsServiceTest, ManyWorkersPushTheSameChunkWhileCheckpointsAreWritten) {
  constexpr int kWorkers = 4;
  constexpr int64_t kSteps = 25;
  for (PsConsistency consistency : {PsConsistency::kSync, PsConsistency::kAsync}) {
    SCOPED_TRACE(std::string(PsModeName(consistency)));
    service_.reset();
    workers_.clear();
    server_.reset();
    Fleet fleet;
    fleet.num_workers = kWorkers;
    ASSERT_NO_FATAL_FAILURE(Start(fleet));
    const PsJobConfig config = TestConfig(consistency, kWorkers);
    const ByKey initial = InitialValues(config);
    ASSERT_TRUE(Init(config, initial).ok());
    const Ids rows = RowsOwnedBy(1, 2);
    // Gradients of whole numbers and lr 0.5: every sum is exact, whatever the order.
    auto grad_of = [](int w, int64_t step) { return static_cast<float>((w + step) % 3); };
    std::atomic<bool> done{false};
    std::thread checkpoints([&] {
      const std::string root = TempRoot("live-" + std::string(PsModeName(consistency)));
      while (!done.load()) {
        auto saved = Checkpoint(root, 0, /*restore=*/false).get();
        // ps-sync: the live state is copied, then refused as a checkpoint of step 0 once
        // training has passed it (a ps-sync shard is of one step).
        EXPECT_TRUE(saved.ok() || (consistency == PsConsistency::kSync &&
                                   saved.status().code() == StatusCode::kFailedPrecondition))
            << saved.status();
      }
    });
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        for (int64_t step = 1; step <= kSteps; ++step) {
          const float g = grad_of(w, step);
          Reply ack = SparsePush(w, step, {rows[0], rows[1]}, {g, g, g, g});
          Reply reply = PushPull(w, step, {{50, Floats(4, g)}});
          EXPECT_TRUE(ack.get().ok()) << ack.get().status();
          EXPECT_TRUE(reply.get().ok()) << reply.get().status();
          Reply pull = SparsePull(w, step, {rows[0]});
          EXPECT_TRUE(pull.get().ok()) << pull.get().status();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    done = true;
    checkpoints.join();
    // Every push applied exactly once: the sum of all gradients (averaged in ps-sync).
    float total = 0;
    for (int w = 0; w < kWorkers; ++w) {
      for (int64_t step = 1; step <= kSteps; ++step) total += grad_of(w, step);
    }
    const float scale = consistency == PsConsistency::kSync ? 1.0f / kWorkers : 1.0f;
    Floats expected = initial.at(50);
    for (float& v : expected) v -= 0.5f * total * scale;
    EXPECT_EQ(ValuesOf(Pull(0, kSteps + 1, {50})), (ByKey{{50, expected}}));
    Floats row(2);
    InitializeEmbeddingRow(42, rows[1], 2, row.data());
    Floats pulled = RowsOf(SparsePull(0, kSteps + 1, {rows[1]}));
    ASSERT_EQ(pulled.size(), 2u);
    EXPECT_NEAR(pulled[0], row[0] - 0.5f * total * scale, 1e-3);  // rounded once per update
  }
}

}  // namespace
}  // namespace tessera::server
