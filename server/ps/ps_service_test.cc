// PsService over in-process endpoints, driven by hand-built requests from "workers" (the fleet
// of ps_test_fleet.h): who waits for whom, what is refused, parked requests, checkpoints.
#include "server/ps/ps_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/training/checkpoint.h"
#include "server/ps/ps_test_fleet.h"

namespace tessera::server {
namespace {

TEST_F(PsServiceTest, SyncRepliesWaitForEveryWorkerThenCarryTheAveragedUpdate) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {1, 2, 3, 4}}}).ok());
  Reply first = PushPull(0, 1, {{50, {1, 1, 1, 1}}});
  // Worker 1 has not pushed step 1: worker 0's reply must wait.
  EXPECT_EQ(first.wait_for(kStillWaiting), std::future_status::timeout);
  Reply second = PushPull(1, 1, {{50, {3, 3, 3, -1}}});
  // p - 0.5 * mean(g0, g1) = p - 0.5 * {2, 2, 2, 0}
  EXPECT_EQ(ValuesOf(first), (ByKey{{50, {0, 1, 2, 4}}}));
  EXPECT_EQ(ValuesOf(second), (ByKey{{50, {0, 1, 2, 4}}}));
}

// A reply held longer than the limit is logged once by the service's watch, saying what holds
// it. (Every PsServiceTest runs the watch, at its default limit, beside its requests.)
TEST_F(PsServiceTest, AReplyHeldLongIsLoggedWithWhatHoldsIt) {
  Fleet fleet;
  fleet.long_wait_ms = 100;
  ASSERT_NO_FATAL_FAILURE(Start(fleet));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {1, 2, 3, 4}}}).ok());
  testing::internal::CaptureStderr();
  Reply held = PushPull(0, 1, {{50, {1, 1, 1, 1}}});
  // Worker 1 has not pushed step 1; the watch looks once a second.
  EXPECT_EQ(held.wait_for(std::chrono::milliseconds(2500)), std::future_status::timeout);
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("range 1, chunk 1: worker 0's push of step 1 has waited "),
            std::string::npos)
      << logged;
  EXPECT_NE(logged.find(" s: it waits for step 1 to be applied; the chunk is at step 0, and "
                        "worker 1 has not pushed step 1 here"),
            std::string::npos)
      << logged;
  // Once.
  EXPECT_EQ(logged.find("has waited", logged.find("has waited") + 1), std::string::npos)
      << logged;
  Reply second = PushPull(1, 1, {{50, {3, 3, 3, -1}}});
  EXPECT_EQ(ValuesOf(held), (ByKey{{50, {0, 1, 2, 4}}}));
  EXPECT_EQ(ValuesOf(second), (ByKey{{50, {0, 1, 2, 4}}}));
}

