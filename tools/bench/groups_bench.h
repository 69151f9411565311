//   tessera-bench groups [--np 2,4] [--groups 16] [--concurrent-bytes 1M]
//                        [--concurrent-iters 20] [--repeats 3] [--latency-iters 2000]
//                        [--bandwidth-bytes 16M] [--bandwidth-iters 20] [--no-torch]
//                        [--no-p2p] [--json] [--timeout-s 300]
//
// groups: what a group of the communicator (worker/collectives/communicator.h) costs and
// gives, beside Gloo and the limits, in the same run (issue 50):
//   - new_group: per --np and backend (tessera, gloo), --np processes of
//     `/usr/bin/python3 tools/bench/torch_groups_bench.py` with a default group of that backend
//     only (a set of processes per backend, one after the other, so that the sockets and
//     threads counted are that backend's): after init and one all_reduce, --groups
//     dist.new_group()s of all ranks, each timed (the slowest rank's) and used by one
//     all_reduce; the listening TCP sockets, threads and resident KiB each group added (the
//     most any rank added, over --groups);
//   - concurrent groups: in the same processes, two of those groups all-reducing
//     --concurrent-bytes (float32) --concurrent-iters times each from two Python threads at
//     once, against one group doing both shares from one thread (concurrent / single time:
//     below 1 when the groups overlap, 2 when they serialise); median of --repeats pairs;
//   - point-to-point (point_to_point_bench.h; no torch): Communicator::Send / Recv between two
//     processes, latency of 8 B and bandwidth of --bandwidth-bytes by ping-pong, beside raw
//     ZeroMQ PAIR sockets and the shared-memory limit (a spun-on word for latency, one memcpy
//     for bandwidth) measured in the same run.
// Figures are ratios: tessera / gloo for new_group (lower is better: time, sockets, threads,
// KiB per group), concurrent / single per backend, and tessera / zmq, tessera / shm (latency)
// and tessera / zmq, tessera / memcpy (bandwidth: higher is better).
//
// The Python ranks run torch with one thread and meet through a file store in a scratch
// directory. When /usr/bin/python3 cannot import torch.distributed or tessera.torch (found as
// for `tessera-bench torch`: torch_python.h) the torch parts say so and are "skipped"; the
// point-to-point part still runs.
#ifndef TESSERA_TOOLS_BENCH_GROUPS_BENCH_H_
#define TESSERA_TOOLS_BENCH_GROUPS_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `groups` subcommand to `parent` (with the hidden flags of its point-to-point
// peers, which run this binary as their process).
BenchCommand AddGroupsBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_GROUPS_BENCH_H_
