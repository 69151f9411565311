// BlockCache: reuse by size, the bound on what stays mapped (never above the most acquired at
// once), and acquires and releases from several threads at once (for TSan).
#include "worker/torch/block_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::worker {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

void* MustAcquire(BlockCache& cache, size_t bytes) {
  StatusOr<void*> block = cache.Acquire(bytes);
  EXPECT_TRUE(block.ok()) << block.status();
  return block.ok() ? *block : nullptr;
}

TEST(BlockCacheTest, AFreedBlockServesTheNextRequestOfItsSize) {
  BlockCache cache;
  void* first = MustAcquire(cache, 3 * kPage + 1);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(cache.stats().mapped_bytes, 4 * kPage);  // whole pages
  std::memset(first, 7, 4 * kPage);                  // writable
  EXPECT_TRUE(cache.Release(first));
  EXPECT_EQ(cache.stats().kept_bytes, 4 * kPage);
  // Released twice, or never acquired: not the cache's.
  EXPECT_FALSE(cache.Release(first));
  int elsewhere = 0;
  EXPECT_FALSE(cache.Release(&elsewhere));
  // The same rounded size: the same memory, without a mapping.
  void* again = MustAcquire(cache, 4 * kPage);
  EXPECT_EQ(again, first);
  BlockCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.kept_bytes, 0u);
  EXPECT_EQ(stats.mapped_bytes, 4 * kPage);
  cache.Release(again);
}

TEST(BlockCacheTest, WhatStaysMappedNeverExceedsTheMostAcquiredAtOnce) {
  BlockCache cache;
  // A "step" that holds blocks of sizes 8, 5 and 3 pages at once (16 pages), then, later, of
  // 9 and 6 pages (15): a cache that kept everything would map 31 pages.
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> held;
    for (size_t pages : {8, 5, 3}) held.push_back(MustAcquire(cache, pages * kPage));
    for (void* block : held) cache.Release(block);
    held.clear();
    for (size_t pages : {9, 6}) held.push_back(MustAcquire(cache, pages * kPage));
    for (void* block : held) cache.Release(block);
    EXPECT_LE(cache.stats().peak_mapped_bytes, 16 * kPage) << "step " << step;
  }
  BlockCache::Stats stats = cache.stats();
  EXPECT_GT(stats.unmapped, 0u);
  EXPECT_EQ(stats.mapped_bytes, stats.kept_bytes);  // nothing acquired now
  cache.UnmapKept();
  EXPECT_EQ(cache.stats().mapped_bytes, 0u);
}

TEST(BlockCacheTest, AStepThatRepeatsItsSizesHitsEveryTimeAfterTheFirst) {
  BlockCache cache;
  const std::vector<size_t> sizes = {7 * kPage, 2 * kPage, 7 * kPage, 11 * kPage};
  for (int step = 0; step < 4; ++step) {
    std::vector<void*> held;
    for (size_t bytes : sizes) held.push_back(MustAcquire(cache, bytes));
    std::reverse(held.begin(), held.end());
    for (void* block : held) cache.Release(block);
  }
  BlockCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.misses, sizes.size());
  EXPECT_EQ(stats.hits, 3 * sizes.size());
  EXPECT_EQ(stats.unmapped, 0u);
}

TEST(BlockCacheTest, ALargerKeptBlockIsCutAndASmallerOneGrown) {
  BlockCache cache;
  void* big = MustAcquire(cache, 8 * kPage);
  std::memset(big, 1, 8 * kPage);
  cache.Release(big);
  // Cut: the same memory, its tail returned.
  void* cut = MustAcquire(cache, 3 * kPage);
  EXPECT_EQ(cut, big);
  BlockCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.trimmed, 1u);
  EXPECT_EQ(stats.mapped_bytes, 3 * kPage);
  EXPECT_EQ(static_cast<unsigned char*>(cut)[3 * kPage - 1], 1);  // the head's bytes kept
  cache.Release(cut);
  // Grown: the kept 3 pages become 6, their bytes kept, within the peak (8 pages).
  void* grown = MustAcquire(cache, 6 * kPage);
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(static_cast<unsigned char*>(grown)[0], 1);
  std::memset(grown, 2, 6 * kPage);  // all of it writable
  stats = cache.stats();
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.kept_bytes, 0u);
  EXPECT_EQ(stats.mapped_bytes, 6 * kPage);
  EXPECT_LE(stats.peak_mapped_bytes, 8 * kPage);
  cache.Release(grown);
}

TEST(BlockCacheTest, ZeroBytesIsRefused) {
  BlockCache cache;
  StatusOr<void*> block = cache.Acquire(0);
  ASSERT_FALSE(block.ok());
  EXPECT_NE(block.status().message().find("0 bytes"), std::string::npos);
}

// Both sides of the mutex at once: threads acquire, write and release blocks of a few sizes
// while others do the same; every block is a thread's alone while it holds it.
TEST(BlockCacheTest, ThreadsAcquireAndReleaseAtOnce) {
  BlockCache cache;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t bytes = static_cast<size_t>(1 + (i + t) % 3) * kPage;
        void* block = MustAcquire(cache, bytes);
        if (block == nullptr) return;
        auto* bytes_of = static_cast<unsigned char*>(block);
        std::memset(bytes_of, t + 1, bytes);
        for (size_t at = 0; at < bytes; at += kPage / 2) {
          ASSERT_EQ(bytes_of[at], static_cast<unsigned char>(t + 1));
        }
        EXPECT_TRUE(cache.Release(block));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  BlockCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits + stats.trimmed + stats.misses, 800u);
  EXPECT_LE(stats.peak_mapped_bytes, 4 * 3 * kPage);
}

}  // namespace
}  // namespace tessera::worker