// --replicas: server 1 holds range 0 beside its own, each with its own chunks, rows and
// steps; every request names its range, a push parks until its range's init, and a backup's
// push (ack_only) is applied but answered without the values.
TEST_F(PsServiceTest, HoldsAnotherServersRangeBesideItsOwn) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 1);
  const ByKey own = InitialValues(config);
  const ByKey other = InitialValues(config, /*range=*/0);
  ASSERT_FALSE(other.empty());
  ASSERT_TRUE(Init(config, own).ok());
  // Range 0's push arrives before range 0 is initialised: it waits for its init.
  PsPushPullRequest backup{{}, true, kTestToken, {}};
  backup.range = 0;
  backup.ack_only = true;
  ByKey grads;
  for (const auto& [key, values] : other) {
    grads[key] = Floats(values.size(), 2.0f);
    backup.tensors.push_back(TensorData::Floats("chunk", key, grads[key]));
  }
  Reply parked = Send(0, std::move(backup), 1, "backup push of range 0");
  EXPECT_EQ(parked.wait_for(kStillWaiting), std::future_status::timeout);
  ASSERT_TRUE(Init(config, other, /*range=*/0).ok());
  const StatusOr<Envelope>& acked = parked.get();
  ASSERT_TRUE(acked.ok()) << acked.status();
  for (const TensorData& tensor : acked->As<PsPushPullReply>()->tensors) {
    EXPECT_TRUE(tensor.bytes.empty()) << "a backup's reply carries the values of " << tensor.key;
  }
  // The push was applied to range 0 (p - 0.5 * 2), and range 1 is untouched.
  std::vector<uint64_t> keys;
  for (const auto& [key, values] : other) keys.push_back(key);
  PsPushPullRequest pull{{}, false, kTestToken, {}};
  pull.range = 0;
  for (uint64_t key : keys) {
    pull.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
  }
  ByKey expected = other;
  for (auto& [key, values] : expected) {
    for (float& v : values) v -= 1.0f;
  }
  EXPECT_EQ(ValuesOf(Send(0, std::move(pull), 2, "pull of range 0")), expected);
  std::vector<uint64_t> own_keys;
  for (const auto& [key, values] : own) own_keys.push_back(key);
  EXPECT_EQ(ValuesOf(Pull(0, 1, own_keys)), own);
  // A range beyond the fleet's servers is refused, naming it.
  PsPushPullRequest beyond{{}, false, kTestToken, {}};
  beyond.range = 7;
  auto refused = Send(0, std::move(beyond), 1, "pull of range 7").get();
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("range 7 of PsPushPullRequest from worker 0 is "
                                            "outside the 2 servers' ranges"),
            std::string::npos)
      << refused.status();
}

// A request parked for its job's init waits at most the parking limit: one of a job never
// initialised here (another token) is answered with an error naming its token at the next
// request parked or init after that, while one of the job an init then creates goes on.
TEST_F(PsServiceTest, ARequestOfAJobNeverInitialisedHereIsAnsweredAfterTheParkingLimit) {
  Fleet fleet;
  fleet.park_limit_ms = 200;
  ASSERT_NO_FATAL_FAILURE(Start(fleet));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 2);
  const ByKey values = InitialValues(config);
  std::vector<uint64_t> keys;
  for (const auto& [key, v] : values) keys.push_back(key);
  PsPushPullRequest stale{{}, false, kTestToken + 1, {}};
  for (uint64_t key : keys) {
    stale.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
  }
  Reply parked = Send(0, stale, 1, "pull of another job");
  EXPECT_EQ(parked.wait_for(std::chrono::milliseconds(600)), std::future_status::timeout);
  // This job's pull parks too, and the stale one, parked over 200 ms ago, is answered.
  Reply pull = Pull(1, 1, keys);
  const Status refused = parked.get().status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("PsPushPullRequest from worker 0 waited "), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("ms for its job (token 8) to be initialised, longer than "
                                   "the limit (200 ms): no worker initialised it here"),
            std::string::npos)
      << refused;
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(Init(config, values).ok());
  EXPECT_EQ(ValuesOf(pull), values);
}

