// tessera-bench memory [--np 1,2,4] [--stages 0,1,2,3,hsdp] [--shard-group-size N]
//                      [--hidden 1024,1024] [--steps 3] [--json] [--timeout-s 600]
//
// memory: the model-state bytes each rank holds in ZeRO stages 0-3 (stage 0 = --mode
// allreduce) with Adam in float32, measured by the engines themselves
// (tessera_model_state_bytes and _peak_bytes, reported in each worker's --json summary after a
// few real training steps under tessera-launch), next to ZeRO's formulas for Ψ parameters and
// N ranks:
//   stage 0: 4Ψ + 4Ψ + 8Ψ          stage 2: 4Ψ + (4Ψ + 8Ψ)/N
//   stage 1: 4Ψ + 4Ψ + 8Ψ/N        stage 3: (4Ψ + 4Ψ + 8Ψ)/N
// "held" is what a rank keeps between steps (the largest over the ranks), compared with the
// formula; "peak" adds what a step holds for a while: stage 3's gathered layer blocks (the one
// computing and the prefetched one) and the gradient blocks awaiting their reduce-scatter.
// --stages hsdp measures --mode hsdp (issue 44): stage 3's formula with N its shard group's
// size (--shard-group-size, or the world on this one host).
#ifndef TESSERA_TOOLS_BENCH_MEMORY_BENCH_H_
#define TESSERA_TOOLS_BENCH_MEMORY_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `memory` subcommand to `parent`.
BenchCommand AddMemoryBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_MEMORY_BENCH_H_
