#include "common/training/lr_schedule.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr float kBase = 0.1f;

LrScheduleOptions Valid(LrScheduleOptions o) {
  EXPECT_TRUE(ValidateLrSchedule(o, kBase).ok()) << ValidateLrSchedule(o, kBase);
  return o;
}

TEST(LrScheduleTest, ConstantWithoutWarmup) {
  const LrScheduleOptions o = Valid({});
  for (int64_t step : {0, 1, 1000000}) EXPECT_EQ(LearningRate(o, kBase, step), kBase);
}

TEST(LrScheduleTest, WarmupRampsLinearlyToTheBaseLr) {
  LrScheduleOptions o;
  o.warmup_steps = 4;
  Valid(o);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 0), 0.025f);  // the first update already moves
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 1), 0.05f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 3), kBase);   // last warmup update: full lr
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 4), kBase);   // warmup over
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 100), kBase);
}

TEST(LrScheduleTest, StepDecaysByGammaEveryStepSizeSteps) {
  LrScheduleOptions o;
  o.kind = LrScheduleKind::kStep;
  o.step_size = 10;
  o.gamma = 0.5f;
  Valid(o);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 0), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 9), kBase);  // last step before the boundary
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 10), 0.05f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 19), 0.05f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 20), 0.025f);
  // With warmup the decay is counted from the end of the warmup.
  o.warmup_steps = 5;
  Valid(o);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 0), 0.02f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 4), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 14), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 15), 0.05f);
}

TEST(LrScheduleTest, CosineFromBaseToMinimum) {
  LrScheduleOptions o;
  o.kind = LrScheduleKind::kCosine;
  o.total_steps = 100;
  o.min_lr = 0.01f;
  Valid(o);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 0), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 50), 0.055f);  // midpoint: (base + min) / 2
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 99),           // the last update, just above min
                  static_cast<float>(0.01 + 0.09 * 0.5 * (1 + std::cos(M_PI * 0.99))));
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 100), 0.01f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 1000), 0.01f);  // stays at the minimum
  // With warmup: ramp to base over 10 steps, then cosine over the remaining 90.
  o.warmup_steps = 10;
  Valid(o);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 0), 0.01f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 9), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 10), kBase);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 55), 0.055f);
  EXPECT_FLOAT_EQ(LearningRate(o, kBase, 100), 0.01f);
}

TEST(LrScheduleTest, ParsesKindNames) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kConstant, LrScheduleKind::kStep, LrScheduleKind::kCosine}) {
    StatusOr<LrScheduleKind> parsed = ParseLrScheduleKind(LrScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  StatusOr<LrScheduleKind> bad = ParseLrScheduleKind("linear");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("lr_schedule=\"linear\" is unknown"));
}

void ExpectRejected(const LrScheduleOptions& o, float base_lr, const std::string& needle) {
  Status s = ValidateLrSchedule(o, base_lr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << o.ToString();
  EXPECT_THAT(s.message(), HasSubstr(needle)) << o.ToString();
}

TEST(LrScheduleTest, RejectsBadOptionsNamingTheField) {
  LrScheduleOptions o;
  o.warmup_steps = -1;
  ExpectRejected(o, kBase, "lr_schedule constant: warmup_steps=-1 must be >= 0");
  ExpectRejected({}, -0.1f, "base lr=-0.1");
  ExpectRejected({}, NAN, "base lr=nan");

  LrScheduleOptions step;
  step.kind = LrScheduleKind::kStep;
  ExpectRejected(step, kBase, "lr_schedule step: step_size=0 must be > 0");
  step.step_size = 10;
  step.gamma = 0.0f;
  ExpectRejected(step, kBase, "gamma=0 must be in (0, 1]");
  step.gamma = 1.5f;
  ExpectRejected(step, kBase, "gamma=1.5");
  step.gamma = NAN;
  ExpectRejected(step, kBase, "gamma=nan");

  LrScheduleOptions cosine;
  cosine.kind = LrScheduleKind::kCosine;
  ExpectRejected(cosine, kBase, "lr_schedule cosine: total_steps=0 must be > warmup_steps=0");
  cosine.total_steps = 10;
  cosine.warmup_steps = 10;
  ExpectRejected(cosine, kBase, "total_steps=10 must be > warmup_steps=10");
  cosine.warmup_steps = 0;
  cosine.min_lr = 0.2f;
  ExpectRejected(cosine, kBase, "min_lr=0.2 must be in [0, base lr=0.1]");
  cosine.min_lr = -0.01f;
  ExpectRejected(cosine, kBase, "min_lr=-0.01");

  LrScheduleOptions bad_kind;
  bad_kind.kind = static_cast<LrScheduleKind>(7);
  ExpectRejected(bad_kind, kBase, "kind=7");
}

TEST(LrScheduleTest, ToStringShowsTheFieldsInUse) {
  LrScheduleOptions o;
  o.kind = LrScheduleKind::kCosine;
  o.warmup_steps = 100;
  o.total_steps = 10000;
  EXPECT_EQ(o.ToString(), "cosine warmup_steps=100 total_steps=10000 min_lr=0");
}

}  // namespace
}  // namespace tessera