// Forwarded steps (--replicas 2): server 0 is range 0's primary and this server its backup.
// The workers push to the primary naming the backup; the step's replies wait until the backup
// has the step (here until the backup's range is initialised: the forward waits for it), and
// then both copies hold the same values. A backup that stops answering holds the replies until
// it is declared failed (PeerLost); no step goes there after that. Only a server forwards.
TEST_F(PsServiceTest, AForwardedStepReachesTheBackupBeforeItsRepliesGo) {
  Fleet fleet;
  fleet.with_primary = true;
  ASSERT_NO_FATAL_FAILURE(Start(fleet));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 2);
  const ByKey values = InitialValues(config, /*range=*/0);
  ASSERT_TRUE(InitPrimary(config, values).ok());
  auto push = [this](int worker, int64_t step, const ByKey& grads, const std::string& backup) {
    return PushToPrimary(worker, step, grads, backup);
  };
  std::mt19937 random(5);
  Reference reference(config, values);
  std::vector<ByKey> grads = {RandomGrads(random, values), RandomGrads(random, values)};
  Reply first = push(0, 1, grads[0], server_->address());
  Reply last = push(1, 1, grads[1], server_->address());
  EXPECT_EQ(last.wait_for(kStillWaiting), std::future_status::timeout);
  ASSERT_TRUE(Init(config, values, /*range=*/0).ok());  // the backup's copy: the step goes on
  reference.ApplyStep(1, grads);
  EXPECT_EQ(ValuesOf(first), reference.values());
  EXPECT_EQ(ValuesOf(last), reference.values());
  PsPushPullRequest pull{{}, false, kTestToken, {}};
  pull.range = 0;
  for (const auto& [key, v] : values) {
    pull.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
  }
  EXPECT_EQ(ValuesOf(Send(0, pull, 2, "pull of the backup's copy")), reference.values());

  // A backup that never answers (worker 1's endpoint, taking the steps and saying nothing).
  std::atomic<int> forwards_taken{0};
  workers_[1]->SetHandler(MessageType::kPsPushPullRequest,
                          [&forwards_taken](Envelope) { ++forwards_taken; });
  const std::string silent = workers_[1]->address();
  grads = {RandomGrads(random, values), RandomGrads(random, values)};
  first = push(0, 2, grads[0], silent);
  last = push(1, 2, grads[1], silent);
  EXPECT_EQ(last.wait_for(kStillWaiting), std::future_status::timeout);
  EXPECT_GE(forwards_taken.load(), 1);  // and sent again every 250 ms, then less often
  primary_service_->PeerLost(silent, "server 1 (" + silent + ") failed: killed");
  reference.ApplyStep(2, grads);
  EXPECT_EQ(ValuesOf(first), reference.values());
  EXPECT_EQ(ValuesOf(last), reference.values());
  const int taken_before_loss = forwards_taken.load();
  grads = {RandomGrads(random, values), RandomGrads(random, values)};
  first = push(0, 3, grads[0], silent);
  last = push(1, 3, grads[1], silent);
  reference.ApplyStep(3, grads);
  EXPECT_EQ(ValuesOf(last), reference.values());  // at once: nothing goes to a failed backup
  EXPECT_EQ(ValuesOf(first), reference.values());
  std::this_thread::sleep_for(kStillWaiting);  // longer than a resend's wait
  EXPECT_EQ(forwards_taken.load(), taken_before_loss);
  workers_[1]->ClearHandler(MessageType::kPsPushPullRequest);

  PsPushPullRequest forged = pull;
  forged.forwarded = true;
  const Status refused = Send(0, std::move(forged), 3, "a forwarded step from a worker")
                             .get()
                             .status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("a forwarded step from worker 0: only a range's primary "
                                   "server forwards steps"),
            std::string::npos)
      << refused;
}

// A backup that refuses a forwarded step (here: its copy is a step behind, as a bug would
// leave it) makes the copies differ: the step's replies still go, and from then on the range's
// pushes are refused naming why, so the job stops loudly instead of failing over to a wrong
// copy later.
TEST_F(PsServiceTest, ABackupThatRefusesAForwardedStepStopsTheRange) {
  Fleet fleet;
  fleet.with_primary = true;
  fleet.num_workers = 1;
  ASSERT_NO_FATAL_FAILURE(Start(fleet));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 1);
  const ByKey values = InitialValues(config, /*range=*/0);
  ASSERT_TRUE(InitPrimary(config, values).ok());
  ASSERT_TRUE(Init(config, values, /*range=*/0).ok());
  ByKey ones;
  for (const auto& [key, v] : values) ones[key] = Floats(v.size(), 1.0f);
  auto push = [&](int64_t step, const std::string& backup) {
    return PushToPrimary(0, step, ones, backup);
  };
  ASSERT_TRUE(push(1, "").get().ok());  // not forwarded: the backup stays at step 0
  const Reply second = push(2, server_->address());
  ASSERT_TRUE(second.get().ok()) << second.get().status();  // the primary's values, as they were
  const Status refused = push(3, server_->address()).get().status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("range 0's backup lost an update, so its two copies may differ"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("forwarded step 2 of chunk"), std::string::npos) << refused;
}

