#include "worker/data/distributed_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace tessera::worker::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

DistributedSampler MakeSampler(int64_t n, int64_t world_size, int64_t rank, bool shuffle,
                               bool drop_last, uint64_t seed = 0) {
  DistributedSamplerOptions options;
  options.num_samples = n;
  options.world_size = world_size;
  options.rank = rank;
  options.shuffle = shuffle;
  options.drop_last = drop_last;
  options.seed = seed;
  auto sampler = DistributedSampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *sampler;
}

// Every rank's indices for one epoch, in rank order.
std::vector<std::vector<size_t>> AllRanks(int64_t n, int64_t world_size, bool shuffle,
                                          bool drop_last, uint64_t epoch, uint64_t seed = 0) {
  std::vector<std::vector<size_t>> ranks;
  for (int64_t r = 0; r < world_size; ++r) {
    ranks.push_back(MakeSampler(n, world_size, r, shuffle, drop_last, seed).Indices(epoch));
  }
  return ranks;
}

TEST(DistributedSamplerTest, RejectsInvalidOptionsNamingTheField) {
  DistributedSamplerOptions options;
  options.num_samples = 10;
  options.world_size = 0;
  auto bad_world = DistributedSampler::Create(options);
  EXPECT_EQ(bad_world.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_world.status().message(), HasSubstr("world_size=0"));

  options.world_size = 4;
  options.rank = 4;
  auto bad_rank = DistributedSampler::Create(options);
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("rank=4"));
  options.rank = -1;
  EXPECT_THAT(DistributedSampler::Create(options).status().message(), HasSubstr("rank=-1"));

  options.rank = 0;
  options.num_samples = -3;
  auto bad_n = DistributedSampler::Create(options);
  EXPECT_EQ(bad_n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_n.status().message(), HasSubstr("num_samples=-3"));
}

TEST(DistributedSamplerTest, NoShuffleMatchesPyTorchExactly) {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False):
  // padded list 0..9,0,1 -> rank 0: [0,3,6,9], rank 1: [1,4,7,0], rank 2: [2,5,8,1].
  auto ranks = AllRanks(10, 3, /*shuffle=*/false, /*drop_last=*/false, 0);
  EXPECT_THAT(ranks[0], ElementsAre(0, 3, 6, 9));
  EXPECT_THAT(ranks[1], ElementsAre(1, 4, 7, 0));
  EXPECT_THAT(ranks[2], ElementsAre(2, 5, 8, 1));
  // drop_last=True: truncated to 9 -> [0,3,6], [1,4,7], [2,5,8].
  auto dropped = AllRanks(10, 3, false, /*drop_last=*/true, 0);
  EXPECT_THAT(dropped[0], ElementsAre(0, 3, 6));
  EXPECT_THAT(dropped[1], ElementsAre(1, 4, 7));
  EXPECT_THAT(dropped[2], ElementsAre(2, 5, 8));
}

TEST(DistributedSamplerTest, PartitionForManySizesAndWorldSizes) {
  for (int64_t w : {1, 2, 3, 5, 8}) {
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100, 101}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " w=" + std::to_string(w) +
                       " shuffle=" + std::to_string(shuffle) +
                       " drop_last=" + std::to_string(drop_last));
          const size_t per_rank =
              drop_last ? static_cast<size_t>(n / w) : static_cast<size_t>((n + w - 1) / w);
          EXPECT_EQ(MakeSampler(n, w, 0, shuffle, drop_last).per_rank_count(), per_rank);
          EXPECT_EQ(MakeSampler(n, w, 0, shuffle, drop_last).total_size(), per_rank * w);

          std::vector<size_t> counts(static_cast<size_t>(n), 0);
          for (const auto& rank : AllRanks(n, w, shuffle, drop_last, /*epoch=*/3, /*seed=*/7)) {
            ASSERT_EQ(rank.size(), per_rank);
            for (size_t index : rank) {
              ASSERT_LT(index, static_cast<size_t>(n));
              ++counts[index];
            }
          }
          const size_t total = per_rank * static_cast<size_t>(w);
          if (!drop_last) {
            // Full coverage; the padding repeats each index at most ceil(total / n) times.
            for (size_t c : counts) {
              EXPECT_GE(c, 1u);
              EXPECT_LE(c, (total + n - 1) / n);
            }
          } else {
            // Truncation: each index at most once, exactly floor(n / w) * w of them.
            size_t seen = 0;
            for (size_t c : counts) {
              EXPECT_LE(c, 1u);
              seen += c;
            }
            EXPECT_EQ(seen, total);
          }
          if (n % w == 0) {
            // No padding and no truncation: a true partition.
            for (size_t c : counts) EXPECT_EQ(c, 1u);
          }
        }
      }
    }
  }
}

