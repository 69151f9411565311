#include "worker/engines/layout_check.h"

#include <cstring>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

uint64_t TensorHash(const ParameterView& view) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&hash](uint64_t part) { hash = (hash ^ part) * 0x100000001b3ULL; };
  for (unsigned char c : view.name) mix(c);
  for (int64_t d : view.shape) mix(static_cast<uint64_t>(d));
  return hash;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

Status CheckLayoutsMatch(Collectives* collectives, const ParameterLayout& layout, uint64_t tag) {
  const int world = collectives->world_size();
  const int rank = collectives->rank();
  // Phase 1: [tensor count, total size (4), layout fingerprint (4)] from every rank.
  constexpr size_t kSummary = 9;
  std::vector<float> mine(kSummary), all(kSummary * static_cast<size_t>(world));
  const auto& views = layout.views();
  mine[0] = static_cast<float>(views.size());
  Put64(layout.total_size(), &mine[1]);
  Put64(layout.Fingerprint(), &mine[5]);
  std::memcpy(all.data() + kSummary * static_cast<size_t>(rank), mine.data(),
              kSummary * sizeof(float));
  RETURN_IF_ERROR(collectives
                      ->AllGather(all.data() + kSummary * static_cast<size_t>(rank), all.data(),
                                  all.size(), DataType::kFloat32, "parameter fingerprint", tag)
                      .WithContext("comparing the ranks' parameters"));
  bool differ = false;
  for (int q = 0; q < world; ++q) {
    const float* theirs = all.data() + kSummary * static_cast<size_t>(q);
    if (theirs[0] != mine[0]) {
      return FailedPreconditionError(
          "rank " + std::to_string(q) + " has " + std::to_string(static_cast<int64_t>(theirs[0])) +
          " parameter tensors to all-reduce; rank " + std::to_string(rank) + " has " +
          std::to_string(views.size()) + " (the ranks must build the same model)");
    }
    if (Get64(theirs + 5) != Get64(&mine[5]) || Get64(theirs + 1) != Get64(&mine[1])) differ = true;
  }
  if (!differ) return OkStatus();
  // Phase 2 (every rank saw the same gathered data, so all get here): per-tensor hashes.
  const size_t per = 4 * views.size();
  std::vector<float> tensors(per * static_cast<size_t>(world));
  for (size_t i = 0; i < views.size(); ++i) {
    Put64(TensorHash(views[i]), tensors.data() + per * static_cast<size_t>(rank) + 4 * i);
  }
  RETURN_IF_ERROR(collectives->AllGather(tensors.data() + per * static_cast<size_t>(rank),
                                         tensors.data(), tensors.size(), DataType::kFloat32,
                                         "tensor fingerprints", tag + 1));
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < views.size(); ++i) {
      if (Get64(tensors.data() + per * static_cast<size_t>(q) + 4 * i) != TensorHash(views[i])) {
        return FailedPreconditionError(
            "rank " + std::to_string(q) + "'s tensor #" + std::to_string(i) +
            " differs from rank " + std::to_string(rank) + "'s '" + views[i].name + "' " +
            Shape(views[i].shape) + " (name or shape): the ranks must build the same model");
      }
    }
  }
  return FailedPreconditionError("the ranks' parameter layouts differ in order or size");
}

}  // namespace tessera::worker