// ps-async and ps-ssp with two copies: two workers push concurrently to the primary, which
// forwards each push with its update numbers; the backup's acknowledgements are dropped (the
// forwards come again: copies) or duplicated at random, and still both copies end bitwise
// equal: the same updates in the same order, each once.
class PsServiceForwardTest : public PsServiceTest {
 protected:
  // `chain`: three copies, primary -> server -> last (--replicas 3).
  void PushConcurrentlyAndCompareTheCopies(PsConsistency consistency, bool chain = false) {
    Fleet fleet;
    fleet.with_primary = true;
    fleet.with_last = chain;
    FaultOptions faults;
    faults.seed = 3;
    faults.drop_probability = 0.05;
    faults.duplicate_probability = 0.05;
    fleet.server_faults = faults;
    fleet.resend_ms = 200;  // the workers' requests dropped are sent again, as PsEngine's
    ASSERT_NO_FATAL_FAILURE(Start(fleet));
    PsJobConfig config = TestConfig(consistency, 2);
    config.staleness = 1;
    config.optimizer = DefaultOptimizerOptions(OptimizerKind::kMomentum);
    config.optimizer.lr = 0.1f;
    const ByKey values = InitialValues(config, /*range=*/0);
    ASSERT_GE(values.size(), 2u);
    ASSERT_TRUE(InitPrimary(config, values).ok());
    ASSERT_TRUE(Init(config, values, /*range=*/0).ok());
    if (chain) {
      ASSERT_TRUE(InitLast(config, values).ok());
    }
    const std::string forward_to =
        chain ? server_->address() + "," + last_->address() : server_->address();
    constexpr int64_t kSteps = 30;
    // Range 0's rows (of server 0 in a fleet of 2): each push touches two of them.
    const Ids rows = RowsOwnedBy(0, 3);
    auto run = [&](int worker) {
      std::mt19937 random(static_cast<unsigned>(11 + worker));
      std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
      for (int64_t step = 1; step <= kSteps; ++step) {
        SparsePushRequest row_push{
            "emb.0", TensorData::Int64s("row_ids", {rows[step % 3], rows[(step + worker) % 3]}),
            TensorData::Floats("values", 0,
                               {grad(random), grad(random), grad(random), grad(random)}),
            0, forward_to};
        const Reply rows_pushed = SendToPrimary(worker, row_push, step, "row push");
        const Reply pushed = PushToPrimary(worker, step, RandomGrads(random, values), forward_to);
        for (const Reply* reply : {&rows_pushed, &pushed}) {
          ASSERT_TRUE(reply->get().ok())
              << "worker " << worker << " step " << step << ": " << reply->get().status();
        }
      }
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    PsPushPullRequest pull{{}, false, kTestToken, {}};
    pull.range = 0;
    for (const auto& [key, v] : values) {
      pull.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
    }
    const ByKey primary = ValuesOf(SendToPrimary(0, pull, 1, "pull of the primary's copy"));
    const ByKey backup = ValuesOf(Send(0, pull, 1, "pull of the backup's copy"));
    ASSERT_EQ(primary.size(), values.size());
    EXPECT_EQ(backup, primary);
    if (chain) {
      EXPECT_EQ(ValuesOf(SendToLast(0, pull, 1, "pull of the last copy")), primary);
    }
    EXPECT_NE(primary, values);
    EXPECT_EQ(DenseUpdates(), static_cast<double>(2 * kSteps * values.size()));
    // The rows too: forwarded by the primary, applied in its order.
    SparsePullRequest row_pull{"emb.0", TensorData::Int64s("row_ids", rows), 0};
    const Reply primary_rows = SendToPrimary(0, row_pull, kSteps + 1, "rows of the primary");
    const Reply backup_rows = Send(0, row_pull, kSteps + 1, "rows of the backup");
    ASSERT_TRUE(primary_rows.get().ok()) << primary_rows.get().status();
    ASSERT_TRUE(backup_rows.get().ok()) << backup_rows.get().status();
    const Floats primary_values = primary_rows.get()->As<SparsePullReply>()->values.Read<float>();
    EXPECT_EQ(backup_rows.get()->As<SparsePullReply>()->values.Read<float>(), primary_values);
    if (chain) {
      const Reply last_rows = SendToLast(0, row_pull, kSteps + 1, "rows of the last copy");
      ASSERT_TRUE(last_rows.get().ok()) << last_rows.get().status();
      EXPECT_EQ(last_rows.get()->As<SparsePullReply>()->values.Read<float>(), primary_values);
    }
    Floats initial;
    for (int64_t id : rows) {
      Floats row(static_cast<size_t>(config.tables[0].dim));
      InitializeEmbeddingRow(config.tables[0].init_seed, id, config.tables[0].dim, row.data());
      initial.insert(initial.end(), row.begin(), row.end());
    }
    EXPECT_NE(primary_values, initial);
  }
};

TEST_F(PsServiceForwardTest, AsyncCopiesStayBitwiseEqualUnderConcurrentPushes) {
  PushConcurrentlyAndCompareTheCopies(PsConsistency::kAsync);
}

TEST_F(PsServiceForwardTest, SspCopiesStayBitwiseEqualUnderConcurrentPushes) {
  PushConcurrentlyAndCompareTheCopies(PsConsistency::kSsp);
}

// --replicas 3: the server passes each update on to the last copy and acknowledges the
// primary's forward once the last has it; the three copies end bitwise alike.
TEST_F(PsServiceForwardTest, AsyncChainOfThreeCopiesStaysBitwiseEqualUnderConcurrentPushes) {
  PushConcurrentlyAndCompareTheCopies(PsConsistency::kAsync, /*chain=*/true);
}

// A range copied to a server that joined in a failed one's place: the copy of a step (no file,
// answered at every asking) starts the range's job at that step on the init that carries it,
// whatever initial values the init carries too; a copy that does not fit is refused naming it.
TEST_F(PsServiceTest, ARangeCopyStartsTheRangesJobAtItsStep) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 1);
  const ByKey other = InitialValues(config, /*range=*/0);
  ASSERT_TRUE(Init(config, other, /*range=*/0).ok());
  auto with_range = [](PsPushPullRequest request) {
    request.range = 0;
    return request;
  };
  PsPushPullRequest push{{}, true, kTestToken, {}};
  for (const auto& [key, values] : other) {
    push.tensors.push_back(TensorData::Floats("chunk", key, Floats(values.size(), 2.0f)));
  }
  ASSERT_TRUE(Send(0, with_range(push), 1, "push of range 0").get().ok());
  ASSERT_TRUE(Send(0,
                   SparsePushRequest{"emb.0", TensorData::Int64s("row_ids", {}),
                                     TensorData::Floats("values", 0, {}), 0},
                   1, "row push of range 0")
                  .get()
                  .ok());
  CheckpointRequest ask{"", 1, false, 0};
  ask.copy = true;
  const Reply copy_reply = Send(0, ask, 1, "copy of range 0");
  const StatusOr<Envelope>& copied = copy_reply.get();
  ASSERT_TRUE(copied.ok()) << copied.status();
  const std::vector<TensorData> copy = copied->As<CheckpointReply>()->tensors;
  ASSERT_FALSE(copy.empty());
  EXPECT_TRUE(Send(0, ask, 1, "copy of range 0 again").get().ok());  // not a ledger's copy

  PsInitRequest bad{EncodePsJobConfig(config), {}, kTestToken, 0};
  for (const auto& [key, v] : other) bad.tensors.push_back(TensorData::Floats("chunk", key, v));
  PsInitRequest good = bad;
  bad.copy.assign(copy.begin() + 1, copy.end());
  bad.copy_step = 1;
  const Status refused = Send(0, std::move(bad), 0, "init with a short copy").get().status();
  EXPECT_EQ(refused.code(), StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("the copy of range 0 of step 1 from worker 0: entry '"),
            std::string::npos)
      << refused;
  good.copy = copy;
  good.copy_step = 1;
  const Status taken = Send(0, std::move(good), 0, "init with the copy").get().status();
  ASSERT_TRUE(taken.ok()) << taken;
  // The values after step 1 (p - 0.5 * 2), not the init's; step 2 applies next.
  PsPushPullRequest pull{{}, false, kTestToken, {}};
  for (const auto& [key, values] : other) {
    pull.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
  }
  ByKey expected = other;
  for (auto& [key, values] : expected) {
    for (float& v : values) v -= 1.0f;
  }
  EXPECT_EQ(ValuesOf(Send(0, with_range(pull), 2, "pull of range 0")), expected);
  for (auto& [key, values] : expected) {
    for (float& v : values) v -= 1.0f;
  }
  EXPECT_EQ(ValuesOf(Send(0, with_range(push), 2, "push of step 2")), expected);
}

