//   tessera-bench torch [--np 2,4] [--ops all_reduce,all_gather,broadcast]
//                       [--sizes 4K,64K,1M,16M,64M] [--warmup 5] [--iters 0 | --seconds 1]
//                       [--models mlp,cnn] [--ddp-np 2] [--batch-size 64] [--steps 60]
//                       [--warmup-steps 10] [--repeats 3] [--threads 1]
//                       [--ring-transport auto] [--no-collectives] [--no-train] [--json]
//                       [--timeout-s 600]
//   tessera-bench torch --fsdp [--fsdp-np 2,4]
//                       [--strategies FULL_SHARD,SHARD_GRAD_OP,NO_SHARD,HYBRID_SHARD]
//                       [--fsdp-dim 768] [--fsdp-layers 12] [--fsdp-heads 12] [--fsdp-vocab 8192]
//                       [--fsdp-seq 128] [--batch-size 2] [--steps 5] [--warmup-steps 2]
//                       [--repeats 1] [--hybrid-hosts 2] [--hybrid-netns]
//                       [--memory-limit 0 | 1536M] [--memory-np 4] [--memory-dim 512] ...
//                       [--malloc-mmap-threshold 0] [--json]
//
// torch: the "tessera" torch.distributed backend (worker/torch/) against Gloo, from Python, as
// a PyTorch user meets them. Every rank is a `/usr/bin/python3 tools/bench/torch_dist_bench.py`
// process holding one group of each backend (dist.new_group(backend=...)), so the two are
// measured alternately in the same processes, with the same code and the same timing:
//   - collectives: all_reduce (sum), all_gather and broadcast of float32 tensors of each size
//     (bytes of each rank's tensor) among each --np processes; per iteration a barrier of the
//     backend's group, then one call timed with perf_counter; an iteration's time is the max
//     over the ranks, a size's the median over the iterations; the backends take turns per
//     (op, size), the first one alternating;
//   - DDP training: the 784-1024-1024-10 MLP and a small CNN (two 3x3 convolutions with
//     max-pooling, two linear layers; 1x28x28 input) at --batch-size per rank on synthetic data
//     with SGD, in DistributedDataParallel over each backend's group among each --ddp-np
//     processes, --repeats runs alternating the backends; samples/s of all ranks over the
//     slowest rank's time, median over the runs, with the busiest rank's CPU time per step;
//     after each pair of runs rank 0 alone trains the same model without DDP while the others
//     sleep (the single-process reference, on the same machine state), so the table shows
//     DDP's scaling.
// Figures are ratios: tessera's speedup = gloo's time / tessera's (samples/s: tessera's over
// gloo's). The table ends with the goals (all_reduce at least 5x Gloo at 4 KiB and 2x from
// 1 MiB, DDP at least 1.8x Gloo's samples/s at 2 processes), each met or missed.
//
// --fsdp (issue 44): tessera's FSDP beside DDP on tessera and on Gloo, on a GPT-like model;
// see torch_fsdp_bench.h.
//
// The ranks run torch with --threads threads (torch.set_num_threads, OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS; 1 by default: the ranks share the machine's cores) and meet through a
// file store in a scratch directory (no port is chosen). The package `tessera` comes from this
// binary's runfiles (//worker/torch/tessera/torch:package, built with it) or else from the
// interpreter's path (tools/install_python.sh). When /usr/bin/python3 cannot import
// torch.distributed or tessera.torch the benchmark says so, prints "skipped" and exits 0.
#ifndef TESSERA_TOOLS_BENCH_TORCH_BENCH_H_
#define TESSERA_TOOLS_BENCH_TORCH_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `torch` subcommand to `parent`.
BenchCommand AddTorchBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TORCH_BENCH_H_
