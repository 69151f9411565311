#include "server/ps/sparse_tables.h"

#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "common/metrics/metrics.h"
#include "server/ps/pushes_around_a_copy.h"

namespace tessera::server {
namespace {

using Floats = std::vector<float>;
using Ids = std::vector<int64_t>;

// One table of 100 rows of 2 (seed 42); SGD lr 0.5; server 1 of 2.
PsJobConfig Config(PsConsistency consistency, int num_workers) {
  PsJobConfig config;
  config.consistency = consistency;
  config.num_workers = num_workers;
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kSgd);
  config.optimizer.lr = 0.5f;
  config.dense_elements = 1;
  config.tables = {{"emb.0", 100, 2, 42}};
  return config;
}

Ids RowsOwnedBy(int owner, size_t count) {
  Ids rows;
  for (int64_t id = 0; rows.size() < count; ++id) {
    if (SparseRowOwner(0, id, 2) == owner) rows.push_back(id);
  }
  return rows;
}

Floats Initial(int64_t id) {
  Floats row(2);
  InitializeEmbeddingRow(42, id, 2, row.data());
  return row;
}

struct Captured {
  std::shared_ptr<std::optional<SparsePullReply>> reply =
      std::make_shared<std::optional<SparsePullReply>>();
  SparseTables::ReplyCallback Callback() const {
    return [reply = reply](SparsePullReply r) { *reply = std::move(r); };
  }
  bool came() const { return reply->has_value(); }
  Floats Values() const { return (*reply)->values.Read<float>(); }
};

class SparseTablesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto metrics = PsMetrics::Register(&registry_);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(metrics).value();
  }
  std::unique_ptr<SparseTables> Create(PsConsistency consistency, int num_workers) {
    return std::make_unique<SparseTables>(Config(consistency, num_workers), 1, 2, metrics_.get());
  }
  static Status Push(SparseTables& tables, int rank, int64_t step, const Ids& ids,
                     const Floats& grads) {
    return tables.Push("emb.0", rank, step, TensorData::Int64s("row_ids", ids),
                       TensorData::Floats("values", 0, grads));
  }
  static Captured Pull(SparseTables& tables, int64_t step, const Ids& ids) {
    Captured captured;
    Status status = tables.Pull("emb.0", step, TensorData::Int64s("row_ids", ids),
                                captured.Callback());
    EXPECT_TRUE(status.ok()) << status;
    return captured;
  }

  MetricsRegistry registry_;
  std::unique_ptr<PsMetrics> metrics_;
};

TEST_F(SparseTablesTest, SyncAppliesEveryWorkersRowsOfAStepAtOnceAveraged) {
  auto tables = Create(PsConsistency::kSync, 2);
  const Ids rows = RowsOwnedBy(1, 3);
  ASSERT_TRUE(Push(*tables, 1, 1, {rows[0]}, {2, 2}).ok());
  Captured pull = Pull(*tables, 2, {rows[0], rows[2]});
  EXPECT_FALSE(pull.came());
  EXPECT_EQ(tables->FirstBehind(1), "table 'emb.0'");
  ASSERT_TRUE(Push(*tables, 0, 1, {rows[0], rows[1]}, {4, 0, 6, 6}).ok());
  ASSERT_TRUE(pull.came());
  EXPECT_EQ((*pull.reply)->row_ids.Read<int64_t>(), (Ids{rows[0], rows[2]}));
  const Floats values = pull.Values();
  ASSERT_EQ(values.size(), 4u);
  EXPECT_FLOAT_EQ(values[0], Initial(rows[0])[0] - 0.5f * 3.0f);  // (4 + 2) / 2
  EXPECT_FLOAT_EQ(values[1], Initial(rows[0])[1] - 0.5f * 1.0f);  // (0 + 2) / 2
  EXPECT_EQ(values[2], Initial(rows[2])[0]);                       // never pushed
  EXPECT_EQ(tables->FirstBehind(1), "");
  // Rows exist once touched: the pushed ones and the pulled one.
  EXPECT_EQ(tables->Snapshot().at("emb.0").ids.size(), 3u);
}

