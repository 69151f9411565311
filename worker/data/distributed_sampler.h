// DistributedSampler: which dataset indices each rank reads in an epoch, with the semantics of
// PyTorch 1.13's torch.utils.data.DistributedSampler.
//
//   DistributedSamplerOptions options;
//   options.num_samples = dataset.size();
//   options.world_size = 4;
//   options.rank = 1;
//   ASSIGN_OR_RETURN(DistributedSampler sampler, DistributedSampler::Create(options));
//   std::vector<size_t> mine = sampler.Indices(epoch);
//
// For an epoch:
//   1. indices = 0..N-1; if shuffle, permuted by Fisher-Yates driven by std::mt19937_64 seeded
//      with seed + epoch (both the engine and our shuffle are fully specified, so the order is
//      the same with every standard library; it is NOT bitwise equal to PyTorch's order).
//   2. if !drop_last, padded to total_size = ceil(N / W) * W by appending indices from the start
//      of the (shuffled) list, wrapping around as often as needed when N < W;
//      if drop_last, truncated to total_size = floor(N / W) * W.
//   3. rank r takes indices[r], indices[r + W], ... (indices[r : total_size : W]).
// Every rank therefore gets exactly per_rank_count() indices; all ranks together cover every
// index (padding repeats a few), and without padding the ranks are disjoint.
//
// Thread-safety: a DistributedSampler is immutable; Indices() may be called concurrently.
#ifndef TESSERA_WORKER_DATA_DISTRIBUTED_SAMPLER_H_
#define TESSERA_WORKER_DATA_DISTRIBUTED_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace tessera::worker::data {

struct DistributedSamplerOptions {
  int64_t num_samples = 0;  // N, the dataset size; >= 0
  int64_t world_size = 1;   // W; >= 1
  int64_t rank = 0;         // 0 <= rank < world_size
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Rejects invalid options with InvalidArgument naming the field and its value.
  static StatusOr<DistributedSampler> Create(const DistributedSamplerOptions& options);

  // This rank's indices for `epoch`, in the order to read them. Deterministic in
  // (options, epoch); with shuffle, different epochs give different orders.
  std::vector<size_t> Indices(uint64_t epoch) const;

  // How many indices every rank gets per epoch (PyTorch's `num_samples`).
  size_t per_rank_count() const { return per_rank_count_; }
  // per_rank_count() * world_size: the padded (or truncated) length of the epoch's list.
  size_t total_size() const { return per_rank_count_ * static_cast<size_t>(options_.world_size); }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  DistributedSampler(const DistributedSamplerOptions& options, size_t per_rank_count)
      : options_(options), per_rank_count_(per_rank_count) {}

  DistributedSamplerOptions options_;
  size_t per_rank_count_;
};

// Permutes 0..n-1 by Fisher-Yates with std::mt19937_64(seed): for i = n-1 down to 1, swap
// element i with element j drawn uniformly from [0, i] by rejection sampling on the engine's
// 64-bit outputs. Exposed for tests and for any other component that needs the same order.
std::vector<size_t> SeededPermutation(size_t n, uint64_t seed);

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_DISTRIBUTED_SAMPLER_H_
