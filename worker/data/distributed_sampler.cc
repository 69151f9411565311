#include "worker/data/distributed_sampler.h"

#include <random>
#include <string>
#include <utility>

namespace tessera::worker::data {
namespace {

// A uniform draw from [0, bound] (inclusive). std::uniform_int_distribution's algorithm is
// unspecified, so two standard libraries could shuffle differently; this rejection sampler is
// ours: draw 64 bits, reject the top sliver that would bias the modulo.
uint64_t UniformInclusive(std::mt19937_64& engine, uint64_t bound) {
  if (bound == UINT64_MAX) return engine();
  const uint64_t range = bound + 1;
  // The largest multiple of `range` that fits, minus one: values above it are rejected.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % range + 1) % range;
  uint64_t draw;
  do {
    draw = engine();
  } while (draw > limit);
  return draw % range;
}

}  // namespace

std::vector<size_t> SeededPermutation(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 engine(seed);
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformInclusive(engine, i - 1));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

StatusOr<DistributedSampler> DistributedSampler::Create(const DistributedSamplerOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgumentError("distributed sampler: world_size=" +
                                std::to_string(options.world_size) + " must be >= 1");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError("distributed sampler: rank=" + std::to_string(options.rank) +
                                " must be in [0, world_size=" +
                                std::to_string(options.world_size) + ")");
  }
  if (options.num_samples < 0) {
    return InvalidArgumentError("distributed sampler: num_samples=" +
                                std::to_string(options.num_samples) + " must be >= 0");
  }
  const auto n = static_cast<uint64_t>(options.num_samples);
  const auto w = static_cast<uint64_t>(options.world_size);
  // PyTorch: drop_last and N % W != 0 -> ceil((N - W) / W) == floor(N / W); otherwise
  // ceil(N / W). When N % W == 0 both are N / W.
  const uint64_t per_rank = options.drop_last ? n / w : n / w + (n % w != 0 ? 1 : 0);
  return DistributedSampler(options, static_cast<size_t>(per_rank));
}

std::vector<size_t> DistributedSampler::Indices(uint64_t epoch) const {
  const auto n = static_cast<size_t>(options_.num_samples);
  const auto w = static_cast<size_t>(options_.world_size);
  const auto r = static_cast<size_t>(options_.rank);
  std::vector<size_t> order;
  if (options_.shuffle) {
    // Unsigned, so seed + epoch wraps modulo 2^64 rather than overflowing for huge seeds.
    order = SeededPermutation(n, options_.seed + epoch);
  } else {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }
  // Position p of the padded/truncated list is order[p % n]: the padding repeats the list from
  // its start, wrapping when N < W; truncation simply never reads past total_size.
  std::vector<size_t> mine;
  mine.reserve(per_rank_count_);
  for (size_t k = 0; k < per_rank_count_; ++k) {
    const size_t position = r + k * w;
    mine.push_back(order[position % n]);
  }
  return mine;
}

}  // namespace tessera::worker::data