TEST_F(SparseTablesTest, SyncRefusesASecondPushOfAStepNamingTheTable) {
  auto tables = Create(PsConsistency::kSync, 2);
  const Ids rows = RowsOwnedBy(1, 1);
  ASSERT_TRUE(Push(*tables, 0, 1, rows, {1, 1}).ok());
  Status twice = Push(*tables, 0, 1, rows, {1, 1});
  EXPECT_EQ(twice.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(twice.message(), "table 'emb.0': worker 0 pushed step 1 twice");
  Captured pull = Pull(*tables, 2, rows);
  EXPECT_FALSE(pull.came()) << "the second push must not count as worker 1's";
}

TEST_F(SparseTablesTest, AsyncAppliesEachPushAndPullsGoAtOnce) {
  auto tables = Create(PsConsistency::kAsync, 2);
  const Ids rows = RowsOwnedBy(1, 1);
  ASSERT_TRUE(Push(*tables, 1, 1, rows, {1, 1}).ok());
  ASSERT_TRUE(Push(*tables, 1, 2, rows, {1, 1}).ok());
  Captured pull = Pull(*tables, 9, rows);
  ASSERT_TRUE(pull.came());
  EXPECT_FLOAT_EQ(pull.Values()[0], Initial(rows[0])[0] - 1.0f);
}

TEST_F(SparseTablesTest, RefusesBadRowsBeforeChangingAnything) {
  auto tables = Create(PsConsistency::kSync, 1);
  const Ids mine = RowsOwnedBy(1, 1);
  const int64_t foreign = RowsOwnedBy(0, 1)[0];
  Status other = Push(*tables, 0, 1, {mine[0], foreign}, {1, 1, 1, 1});
  EXPECT_EQ(other.message(), "row " + std::to_string(foreign) +
                                 " of table 'emb.0' belongs to server 0, not server 1");
  Status outside = Push(*tables, 0, 1, {mine[0], 100}, {1, 1, 1, 1});
  EXPECT_EQ(outside.message(), "row 100 of table 'emb.0' is outside [0, 100)");
  Status size = Push(*tables, 0, 1, mine, {1, 1, 1});
  EXPECT_EQ(size.message(), "sparse push to table 'emb.0': 1 rows but 3 floats (dim 2)");
  Status dtype = tables->Push("emb.0", 0, 1, TensorData::Floats("row_ids", 0, {1}),
                              TensorData::Floats("values", 0, {1, 1}));
  EXPECT_EQ(dtype.code(), StatusCode::kInvalidArgument);
  Status table = tables->Push("emb.9", 0, 1, TensorData::Int64s("row_ids", mine),
                              TensorData::Floats("values", 0, {1, 1}));
  EXPECT_EQ(table.code(), StatusCode::kNotFound);
  EXPECT_EQ(table.message(), "no embedding table 'emb.9' in this job");
  Captured never;
  Status pull = tables->Pull("emb.0", 1, TensorData::Int64s("row_ids", {-1}), never.Callback());
  EXPECT_EQ(pull.message(), "row -1 of table 'emb.0' is outside [0, 100)");
  const Ids two = RowsOwnedBy(1, 2);
  Status poisoned = Push(*tables, 0, 1, two, {1, 1, 1, -std::numeric_limits<float>::infinity()});
  EXPECT_EQ(poisoned.message(), "worker 0's sparse push of step 1 to table 'emb.0': the gradient "
                                "of row " + std::to_string(two[1]) + " holds -inf at element 3; "
                                "refused, nothing of this push was applied");
  EXPECT_NE(registry_.RenderText().find("tessera_ps_nonfinite_pushes_total{kind=\"sparse\"} 1"),
            std::string::npos);
  EXPECT_EQ(tables->FirstBehind(1), "table 'emb.0'");  // nothing was taken
  EXPECT_TRUE(tables->Snapshot().at("emb.0").ids.empty());
}

TEST_F(SparseTablesTest, RestoreIsPreparedAsideThenCommittedAtTheStep) {
  auto tables = Create(PsConsistency::kSync, 1);
  const Ids rows = RowsOwnedBy(1, 2);
  ASSERT_TRUE(Push(*tables, 0, 1, {rows[0]}, {2, 2}).ok());
  const std::map<std::string, TableRows> saved = tables->Snapshot();
  ASSERT_TRUE(Push(*tables, 0, 2, {rows[0]}, {2, 2}).ok());
  Captured waiting = Pull(*tables, 9, {rows[0]});
  EXPECT_FALSE(waiting.came());

  std::map<std::string, TableRows> broken = saved;
  broken["emb.0"].values.pop_back();
  auto refused = tables->PrepareRestore(broken);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("emb.0"), std::string::npos) << refused.status();
  EXPECT_FALSE(tables->PrepareRestore({}).ok());

  auto restored = tables->PrepareRestore(saved);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(waiting.came());  // preparing changes nothing
  tables->CommitRestore(std::move(restored).value(), 8);
  ASSERT_TRUE(waiting.came());
  EXPECT_FLOAT_EQ(waiting.Values()[0], Initial(rows[0])[0] - 1.0f);  // after step 1 only
  ASSERT_TRUE(Push(*tables, 0, 9, {rows[1]}, {2, 2}).ok());             // goes on at step 9
}

