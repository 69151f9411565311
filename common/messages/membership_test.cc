#include "common/messages/membership.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(MembershipHistoryTest, EveryChangeIsAnEpochWithWhoWhyAndTheStep) {
  MembershipHistory history(/*min_workers=*/2, /*max_workers=*/4, /*initial_workers=*/4);
  EXPECT_EQ(history.epoch(), 0u);
  StatusOr<MembershipChange> left =
      history.Leave(2, MembershipKind::kKilled, "process gone", /*step=*/40, 100.5);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->epoch, 1u);
  EXPECT_EQ(left->world_size, 3);
  EXPECT_EQ(DescribeMembershipChange(*left),
            "membership epoch 1: worker 2 left after step 40 (killed: process gone); "
            "3 workers now");
  EXPECT_EQ(history.Leave(2, MembershipKind::kExit, "", 41, 101).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(history.FreeRank(), 2);
  StatusOr<MembershipChange> joined = history.Join(history.FreeRank(), 57, 102);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->epoch, 2u);
  EXPECT_EQ(joined->kind, MembershipKind::kJoin);
  EXPECT_EQ(joined->world_size, 4);
  EXPECT_EQ(history.changes().size(), 2u);
}

TEST(MembershipHistoryTest, AJoinBeyondMaxWorkersIsRefusedNamingBothNumbers) {
  MembershipHistory history(1, 3, 3);
  EXPECT_EQ(history.FreeRank(), -1);
  StatusOr<MembershipChange> refused = history.Join(3, 10, 0);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(), "join refused: the job has 3 workers, --max-workers 3");
  EXPECT_EQ(history.epoch(), 0u);
}

TEST(MembershipHistoryTest, BelowMinWorkersNamesTheCauseAndTheCheckpoint) {
  MembershipHistory history(2, 2, 2);
  StatusOr<MembershipChange> left =
      history.Leave(1, MembershipKind::kError, "nan in loss", 12, 0);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(history.BelowMinimum());
  EXPECT_EQ(history.StopReason(*left, "/ckpt/step-10"),
            "the job has 1 worker, below --min-workers 2, since membership epoch 1: worker 1 "
            "left after step 12 (error: nan in loss); 1 worker now; last checkpoint: "
            "/ckpt/step-10");
  EXPECT_EQ(history.StopReason(*left, "").find("checkpoint"), std::string::npos);
}

TEST(MembershipHistoryTest, WorkersThatLeftCleanlyStillCountTowardsTheMinimum) {
  // ps-async: a fast worker finishes (a clean exit) long before a slow one is killed.
  MembershipHistory history(3, 4, 4);
  ASSERT_TRUE(history.Leave(0, MembershipKind::kExit, "finished", 20, 0).ok());
  ASSERT_TRUE(history.Leave(1, MembershipKind::kKilled, "gone", 5, 0).ok());
  EXPECT_EQ(history.world_size(), 2);
  EXPECT_FALSE(history.BelowMinimum());
  ASSERT_TRUE(history.Leave(2, MembershipKind::kError, "disk full", 6, 0).ok());
  EXPECT_TRUE(history.BelowMinimum());
}

TEST(MembershipJsonLineTest, RoundTripsAndNamesABadField) {
  MembershipChange change{3, 40, MembershipKind::kKilled, 2, "a \"quoted\"\nreason", 3, 1.25};
  const std::string line = MembershipJsonLine(change);
  EXPECT_EQ(line,
            "{\"epoch\":3,\"kind\":\"killed\",\"rank\":2,\"reason\":\"a \\\"quoted\\\"\\nreason\","
            "\"step\":40,\"time\":1.25,\"world_size\":3}");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  StatusOr<MembershipChange> back = ParseMembershipJsonLine(line);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch, 3u);
  EXPECT_EQ(back->step, 40);
  EXPECT_EQ(back->kind, MembershipKind::kKilled);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->reason, change.reason);
  EXPECT_EQ(back->world_size, 3);
  EXPECT_EQ(back->unix_time_s, 1.25);
  StatusOr<MembershipChange> bad = ParseMembershipJsonLine("{\"epoch\":\"x\"}");
  EXPECT_NE(bad.status().message().find("field \"epoch\""), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseMembershipJsonLine("not json").ok());
  EXPECT_FALSE(ParseMembershipKind("left").ok());
}

}  // namespace
}  // namespace tessera
