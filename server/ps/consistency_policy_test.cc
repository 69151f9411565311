#include "server/ps/consistency_policy.h"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

PushDecision MustPush(ConsistencyPolicy& policy, int rank, int64_t step) {
  StatusOr<PushDecision> decision = policy.Push(rank, step);
  EXPECT_TRUE(decision.ok()) << decision.status();
  return decision.ok() ? *decision : PushDecision{};
}

TEST(ConsistencyPolicyTest, SyncHoldsEachStepUntilEveryWorkerPushedItThenAppliesItOnce) {
  ConsistencyPolicy policy(PsConsistency::kSync, 3, 0);
  for (int64_t step = 1; step <= 3; ++step) {
    // Any arrival order; the last arrival applies.
    PushDecision a = MustPush(policy, 2, step);
    PushDecision b = MustPush(policy, 0, step);
    EXPECT_EQ(a.action, PushAction::kHold);
    EXPECT_EQ(b.action, PushAction::kHold);
    EXPECT_EQ(policy.version(), step - 1);
    EXPECT_FALSE(policy.MayRelease(a.reply));
    PushDecision c = MustPush(policy, 1, step);
    EXPECT_EQ(c.action, PushAction::kApplyHeld);
    EXPECT_EQ(c.update, step);
    EXPECT_EQ(policy.version(), step);
    for (const PushDecision& d : {a, b, c}) EXPECT_TRUE(policy.MayRelease(d.reply));
  }
}

TEST(ConsistencyPolicyTest, SyncRefusesASecondPushOfAStepAndOneOfAnAppliedStep) {
  ConsistencyPolicy policy(PsConsistency::kSync, 2, 0);
  MustPush(policy, 0, 1);
  StatusOr<PushDecision> twice = policy.Push(0, 1);
  EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(twice.status().message(), "worker 0 pushed step 1 twice");
  EXPECT_EQ(MustPush(policy, 1, 1).action, PushAction::kApplyHeld);  // the refusal counted nothing
  StatusOr<PushDecision> late = policy.Push(1, 1);
  EXPECT_EQ(late.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(late.status().message(), "worker 1 pushed step 1, which is applied already (step 1)");
  EXPECT_EQ(policy.version(), 1);
}

// A backup whose primary forwards each step (Advance): the workers' pushes of a step it holds
// are answered as applied once per worker (their replies were lost with the primary); a
// second push of it by the same worker is refused as anywhere; a forward of a step it took
// already changes nothing; and pushes of the step held here when its forward comes are released
// by it.
TEST(ConsistencyPolicyTest, SyncAdvancedByForwardsAnswersEachWorkersLatePushOnce) {
  ConsistencyPolicy policy(PsConsistency::kSync, 2, 0);
  EXPECT_TRUE(policy.Advance(1));
  EXPECT_FALSE(policy.Advance(1));  // a copy of the forward
  EXPECT_EQ(policy.version(), 1);
  PushDecision late = MustPush(policy, 0, 1);
  EXPECT_EQ(late.action, PushAction::kApplied);
  EXPECT_EQ(late.update, 1);
  EXPECT_TRUE(policy.MayRelease(late.reply));
  StatusOr<PushDecision> again = policy.Push(0, 1);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(again.status().message(), "worker 0 pushed step 1, which is applied already (step 1)");
  // Step 2: worker 1 pushed it here (the primary failed), then the primary's forward came.
  PushDecision held = MustPush(policy, 1, 2);
  EXPECT_EQ(held.action, PushAction::kHold);
  EXPECT_FALSE(policy.MayRelease(held.reply));
  EXPECT_TRUE(policy.Advance(2));
  EXPECT_TRUE(policy.MayRelease(held.reply));
  EXPECT_EQ(MustPush(policy, 0, 2).action, PushAction::kApplied);  // worker 0's, after it
  // Step 3 completes here from the workers' pushes as on any primary.
  EXPECT_EQ(MustPush(policy, 0, 3).action, PushAction::kHold);
  EXPECT_EQ(MustPush(policy, 1, 3).action, PushAction::kApplyHeld);
}

TEST(ConsistencyPolicyTest, SyncWithOneWorkerAppliesEveryPush) {
  ConsistencyPolicy policy(PsConsistency::kSync, 1, 0);
  EXPECT_EQ(MustPush(policy, 0, 1).action, PushAction::kApplyHeld);
  EXPECT_EQ(MustPush(policy, 0, 2).action, PushAction::kApplyHeld);
  EXPECT_FALSE(policy.Push(0, 2).ok());
}

TEST(ConsistencyPolicyTest, AsyncAppliesEachPushAsTheNextUpdateAndRepliesAtOnce) {
  ConsistencyPolicy policy(PsConsistency::kAsync, 2, 0);
  int64_t update = 0;
  for (auto [rank, step] : std::vector<std::pair<int, int64_t>>{{0, 1}, {0, 2}, {0, 3}, {1, 1}}) {
    PushDecision d = MustPush(policy, rank, step);
    EXPECT_EQ(d.action, PushAction::kApplyNow);
    EXPECT_EQ(d.update, ++update);
    EXPECT_TRUE(policy.MayRelease(d.reply));
    EXPECT_EQ(policy.Lead(d.reply), 0);
  }
  EXPECT_EQ(policy.version(), 4);
}

// A worker pushes each step once: a second push of a step (or of one before it) is a copy,
// asked again of a backup that took the push from its former primary: nothing applied, the
// reply goes (ps-ssp: once the staleness allows it).
TEST(ConsistencyPolicyTest, AsyncTakesAPushOfAStepAtOrBelowTheWorkersClockAsACopy) {
  ConsistencyPolicy async(PsConsistency::kAsync, 2, 0);
  MustPush(async, 0, 1);
  MustPush(async, 0, 2);
  for (int64_t step : {2, 1}) {
    PushDecision copy = MustPush(async, 0, step);
    EXPECT_EQ(copy.action, PushAction::kApplied);
    EXPECT_EQ(copy.update, 2);
    EXPECT_TRUE(async.MayRelease(copy.reply));
  }
  EXPECT_EQ(async.version(), 2);
  EXPECT_EQ(MustPush(async, 1, 2).action, PushAction::kApplyNow);  // another worker's
  StatusOr<PushDecision> skipped = async.Skip(1, 2);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->action, PushAction::kNone);

  ConsistencyPolicy ssp(PsConsistency::kSsp, 2, 0);
  MustPush(ssp, 0, 1);
  PushDecision copy = MustPush(ssp, 0, 1);
  EXPECT_EQ(copy.action, PushAction::kApplied);
  EXPECT_FALSE(ssp.MayRelease(copy.reply));  // worker 1 has not pushed step 1
  MustPush(ssp, 1, 1);
  EXPECT_TRUE(ssp.MayRelease(copy.reply));
}

