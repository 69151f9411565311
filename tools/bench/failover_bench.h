// tessera-bench failover [--rounds 10] [--servers 3] [--workers 3] [--replicas 2]
//                        [--no-hang] [--json] [--timeout-s 300]
//
// failover: how long a ps-sync job with replicated key ranges (tessera-launch --replicas R)
// stops when a server dies: the time from the server's death to the first training step that
// completes after it (worker 0's first step line after its "server N failed" line), over
// --rounds deaths, each in a fresh fleet (servers killed in turn), p50 and max, with the time
// the death took to be noticed (to that failed line). Two kinds of death:
//   kill  SIGKILL: the process is gone, which the coordinator on its host sees at once (its
//         check of local members' processes; a closed connection stands for it across hosts).
//         Goal: under 1 s.
//   hang  SIGSTOP: the process stops answering and nothing closes; only the heartbeat timeout
//         (the default, --heartbeat-timeout-ms 10000) finds it. Goal: under 5 s. --no-hang
//         skips it (each round waits out the timeout).
// Figures are stated as ratios to their goals (< 1 meets it); the step time before the death
// is printed beside them.
#ifndef TESSERA_TOOLS_BENCH_FAILOVER_BENCH_H_
#define TESSERA_TOOLS_BENCH_FAILOVER_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `failover` subcommand to `parent`.
BenchCommand AddFailoverBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_FAILOVER_BENCH_H_
