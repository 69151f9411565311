#include "worker/torch/block_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

namespace tessera::worker {
namespace {

size_t PageRounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

BlockCache::~BlockCache() { UnmapKept(); }

StatusOr<void*> BlockCache::Acquire(size_t bytes) {
  if (bytes == 0) return InvalidArgumentError("block cache: a block of 0 bytes");
  const size_t rounded = PageRounded(bytes);
  std::list<Block> room;
  Block trimmed, grown;  // a kept block cut to this size, or one grown to it
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [first, last] = kept_by_size_.equal_range(rounded);
    if (first != last) {
      auto newest = std::prev(last);  // the most recently kept: its pages the warmest
      void* data = newest->second->data;
      kept_.erase(newest->second);
      kept_by_size_.erase(newest);
      acquired_.emplace(data, rounded);
      stats_.kept_bytes -= rounded;
      stats_.peak_acquired_bytes = std::max(stats_.peak_acquired_bytes,
                                            stats_.mapped_bytes - stats_.kept_bytes);
      ++stats_.hits;
      return data;
    }
    // No kept block of this size: the smallest larger one is cut to it, its head's pages
    // resident already (a step's sizes differ a little from unit to unit: parameters'
    // gradients, activations; a cache that only matched sizes mapped fresh pages every step).
    auto larger = kept_by_size_.upper_bound(rounded);
    if (larger != kept_by_size_.end()) {
      trimmed = *larger->second;
      kept_.erase(larger->second);
      kept_by_size_.erase(larger);
      stats_.kept_bytes -= trimmed.bytes;
      stats_.mapped_bytes -= trimmed.bytes - rounded;
      acquired_.emplace(trimmed.data, rounded);
      stats_.peak_acquired_bytes = std::max(stats_.peak_acquired_bytes,
                                            stats_.mapped_bytes - stats_.kept_bytes);
      ++stats_.trimmed;
    } else {
      if (!kept_by_size_.empty()) {
        // Only smaller ones: the largest grows to this size (mremap keeps its pages).
        auto smaller = std::prev(kept_by_size_.end());
        grown = *smaller->second;
        kept_.erase(smaller->second);
        kept_by_size_.erase(smaller);
        stats_.kept_bytes -= grown.bytes;
        stats_.mapped_bytes -= grown.bytes;  // counted again, grown, below
      }
      // Kept blocks stay while the bytes mapped, with this request, fit in the most ever
      // acquired at once (this request counted in): the rest go, the least recently kept
      // first.
      const size_t acquired = stats_.mapped_bytes - stats_.kept_bytes;
      stats_.peak_acquired_bytes = std::max(stats_.peak_acquired_bytes, acquired + rounded);
      const size_t budget = stats_.peak_acquired_bytes - acquired - rounded;
      room = TakeForRoom(stats_.kept_bytes > budget ? stats_.kept_bytes - budget : 0);
      ++stats_.misses;
      stats_.unmapped += room.size();
    }
  }
  if (trimmed.data != nullptr) {
    munmap(static_cast<char*>(trimmed.data) + rounded, trimmed.bytes - rounded);
    return trimmed.data;
  }
  Unmap(room);
  void* data = MAP_FAILED;
  if (grown.data != nullptr) {
    data = mremap(grown.data, grown.bytes, rounded, MREMAP_MAYMOVE);
    if (data == MAP_FAILED) munmap(grown.data, grown.bytes);
  }
  if (data == MAP_FAILED) {
    data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (data == MAP_FAILED) {
    return ResourceExhaustedError("block cache: mapping a block of " + std::to_string(rounded) +
                                  " bytes: " + std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(mu_);
  acquired_.emplace(data, rounded);
  stats_.mapped_bytes += rounded;
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.mapped_bytes);
  return data;
}

bool BlockCache::Release(void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = acquired_.find(data);
  if (found == acquired_.end()) return false;
  const size_t bytes = found->second;
  acquired_.erase(found);
  auto at = kept_.insert(kept_.end(), Block{data, bytes});
  kept_by_size_.emplace(bytes, at);
  stats_.kept_bytes += bytes;
  return true;
}

void BlockCache::UnmapKept() {
  std::list<Block> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = TakeForRoom(stats_.kept_bytes);
  }
  Unmap(all);
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::list<BlockCache::Block> BlockCache::TakeForRoom(size_t bytes) {
  std::list<Block> taken;
  size_t found = 0;
  while (found < bytes && !kept_.empty()) {
    const size_t size = kept_.front().bytes;
    auto [first, last] = kept_by_size_.equal_range(size);
    for (auto it = first; it != last; ++it) {
      if (it->second == kept_.begin()) {
        kept_by_size_.erase(it);
        break;
      }
    }
    taken.splice(taken.end(), kept_, kept_.begin());
    found += size;
    stats_.kept_bytes -= size;
    stats_.mapped_bytes -= size;
  }
  return taken;
}

void BlockCache::Unmap(const std::list<Block>& blocks) {
  for (const Block& block : blocks) munmap(block.data, block.bytes);
}

}  // namespace tessera::worker