TEST(ConsistencyPolicyTest, SspReleasesAPushOfStepTOnceTheSlowestPushedTMinusK) {
  for (int64_t k : {0, 1, 3}) {
    SCOPED_TRACE("K=" + std::to_string(k));
    ConsistencyPolicy policy(PsConsistency::kSsp, 2, k);
    // Worker 0 runs ahead while worker 1 stays at clock 0: step t may go while t - K <= 0.
    std::vector<PushDecision> ahead;
    for (int64_t step = 1; step <= k + 2; ++step) {
      ahead.push_back(MustPush(policy, 0, step));
      EXPECT_EQ(ahead.back().action, PushAction::kApplyNow);  // applied anyway
      EXPECT_EQ(policy.MayRelease(ahead.back().reply), step - k <= 0) << step;
    }
    EXPECT_EQ(policy.Spread(), k + 2);
    // Worker 1 pushes step 1: every push up to step K + 1 may go now, K + 2 still waits.
    MustPush(policy, 1, 1);
    EXPECT_EQ(policy.Spread(), k + 1);
    for (int64_t step = 1; step <= k + 2; ++step) {
      const ReleaseRule& rule = ahead[static_cast<size_t>(step - 1)].reply;
      EXPECT_EQ(policy.MayRelease(rule), step <= k + 1) << step;
      if (step - k >= 0 && policy.MayRelease(rule)) {
        EXPECT_LE(policy.Lead(rule), k);
      }
    }
    EXPECT_EQ(policy.Lead(ahead[static_cast<size_t>(k)].reply), k);  // step K + 1, slowest at 1
  }
}

// A skip counts as the worker's push: in ps-sync the step's last arrival drops it for everyone
// (naming the first who skipped) and the version still moves, so every reply goes; the next
// step is applied as usual. A skip is refused as a push is.
TEST(ConsistencyPolicyTest, SyncDropsAStepAnyWorkerSkippedAndGoesOn) {
  ConsistencyPolicy policy(PsConsistency::kSync, 3, 0);
  PushDecision pushed = MustPush(policy, 0, 1);
  StatusOr<PushDecision> first = policy.Skip(2, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->action, PushAction::kHold);
  EXPECT_EQ(policy.Skip(2, 1).status().message(), "worker 2 pushed step 1 twice");
  StatusOr<PushDecision> last = policy.Skip(1, 1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->action, PushAction::kDropHeld);
  EXPECT_EQ(last->update, 1);
  EXPECT_EQ(last->skipped_by, 2);  // the first who skipped
  EXPECT_EQ(policy.version(), 1);
  for (const PushDecision& d : {pushed, *first, *last}) EXPECT_TRUE(policy.MayRelease(d.reply));
  for (int rank = 0; rank < 2; ++rank) MustPush(policy, rank, 2);
  PushDecision applied = MustPush(policy, 2, 2);
  EXPECT_EQ(applied.action, PushAction::kApplyHeld);
  EXPECT_EQ(applied.skipped_by, -1);
}

