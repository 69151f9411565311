//   tessera-bench pipeline [--stages 2] [--micro-batches 4,8]
//                          [--schedules gpipe,1f1b,interleaved,zb-h1] [--dim 1024]
//                          [--layers 16] [--batch-size 256] [--steps 10] [--warmup-steps 2]
//                          [--threads 1] [--ring-transport auto] [--timeout-s 600]
//                          [--tp-dim 4096] [--tp-batch 128] [--no-tp] [--json]
//
// pipeline (issue 46): tessera.torch.pipelining's schedules on the tessera backend, each
// beside the formula of its bubble, beside one process and beside data parallelism on the
// same processes, in the same invocation. The ranks are `/usr/bin/python3
// tools/bench/torch_pipeline_bench.py` processes (its docstring has the model, the step and
// how each figure is taken):
//   - one process trains the whole model (--layers blocks of Linear(--dim, --dim) + ReLU) on
//     the global batch (--batch-size rows): the one-process reference;
//   - for each P of --stages, P processes: first DistributedDataParallel on the tessera
//     backend, each rank on batch / P (the data-parallel reference), then each schedule at
//     each M of --micro-batches, the model cut evenly into P stages (interleaved: 2 P, two
//     per rank, stage s on rank s mod P);
//   - per schedule, P and M: the step time (median over --steps timed steps of the slowest
//     rank's zero_grad, step and optimizer.step, after --warmup-steps and a barrier), samples/s
//     and its ratios to the references; the measured bubble, each rank's idle share
//     1 - busy / step length from the schedule's timeline of compute actions (F, B, I, W), the
//     median over the steps, averaged over the ranks, beside the schedule library's
//     bubble_fraction (from running the schedule with F = 1, B = 2; for GPipe and 1F1B that is
//     (P-1)/(M+P-1), printed too); the peak activation bytes per rank, measured with
//     saved_tensors_hooks over one untimed step (what autograd holds at once), beside the
//     micro-batches held at once (peak_held, measured and the library's).
// The table (or --json: one object per line, a config, then a row per schedule, P and M
// carrying schedule, stages (P), micro_batches, bubble_measured, bubble_formula,
// throughput_over_one_process, throughput_over_ddp, peak_activation_bytes, ...) ends with the
// goals of issue 46, each met or MISSED: GPipe's and 1F1B's measured bubble within 0.05 of the
// formula; ZB-H1's below 1F1B's at equal peak_held (the most micro-batches any rank holds:
// ZB-H1's ranks all hold P, 1F1B's rank r P - r). When P exceeds the machine's cores the
// output says so: the ranks then share cores, and neither bubble nor throughput is a
// pipeline's.
//
// Then (unless --no-tp) the tensor-parallel part, issue 46's "T = 2 at >= 0.8x the throughput
// of data parallel on the same two processes for a layer of 4096 x 4096": a Megatron pair
// (Linear(--tp-dim, --tp-dim) ColwiseParallel, ReLU, Linear(--tp-dim, --tp-dim)
// RowwiseParallel from tessera.torch.tensor_parallel), MSE loss, SGD momentum 0.9, a global
// batch of --tp-batch rows, trained by one process, by DDP on the tessera backend over 2
// processes (half the batch each) and by TP T = 2 over the same 2 (the whole batch each, the
// weights halved), timed as the schedules are. The row (--json kind "tensor_parallel") has
// TP's samples/s, throughput_over_ddp and throughput_over_one_process, and each one's loss on
// the whole batch after the timed steps; the goal is met when TP reaches 0.8x DDP and its loss
// is DDP's within a relative 1e-3 (a TP that computes something else cannot look fast).
//
// Every rank runs torch with --threads threads; they meet through a file store in a scratch
// directory. The package `tessera` is found as for `tessera-bench torch` (torch_python.h);
// when /usr/bin/python3 cannot import torch.distributed or tessera.torch the benchmark says so,
// prints "skipped" and exits 0.
#ifndef TESSERA_TOOLS_BENCH_PIPELINE_BENCH_H_
#define TESSERA_TOOLS_BENCH_PIPELINE_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `pipeline` subcommand to `parent`.
BenchCommand AddPipelineBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_PIPELINE_BENCH_H_