TEST_F(PsServiceTest, KeysAndRowsOfAnotherServerAreRefusedNamingTheOwner) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {0, 0, 0, 0}}}).ok());
  auto wrong_key = PushPull(0, 1, {{3, {1, 1, 1, 1}}}).get();
  EXPECT_EQ(wrong_key.status().code(), StatusCode::kNotFound);
  EXPECT_NE(wrong_key.status().message().find("key 3 belongs to server 0, not server 1"),
            std::string::npos)
      << wrong_key.status();
  const int64_t foreign = RowsOwnedBy(0, 1)[0];
  auto wrong_row = SparsePush(0, 1, {foreign}, {1, 1}).get();
  EXPECT_NE(wrong_row.status().message().find("row " + std::to_string(foreign) +
                                              " of table 'emb.0' belongs to server 0"),
            std::string::npos)
      << wrong_row.status();
  auto wrong_size = PushPull(1, 1, {{50, {1, 1}}}).get();
  EXPECT_NE(wrong_size.status().message().find("chunk 1 has 4 floats"), std::string::npos)
      << wrong_size.status();
}

TEST_F(PsServiceTest, SyncRefusesASecondPushOfTheSameStep) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {0, 0, 0, 0}}}).ok());
  Reply first = PushPull(0, 1, {{50, {1, 1, 1, 1}}});
  // Held (waiting for worker 1) before the second push goes: the work queue's two threads
  // could otherwise take the two in either order, and the test is about the second.
  for (Deadline deadline = Deadline::AfterMillis(10000);
       GaugeValue(metric_names::kPsWaitingRequests) < 1 && !deadline.Expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(GaugeValue(metric_names::kPsWaitingRequests), 1);
  auto again = PushPull(0, 1, {{50, {5, 5, 5, 5}}}).get();  // a new request, not a duplicate
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("worker 0 pushed step 1 twice"), std::string::npos)
      << again.status();
  Reply second = PushPull(1, 1, {{50, {3, 3, 3, 3}}});
  EXPECT_EQ(ValuesOf(first), (ByKey{{50, {-1, -1, -1, -1}}}));  // the second push was not used
  EXPECT_EQ(ValuesOf(second), (ByKey{{50, {-1, -1, -1, -1}}}));
}