TEST(ConsistencyPolicyTest, AsyncSkipAppliesNothingAndMovesOnlyTheClock) {
  ConsistencyPolicy policy(PsConsistency::kSsp, 2, 1);
  MustPush(policy, 0, 1);
  StatusOr<PushDecision> skip = policy.Skip(1, 1);
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_EQ(skip->action, PushAction::kNone);
  EXPECT_EQ(policy.version(), 1);  // one update applied, not two
  EXPECT_EQ(policy.Spread(), 0);   // worker 1's clock moved to step 1
  EXPECT_TRUE(policy.MayRelease(skip->reply));
}

TEST(ConsistencyPolicyTest, PullsWaitForTheStepBeforeTheirsAndRowPullsOnlyInSync) {
  ConsistencyPolicy sync(PsConsistency::kSync, 2, 0);
  EXPECT_TRUE(sync.MayRelease(sync.Pull(1)));
  EXPECT_FALSE(sync.MayRelease(sync.Pull(2)));
  EXPECT_FALSE(sync.MayRelease(sync.RowPull(2)));
  MustPush(sync, 0, 1);
  MustPush(sync, 1, 1);
  EXPECT_TRUE(sync.MayRelease(sync.Pull(2)));
  EXPECT_TRUE(sync.MayRelease(sync.RowPull(2)));

  ConsistencyPolicy async(PsConsistency::kAsync, 2, 0);
  EXPECT_FALSE(async.MayRelease(async.Pull(2)));
  EXPECT_TRUE(async.MayRelease(async.RowPull(50)));
  MustPush(async, 1, 1);
  EXPECT_TRUE(async.MayRelease(async.Pull(2)));
}

TEST(ConsistencyPolicyTest, RestoreResetsTheVersionAndClocksAndForgetsHeldPushes) {
  ConsistencyPolicy sync(PsConsistency::kSync, 2, 0);
  MustPush(sync, 0, 1);
  MustPush(sync, 1, 1);
  MustPush(sync, 0, 2);  // held
  sync.Restore(10);
  EXPECT_EQ(sync.version(), 10);
  EXPECT_TRUE(sync.MayRelease(sync.Pull(11)));
  EXPECT_FALSE(sync.MayRelease(sync.Pull(12)));
  EXPECT_FALSE(sync.Push(0, 10).ok());  // applied by the checkpoint
  EXPECT_EQ(MustPush(sync, 0, 11).action, PushAction::kHold);
  EXPECT_EQ(MustPush(sync, 1, 11).action, PushAction::kApplyHeld);

  ConsistencyPolicy ssp(PsConsistency::kSsp, 2, 1);
  MustPush(ssp, 0, 1);
  MustPush(ssp, 0, 2);
  ssp.Restore(5);
  EXPECT_EQ(ssp.Spread(), 0);
  EXPECT_EQ(ssp.version(), 5);
  PushDecision next = MustPush(ssp, 0, 6);
  EXPECT_EQ(next.update, 6);
  EXPECT_TRUE(ssp.MayRelease(next.reply));  // 6 - 1 <= 5
  EXPECT_FALSE(ssp.MayRelease(MustPush(ssp, 0, 7).reply));
}

