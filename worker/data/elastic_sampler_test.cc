#include "worker/data/elastic_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "worker/data/distributed_sampler.h"

namespace tessera::worker::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ElasticSampler MakeSampler(int64_t n, bool shuffle, uint64_t seed, uint64_t epoch) {
  ElasticSamplerOptions options;
  options.num_samples = n;
  options.shuffle = shuffle;
  options.seed = seed;
  auto sampler = ElasticSampler::Create(options, epoch);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *sampler;
}

// Runs `steps` steps of `batch` samples per rank in a world of `world`: each rank reads the
// next `batch` of its Indices(), as a trainer would; every read is counted in `seen`.
void RunSteps(ElasticSampler& sampler, int64_t steps, int64_t world, int64_t batch,
              std::map<size_t, int>& seen) {
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<size_t> mine = sampler.Indices(world, r);
    const auto want = static_cast<size_t>(steps * batch);
    for (size_t i = 0; i < mine.size() && i < want; ++i) ++seen[mine[i]];
  }
  ASSERT_TRUE(sampler.Consume(steps, world, batch).ok());
}

TEST(ElasticSamplerTest, RejectsNegativeSizeNamingTheField) {
  ElasticSamplerOptions options;
  options.num_samples = -1;
  auto sampler = ElasticSampler::Create(options, 0);
  ASSERT_FALSE(sampler.ok());
  EXPECT_THAT(sampler.status().message(), HasSubstr("num_samples=-1"));
  ElasticSampler ok = MakeSampler(10, false, 0, 3);
  Status bad = ok.Consume(1, 0, 2);
  EXPECT_THAT(bad.message(), HasSubstr("epoch=3"));
  EXPECT_THAT(bad.message(), HasSubstr("world_size=0"));
}

TEST(ElasticSamplerTest, InterleavesTheTailWithoutPadding) {
  ElasticSampler sampler = MakeSampler(10, /*shuffle=*/false, 0, 0);
  EXPECT_THAT(sampler.Indices(4, 0), ElementsAre(0, 4, 8));
  EXPECT_THAT(sampler.Indices(4, 3), ElementsAre(3, 7));
  ASSERT_TRUE(sampler.Consume(1, 4, 1).ok());  // positions 0..3 read
  EXPECT_EQ(sampler.cursor(), 4u);
  EXPECT_THAT(sampler.Indices(3, 0), ElementsAre(4, 7));
  EXPECT_THAT(sampler.Indices(3, 2), ElementsAre(6, 9));
  EXPECT_TRUE(sampler.Indices(3, 3).empty());  // rank outside the world
}

TEST(ElasticSamplerTest, MatchesDistributedSamplerUntilTheFirstChange) {
  // 96 samples over 4 ranks need no padding, so both samplers give each rank the same list.
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSamplerOptions options;
    options.num_samples = 96;
    options.world_size = 4;
    options.rank = r;
    options.seed = 11;
    auto fixed = DistributedSampler::Create(options);
    ASSERT_TRUE(fixed.ok());
    EXPECT_EQ(MakeSampler(96, true, 11, 5).Indices(4, r), fixed->Indices(5)) << "rank " << r;
  }
}

TEST(ElasticSamplerTest, EverySampleOnceAcrossALeaveAndAJoin) {
  for (bool shuffle : {false, true}) {
    for (int64_t n : {0, 1, 97, 100, 1000}) {
      ElasticSampler sampler = MakeSampler(n, shuffle, /*seed=*/42, /*epoch=*/1);
      std::map<size_t, int> seen;
      RunSteps(sampler, 3, /*world=*/4, /*batch=*/5, seen);  // 4 workers, 3 steps
      RunSteps(sampler, 4, /*world=*/3, /*batch=*/5, seen);  // one left
      RunSteps(sampler, 2, /*world=*/4, /*batch=*/5, seen);  // one joined
      // The rest of the epoch, to its end (uneven final step included).
      const int64_t rest = static_cast<int64_t>(sampler.remaining_count());
      RunSteps(sampler, rest, /*world=*/4, /*batch=*/1, seen);
      EXPECT_EQ(sampler.remaining_count(), 0u);
      ASSERT_EQ(seen.size(), static_cast<size_t>(n)) << "n=" << n << " shuffle=" << shuffle;
      for (const auto& [index, count] : seen) {
        EXPECT_EQ(count, 1) << "sample " << index << " n=" << n << " shuffle=" << shuffle;
        EXPECT_LT(index, static_cast<size_t>(n));
      }
    }
  }
}

TEST(ElasticSamplerTest, DeterministicForAHistoryOfChanges) {
  auto replay = [] {
    ElasticSampler sampler = MakeSampler(500, true, 9, 2);
    EXPECT_TRUE(sampler.Consume(7, 4, 8).ok());
    EXPECT_TRUE(sampler.Consume(2, 3, 8).ok());
    return sampler.Indices(5, 2);
  };
  EXPECT_EQ(replay(), replay());
  EXPECT_NE(replay(), MakeSampler(500, true, 9, 2).Indices(5, 2));
}

TEST(ElasticSamplerTest, HugeStepCountsClampAtTheEndOfTheEpoch) {
  ElasticSampler sampler = MakeSampler(10, false, 0, 0);
  ASSERT_TRUE(sampler.Consume(INT64_MAX, 1 << 20, 1 << 20).ok());
  EXPECT_EQ(sampler.cursor(), 10u);
  EXPECT_TRUE(sampler.Indices(2, 0).empty());
}

}  // namespace
}  // namespace tessera::worker::data
