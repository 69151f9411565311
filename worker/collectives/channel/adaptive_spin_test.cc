#include "worker/collectives/channel/adaptive_spin.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(NextSpinBudgetTest, ACapOfZeroNeverSpins) {
  EXPECT_EQ(NextSpinBudgetUs(0, 10, 0), 0);
  EXPECT_EQ(NextSpinBudgetUs(100, 10, 0), 0);
  EXPECT_EQ(NextSpinBudgetUs(100, 10, -5), 0);
}

TEST(NextSpinBudgetTest, AWaitTheSpinCaughtKeepsTheBudget) {
  EXPECT_EQ(NextSpinBudgetUs(100, 0, 200), 100);
  EXPECT_EQ(NextSpinBudgetUs(100, 37, 200), 100);
  EXPECT_EQ(NextSpinBudgetUs(100, 100, 200), 100);
  EXPECT_EQ(NextSpinBudgetUs(0, 0, 200), 0);
}

TEST(NextSpinBudgetTest, AWaitWithinTheCapThatSleptGrowsTheBudgetToTwiceIt) {
  EXPECT_EQ(NextSpinBudgetUs(0, 30, 200), 60);
  EXPECT_EQ(NextSpinBudgetUs(20, 50, 200), 100);
  // Twice the wait would pass the cap: the cap.
  EXPECT_EQ(NextSpinBudgetUs(20, 150, 200), 200);
  EXPECT_EQ(NextSpinBudgetUs(20, 200, 200), 200);
}

TEST(NextSpinBudgetTest, AWaitPastTheCapHalvesTheBudgetDownToZero) {
  EXPECT_EQ(NextSpinBudgetUs(200, 201, 200), 100);
  EXPECT_EQ(NextSpinBudgetUs(100, 5000, 200), 50);
  EXPECT_EQ(NextSpinBudgetUs(kMinSpinBudgetUs * 2, 5000, 200), kMinSpinBudgetUs);
  EXPECT_EQ(NextSpinBudgetUs(kMinSpinBudgetUs * 2 - 1, 5000, 200), 0);
  EXPECT_EQ(NextSpinBudgetUs(0, 5000, 200), 0);
}

TEST(NextSpinBudgetTest, ABudgetOutsideTheCapIsBroughtInto) {
  EXPECT_EQ(NextSpinBudgetUs(1000, 10, 200), 200);
  EXPECT_EQ(NextSpinBudgetUs(-7, 0, 200), 0);
}

TEST(AdaptiveSpinTest, StartsAtTheCapStopsAfterLongWaitsAndComesBackAfterShortOnes) {
  AdaptiveSpin spin(200);
  EXPECT_EQ(spin.cap_us(), 200);
  EXPECT_EQ(spin.budget_us(), 200);
  spin.Record(15);  // caught by the spin
  EXPECT_EQ(spin.budget_us(), 200);
  int rounds = 0;
  while (spin.budget_us() > 0 && rounds < 100) {  // a peer busy elsewhere: long waits
    spin.Record(3000);
    ++rounds;
  }
  EXPECT_EQ(spin.budget_us(), 0);
  EXPECT_LE(rounds, 6);  // 200 -> 100 -> 50 -> 25 -> 12 -> 6 -> 0 (3 < kMinSpinBudgetUs)
  spin.Record(40);  // a short wait that slept: spinning would have caught it
  EXPECT_EQ(spin.budget_us(), 80);
  spin.Record(60);  // caught again
  EXPECT_EQ(spin.budget_us(), 80);
}

TEST(AdaptiveSpinTest, ANonPositiveCapNeverSpins) {
  AdaptiveSpin off(0);
  EXPECT_EQ(off.budget_us(), 0);
  off.Record(10);
  EXPECT_EQ(off.budget_us(), 0);
  AdaptiveSpin negative(-3);
  EXPECT_EQ(negative.cap_us(), 0);
  EXPECT_EQ(negative.budget_us(), 0);
}

}  // namespace
}  // namespace tessera::worker