TEST(ConsistencyPolicyTest, ACopyTakesItsVersionAndEachWorkersClock) {
  // Another replica's part after 5 updates: worker 0 pushed steps 1-3, worker 1 steps 1-2.
  ConsistencyPolicy ssp(PsConsistency::kSsp, 2, 1);
  ssp.Restore(5, {3, 2});
  EXPECT_EQ(ssp.version(), 5);
  EXPECT_EQ(ssp.clocks(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(ssp.Spread(), 1);
  EXPECT_EQ(MustPush(ssp, 0, 3).action, PushAction::kApplied);  // in the copy
  PushDecision next = MustPush(ssp, 1, 3);
  EXPECT_EQ(next.action, PushAction::kApplyNow);
  EXPECT_EQ(next.update, 6);
  EXPECT_TRUE(ssp.MayRelease(next.reply));                  // the slowest clock is 3 now
  EXPECT_FALSE(ssp.MayRelease(MustPush(ssp, 0, 5).reply));  // 5 - 1 > 3
}

// Elastic jobs (issue 47): a worker that leaves stops counting at once.
TEST(ConsistencyPolicyTest, SyncLeaveCompletesTheStepTheLeaverHeldUp) {
  ConsistencyPolicy policy(PsConsistency::kSync, 4, 0);
  for (int rank = 0; rank < 4; ++rank) MustPush(policy, rank, 1);
  ASSERT_EQ(policy.version(), 1);
  // Worker 2 dies after step 1: the others' pushes of step 2 wait for it...
  PushDecision a = MustPush(policy, 0, 2);
  MustPush(policy, 1, 2);
  MustPush(policy, 3, 2);
  EXPECT_EQ(a.action, PushAction::kHold);
  EXPECT_EQ(policy.NotPushed(2), std::vector<int>({2}));
  // ...until it leaves: step 2 is complete with the three that pushed.
  std::vector<PushDecision> completed = policy.Leave(2);
  ASSERT_EQ(completed.size(), 1u);
  EXPECT_EQ(completed[0].action, PushAction::kApplyHeld);
  EXPECT_EQ(completed[0].update, 2);
  EXPECT_EQ(policy.version(), 2);
  EXPECT_TRUE(policy.MayRelease(a.reply));
  EXPECT_TRUE(policy.Leave(2).empty());  // twice: nothing more
  // Step 3 waits only for the three, and the leaver's late push is refused naming it.
  MustPush(policy, 0, 3);
  MustPush(policy, 1, 3);
  EXPECT_EQ(MustPush(policy, 3, 3).action, PushAction::kApplyHeld);
  StatusOr<PushDecision> late = policy.Push(2, 4);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("worker 2 pushed step 4"), std::string::npos)
      << late.status();
  EXPECT_EQ(policy.CountingWorkers(4), 3);
}

TEST(ConsistencyPolicyTest, SyncLeaveOfAWorkerThatPushedKeepsItsGradientInTheStep) {
  ConsistencyPolicy policy(PsConsistency::kSync, 3, 0);
  MustPush(policy, 1, 1);  // pushed, then died before its reply
  EXPECT_TRUE(policy.Leave(1).empty());  // 0 and 2 still count for step 1
  MustPush(policy, 0, 1);
  EXPECT_EQ(MustPush(policy, 2, 1).action, PushAction::kApplyHeld);
  EXPECT_EQ(policy.version(), 1);
}

TEST(ConsistencyPolicyTest, SyncJoinerCountsFromItsFirstStep) {
  ConsistencyPolicy policy(PsConsistency::kSync, 3, 0);
  policy.Leave(2);
  MustPush(policy, 0, 1);
  EXPECT_EQ(MustPush(policy, 1, 1).action, PushAction::kApplyHeld);
  EXPECT_FALSE(policy.Join(0, 5).ok());  // in the job already
  Status applied = policy.Join(2, 1);
  EXPECT_EQ(applied.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(applied.message().find("step 1 is applied"), std::string::npos) << applied;
  ASSERT_TRUE(policy.Join(2, 3).ok());
  // Step 2 does not wait for it, nor takes its push; step 3 waits for it.
  EXPECT_FALSE(policy.Push(2, 2).ok());
  MustPush(policy, 0, 2);
  EXPECT_EQ(MustPush(policy, 1, 2).action, PushAction::kApplyHeld);
  MustPush(policy, 0, 3);
  EXPECT_EQ(MustPush(policy, 1, 3).action, PushAction::kHold);
  EXPECT_EQ(MustPush(policy, 2, 3).action, PushAction::kApplyHeld);
}

TEST(ConsistencyPolicyTest, SspSlowestClockIgnoresAWorkerThatLeft) {
  ConsistencyPolicy policy(PsConsistency::kSsp, 2, /*staleness=*/1);
  MustPush(policy, 0, 1);
  MustPush(policy, 1, 1);
  MustPush(policy, 0, 2);
  PushDecision ahead = MustPush(policy, 0, 3);
  EXPECT_FALSE(policy.MayRelease(ahead.reply));  // worker 1 is at 1, 3 - 1 > 1
  EXPECT_TRUE(policy.Leave(1).empty());
  EXPECT_TRUE(policy.MayRelease(ahead.reply));
  EXPECT_EQ(policy.Spread(), 0);
}

}  // namespace
}  // namespace tessera::server
