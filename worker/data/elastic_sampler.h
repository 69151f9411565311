// ElasticSampler: the indices each rank reads in an epoch whose world changes size mid-epoch
// (issue 47, item 4), re-partitioning the samples not yet read over the new world.
//
//   ElasticSamplerOptions options;
//   options.num_samples = dataset.size();
//   options.seed = 7;
//   ASSIGN_OR_RETURN(ElasticSampler sampler, ElasticSampler::Create(options, /*epoch=*/0));
//   std::vector<size_t> mine = sampler.Indices(/*world_size=*/4, /*rank=*/1);
//   ... train 10 steps of 32 samples per rank, then a worker leaves ...
//   RETURN_IF_ERROR(sampler.Consume(/*steps=*/10, /*world_size=*/4, /*batch_per_rank=*/32));
//   mine = sampler.Indices(/*world_size=*/3, /*rank=*/1);
//
// Why a cursor is enough: like DistributedSampler, rank r of a world of W reads the remaining
// list interleaved (remaining[r], remaining[r + W], ...). After k steps of B samples per rank,
// every rank has read its first k*B entries, which are exactly positions [0, k*B*W) of the
// remaining list. So the samples still unread are remaining[k*B*W:], whatever W was, and a new
// world interleaves that tail. The epoch's order is SeededPermutation(N, seed + epoch) (the same
// as DistributedSampler's) or 0..N-1 without shuffle.
//
// Unlike DistributedSampler there is no padding: padding repeats samples, and a change of world
// would then count them twice. When the tail is not a multiple of W, ranks r < tail % W get one
// sample more. Deterministic in (options, epoch, the sequence of Consume calls).
//
// Thread-safety: const methods may run concurrently; Consume needs exclusive access.
#ifndef TESSERA_WORKER_DATA_ELASTIC_SAMPLER_H_
#define TESSERA_WORKER_DATA_ELASTIC_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace tessera::worker::data {

struct ElasticSamplerOptions {
  int64_t num_samples = 0;  // N, the dataset size; >= 0
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
};

class ElasticSampler {
 public:
  // Rejects invalid options with InvalidArgument naming the field and its value.
  static StatusOr<ElasticSampler> Create(const ElasticSamplerOptions& options, uint64_t epoch);

  // The unread samples of the epoch that `rank` of a world of `world_size` reads, in order:
  // remaining()[rank], remaining()[rank + world_size], ... Empty when the epoch is exhausted.
  // REQUIRES: 1 <= world_size, 0 <= rank < world_size (checked: an empty list otherwise).
  std::vector<size_t> Indices(int64_t world_size, int64_t rank) const;

  // Records that `steps` steps of `batch_per_rank` samples per rank ran in a world of
  // `world_size` since the last call: the cursor moves by steps * batch_per_rank * world_size
  // (stopping at the end of the epoch). Rejects non-positive sizes or negative steps.
  Status Consume(int64_t steps, int64_t world_size, int64_t batch_per_rank);

  // Position in the epoch's order of the first unread sample, in [0, N].
  size_t cursor() const { return cursor_; }
  size_t remaining_count() const { return order_.size() - cursor_; }
  uint64_t epoch() const { return epoch_; }

 private:
  ElasticSampler(std::vector<size_t> order, uint64_t epoch)
      : order_(std::move(order)), epoch_(epoch) {}

  std::vector<size_t> order_;  // the epoch's full order, length N
  uint64_t epoch_;
  size_t cursor_ = 0;
};

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_ELASTIC_SAMPLER_H_
