// tessera-bench allreduce --np N [--sizes 4K,...,256M] [--seconds 0.5 | --iters K] [--warmup 3]
//                         [--segment-kb 1024] [--ring-transport auto|shm|links|zmq]
//                         [--ring-spin-us 200] [--json] [--no-mpi] [--no-mpi-shm] [--no-gloo]
//                         [--timeout-s 600] [--direct-read-min-bytes 3145728]
//                         [--one-shot-max-bytes 16384] [--no-ring-baseline]
//
// allreduce: like nccl-tests' all_reduce_perf, a table per buffer size of time, algbw
// (bytes / time) and busbw (algbw x 2(N-1)/N, what each rank's link carries in a ring) of a
// float32 sum all-reduce among N processes on this machine, for
//   - Tessera: `tessera-launch --workers N --mode bench-allreduce`: N real tessera-worker
//     processes join the coordinator and build the ring from the fleet view exactly as
//     --mode allreduce does (worker/jobs/allreduce_bench_job.h times RingCollectives::AllReduce),
//     over the channel --ring-transport picks (auto: shared memory here); rank 0 reports the
//     channel it uses, and the table's header names it; and again with
//     --direct-read-min-bytes 0 (column ring: the ring alone, no direct reads) unless that is
//     0 already or --no-ring-baseline;
//   - OpenMPI's MPI_Allreduce, twice: tools/bench/mpi_allreduce.c, compiled here with mpicc and
//     run with `mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,tcp -np N`
//     (mpi-tcp: loopback TCP, what the goals are stated against) and with
//     `--mca btl self,vader` (mpi-shm: OpenMPI's shared-memory transport, the fair peer of
//     Tessera's shm channel); skipped, saying why, when mpicc or mpirun is missing;
//   - Gloo: N `/usr/bin/python3 tools/bench/gloo_allreduce.py` processes, torch.distributed
//     with backend gloo over a TCP store on a free localhost port (skipped, saying why, when
//     torch cannot be imported);
// with the same timing on all three: a zeroed buffer, warm-up calls, then per timed iteration
// a barrier and one all-reduce; an iteration's time is the max over the ranks, a size's time
// the median over the iterations. The ratios are Tessera's busbw over each peer's (= the
// peer's time over Tessera's), one column per peer, and the goals are checked at the
// end against mpi-tcp, as the issue states them. Each system runs
// as child processes with a deadline (--timeout-s); a failing one is named in the error.
#ifndef TESSERA_TOOLS_BENCH_ALLREDUCE_BENCH_H_
#define TESSERA_TOOLS_BENCH_ALLREDUCE_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `allreduce` subcommand to `parent`.
BenchCommand AddAllReduceBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_ALLREDUCE_BENCH_H_