TEST(DistributedSamplerTest, FewerSamplesThanRanksWrapsThePadding) {
  // N = 2, W = 5: padded list is [0, 1, 0, 1, 0]; every rank gets one index.
  auto ranks = AllRanks(2, 5, false, false, 0);
  EXPECT_THAT(ranks[0], ElementsAre(0));
  EXPECT_THAT(ranks[1], ElementsAre(1));
  EXPECT_THAT(ranks[2], ElementsAre(0));
  EXPECT_THAT(ranks[3], ElementsAre(1));
  EXPECT_THAT(ranks[4], ElementsAre(0));
  // With drop_last nobody gets anything.
  for (const auto& rank : AllRanks(2, 5, true, true, 0)) EXPECT_TRUE(rank.empty());
}

TEST(DistributedSamplerTest, EmptyDatasetGivesEmptyEpochs) {
  for (bool drop_last : {false, true}) {
    auto sampler = MakeSampler(0, 3, 2, true, drop_last);
    EXPECT_EQ(sampler.per_rank_count(), 0u);
    EXPECT_TRUE(sampler.Indices(0).empty());
  }
}

TEST(DistributedSamplerTest, PaddingRepeatsTheStartOfTheShuffledList) {
  // N = 7, W = 4: total 8, the last slot (rank 3's second index) repeats shuffled[0],
  // which is rank 0's first index.
  auto ranks = AllRanks(7, 4, true, false, /*epoch=*/2, /*seed=*/11);
  const std::vector<size_t> shuffled = SeededPermutation(7, 11 + 2);
  EXPECT_EQ(ranks[3][1], shuffled[0]);
  EXPECT_EQ(ranks[0][0], shuffled[0]);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r][0], shuffled[r]);
}

TEST(DistributedSamplerTest, DeterministicPerSeedAndEpoch) {
  auto a = MakeSampler(1000, 4, 1, true, false, /*seed=*/42);
  auto b = MakeSampler(1000, 4, 1, true, false, /*seed=*/42);
  EXPECT_EQ(a.Indices(5), b.Indices(5));
  EXPECT_EQ(a.Indices(5), a.Indices(5));
  EXPECT_NE(a.Indices(5), a.Indices(6));
  auto other_seed = MakeSampler(1000, 4, 1, true, false, /*seed=*/43);
  EXPECT_NE(a.Indices(5), other_seed.Indices(5));
  // seed + epoch is what seeds the shuffle, as in PyTorch.
  EXPECT_EQ(a.Indices(6), other_seed.Indices(5));
}

TEST(DistributedSamplerTest, ShuffleIsAPermutationAndActuallyShuffles) {
  std::vector<size_t> order = SeededPermutation(1000, 123);
  std::vector<size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  size_t fixed_points = 0;
  for (size_t i = 0; i < order.size(); ++i) fixed_points += order[i] == i;
  EXPECT_LT(fixed_points, 10u);  // a random permutation has ~1 on average
  EXPECT_TRUE(SeededPermutation(0, 1).empty());
  EXPECT_THAT(SeededPermutation(1, 1), ElementsAre(0));
}

TEST(DistributedSamplerTest, PermutationIsPinnedAcrossStandardLibraries) {
  // mt19937_64 and our Fisher-Yates are fully specified: this order must never change, or
  // checkpoints resumed mid-epoch would read different samples.
  EXPECT_THAT(SeededPermutation(10, 0), ElementsAre(7, 2, 0, 8, 3, 9, 6, 1, 5, 4));
  EXPECT_THAT(SeededPermutation(10, 42), ElementsAre(1, 7, 9, 0, 3, 8, 4, 2, 5, 6));
}

}  // namespace
}  // namespace tessera::worker::data
