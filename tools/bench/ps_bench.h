//   tessera-bench ps [--configs 1x1,2x2] [--sizes 4K,64K,1M,16M,64M] [--warmup 3]
//                    [--iters 0 | --seconds 1] [--chunk-elements 65536] [--python-bytes 16M]
//                    [--mlp-steps 40] [--replicas 1 [--replica-pairs 3] [--replica-mode
//                    ps-sync] [--replica-paths shm,sockets]] [--no-zmq] [--no-python] [--json]
//                    [--timeout-s 600]
//
// ps: parameter-server push+pull throughput on the loopback, beside its limit in the same run.
// For each servers x workers configuration (--configs, "SxW"):
//   - tessera: `tessera-launch --servers S --workers W --mode bench-ps
//     --ps-shared-memory=false` (worker/jobs/ps_bench_job.h): every worker times PsEngine
//     steps, each pushing a gradient of each size to the servers and pulling the parameters
//     back over the transport's sockets (ps-async, so each worker measures its own throughput
//     while the others load the servers);
//   - shm: the same with the default --ps-shared-memory=true: the servers, on the workers'
//     host, take the gradients from and put the values into memory shared with each worker;
//   - replicated (--replicas R > 1, configs with S >= R): `--replicas R` beside one copy, in
//     --replica-mode, in alternated pairs of runs, on each of --replica-paths: shm (the
//     default path; the primaries' forwards name the chunks in the workers' regions) and
//     sockets (every byte, the forwards' too, through the kernel, as between hosts);
//   - zmq: the same exchange in raw ZeroMQ (tools/bench/ps_zmq_limit.cc): S echo processes
//     and W client processes, the same chunks and requests per step, no header, no checks, no
//     optimizer, zero-copy sends: the limit.
// Per worker: GB/s = (bytes pushed + bytes pulled) / median step time, and requests/s;
// aggregate: the sum over the workers. Ratios = tessera / zmq and shm / zmq.
// The Python path (tools/bench/torch_ps_bench.py, on a fleet of 1 server it starts): the same
// push+pull of a --python-bytes model through tessera.torch.ParameterServerOptimizer (its
// default, shared memory), beside the C++ shm figure of 1x1 (what the binding costs), and the
// 784-1024-1024-10 MLP at batch 64 trained with ParameterServerOptimizer in ps-sync (1 worker,
// 1 server) beside the same model trained alone with torch.optim.SGD (step time ratio).
// The table ends with the goals: 16 MiB 1x1 over the sockets at >= 70% of raw ZeroMQ;
// on the default path (shared memory) >= 2x ps-lite (ps-lite's 1.09 GB/s per worker at 16 MiB
// 1x1, as the issue measured it: not this run; the sockets' ratio is printed beside it); from Python >= 90% of C++ at 16 MiB; the MLP in ps-sync within 1.5x of alone; with --replicas,
// the push+pull time with R copies at most 1.5x that with one at 16 MiB on the default path
// (the sockets' figures beside it).
#ifndef TESSERA_TOOLS_BENCH_PS_BENCH_H_
#define TESSERA_TOOLS_BENCH_PS_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `ps` subcommand to `parent`.
BenchCommand AddPsBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_PS_BENCH_H_
