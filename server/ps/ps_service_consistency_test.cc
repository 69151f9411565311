// PsService's consistency models against a reference computed in the test: one server holding
// all three chunks, three workers, random gradients, bitwise equality (SGD).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "server/ps/ps_test_fleet.h"

namespace tessera::server {
namespace {

// One server holding all three chunks (sizes 4, 4, 2), three workers, a warmup schedule (so
// the update numbers the server uses show in the lr), random gradients: bitwise equal.
class ConsistencyTest : public PsServiceTest {
 protected:
  PsJobConfig Start(PsConsistency consistency, int64_t staleness = 0) {
    Fleet fleet;
    fleet.server_rank = 0;
    fleet.num_servers = 1;
    fleet.num_workers = 3;
    PsServiceTest::Start(fleet);
    PsJobConfig config = TestConfig(consistency, 3);
    config.staleness = staleness;
    config.schedule.warmup_steps = 5;
    return config;
  }
};

TEST_F(ConsistencyTest, SyncAppliesTheAverageOfEveryWorkerOncePerStep) {
  const PsJobConfig config = Start(PsConsistency::kSync);
  ASSERT_FALSE(HasFatalFailure());
  const ByKey initial = InitialValues(config);
  ASSERT_EQ(initial.size(), 3u);
  ASSERT_TRUE(Init(config, initial).ok());
  Reference reference(config, initial);
  std::mt19937 random(1);
  for (int64_t step = 1; step <= 6; ++step) {
    std::vector<ByKey> grads;
    std::vector<Reply> replies;
    for (int w = 0; w < 3; ++w) grads.push_back(RandomGrads(random, initial));
    for (int w = 2; w >= 0; --w) replies.push_back(PushPull(w, step, grads[w]));  // any order
    reference.ApplyStep(step, grads);
    for (const Reply& reply : replies) EXPECT_EQ(ValuesOf(reply), reference.values()) << step;
  }
  EXPECT_EQ(DenseUpdates(), 6 * 3);
}

TEST_F(ConsistencyTest, AsyncAppliesEachPushAsItArrives) {
  const PsJobConfig config = Start(PsConsistency::kAsync);
  ASSERT_FALSE(HasFatalFailure());
  const ByKey initial = InitialValues(config);
  ASSERT_TRUE(Init(config, initial).ok());
  Reference reference(config, initial);
  std::mt19937 random(2);
  // Worker 2 runs ahead, worker 0 lags: nobody waits for anybody.
  const std::vector<std::pair<int, int64_t>> order = {{2, 1}, {2, 2}, {1, 1}, {2, 3}, {0, 1},
                                                      {1, 2}, {2, 4}, {2, 5}, {0, 2}, {1, 3}};
  for (auto [worker, step] : order) {
    ByKey grads = RandomGrads(random, initial);
    reference.ApplyOne(grads);
    EXPECT_EQ(ValuesOf(PushPull(worker, step, grads)), reference.values())
        << "worker " << worker << " step " << step;
  }
  // A pull of step s returns the values after update s - 1 at least: here, the latest.
  EXPECT_EQ(ValuesOf(Pull(0, 3, {0, 1, 2})), reference.values());
}

TEST_F(ConsistencyTest, SspAppliesPushesLikeAsyncWithinTheBound) {
  const PsJobConfig config = Start(PsConsistency::kSsp, /*staleness=*/2);
  ASSERT_FALSE(HasFatalFailure());
  const ByKey initial = InitialValues(config);
  ASSERT_TRUE(Init(config, initial).ok());
  Reference reference(config, initial);
  std::mt19937 random(3);
  // Every push stays within 2 steps of the slowest worker, so every reply is immediate.
  const std::vector<std::pair<int, int64_t>> order = {{0, 1}, {0, 2}, {1, 1}, {2, 1}, {0, 3},
                                                      {1, 2}, {2, 2}, {2, 3}, {2, 4}, {1, 3}};
  for (auto [worker, step] : order) {
    ByKey grads = RandomGrads(random, initial);
    reference.ApplyOne(grads);
    EXPECT_EQ(ValuesOf(PushPull(worker, step, grads)), reference.values())
        << "worker " << worker << " step " << step;
  }
  EXPECT_LE(GaugeValue(metric_names::kPsMaxReleasedStaleness), 2);
}

TEST_F(ConsistencyTest, SspHoldsAReplyUntilTheSlowestWorkerIsWithinTheBound) {
  const PsJobConfig config = Start(PsConsistency::kSsp, /*staleness=*/1);
  ASSERT_FALSE(HasFatalFailure());
  const ByKey initial = InitialValues(config);
  ASSERT_TRUE(Init(config, initial).ok());
  Reference reference(config, initial);
  std::mt19937 random(4);
  double updates = 0;  // dense updates the server has applied (3 chunks per push)
  auto push = [&](int worker, int64_t step) {
    ByKey grads = RandomGrads(random, initial);
    reference.ApplyOne(grads);  // applied on arrival, even when the reply waits
    Reply reply = PushPull(worker, step, grads);
    // Applied before the next push is sent, so the server's order of updates is the test's
    // even when this reply is held (the work queue's two threads could reorder them).
    updates += 3;
    for (Deadline deadline = Deadline::AfterMillis(10000);
         DenseUpdates() < updates && !deadline.Expired();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(DenseUpdates(), updates);
    return reply;
  };
  // Workers 0 and 1 run to step 2; worker 2 is still at step 0: a push of step 2 needs the
  // slowest worker at step 1 (2 - K).
  EXPECT_EQ(ValuesOf(push(0, 1)), reference.values());
  Reply ahead = push(0, 2);
  Reply ahead_too = push(1, 1);
  EXPECT_EQ(ValuesOf(ahead_too), reference.values());
  Reply ahead_also = push(1, 2);
  EXPECT_EQ(ahead.wait_for(kStillWaiting), std::future_status::timeout);
  EXPECT_EQ(ahead_also.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(GaugeValue(metric_names::kPsStaleness), 2);
  // Worker 2 pushes step 1: both held replies go, carrying every update so far.
  Reply slowest = push(2, 1);
  EXPECT_EQ(ValuesOf(slowest), reference.values());
  EXPECT_EQ(ValuesOf(ahead), reference.values());
  EXPECT_EQ(ValuesOf(ahead_also), reference.values());
  EXPECT_EQ(GaugeValue(metric_names::kPsMaxReleasedStaleness), 1);
  EXPECT_EQ(GaugeValue(metric_names::kPsStaleness), 1);
  // Worker 0 at step 3 needs everyone at step 2; workers 1 is, worker 2 is not.
  Reply third = push(0, 3);
  EXPECT_EQ(third.wait_for(kStillWaiting), std::future_status::timeout);
  Reply caught_up = push(2, 2);
  EXPECT_EQ(ValuesOf(caught_up), reference.values());
  EXPECT_EQ(ValuesOf(third), reference.values());
  EXPECT_EQ(GaugeValue(metric_names::kPsMaxReleasedStaleness), 1);
}

}  // namespace
}  // namespace tessera::server