TEST_F(SparseTablesTest, ConcurrentPushesAndPullsOfOneTable) {
  auto tables = Create(PsConsistency::kSync, 4);
  const Ids rows = RowsOwnedBy(1, 2);
  std::atomic<int> pulled{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = 1; step <= 100; ++step) {
        EXPECT_TRUE(Push(*tables, w, step, rows, {1, 1, 1, 1}).ok());
        Status status = tables->Pull("emb.0", step, TensorData::Int64s("row_ids", rows),
                                     [&](SparsePullReply) { ++pulled; });
        EXPECT_TRUE(status.ok()) << status;
        if (step % 25 == 0) tables->Snapshot();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(pulled.load(), 400);
  Captured last = Pull(*tables, 101, {rows[1]});
  ASSERT_TRUE(last.came());
  EXPECT_NEAR(last.Values()[1], Initial(rows[1])[1] - 0.5f * 100, 1e-3);
}

// ps-async with two copies: each row push the primary applies goes to the backup with the
// table's update number, and is done once the backup acknowledged it. The backup applies the
// forwards in the primary's order, parking one that overtook the one before it: bitwise the
// primary's rows and optimizer state (momentum); a copy of a forward changes nothing; a
// worker's push at the backup applies every parked forward first, and is taken as a copy when
// the backup has it already.
TEST_F(SparseTablesTest, AsyncForwardsEachRowPushAndTheBackupAppliesThemInThePrimarysOrder) {
  PsJobConfig config = Config(PsConsistency::kAsync, 2);
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
  config.optimizer.lr = 0.25f;
  struct Sent {
    std::string to;
    SparseTables::ForwardedRows rows;
    std::function<void()> done;
  };
  std::vector<Sent> sent;
  SparseTables primary(
      config, 1, 2, metrics_.get(),
      [&sent](const std::string& to, SparseTables::ForwardedRows rows, std::function<void()> done) {
        sent.push_back({to, std::move(rows), std::move(done)});
      });
  SparseTables backup(config, 1, 2, metrics_.get());
  const Ids rows = RowsOwnedBy(1, 3);
  int done = 0;
  auto push = [&](int rank, int64_t step, const Ids& ids, const Floats& grads) {
    ASSERT_TRUE(primary
                    .Push("emb.0", rank, step, TensorData::Int64s("row_ids", ids),
                          TensorData::Floats("values", 0, grads), "tcp://10.0.0.2:5000",
                          [&done] { ++done; })
                    .ok());
  };
  push(0, 1, {rows[0], rows[1]}, {0.1f, 0.2f, -1, 3});
  push(1, 1, {rows[1], rows[1]}, {0.7f, 1e-3f, 2, -0.5f});  // a row twice
  push(0, 2, {rows[2], rows[0]}, {5, 6, 1e-4f, -7});
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].to, "tcp://10.0.0.2:5000");
  EXPECT_EQ(sent[1].rows.pushed_by, 1);
  EXPECT_EQ(sent[2].rows.update, 3);
  EXPECT_EQ(done, 0);  // until the backup has them
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  ASSERT_TRUE(backup.ApplyForwarded(sent[2].rows, take).ok());
  ASSERT_TRUE(backup.ApplyForwarded(sent[1].rows, take).ok());
  EXPECT_EQ(taken, 2);
  EXPECT_EQ(backup.Snapshot().at("emb.0").ids.size(), 0u);  // parked: nothing applied yet
  ASSERT_TRUE(backup.ApplyForwarded(sent[0].rows, take).ok());
  ASSERT_TRUE(backup.ApplyForwarded(sent[1].rows, take).ok());  // a copy
  EXPECT_EQ(taken, 4);
  const TableRows theirs = primary.Snapshot().at("emb.0");
  const TableRows ours = backup.Snapshot().at("emb.0");
  EXPECT_EQ(ours.ids, theirs.ids);
  EXPECT_EQ(ours.values, theirs.values);
  EXPECT_EQ(ours.state, theirs.state);
  for (Sent& forward : sent) forward.done();
  EXPECT_EQ(done, 3);
  // Refused unacknowledged: a worker outside the job, an update below 1, a row of another
  // server.
  SparseTables::ForwardedRows bad = sent[0].rows;
  bad.pushed_by = 2;
  EXPECT_EQ(backup.ApplyForwarded(bad, take).message(),
            "worker 2's push of step 1 to table 'emb.0', forwarded: the job has workers 0 to 1");
  bad = sent[0].rows;
  bad.update = 0;
  EXPECT_EQ(backup.ApplyForwarded(bad, take).code(), StatusCode::kInvalidArgument);
  bad = sent[0].rows;
  bad.row_ids = TensorData::Int64s("row_ids", {RowsOwnedBy(0, 1)[0], rows[0]});
  EXPECT_EQ(backup.ApplyForwarded(bad, take).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(taken, 4);

  // The primary failed with update 4 forwarded but update 5's forward lost; worker 1 pushes
  // step 2 again at the backup, which took it: a copy, nothing applied. Update 5 (worker 0's
  // step 3), forwarded, parks behind the missing 4 until a worker's request applies it.
  push(1, 2, {rows[0]}, {1, 1});
  push(0, 3, {rows[1]}, {2, 2});
  ASSERT_EQ(sent.size(), 5u);
  ASSERT_TRUE(backup.ApplyForwarded(sent[4].rows, take).ok());
  EXPECT_EQ(backup.Snapshot().at("emb.0").values, ours.values);
  ASSERT_TRUE(backup
                  .Push("emb.0", 0, 3, TensorData::Int64s("row_ids", {rows[1]}),
                        TensorData::Floats("values", 0, {2, 2}))
                  .ok());  // applied the parked update: a copy of it now
  ASSERT_TRUE(backup
                  .Push("emb.0", 1, 2, TensorData::Int64s("row_ids", {rows[0]}),
                        TensorData::Floats("values", 0, {1, 1}))
                  .ok());  // never forwarded: applied now
  EXPECT_EQ(backup.Snapshot().at("emb.0").ids, primary.Snapshot().at("emb.0").ids);
}

