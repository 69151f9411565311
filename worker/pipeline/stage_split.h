// Stage splitting (issue 46, item 2): which contiguous layers of a model each pipeline stage
// runs.
//
//   ASSIGN_OR_RETURN(std::vector<int> begins, SplitStages(costs, /*stages=*/4, /*split=*/{}));
//   // stage s runs layers [begins[s], begins[s + 1]) (the last one up to costs.size())
//
// Without an explicit split, the stages are balanced by cost: of every way to cut the layers
// into `stages` non-empty contiguous runs, the one whose most expensive run costs least (ties:
// the earliest cuts). The caller says what a layer's cost is; the native mlp uses its
// multiply-adds per sample (in x out for a Linear, the width for an elementwise layer), which
// is also, for a Linear, its parameter count less the bias.
//
// An explicit split (--pipeline-split) lists where stages 1 .. stages-1 begin: strictly
// increasing layer indices in 1 .. layers-1.
//
// Thread-safety: a plain function.
#ifndef TESSERA_WORKER_PIPELINE_STAGE_SPLIT_H_
#define TESSERA_WORKER_PIPELINE_STAGE_SPLIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera::worker {

// The first layer of each stage (begins[0] == 0). InvalidArgument naming the numbers when
// there are fewer layers than stages, or a split that is not `stages - 1` strictly increasing
// indices in 1 .. layers-1.
StatusOr<std::vector<int>> SplitStages(const std::vector<int64_t>& layer_costs, int stages,
                                       const std::vector<int>& split);

// "2,5,7" -> {2, 5, 7}; InvalidArgument naming --pipeline-split and the item otherwise.
StatusOr<std::vector<int>> ParsePipelineSplit(const std::string& text);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_STAGE_SPLIT_H_
