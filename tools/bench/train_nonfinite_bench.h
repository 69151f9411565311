// `tessera-bench train --nonfinite-check` (issue 19): what --on-nonfinite error (the default:
// every gradient scanned for NaN and Inf before it is applied or sent) costs, against off (no
// scan), alternating on the same batch pool, model, optimizer, steps and threads, in --mode
// local, allreduce and ps-sync (np workers, one server).
#ifndef TESSERA_TOOLS_BENCH_TRAIN_NONFINITE_BENCH_H_
#define TESSERA_TOOLS_BENCH_TRAIN_NONFINITE_BENCH_H_

#include "common/base/status.h"
#include "tools/bench/train_run.h"

namespace tessera::tools {

// Prints, per mode and (batch, optimizer), the median ms/step with the check and without, their
// ratio, the time worker 0 spent in the check per step and its share of the step, and whether
// that share meets the goal (< 2%); with o.json, one JSON object on stdout.
Status RunTrainNonFiniteBench(const TrainBenchOptions& o);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TRAIN_NONFINITE_BENCH_H_