// ps-async with three copies (DenseShardTest's chain, for rows): the middle copy applies the
// primary's forwards in its order, passes each on to the last as it applies it, and
// acknowledges one only once the last has it. After the primary failed, a worker's push at the
// middle applies its parked forwards first and passes them on numbered as applied there, and a
// copy of a push it took is acknowledged only once the last has every update; the last copy
// stays bitwise the middle.
TEST_F(SparseTablesTest, AsyncChainOfThreeCopiesPassesRowsOnAndAcknowledgesFromTheEnd) {
  PsJobConfig config = Config(PsConsistency::kAsync, 2);
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
  config.optimizer.lr = 0.25f;
  constexpr char kMiddle[] = "tcp://10.0.0.2:5000";
  constexpr char kLast[] = "tcp://10.0.0.3:5000";
  const std::string chain = std::string(kMiddle) + "," + kLast;
  struct Sent {
    std::string to;
    SparseTables::ForwardedRows rows;
    std::function<void()> done;
  };
  std::vector<Sent> sent;    // the primary's
  std::vector<Sent> onward;  // the middle's
  auto forwarder = [](std::vector<Sent>* into) {
    return [into](const std::string& to, SparseTables::ForwardedRows rows,
                  std::function<void()> done) {
      into->push_back({to, std::move(rows), std::move(done)});
    };
  };
  SparseTables primary(config, 1, 2, metrics_.get(), forwarder(&sent));
  SparseTables middle(config, 1, 2, metrics_.get(), forwarder(&onward));
  SparseTables last(config, 1, 2, metrics_.get());
  const Ids rows = RowsOwnedBy(1, 3);
  int done = 0;
  auto push = [&](SparseTables& tables, int rank, int64_t step, const Ids& ids, const Floats& grads,
                  const std::string& forward_to) {
    ASSERT_TRUE(tables
                    .Push("emb.0", rank, step, TensorData::Int64s("row_ids", ids),
                          TensorData::Floats("values", 0, grads), forward_to, [&done] { ++done; })
                    .ok());
  };
  auto expect_alike = [](SparseTables& a, SparseTables& b, const std::string& what) {
    const TableRows ours = a.Snapshot().at("emb.0");
    const TableRows theirs = b.Snapshot().at("emb.0");
    EXPECT_EQ(ours.ids, theirs.ids) << what;
    EXPECT_EQ(ours.values, theirs.values) << what;
    EXPECT_EQ(ours.state, theirs.state) << what;
  };
  push(primary, 0, 1, {rows[0], rows[1]}, {0.1f, 0.2f, -1, 3}, chain);
  push(primary, 1, 1, {rows[1]}, {0.7f, 1e-3f}, chain);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].to, chain);
  for (Sent& forward : sent) forward.rows.forward_to = kLast;
  int taken = 0;
  const auto take = [&taken] { ++taken; };
  ASSERT_TRUE(middle.ApplyForwarded(sent[1].rows, take).ok());  // overtook update 1: parked
  EXPECT_TRUE(onward.empty());
  ASSERT_TRUE(middle.ApplyForwarded(sent[0].rows, take).ok());
  ASSERT_EQ(onward.size(), 2u);
  EXPECT_EQ(onward[0].to, kLast);
  EXPECT_EQ(onward[0].rows.update, 1);
  EXPECT_EQ(onward[1].rows.pushed_by, 1);
  EXPECT_EQ(taken, 0);  // until the last copy has them
  ASSERT_TRUE(last.ApplyForwarded(onward[1].rows, [] {}).ok());
  ASSERT_TRUE(last.ApplyForwarded(onward[0].rows, [] {}).ok());
  onward[1].done();
  EXPECT_EQ(taken, 0);  // update 2 needs update 1 there too
  onward[0].done();
  EXPECT_EQ(taken, 2);
  expect_alike(middle, primary, "the middle copy");
  expect_alike(last, primary, "the last copy");
  for (Sent& forward : sent) forward.done();
  EXPECT_EQ(done, 2);

  // The primary fails with worker 1's next push lost and worker 0's forwarded to the middle.
  push(primary, 1, 2, {rows[2]}, {3, -3}, chain);
  push(primary, 0, 2, {rows[0]}, {1, 1}, chain);
  ASSERT_EQ(sent.size(), 4u);
  sent[3].rows.forward_to = kLast;
  ASSERT_TRUE(middle.ApplyForwarded(sent[3].rows, take).ok());  // parked behind update 3
  // Worker 0 asks the middle again: the parked forward is applied (update 3 here) and passed
  // on; the push is a copy, acknowledged once the last has update 3.
  push(middle, 0, 2, {rows[0]}, {1, 1}, kLast);
  ASSERT_EQ(onward.size(), 3u);
  EXPECT_EQ(onward[2].rows.pushed_by, 0);
  EXPECT_EQ(onward[2].rows.update, 3);
  EXPECT_EQ(done, 2);
  ASSERT_TRUE(last.ApplyForwarded(onward[2].rows, [] {}).ok());
  onward[2].done();
  EXPECT_EQ(done, 3);
  // Worker 1's lost push, asked again: applied as update 4 and passed on.
  push(middle, 1, 2, {rows[2]}, {3, -3}, kLast);
  ASSERT_EQ(onward.size(), 4u);
  EXPECT_EQ(onward[3].rows.update, 4);
  ASSERT_TRUE(last.ApplyForwarded(onward[3].rows, [] {}).ok());
  onward[3].done();
  EXPECT_EQ(done, 4);
  expect_alike(last, middle, "the last copy after the primary failed");
}

