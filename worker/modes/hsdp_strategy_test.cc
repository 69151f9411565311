#include "worker/modes/hsdp_strategy.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(ShardGroupOfRanksTest, ConsecutiveRanksWithAGroupSize) {
  const std::vector<std::string> peers(6, "tcp://127.0.0.1:1");
  auto groups = ShardGroupOfRanks(peers, 2);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  groups = ShardGroupOfRanks(peers, 6);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, std::vector<int>(6, 0));
}

TEST(ShardGroupOfRanksTest, ASizeThatDoesNotDivideTheWorldNamesBoth) {
  auto groups = ShardGroupOfRanks(std::vector<std::string>(4, "tcp://127.0.0.1:1"), 3);
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().message(),
            "--shard-group-size 3 does not divide the world of 4 workers");
}

// Without a size, each host's ranks, hosts in the order of their lowest rank.
TEST(ShardGroupOfRanksTest, EachHostsRanksWithoutASize) {
  auto groups = ShardGroupOfRanks({"tcp://b:1", "tcp://a:1", "tcp://b:2", "tcp://a:2"}, 0);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, (std::vector<int>{0, 1, 0, 1}));
}

TEST(ShardGroupOfRanksTest, HostsOfDifferentSizesAreRefused) {
  auto groups = ShardGroupOfRanks({"tcp://a:1", "tcp://a:2", "tcp://b:1"}, 0);
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.status().message().find("host b has 1 workers and the first has 2"),
            std::string::npos)
      << groups.status();
}

}  // namespace
}  // namespace tessera::worker
