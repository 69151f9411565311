// BlockCache: large blocks of memory mapped on their own and, once freed, kept for the next
// request of the same size, as CUDA's caching allocators keep device memory. tessera.torch.fsdp
// puts it under torch's CPU tensors (module.cc adapts it to c10::Allocator), so that the
// unit-sized tensors FSDP gathers, autograd fills and FSDP frees, several times a step, reuse
// the same pages.
//
// Why: with glibc's malloc such tensors either land in the heap, which keeps every block it
// takes back and, in a step of many sizes, grows holes it cannot reuse (FULL_SHARD of a 91M
// GPT at 2 ranks held 1.7x the memory its tensors ever needed at once), or, under a low mmap
// threshold, are fresh pages each time (the step 1.4-1.75x slower in page faults).
//
//   BlockCache cache;
//   StatusOr<void*> block = cache.Acquire(28 << 20);  // mapped, or a kept one
//   ...
//   cache.Release(*block);  // kept for the next Acquire of its size
//
// Blocks are known by their address alone (Release finds the block), as torch's raw
// allocation interface needs.
//
// A request takes a kept block of its size (rounded up to whole pages); else the smallest
// larger kept block, its tail unmapped (the head's pages stay resident); else it maps pages:
// the largest kept block grown to its size (mremap: its pages kept), or a new block, first
// unmapping kept blocks (the least recently kept first) as far as needed for the bytes mapped
// to stay within the most that were ever acquired at once (this request counted in). So the
// cache costs nothing in peak memory, and in a loop that asks for about the same sizes every
// iteration (a training step) requests after the first iterations take resident pages,
// without a page fault.
//
// Thread-safety: thread-safe (one mutex; Acquire and Release hold it for a list operation, and
// mmap and munmap run outside it).
#ifndef TESSERA_WORKER_TORCH_BLOCK_CACHE_H_
#define TESSERA_WORKER_TORCH_BLOCK_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/base/status.h"

namespace tessera::worker {

class BlockCache {
 public:
  struct Stats {
    size_t mapped_bytes = 0;  // acquired and kept
    size_t kept_bytes = 0;    // kept for reuse
    size_t peak_mapped_bytes = 0;
    size_t peak_acquired_bytes = 0;  // the most acquired at once (requests being mapped too)
    uint64_t hits = 0;       // requests served by a kept block of their size
    uint64_t trimmed = 0;    // requests served by a larger kept block, cut to their size
    uint64_t misses = 0;     // requests that mapped pages (a new block, or a kept one grown)
    uint64_t unmapped = 0;   // kept blocks unmapped to make room
  };

  BlockCache() = default;
  // Unmaps the kept blocks; blocks still acquired must not be used after it.
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `bytes` (> 0) (whole pages: the request rounded up): a kept one of
  // that size, or a new mapping. ResourceExhausted naming the size when the kernel maps
  // nothing.
  StatusOr<void*> Acquire(size_t bytes);
  // Keeps the block at `data` (from Acquire) for a later request of its size; false, doing
  // nothing, when `data` is not an acquired block of this cache.
  bool Release(void* data);
  // Unmaps every kept block.
  void UnmapKept();
  Stats stats() const;

 private:
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;  // mapped
  };
  using Kept = std::list<Block>;  // oldest first

  // Takes kept blocks to unmap, oldest first, until `bytes` are found or none is left. mu_.
  std::list<Block> TakeForRoom(size_t bytes);
  static void Unmap(const std::list<Block>& blocks);

  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> acquired_;          // bytes by address; mu_
  Kept kept_;                                           // every kept block, oldest first; mu_
  std::multimap<size_t, Kept::iterator> kept_by_size_;  // into kept_; mu_
  Stats stats_;                                         // mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_BLOCK_CACHE_H_
