#include "worker/pipeline/stage_split.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace tessera::worker {
namespace {

std::string Join(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out;
}

}  // namespace

StatusOr<std::vector<int>> SplitStages(const std::vector<int64_t>& layer_costs, int stages,
                                       const std::vector<int>& split) {
  const int layers = static_cast<int>(layer_costs.size());
  if (stages < 1) {
    return InvalidArgumentError("pipeline: " + std::to_string(stages) +
                                " stages; at least 1 is needed");
  }
  if (layers < stages) {
    return InvalidArgumentError("pipeline: the model has " + std::to_string(layers) +
                                " layers, fewer than the " + std::to_string(stages) +
                                " stages (pipeline stages x virtual stages) to split it into");
  }
  if (!split.empty()) {
    if (static_cast<int>(split.size()) != stages - 1) {
      return InvalidArgumentError("--pipeline-split " + Join(split) + " lists " +
                                  std::to_string(split.size()) + " stage starts; " +
                                  std::to_string(stages) + " stages need " +
                                  std::to_string(stages - 1));
    }
    std::vector<int> begins = {0};
    for (int at : split) {
      if (at <= begins.back() || at >= layers) {
        return InvalidArgumentError("--pipeline-split " + Join(split) + ": " +
                                    std::to_string(at) + " is not after the previous start (" +
                                    std::to_string(begins.back()) + ") and below the " +
                                    std::to_string(layers) + " layers");
      }
      begins.push_back(at);
    }
    return begins;
  }
  // best[s][i]: the least max cost of splitting layers [0, i) into s runs; cut[s][i] the
  // start of the last of them. O(stages x layers^2), for models of tens of layers.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> prefix(static_cast<size_t>(layers) + 1, 0);
  for (int i = 0; i < layers; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(layers + 1, kNone));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= layers; ++i) {
      for (int j = s - 1; j < i; ++j) {  // the last run is [j, i)
        if (best[s - 1][j] == kNone) continue;
        const int64_t cost = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (cost < best[s][i]) {
          best[s][i] = cost;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<int> begins(static_cast<size_t>(stages));
  for (int s = stages, i = layers; s >= 1; --s) {
    begins[s - 1] = cut[s][i];
    i = cut[s][i];
  }
  return begins;
}

StatusOr<std::vector<int>> ParsePipelineSplit(const std::string& text) {
  std::vector<int> values;
  if (text.empty()) return values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const int value = std::stoi(item, &used);
      if (used != item.size() || value < 0) throw std::invalid_argument(item);
      values.push_back(value);
    } catch (const std::exception&) {
      return InvalidArgumentError("--pipeline-split " + text + ": '" + item +
                                  "' is not a layer index (comma-separated, e.g. 2,4)");
    }
  }
  return values;
}

}  // namespace tessera::worker