// A table copied for a joined server: pull replies name it once it acknowledged a push
// forwarded there (it has the copy), so workers learn it holds the range even when the range
// has no dense chunks whose push replies would say so.
TEST_F(SparseTablesTest, AsyncPullRepliesNameAJoinedServerOnceItAcknowledgedAPush) {
  std::vector<std::pair<std::string, std::function<void()>>> sent;
  SparseTables primary(
      Config(PsConsistency::kAsync, 2), 1, 2, metrics_.get(),
      [&sent](const std::string& to, SparseTables::ForwardedRows, std::function<void()> done) {
        sent.emplace_back(to, std::move(done));
      });
  const Ids rows = RowsOwnedBy(1, 2);
  auto copied_to = [&] {
    std::string named = "(no reply)";
    EXPECT_TRUE(primary
                    .Pull("emb.0", 1, TensorData::Int64s("row_ids", rows),
                          [&named](SparsePullReply reply) { named = reply.copied_to; })
                    .ok());
    return named;
  };
  ASSERT_TRUE(Push(primary, 0, 1, rows, {1, 1, 1, 1}).ok());  // alone: nothing forwarded
  EXPECT_EQ(copied_to(), "");
  primary.CopyTo("tcp://10.0.0.3:7000");
  EXPECT_EQ(copied_to(), "");  // not before it acknowledged one
  ASSERT_TRUE(Push(primary, 1, 1, rows, {2, 2, 2, 2}).ok());
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "tcp://10.0.0.3:7000");
  EXPECT_EQ(copied_to(), "");
  sent[0].second();
  EXPECT_EQ(copied_to(), "tcp://10.0.0.3:7000");
}