// A skip over the wire (--on-nonfinite skip): in ps-sync the step is dropped for both workers
// and each reply names who skipped; a skip that is not a push is refused, saying so.
TEST_F(PsServiceTest, SyncDropsASkippedStepAndRefusesASkipInAPull) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {1, 2, 3, 4}}}).ok());
  auto skip = [this](bool has_gradients) {
    PsPushPullRequest request{{}, has_gradients, kTestToken, {}};
    request.tensors.push_back(TensorData{"chunk", 50, DataType::kFloat32, {}, Payload()});
    request.skip = true;
    return Send(1, std::move(request), 1, "skip of step 1 by worker 1");
  };
  auto in_a_pull = skip(/*has_gradients=*/false).get();
  EXPECT_EQ(in_a_pull.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in_a_pull.status().message().find("worker 1 skipped step 1 in a pull (a skip is a "
                                              "push)"),
            std::string::npos)
      << in_a_pull.status();
  Reply pushed = PushPull(0, 1, {{50, {1, 1, 1, 1}}});
  Reply skipped = skip(/*has_gradients=*/true);
  for (const Reply* reply : {&pushed, &skipped}) {
    EXPECT_EQ(ValuesOf(*reply), (ByKey{{50, {1, 2, 3, 4}}}));  // nothing applied
    EXPECT_EQ(reply->get()->As<PsPushPullReply>()->skipped_by, 1);
  }
}

