#include "worker/engines/gradient_buckets.h"

#include <algorithm>

namespace tessera::worker {

std::vector<GradientBucket> PlanGradientBuckets(const ParameterLayout& layout,
                                                uint64_t bucket_bytes) {
  std::vector<GradientBucket> buckets;
  const auto& views = layout.views();
  GradientBucket current;
  bool open = false;
  for (size_t i = views.size(); i-- > 0;) {
    const ParameterView& view = views[i];
    if (!open) {
      current = GradientBucket{view.offset, 0, view.name, view.name};
      open = true;
    }
    // Reverse order: the bucket grows downwards.
    current.offset = view.offset;
    current.size += view.size;
    current.first = view.name;
    if (current.size * sizeof(float) >= bucket_bytes) {
      buckets.push_back(current);
      open = false;
    }
  }
  if (open) buckets.push_back(current);
  return buckets;
}

BucketTracker::BucketTracker(const std::vector<GradientBucket>* buckets) : buckets_(buckets) {
  Reset();
}

void BucketTracker::Reset() {
  ready_.assign(buckets_->size(), 0);
  started_.assign(buckets_->size(), false);
}

std::vector<size_t> BucketTracker::MarkReady(uint64_t offset, uint64_t size) {
  std::vector<size_t> complete;
  const uint64_t end = offset + size;
  for (size_t b = 0; b < buckets_->size(); ++b) {
    const GradientBucket& bucket = (*buckets_)[b];
    const uint64_t lo = std::max(offset, bucket.offset);
    const uint64_t hi = std::min(end, bucket.offset + bucket.size);
    if (lo >= hi) continue;
    const bool was_complete = ready_[b] == bucket.size;
    ready_[b] = std::min(bucket.size, ready_[b] + (hi - lo));
    if (!was_complete && ready_[b] == bucket.size) complete.push_back(b);
  }
  return complete;
}

}  // namespace tessera::worker