// The cut under concurrency: CopyTo while two workers push rows on their own threads. The
// copy (restored at its version and clocks) and the pushes forwarded after it give the joined
// server bitwise the primary's rows and state.
TEST_F(SparseTablesTest, AsyncCopyWhileRowPushesAreInFlightIsACut) {
  PsJobConfig config = Config(PsConsistency::kAsync, 2);
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
  config.optimizer.lr = 0.25f;
  std::mutex sent_mu;
  std::vector<SparseTables::ForwardedRows> forwards;
  SparseTables primary(
      config, 1, 2, metrics_.get(),
      [&](const std::string& to, SparseTables::ForwardedRows rows, std::function<void()> done) {
        EXPECT_EQ(to, "tcp://10.0.0.3:7000");
        {
          std::lock_guard<std::mutex> lock(sent_mu);
          forwards.push_back(std::move(rows));
        }
        done();
      });
  const Ids rows = RowsOwnedBy(1, 4);
  std::map<std::string, TableRows> copy;
  PushAroundACopy(
      /*workers=*/2, /*steps=*/200,
      [&](int rank, int64_t step) {
        const float g = 0.01f * static_cast<float>(rank + 1) * static_cast<float>(step % 5);
        EXPECT_TRUE(
            Push(primary, rank, step, {rows[step % 4], rows[(step + rank) % 4]}, {g, -g, 2 * g, g})
                .ok());
      },
      [&] { copy = primary.CopyTo("tcp://10.0.0.3:7000"); });
  SparseTables joined(config, 1, 2, metrics_.get());
  auto restored = joined.PrepareRestore(copy);
  ASSERT_TRUE(restored.ok()) << restored.status();
  joined.CommitRestore(std::move(restored).value(), 1, copy);
  for (const SparseTables::ForwardedRows& forward : forwards) {
    ASSERT_TRUE(joined.ApplyForwarded(forward, [] {}).ok());
  }
  EXPECT_FALSE(forwards.empty());
  const TableRows theirs = primary.Snapshot().at("emb.0");
  const TableRows ours = joined.Snapshot().at("emb.0");
  EXPECT_EQ(ours.ids, theirs.ids);
  EXPECT_EQ(ours.values, theirs.values);
  EXPECT_EQ(ours.state, theirs.state);
}

}  // namespace
}  // namespace tessera::server