TEST_F(PsServiceTest, SparseRowsExistOnlyOnceTouchedAndSyncAveragesThem) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {0, 0, 0, 0}}}).ok());
  const Ids rows = RowsOwnedBy(1, 3);
  // Step 1: worker 0 touches rows[0] twice (duplicates add up), worker 1 touches rows[1].
  ASSERT_TRUE(SparsePush(0, 1, {rows[0], rows[0]}, {1, 2, 3, 4}).get().ok());
  Reply pull = SparsePull(0, 2, {rows[0], rows[1], rows[2]});
  EXPECT_EQ(pull.wait_for(kStillWaiting), std::future_status::timeout)
      << "a pull for step 2 must wait until step 1's rows are applied";
  ASSERT_TRUE(SparsePush(1, 1, {rows[1]}, {2, 2}).get().ok());
  Floats values = RowsOf(pull);
  ASSERT_EQ(values.size(), 6u);
  Floats initial(2);
  // rows[0]: init - 0.5 * (1+3, 2+4) / 2 workers
  InitializeEmbeddingRow(42, rows[0], 2, initial.data());
  EXPECT_FLOAT_EQ(values[0], initial[0] - 0.5f * 2.0f);
  EXPECT_FLOAT_EQ(values[1], initial[1] - 0.5f * 3.0f);
  InitializeEmbeddingRow(42, rows[1], 2, initial.data());
  EXPECT_FLOAT_EQ(values[2], initial[0] - 0.5f * 1.0f);
  // rows[2] was never pushed: its initial value.
  InitializeEmbeddingRow(42, rows[2], 2, initial.data());
  EXPECT_EQ(values[4], initial[0]);
  EXPECT_EQ(values[5], initial[1]);
}

TEST_F(PsServiceTest, RequestsBeforeTheJobWaitForItsInit) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  // Worker 1 pulls before worker 0 initialised the job: answered once the init arrives.
  Reply early = Pull(1, 1, {50});
  EXPECT_EQ(early.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  ASSERT_TRUE(Init(TestConfig(PsConsistency::kSync, 2), {{50, {5, 6, 7, 8}}}).ok());
  EXPECT_EQ(ValuesOf(early), (ByKey{{50, {5, 6, 7, 8}}}));
}

