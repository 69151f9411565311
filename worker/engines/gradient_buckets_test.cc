#include "worker/engines/gradient_buckets.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

ParameterLayout Layout() {
  ParameterLayout layout;
  EXPECT_TRUE(layout.Add("a.weight", {100}).ok());  // [0, 100)
  EXPECT_TRUE(layout.Add("a.bias", {10}).ok());     // [100, 110)
  EXPECT_TRUE(layout.Add("b.weight", {300}).ok());  // [110, 410)
  EXPECT_TRUE(layout.Add("b.bias", {5}).ok());      // [410, 415)
  return layout;
}

TEST(GradientBucketsTest, ReverseOrderContiguousAndNeverSplittingAParameter) {
  // 1200 bytes = 300 floats: b.bias + b.weight fill the first bucket.
  auto buckets = PlanGradientBuckets(Layout(), 1200);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].offset, 110u);
  EXPECT_EQ(buckets[0].size, 305u);
  EXPECT_EQ(buckets[0].first, "b.weight");
  EXPECT_EQ(buckets[0].last, "b.bias");
  EXPECT_EQ(buckets[1].offset, 0u);
  EXPECT_EQ(buckets[1].size, 110u);
  // One bucket for everything, and one per parameter.
  EXPECT_EQ(PlanGradientBuckets(Layout(), 1 << 30).size(), 1u);
  EXPECT_EQ(PlanGradientBuckets(Layout(), 0).size(), 4u);
  EXPECT_TRUE(PlanGradientBuckets(ParameterLayout(), 100).empty());
}

TEST(GradientBucketsTest, TrackerReportsEachBucketOnceWhenItsLastRangeArrives) {
  auto buckets = PlanGradientBuckets(Layout(), 1200);
  BucketTracker tracker(&buckets);
  EXPECT_TRUE(tracker.MarkReady(410, 5).empty());
  EXPECT_EQ(tracker.MarkReady(110, 300), (std::vector<size_t>{0}));
  EXPECT_TRUE(tracker.MarkReady(100, 10).empty());
  EXPECT_EQ(tracker.MarkReady(0, 100), (std::vector<size_t>{1}));
  EXPECT_TRUE(tracker.MarkReady(0, 415).empty());  // nothing twice
  tracker.Reset();
  EXPECT_EQ(tracker.MarkReady(0, 415), (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace tessera::worker
