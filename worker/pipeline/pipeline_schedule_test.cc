// The schedules: exact orders for small shapes (as torch's pipelining orders them), every
// shape each accepts runs to the end without a deadlock and with every dependency met, the
// shapes each refuses named, bubbles and memory against the closed forms, and the checks of
// SimulateSchedule on lists that are not schedules.
#include "worker/pipeline/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "worker/pipeline/schedule_simulation.h"

namespace tessera::worker {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kInterleaved1F1B,
                                   ScheduleKind::kZeroBubbleH1};

std::string Names(const std::vector<PipelineAction>& actions) {
  std::string text;
  for (const PipelineAction& a : actions) text += (text.empty() ? "" : " ") + ActionName(a);
  return text;
}

PipelineSchedule MakeOrDie(ScheduleKind kind, PipelineShape shape) {
  StatusOr<PipelineSchedule> schedule = PipelineSchedule::Make(kind, shape);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return std::move(schedule).value();
}

TEST(PipelineScheduleTest, NamesRoundTripAndAnUnknownOneListsThem) {
  for (ScheduleKind kind : kKinds) {
    StatusOr<ScheduleKind> parsed = ParseScheduleKind(ScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  StatusOr<ScheduleKind> bad = ParseScheduleKind("zb-v");
  EXPECT_EQ(bad.status().message(),
            "pipeline schedule 'zb-v': not one of gpipe, 1f1b, interleaved, zb-h1");
}

TEST(PipelineScheduleTest, OneFOneBAtTwoRanksAndThreeMicroBatches) {
  PipelineSchedule s = MakeOrDie(ScheduleKind::k1F1B, {2, 3});
  EXPECT_EQ(Names(s.actions(0)),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2");
  EXPECT_EQ(Names(s.actions(1)),
            "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2");
}

TEST(PipelineScheduleTest, GPipeRunsEveryForwardThenEveryBackward) {
  PipelineSchedule s = MakeOrDie(ScheduleKind::kGPipe, {2, 2});
  EXPECT_EQ(Names(s.actions(0)), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  EXPECT_EQ(s.peak_held(0), 2);
}

// Rank 1 holds back the weight gradient of its first backward (one: its rank) to the end.
TEST(PipelineScheduleTest, ZeroBubbleSplitsTheBackwardAndHoldsWeightGradientsBack) {
  PipelineSchedule s = MakeOrDie(ScheduleKind::kZeroBubbleH1, {2, 2});
  EXPECT_EQ(Names(s.actions(0)),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1");
  EXPECT_EQ(Names(s.actions(1)),
            "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1");
}

// Two ranks, two stages each (stage s on rank s mod 2), four micro-batches: rank 0 warms up
// with its first stage's two forwards, then its second stage's.
TEST(PipelineScheduleTest, InterleavedTakesStagesInRoundsOfTheRanks) {
  PipelineSchedule s = MakeOrDie(ScheduleKind::kInterleaved1F1B, {2, 4, 2});
  std::string forwards;
  for (const PipelineAction& a : s.actions(0)) {
    if (a.op == PipelineOp::kForward) forwards += ActionName(a) + " ";
  }
  EXPECT_EQ(forwards, "0F0 0F1 2F0 2F1 0F2 0F3 2F2 2F3 ");
  EXPECT_EQ(s.stages(), 4);
  EXPECT_EQ(s.RankOf(3), 1);
}

bool Accepts(ScheduleKind kind, int p, int m, int v) {
  switch (kind) {
    case ScheduleKind::kGPipe: return v == 1;
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZeroBubbleH1: return v == 1 && m >= p;
    case ScheduleKind::kInterleaved1F1B: return m % p == 0;
  }
  return false;
}

// Every shape up to 8 ranks, 16 micro-batches and 4 stages per rank: accepted ones run (Make
// simulates each and fails on a deadlock or an unmet dependency); the others are refused
// naming the schedule and the shape.
TEST(PipelineScheduleTest, EveryAcceptedShapeRunsAndEveryOtherIsRefused) {
  int accepted = 0;
  for (ScheduleKind kind : kKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (int v = 1; v <= 4; ++v) {
          StatusOr<PipelineSchedule> s = PipelineSchedule::Make(kind, {p, m, v});
          const std::string what = ScheduleKindName(kind) + " P=" + std::to_string(p) +
                                   " M=" + std::to_string(m) + " V=" + std::to_string(v);
          if (Accepts(kind, p, m, v)) {
            ASSERT_TRUE(s.ok()) << what << ": " << s.status();
            ++accepted;
          } else {
            ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument) << what;
            EXPECT_EQ(s.status().message().rfind("pipeline schedule " +
                                                     ScheduleKindName(kind) + ", ",
                                                 0),
                      0u)
                << s.status();
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 400);
}

TEST(PipelineScheduleTest, RefusalsSayWhy) {
  EXPECT_EQ(PipelineSchedule::Make(ScheduleKind::k1F1B, {4, 2}).status().message(),
            "pipeline schedule 1f1b, 4 ranks, 2 micro-batches: it needs at least as many "
            "micro-batches as ranks (2 < 4; gpipe runs any number)");
  EXPECT_EQ(PipelineSchedule::Make(ScheduleKind::kInterleaved1F1B, {4, 6, 2}).status().message(),
            "pipeline schedule interleaved, 4 ranks, 6 micro-batches, 2 stages per rank: it needs "
            "a multiple of the ranks' number of micro-batches (6 is not a multiple of 4)");
  EXPECT_EQ(PipelineSchedule::Make(ScheduleKind::kGPipe, {2, 4, 2}).status().message(),
            "pipeline schedule gpipe, 2 ranks, 4 micro-batches, 2 stages per rank: it runs 1 "
            "stage per rank (interleaved runs several)");
  EXPECT_EQ(PipelineSchedule::Make(ScheduleKind::kGPipe, {0, 4}).status().message(),
            "pipeline schedule gpipe, 0 ranks, 4 micro-batches: it needs at least 1 rank");
}

// GPipe and 1F1B idle (P-1)/(M+P-1) of the step (forward 1, backward 2); 1F1B holds at most
// P-r micro-batches on rank r against GPipe's M; interleaving and zero bubble idle less, and
// ZB-H1 holds no more than 1F1B's most.
TEST(PipelineScheduleTest, BubblesAndMemoryAgainstTheClosedForms) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      const double closed = static_cast<double>(p - 1) / (m + p - 1);
      PipelineSchedule gpipe = MakeOrDie(ScheduleKind::kGPipe, {p, m});
      PipelineSchedule one = MakeOrDie(ScheduleKind::k1F1B, {p, m});
      PipelineSchedule zero = MakeOrDie(ScheduleKind::kZeroBubbleH1, {p, m});
      EXPECT_NEAR(gpipe.bubble_fraction(), closed, 1e-12) << "P=" << p << " M=" << m;
      EXPECT_NEAR(one.bubble_fraction(), closed, 1e-12) << "P=" << p << " M=" << m;
      EXPECT_LT(zero.bubble_fraction(), 0.6 * closed) << "P=" << p << " M=" << m;
      int most = 0;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe.peak_held(r), m);
        EXPECT_EQ(one.peak_held(r), p - r) << "P=" << p << " M=" << m << " rank " << r;
        EXPECT_LE(zero.peak_held(r), p) << "P=" << p << " M=" << m << " rank " << r;
        most = std::max(most, one.peak_held(r));
      }
      EXPECT_EQ(most, p);
      if (m % p == 0) {
        PipelineSchedule interleaved = MakeOrDie(ScheduleKind::kInterleaved1F1B, {p, m, 2});
        EXPECT_LT(interleaved.bubble_fraction(), one.bubble_fraction())
            << "P=" << p << " M=" << m;
      }
    }
  }
}

// Lists that are not schedules.
TEST(ScheduleSimulationTest, NamesWhatIsWrong) {
  const std::vector<std::vector<PipelineAction>> good =
      MakeOrDie(ScheduleKind::kGPipe, {2, 1}).all_actions();
  ASSERT_TRUE(SimulateSchedule(good, 2, 1).ok());

  // Rank 0 waits for the gradient before it sends the activation.
  std::vector<std::vector<PipelineAction>> lists = good;
  lists[0] = {{PipelineOp::kRecvGradient, 0, 0},
              {PipelineOp::kForward, 0, 0},
              {PipelineOp::kSendActivation, 0, 0},
              {PipelineOp::kBackward, 0, 0}};
  StatusOr<SimulatedSchedule> run = SimulateSchedule(lists, 2, 1);
  EXPECT_EQ(run.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(run.status().message(),
            "deadlock: rank 0 waits at 0RECV_B0 for 1SEND_B0 (rank 1); rank 1 waits at "
            "1RECV_F0 for 0SEND_F0 (rank 0)");

  lists = good;
  lists[1].erase(std::find(lists[1].begin(), lists[1].end(),
                           PipelineAction{PipelineOp::kBackward, 1, 0}));
  EXPECT_EQ(SimulateSchedule(lists, 2, 1).status().message(),
            "rank 1 never runs 1B0 (nor 1I0 and 1W0)");

  lists = good;
  lists[0].push_back({PipelineOp::kForward, 1, 0});
  EXPECT_EQ(SimulateSchedule(lists, 2, 1).status().message(), "rank 0's 1F0 belongs on rank 1");

  lists = good;
  std::swap(lists[1][1], lists[1][2]);  // 1B0 before 1F0
  EXPECT_EQ(SimulateSchedule(lists, 2, 1).status().message(),
            "rank 1's 1B0 comes before 1F0, which it needs");

  lists = good;
  lists[1].push_back({PipelineOp::kSendActivation, 1, 0});
  EXPECT_EQ(SimulateSchedule(lists, 2, 1).status().message(),
            "rank 1's 1SEND_F0 does not belong in this schedule");

  lists = good;
  lists[0].push_back({PipelineOp::kForward, 0, 0});
  EXPECT_EQ(SimulateSchedule(lists, 2, 1).status().message(), "rank 0's 0F0 is listed twice");
}

}  // namespace
}  // namespace tessera::worker
