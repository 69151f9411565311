// `tessera-bench train --mode zero1|zero2|zero3|hsdp` (issue 6; hsdp: issue 44): Tessera
// alone, np processes of --mode allreduce against np of that ZeRO stage (or hsdp), alternating,
// on the same batch pool, model, optimizer, steps and threads.
#ifndef TESSERA_TOOLS_BENCH_TRAIN_ZERO_BENCH_H_
#define TESSERA_TOOLS_BENCH_TRAIN_ZERO_BENCH_H_

#include "common/base/status.h"
#include "tools/bench/train_run.h"

namespace tessera::tools {

// Runs the comparison for every (batch, optimizer) of `o` and prints, per mode, ms/step, global
// samples/s and the per-rank model-state bytes held and at the peak, then the ratios
// zero/allreduce and whether the step-time goal holds (stages 1 and 2 within 10% of
// allreduce, stage 3 within 35%); with o.json, the same as one JSON object on stdout.
// REQUIRES: o.zero().
Status RunTrainZeroBench(const TrainBenchOptions& o);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TRAIN_ZERO_BENCH_H_
