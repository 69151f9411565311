//   tessera-bench train [--batch-size 64] [--optimizer sgd] [--hidden 1024,1024] [--steps 200]
//                       [--warmup-steps 20] [--threads N] [--repeats 3] [--json] [--no-torch]
//                       [--mode local|allreduce|zero1|zero2|zero3|hsdp] [--np 2]
//
// train: single-process training throughput (samples/s) of Tessera's `mlp` model on the CPU
// against PyTorch (Debian's python3-torch, CPU) training the same architecture with the same
// batch size, optimizer and thread count. Each side runs as a child process with the same
// environment (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE, and
// LD_LIBRARY_PATH on Debian's pthread OpenBLAS, so both load the same libopenblas; see
// shared/notes/peers.md): tessera-worker --mode local (the real training loop: Trainer, Mlp,
// CpuBackend, LocalEngine; the worker libraries are not visible to tools/, and a child process
// also sets OpenBLAS's thread count at load, as for the peer) and tools/bench/torch_mlp.py.
// Both train on a small pool of batches made before the clock starts (Tessera reads a TSRDATA1
// file of synthetic samples written here, so per step it only copies rows; generating
// synthetic samples is timed separately and reported, not counted), and both time only the
// steps after the warm-up: Tessera from the trainer's per-step progress lines, PyTorch with
// its own clock around the step loop.
//
// --mode allreduce adds np processes on each side: tessera-launch --mode allreduce against
// PyTorch DDP. --mode zero1|zero2|zero3|hsdp (issue 6, 44) measures Tessera alone: np processes of
// --mode allreduce against np of that ZeRO stage, alternating, on the same batch pool, model,
// optimizer (Adam unless --optimizer says otherwise), steps and threads; it reports ms/step,
// global samples/s, the per-rank model-state bytes held between steps and at the peak (from
// the workers' --json summaries), the ratios to allreduce, and whether the step-time goal
// holds (stages 1 and 2 within 10% of allreduce, stage 3 within 35%).
#ifndef TESSERA_TOOLS_BENCH_TRAIN_BENCH_H_
#define TESSERA_TOOLS_BENCH_TRAIN_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `train` subcommand to `parent`.
BenchCommand AddTrainBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TRAIN_BENCH_H_
