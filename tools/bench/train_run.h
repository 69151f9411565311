// One timed run of `tessera-bench train`'s Tessera side and the options of the whole
// benchmark: shared by train_bench.cc (Tessera vs PyTorch, --mode local|allreduce) and
// train_zero_bench.cc (a ZeRO stage vs --mode allreduce). Each run is a child process
// (tessera-worker, or tessera-launch with np > 1) reading a pool of batches written before the
// clock starts; only the steps after the warm-up are timed, from the trainer's per-step progress
// lines. Free functions, no shared state.
#ifndef TESSERA_TOOLS_BENCH_TRAIN_RUN_H_
#define TESSERA_TOOLS_BENCH_TRAIN_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace tessera::tools {

// Distinct batches each side cycles through, so both touch the same amount of data.
constexpr int64_t kBatchPool = 8;

struct TrainBenchOptions {
  std::vector<int64_t> batch_sizes;
  std::vector<std::string> optimizers;  // sgd | adam
  std::vector<int64_t> hidden;
  int64_t input_dim = 784;
  int64_t classes = 10;
  int64_t steps = 200;        // timed
  int64_t warmup_steps = 20;  // run first, not timed
  int threads = 1;
  int repeats = 3;
  bool json = false;
  bool no_torch = false;
  // "allreduce": also data parallel with np processes on each side (tessera-launch --mode
  // allreduce vs PyTorch DDP over gloo), batch_size per rank, beside the single-process runs.
  // "zero1" | "zero2" | "zero3": Tessera only, np processes of --mode allreduce against np of
  // that ZeRO stage (step time and model-state bytes), no single-process or PyTorch runs.
  // "hsdp" likewise (issue 44, item 4), with --shard-group-size passed on when not 0.
  std::string mode = "local";
  int np = 2;
  int shard_group_size = 0;
  // --nonfinite-check: --on-nonfinite error against off in local, allreduce and ps-sync
  // (train_nonfinite_bench.h) instead of the comparison with PyTorch.
  bool nonfinite_check = false;
  // A ring mode (the registry's: gradients reduced across ranks), and one of those that is
  // measured against the allreduce baseline.
  bool distributed() const;
  bool zero() const { return distributed() && mode != "allreduce"; }
};

// The kinds of model state the workers' summaries count ("model_state_bytes").
constexpr const char* kStateKinds[3] = {"parameters", "gradients", "optimizer_state"};

// One timed run of one side.
struct TrainRun {
  double samples_per_second = 0;
  double ms_per_step = 0;
  int64_t parameters = 0;
  // Per rank, the largest over the ranks, by kStateKinds: between steps and at the peak.
  double held_bytes[3] = {0, 0, 0}, peak_bytes[3] = {0, 0, 0};
  nlohmann::json report;  // the side's own summary (worker 0's with np > 1)
  double held_total() const { return held_bytes[0] + held_bytes[1] + held_bytes[2]; }
  double peak_total() const { return peak_bytes[0] + peak_bytes[1] + peak_bytes[2]; }
};

// The learning rate both sides use: 0.001 for adam, 0.01 for sgd.
double DefaultLr(const std::string& optimizer);

// `/usr/bin/env VAR=value ...`: the environment every child runs in, identical for both sides
// (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE, LD_LIBRARY_PATH on Debian's
// pthread OpenBLAS when present).
std::vector<std::string> ChildEnvironment(int threads);

// Writes kBatchPool batches of `batch` synthetic samples (times np when o.distributed(), each
// rank reading its 1/np) to `path` (TSRDATA1) and returns how long generating one batch took
// (what reading --dataset synthetic would add to every step).
StatusOr<double> WriteBatchPool(const TrainBenchOptions& o, int64_t batch,
                                const std::string& path);

// tessera-worker --mode local on the batch pool (`worker`), a progress line per step; the timed
// steps' rates are read back from those lines. With np > 1: `launch` --workers np --mode `mode`
// (allreduce, zero1, zero2, zero3, hsdp; ps-sync with one server), the rates read from worker 0's
// lines (every step is synchronous) times np, the model-state bytes the largest over the
// workers' summaries (every worker but a ps-* one must report them). `worker_args` go to
// every worker after the benchmark's own.
StatusOr<TrainRun> RunTessera(const std::string& worker, const std::string& launch,
                              const std::string& data_path, const TrainBenchOptions& o,
                              int64_t batch, const std::string& optimizer, int np,
                              const std::string& mode = "allreduce",
                              const std::vector<std::string>& worker_args = {});

// The median of one field over `runs` (not empty).
double MedianOf(const std::vector<TrainRun>& runs, double TrainRun::*field);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TRAIN_RUN_H_
