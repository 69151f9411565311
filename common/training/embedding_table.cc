#include "common/training/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace tessera {
namespace {

uint64_t Mix(uint64_t x) {  // SplitMix64's output function
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void InitializeEmbeddingRow(uint64_t seed, int64_t id, int64_t dim, float* out) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(dim));
  uint64_t state = Mix(seed ^ Mix(static_cast<uint64_t>(id)));
  for (int64_t j = 0; j < dim; ++j) {
    state = Mix(state);
    // 24 random bits -> [0, 1) exactly representable in float, then to [-bound, bound).
    float unit = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    out[j] = (2.0f * unit - 1.0f) * bound;
  }
}

EmbeddingTable::EmbeddingTable(EmbeddingTableSpec spec, const OptimizerOptions& optimizer)
    : spec_(std::move(spec)),
      optimizer_(optimizer),
      state_per_row_(StateFloatsPerElement(optimizer.kind) * static_cast<size_t>(spec_.dim)) {}

Status EmbeddingTable::CheckIds(const int64_t* ids, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= spec_.rows) {
      return InvalidArgumentError("embedding table '" + spec_.name + "': id " +
                                  std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                  " is outside [0, " + std::to_string(spec_.rows) + ")");
    }
  }
  return OkStatus();
}

size_t EmbeddingTable::SlotOf(int64_t id) {
  auto [it, inserted] = slots_.try_emplace(id, slots_.size());
  if (inserted) {
    const size_t dim = static_cast<size_t>(spec_.dim);
    values_.resize(values_.size() + dim);
    InitializeEmbeddingRow(spec_.init_seed, id, spec_.dim, values_.data() + it->second * dim);
    state_.resize(state_.size() + state_per_row_);
    InitOptimizerState(optimizer_, state_.data() + it->second * state_per_row_,
                       static_cast<size_t>(spec_.dim));
  }
  return it->second;
}

Status EmbeddingTable::Lookup(const int64_t* ids, size_t n, float* out) {
  RETURN_IF_ERROR(CheckIds(ids, n));
  const size_t dim = static_cast<size_t>(spec_.dim);
  for (size_t i = 0; i < n; ++i) {
    const size_t slot = SlotOf(ids[i]);  // may grow values_: take data() after it
    const float* row = values_.data() + slot * dim;
    std::copy(row, row + dim, out + i * dim);
  }
  return OkStatus();
}

void EmbeddingTable::Read(int64_t id, float* out) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    InitializeEmbeddingRow(spec_.init_seed, id, spec_.dim, out);
  } else {
    std::copy(values_.data() + it->second * dim, values_.data() + (it->second + 1) * dim, out);
  }
}

void EmbeddingTable::Export(std::vector<int64_t>* ids, std::vector<float>* values,
                            std::vector<float>* state) const {
  const size_t dim = static_cast<size_t>(spec_.dim);
  ids->clear();
  for (const auto& [id, slot] : slots_) ids->push_back(id);
  std::sort(ids->begin(), ids->end());
  values->clear();
  state->clear();
  for (int64_t id : *ids) {
    const size_t slot = slots_.at(id);
    values->insert(values->end(), values_.begin() + slot * dim, values_.begin() + (slot + 1) * dim);
    state->insert(state->end(), state_.begin() + slot * state_per_row_,
                  state_.begin() + (slot + 1) * state_per_row_);
  }
}

Status EmbeddingTable::Import(const std::vector<int64_t>& ids, const std::vector<float>& values,
                              const std::vector<float>& state) {
  const size_t dim = static_cast<size_t>(spec_.dim);
  if (values.size() != ids.size() * dim || state.size() != ids.size() * state_per_row_) {
    return InvalidArgumentError("embedding table '" + spec_.name + "': " +
                                std::to_string(ids.size()) + " rows with " +
                                std::to_string(values.size()) + " values and " +
                                std::to_string(state.size()) + " state floats do not fit rows of " +
                                std::to_string(dim));
  }
  RETURN_IF_ERROR(CheckIds(ids.data(), ids.size()));
  slots_.clear();
  values_ = values;
  state_ = state;
  for (size_t i = 0; i < ids.size(); ++i) slots_[ids[i]] = i;
  return OkStatus();
}

Status EmbeddingTable::ApplyGradients(float lr, int64_t step, const int64_t* ids,
                                      const float* grads, size_t n) {
  RETURN_IF_ERROR(CheckIds(ids, n));
  const size_t dim = static_cast<size_t>(spec_.dim);
  // Coalesce first (as SparseRowUpdate does), so each row is updated once with its summed
  // gradient; then one single-row SparseRowUpdate per row on the row's own storage.
  std::unordered_map<int64_t, size_t> position;
  distinct_.clear();
  summed_.clear();
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = position.try_emplace(ids[i], distinct_.size());
    if (inserted) {
      distinct_.push_back(ids[i]);
      summed_.insert(summed_.end(), grads + i * dim, grads + (i + 1) * dim);
    } else {
      float* sum = summed_.data() + it->second * dim;
      for (size_t j = 0; j < dim; ++j) sum[j] += grads[i * dim + j];
    }
  }
  const int64_t zero = 0;
  for (size_t r = 0; r < distinct_.size(); ++r) {
    const size_t slot = SlotOf(distinct_[r]);
    RETURN_IF_ERROR(SparseRowUpdate(optimizer_, lr, step, values_.data() + slot * dim, 1, dim,
                                    &zero, summed_.data() + r * dim, 1,
                                    state_.data() + slot * state_per_row_));
  }
  return OkStatus();
}

}  // namespace tessera