TEST_F(PsServiceTest, ACheckpointRestoresTheStateOfItsStepAndTrainingGoesOnFromThere) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const PsJobConfig config = TestConfig(PsConsistency::kSync, 2);
  const ByKey initial = InitialValues(config);
  ASSERT_TRUE(Init(config, initial).ok());
  std::optional<Reference> reference(std::in_place, config, initial);
  const Ids rows = RowsOwnedBy(1, 3);
  std::mt19937 random(5);
  std::vector<std::vector<ByKey>> grads;  // by step - 1, then rank
  std::vector<std::vector<Floats>> row_grads;
  auto step = [&](int64_t s, bool record) {
    if (record) {
      grads.push_back({RandomGrads(random, initial), RandomGrads(random, initial)});
      row_grads.push_back({RandomFloats(random, 4), RandomFloats(random, 2)});
    }
    const std::vector<Ids> ids = {{rows[0], rows[1]}, {rows[(s + 1) % 3]}};
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(SparsePush(w, s, ids[w], row_grads[s - 1][w]).get().ok());
    }
    Reply r0 = PushPull(0, s, grads[s - 1][0]);
    Reply r1 = PushPull(1, s, grads[s - 1][1]);
    reference->ApplyStep(s, grads[s - 1]);
    reference->ApplyRows(s, ids, row_grads[s - 1]);
    EXPECT_EQ(ValuesOf(r0), reference->values());
    EXPECT_EQ(ValuesOf(r1), reference->values());
  };
  step(1, true);
  step(2, true);
  const Reference at_step_2 = *reference;
  const std::string root = TempRoot("roundtrip");
  ASSERT_TRUE(PrepareCheckpointStep(root, 2).ok());
  auto saved = Checkpoint(root, 2, /*restore=*/false).get();
  ASSERT_TRUE(saved.ok()) << saved.status();
  const CheckpointReply* written = saved->As<CheckpointReply>();
  ASSERT_NE(written, nullptr);
  ASSERT_EQ(written->files, std::vector<std::string>{"server-1.ckpt"});
  CheckpointManifest manifest;
  manifest.step = 2;
  manifest.mode = "ps-sync";
  manifest.layout_fingerprint = config.layout_fingerprint;
  manifest.dense_elements = config.dense_elements;
  manifest.num_servers = 2;
  manifest.chunk_elements = config.chunk_elements;
  manifest.files = {{written->files[0], written->bytes[0], written->checksums[0]}};
  ASSERT_TRUE(CommitCheckpoint(root, manifest).ok());
  step(3, true);
  const Reference at_step_3 = *reference;

  // A checkpoint whose dense part is fine but whose table is not changes nothing.
  const std::string bad_root = TempRoot("bad");
  ASSERT_TRUE(PrepareCheckpointStep(bad_root, 2).ok());
  CheckpointShard bad;
  bad.floats["chunk1.values"] = {9, 9, 9, 9};
  bad.floats["chunk1.state"] = {};
  bad.ints["emb.0.ids"] = {rows[0]};
  bad.floats["emb.0.values"] = {1, 2, 3};  // not one row of 2
  bad.floats["emb.0.state"] = {};
  auto bad_file =
      WriteCheckpointShard(CheckpointStepDirectory(bad_root, 2) + "/server-1.ckpt", bad);
  ASSERT_TRUE(bad_file.ok()) << bad_file.status();
  CheckpointManifest bad_manifest = manifest;
  bad_manifest.files = {*bad_file};
  ASSERT_TRUE(CommitCheckpoint(bad_root, bad_manifest).ok());
  auto refused = Checkpoint(bad_root, 2, /*restore=*/true).get();
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("emb.0"), std::string::npos) << refused.status();
  // ... and one of another placement is refused naming both.
  CheckpointManifest other = manifest;
  other.chunk_elements = 8;
  ASSERT_TRUE(PrepareCheckpointStep(TempRoot("other"), 2).ok());
  ASSERT_TRUE(CommitCheckpoint(TempRoot("other"), other).ok());
  auto misplaced = Checkpoint(TempRoot("other"), 2, /*restore=*/true).get();
  EXPECT_EQ(misplaced.status().code(), StatusCode::kFailedPrecondition) << misplaced.status();
  EXPECT_NE(misplaced.status().message().find("chunks of 8 floats"), std::string::npos)
      << misplaced.status();
  EXPECT_EQ(ValuesOf(Pull(0, 4, {50})), at_step_3.values());
  EXPECT_EQ(RowsOf(SparsePull(1, 4, rows)), at_step_3.Rows(rows));

  // The real one: step 2's values and rows; steps 3 and 4 then give what they gave before.
  auto restored = Checkpoint(root, 2, /*restore=*/true).get();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(ValuesOf(Pull(1, 3, {50})), at_step_2.values());
  EXPECT_EQ(RowsOf(SparsePull(0, 3, rows)), at_step_2.Rows(rows));
  reference.emplace(at_step_2);
  step(3, false);
  EXPECT_EQ(reference->values(), at_step_3.values());
  step(4, true);
}

}  // namespace
}  // namespace tessera::server
