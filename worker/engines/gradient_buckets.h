// Gradient buckets: how the DDP engine groups a model's gradients into all-reduces.
//
// Like PyTorch DDP: parameters are taken in reverse layout order (backward produces the last
// layer's gradients first) and packed into buckets of at least `bucket_bytes` (the last bucket
// may be smaller); a parameter is never split. Because the layout is one flat buffer, each
// bucket is one contiguous range of it, so a bucket's all-reduce runs on the gradient buffer in
// place: this is also Horovod's tensor fusion (many small tensors, one operation).
//
// BucketTracker follows backward: GradientsReady reports ranges as they become final, and it
// says which buckets just became complete, so their all-reduce can start at once.
//
// Thread-safety: plain values; BucketTracker is used by one thread.
#ifndef TESSERA_WORKER_ENGINES_GRADIENT_BUCKETS_H_
#define TESSERA_WORKER_ENGINES_GRADIENT_BUCKETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/training/parameter_layout.h"

namespace tessera::worker {

struct GradientBucket {
  uint64_t offset = 0;  // first element in the flat gradient buffer
  uint64_t size = 0;    // elements
  std::string first, last;  // the parameters at its ends (for messages), in layout order
};

// Buckets in the order backward fills them (the last layers first). bucket_bytes 0: one bucket
// per parameter.
std::vector<GradientBucket> PlanGradientBuckets(const ParameterLayout& layout,
                                                uint64_t bucket_bytes);

class BucketTracker {
 public:
  explicit BucketTracker(const std::vector<GradientBucket>* buckets);
  // Forget everything reported (a new backward pass).
  void Reset();
  // Marks [offset, offset + size) final; returns the indices of buckets that became complete.
  std::vector<size_t> MarkReady(uint64_t offset, uint64_t size);
  bool started(size_t bucket) const { return started_[bucket]; }
  void set_started(size_t bucket) { started_[bucket] = true; }

 private:
  const std::vector<GradientBucket>* buckets_;
  std::vector<uint64_t> ready_;  // elements reported per bucket
  std::vector<bool> started_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_GRADIENT_BUCKETS_H_
