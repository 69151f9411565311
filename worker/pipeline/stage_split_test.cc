#include "worker/pipeline/stage_split.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(SplitStagesTest, BalancesTheMostExpensiveStage) {
  // An mlp 16-64-32-4 with ReLU: Linear 1024, ReLU 64, Linear 2048, ReLU 32, Linear 128.
  const std::vector<int64_t> costs = {1024, 64, 2048, 32, 128};
  auto two = SplitStages(costs, 2, {});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<int>{0, 2}));  // 1088 | 2208
  auto three = SplitStages(costs, 3, {});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*three, (std::vector<int>{0, 2, 3}));  // 1088 | 2048 | 160
  auto all = SplitStages(costs, 5, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SplitStagesTest, EqualCostsSplitEvenly) {
  auto split = SplitStages(std::vector<int64_t>(8, 10), 4, {});
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(*split, (std::vector<int>{0, 2, 4, 6}));
}

TEST(SplitStagesTest, AnExplicitSplitIsTaken) {
  auto split = SplitStages(std::vector<int64_t>(5, 1), 3, {1, 4});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(*split, (std::vector<int>{0, 1, 4}));
}

TEST(SplitStagesTest, RefusesFewerLayersThanStagesNamingBoth) {
  auto split = SplitStages(std::vector<int64_t>(3, 1), 4, {});
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.status().message().find("the model has 3 layers, fewer than the 4 stages"),
            std::string::npos)
      << split.status();
}

TEST(SplitStagesTest, RefusesABadExplicitSplit) {
  EXPECT_FALSE(SplitStages(std::vector<int64_t>(5, 1), 3, {2}).ok());      // too few
  EXPECT_FALSE(SplitStages(std::vector<int64_t>(5, 1), 3, {3, 2}).ok());   // not increasing
  EXPECT_FALSE(SplitStages(std::vector<int64_t>(5, 1), 3, {0, 2}).ok());   // stage 1 at 0
  EXPECT_FALSE(SplitStages(std::vector<int64_t>(5, 1), 3, {2, 5}).ok());   // past the end
  auto bad = SplitStages(std::vector<int64_t>(5, 1), 3, {3, 2});
  EXPECT_NE(bad.status().message().find("--pipeline-split 3,2"), std::string::npos);
}

TEST(ParsePipelineSplitTest, ParsesAndRefuses) {
  auto ok = ParsePipelineSplit("2,4");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<int>{2, 4}));
  EXPECT_TRUE(ParsePipelineSplit("")->empty());
  auto bad = ParsePipelineSplit("2,x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'x'"), std::string::npos);
}

}  // namespace
}  // namespace tessera::worker
