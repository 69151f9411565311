#include "worker/data/elastic_sampler.h"

#include <string>
#include <utility>

#include "worker/data/distributed_sampler.h"

namespace tessera::worker::data {

StatusOr<ElasticSampler> ElasticSampler::Create(const ElasticSamplerOptions& options,
                                                uint64_t epoch) {
  if (options.num_samples < 0) {
    return InvalidArgumentError("elastic sampler: num_samples=" +
                                std::to_string(options.num_samples) + " must be >= 0");
  }
  const auto n = static_cast<size_t>(options.num_samples);
  std::vector<size_t> order;
  if (options.shuffle) {
    // The same order as DistributedSampler's, so a job that never changes its world reads the
    // same samples in the same order as before (only without the padding).
    order = SeededPermutation(n, options.seed + epoch);
  } else {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }
  return ElasticSampler(std::move(order), epoch);
}

std::vector<size_t> ElasticSampler::Indices(int64_t world_size, int64_t rank) const {
  std::vector<size_t> mine;
  if (world_size < 1 || rank < 0 || rank >= world_size) return mine;
  const auto w = static_cast<size_t>(world_size);
  for (size_t p = cursor_ + static_cast<size_t>(rank); p < order_.size(); p += w) {
    mine.push_back(order_[p]);
  }
  return mine;
}

Status ElasticSampler::Consume(int64_t steps, int64_t world_size, int64_t batch_per_rank) {
  if (steps < 0 || world_size < 1 || batch_per_rank < 1) {
    return InvalidArgumentError(
        "elastic sampler epoch=" + std::to_string(epoch_) + ": Consume(steps=" +
        std::to_string(steps) + ", world_size=" + std::to_string(world_size) +
        ", batch_per_rank=" + std::to_string(batch_per_rank) +
        ") needs steps >= 0, world_size >= 1, batch_per_rank >= 1");
  }
  // Compared by division so that a huge step count clamps at the end instead of wrapping.
  const size_t left = order_.size() - cursor_;
  const auto per_step = static_cast<size_t>(world_size) * static_cast<size_t>(batch_per_rank);
  const auto k = static_cast<size_t>(steps);
  if (per_step != 0 && k > left / per_step) {
    cursor_ = order_.size();
  } else {
    cursor_ += k * per_step;
  }
  return OkStatus();
}

}  // namespace tessera::worker::data
