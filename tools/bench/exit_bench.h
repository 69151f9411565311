// tessera-bench exit [--rounds 3] [--bin-dir DIR] [--json] [--timeout-s 120]
//
// exit: how long each binary takes to leave once its work is done (issue 22's goals), beside
// the floor a process costs here (/bin/true spawned and reaped the same way), in one run:
//   worker-local   tessera-worker --mode local --steps 5: its whole run (goal < 500 ms) and
//                  the time from its summary line to its exit (goal < 100 ms);
//   coordinator    SIGTERM to exit, once it has registered its fleet (goal < 100 ms);
//   server         SIGTERM to exit, while registered with a coordinator (goal < 100 ms);
//   launch-2x2     tessera-launch --servers 2 --workers 2 --mode ps-sync -- --steps 5: its
//                  whole run (goal < 2 s) and the time from its last worker's exit to its own
//                  (goal < 100 ms: the servers and the coordinator stopped meanwhile).
// Each figure is the median of --rounds runs and is stated as a ratio to its goal. --bin-dir
// times the binaries under DIR (e.g. another checkout's bazel-bin) instead of this build's.
#ifndef TESSERA_TOOLS_BENCH_EXIT_BENCH_H_
#define TESSERA_TOOLS_BENCH_EXIT_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `exit` subcommand to `parent`.
BenchCommand AddExitBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_EXIT_BENCH_H_
