#include "tools/bench/train_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/data/binary_dataset.h"
#include "worker/data/synthetic_classification.h"

namespace tessera::tools {
namespace {

constexpr char kTorchInstallHint[] = "apt-get install python3-torch libopenblas0-pthread";
// Debian's pthread OpenBLAS; first on the children's library path, so PyTorch's libblas.so.3 is
// OpenBLAS rather than the reference BLAS (and tessera-worker loads the same libopenblas).
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
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
  std::string mode = "local";
  int np = 2;
  bool zero() const { return mode.rfind("zero", 0) == 0; }
  bool distributed() const { return mode == "allreduce" || zero(); }
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

double DefaultLr(const std::string& optimizer) { return optimizer == "adam" ? 0.001 : 0.01; }

// `/usr/bin/env VAR=value ...`: the environment both sides run in, identical for both.
// OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP workers otherwise spin between parallel regions
// and take the cores OpenBLAS's own threads need (3-4x slower with 2 threads on 2 cores).
std::vector<std::string> ChildEnvironment(int threads) {
  std::vector<std::string> env = {"/usr/bin/env",
                                  "OPENBLAS_NUM_THREADS=" + std::to_string(threads),
                                  "OMP_NUM_THREADS=" + std::to_string(threads),
                                  "OMP_WAIT_POLICY=PASSIVE"};
  if (access(kOpenBlasPthreadDir, R_OK) == 0) {
    env.push_back(std::string("LD_LIBRARY_PATH=") + kOpenBlasPthreadDir);
  }
  return env;
}

// Fails with the install command when Debian's PyTorch cannot be imported.
Status CheckTorch() {
  const std::string hint = std::string("; install it with `") + kTorchInstallHint +
                           "` (as root), or pass --no-torch to measure Tessera alone";
  if (access(kPython, X_OK) != 0) {
    return FailedPreconditionError(std::string("PyTorch's side needs ") + kPython +
                                   ", which is missing" + hint);
  }
  StatusOr<ChildOutput> probe =
      RunToCompletion("python3 -c 'import torch.nn'", {kPython, "-c", "import torch.nn"});
  if (!probe.ok()) {
    return FailedPreconditionError(std::string(kPython) + " cannot import torch (" +
                                   probe.status().ToString() + ")" + hint);
  }
  return OkStatus();
}

// Writes kBatchPool batches of synthetic samples to `path` (TSRDATA1) and returns how long
// generating one batch took (what reading --dataset synthetic would add to every step).
StatusOr<double> WriteBatchPool(const TrainBenchOptions& o, int64_t batch,
                                const std::string& path) {
  worker::data::SyntheticClassificationOptions options;
  // Each of np ranks reads its 1/np of the file: kBatchPool batches each.
  options.num_samples = static_cast<size_t>(kBatchPool * batch * (o.distributed() ? o.np : 1));
  options.feature_dim = static_cast<size_t>(o.input_dim);
  options.num_classes = static_cast<size_t>(o.classes);
  ASSIGN_OR_RETURN(auto dataset, worker::data::SyntheticClassification::Create(options));
  std::vector<float> features(options.feature_dim);
  int64_t label = 0;
  auto start = Clock::now();
  for (size_t i = 0; i < options.num_samples; ++i) {
    RETURN_IF_ERROR(dataset->Get(i, features.data(), &label));
  }
  const double seconds = Seconds(Clock::now() - start);
  RETURN_IF_ERROR(worker::data::WriteBinaryDataset(*dataset, path));
  return 1000.0 * seconds * static_cast<double>(batch) / static_cast<double>(options.num_samples);
}

// tessera-worker --mode local on the batch pool, a progress line per step; the timed steps'
// rates are read back from those lines. With np > 1: tessera-launch --workers np --mode
// `mode` (allreduce, zero1, zero2, zero3), the rates read from worker 0's lines (every step is
// synchronous) times np, the model-state bytes the largest over the workers' summaries.
StatusOr<TrainRun> RunTessera(const std::string& worker, const std::string& launch,
                              const std::string& data_path, const TrainBenchOptions& o,
                              int64_t batch, const std::string& optimizer, int np,
                              const std::string& mode = "allreduce") {
  const int64_t total = o.warmup_steps + o.steps;
  std::vector<std::string> argv = ChildEnvironment(o.threads);
  if (np > 1) {
    for (const std::string& arg : {launch, std::string("--workers"), std::to_string(np),
                                   std::string("--mode"), mode, std::string("--")}) {
      argv.push_back(arg);
    }
  } else {
    argv.push_back(worker);
    argv.push_back("--mode=local");
  }
  for (const std::string& arg :
       {std::string("--model=mlp"),
        std::string("--dataset=file"), "--data-path=" + data_path,
        "--hidden=" + JoinInts(o.hidden, ","), "--batch-size=" + std::to_string(batch),
        "--steps=" + std::to_string(total), "--optimizer=" + optimizer,
        "--lr=" + std::to_string(DefaultLr(optimizer)), std::string("--device=cpu"),
        std::string("--seed=0"), std::string("--log-every=1"), std::string("--log-level=info"),
        std::string("--json")}) {
    argv.push_back(arg);
  }
  const std::string label =
      (np > 1 ? "tessera-launch --workers " + std::to_string(np) + " --mode " + mode
              : std::string("tessera-worker")) +
      " (batch " + std::to_string(batch) + ", " + optimizer + ")";
  ASSIGN_OR_RETURN(ChildOutput output, RunToCompletion(label, argv));
  TrainRun run;
  int reports = 0;  // summaries with model-state bytes ("[worker r] {...}" with np > 1)
  for (const std::string& line : output.stdout_lines) {
    const size_t start = line.find("{\"");
    if (start == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line.substr(start), nullptr, false);
    if (!j.is_object() || !j.contains("model_state_bytes")) continue;
    ++reports;
    const nlohmann::json& bytes = j["model_state_bytes"];
    for (int k = 0; k < 3; ++k) {
      run.held_bytes[k] = std::max(run.held_bytes[k], bytes["held"].value(kStateKinds[k], 0.0));
      run.peak_bytes[k] = std::max(run.peak_bytes[k], bytes["peak"].value(kStateKinds[k], 0.0));
    }
  }
  if (np > 1 && reports != np) {
    return DataLossError(label + ": " + std::to_string(reports) + " of " + std::to_string(np) +
                         " workers reported their model-state bytes");
  }
  if (np > 1) {  // worker 0's lines only, without the launcher's prefix
    const std::string prefix = "[worker 0] ";
    for (std::vector<std::string>* lines : {&output.stdout_lines, &output.stderr_lines}) {
      std::vector<std::string> kept;
      for (const std::string& line : *lines) {
        if (line.rfind(prefix, 0) == 0) kept.push_back(line.substr(prefix.size()));
      }
      *lines = std::move(kept);
    }
  }
  // "... I worker | step 21/220 loss 2.29 accuracy 0.11 samples/s 7578": the rate of one step,
  // timed by the trainer around data, forward/backward and the optimizer step.
  double seconds = 0;
  int64_t timed = 0;
  for (const std::string& line : output.stderr_lines) {
    const size_t at = line.find("| step ");
    const size_t rate_at = line.find(" samples/s ");
    if (at == std::string::npos || rate_at == std::string::npos) continue;
    const int64_t step = std::strtoll(line.c_str() + at + 7, nullptr, 10);
    const double rate = std::strtod(line.c_str() + rate_at + 11, nullptr);
    if (step <= o.warmup_steps) continue;
    if (!(rate > 0)) return DataLossError(label + ": bad progress line: " + line);
    seconds += static_cast<double>(batch) / rate;
    ++timed;
  }
  if (timed != o.steps) {
    return DataLossError(label + ": expected " + std::to_string(o.steps) +
                         " progress lines after the warm-up, read " + std::to_string(timed));
  }
  ASSIGN_OR_RETURN(nlohmann::json summary, LastJsonLine(label, output));
  run.samples_per_second = static_cast<double>(batch * o.steps * np) / seconds;
  run.ms_per_step = 1000.0 * seconds / static_cast<double>(o.steps);
  run.parameters = summary.value("parameters", int64_t{0});
  run.report = std::move(summary);
  return run;
}

// torch_mlp.py; with np > 1, np of them (ranks of a gloo process group on a free port,
// DistributedDataParallel), rank 0's report counting the samples of all ranks.
StatusOr<TrainRun> RunTorch(const std::string& script, const TrainBenchOptions& o, int64_t batch,
                            const std::string& optimizer, int np) {
  int port = 0;
  if (np > 1) {
    ASSIGN_OR_RETURN(port, FreePort());
  }
  std::vector<ChildSpec> children;
  for (int rank = 0; rank < np; ++rank) {
    std::vector<std::string> argv = ChildEnvironment(o.threads);
    for (const std::string& arg :
         {std::string(kPython), script, "--batch-size=" + std::to_string(batch),
          "--hidden=" + JoinInts(o.hidden, ","), "--input-dim=" + std::to_string(o.input_dim),
          "--classes=" + std::to_string(o.classes), "--optimizer=" + optimizer,
          "--lr=" + std::to_string(DefaultLr(optimizer)), "--steps=" + std::to_string(o.steps),
          "--warmup-steps=" + std::to_string(o.warmup_steps),
          "--threads=" + std::to_string(o.threads), "--pool=" + std::to_string(kBatchPool)}) {
      argv.push_back(arg);
    }
    if (np > 1) {
      for (const std::string& arg : {"--world=" + std::to_string(np),
                                     "--rank=" + std::to_string(rank),
                                     "--port=" + std::to_string(port)}) {
        argv.push_back(arg);
      }
    }
    children.push_back(
        {"torch_mlp.py (batch " + std::to_string(batch) + ", " + optimizer +
             (np > 1 ? ", DDP rank " + std::to_string(rank) + " of " + std::to_string(np) : "") +
             ")",
         std::move(argv)});
  }
  const std::string label = children[0].label;
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion(children, kChildTimeoutMillis));
  const ChildOutput& output = outputs[0];
  ASSIGN_OR_RETURN(nlohmann::json summary, LastJsonLine(label, output));
  TrainRun run;
  run.samples_per_second = summary.value("samples_per_second", 0.0);
  run.ms_per_step = summary.value("ms_per_step", 0.0);
  run.parameters = summary.value("parameters", int64_t{0});
  if (!(run.samples_per_second > 0)) return DataLossError(label + ": no samples_per_second");
  run.report = std::move(summary);
  return run;
}

// OpenBLAS 0.3.21 does not recognise some recent AVX-512 Xeons and falls back to a slow
// kernel unless OPENBLAS_CORETYPE says otherwise (shared/notes/peers.md). Both sides load the
// same library with the same environment, so a warning is all this needs.
void WarnOnGenericOpenBlasCore(const std::string& core) {
  if (core.empty()) return;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool avx512 = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      avx512 = line.find(" avx512f") != std::string::npos;
      break;
    }
  }
  if (avx512 && core != "SkylakeX" && core != "Cooperlake" && core != "SapphireRapids") {
    std::cerr << "warning: OpenBLAS chose its " << core << " kernels on an AVX-512 CPU; "
              << "both sides are slower than they could be. Set OPENBLAS_CORETYPE=SkylakeX.\n";
  }
}

struct TrainRow {
  int64_t batch = 0;
  std::string optimizer;
  std::vector<TrainRun> tessera, torch;
  std::vector<TrainRun> tessera_np, torch_np;  // --mode allreduce: np processes each
  double synthetic_ms_per_batch = 0;
};

Status MeasureRow(const std::string& worker, const std::string& launch,
                  const std::string& script, const std::string& data_path,
                  const TrainBenchOptions& o, TrainRow* row) {
  for (int r = 0; r < o.repeats; ++r) {
    for (int np : {1, o.distributed() ? o.np : 0}) {
      if (np == 0) continue;
      // Alternate which side goes first, so drift in the machine's load hits both alike.
      for (int side = 0; side < 2; ++side) {
        const bool tessera_turn = (side == 0) == (r % 2 == 0);
        if (!tessera_turn && o.no_torch) continue;
        if (!o.json) {
          std::cerr << "batch " << row->batch << " " << row->optimizer << ": "
                    << (tessera_turn ? "tessera" : "torch")
                    << (np > 1 ? " x" + std::to_string(np) : std::string()) << " run " << r + 1
                    << "/" << o.repeats << "\n";
        }
        if (tessera_turn) {
          ASSIGN_OR_RETURN(TrainRun run, RunTessera(worker, launch, data_path, o, row->batch,
                                                    row->optimizer, np));
          (np > 1 ? row->tessera_np : row->tessera).push_back(std::move(run));
        } else {
          ASSIGN_OR_RETURN(TrainRun run, RunTorch(script, o, row->batch, row->optimizer, np));
          (np > 1 ? row->torch_np : row->torch).push_back(std::move(run));
        }
      }
    }
  }
  if (!row->torch.empty() && row->torch[0].parameters != row->tessera[0].parameters) {
    return InternalError("the models differ: tessera has " +
                         std::to_string(row->tessera[0].parameters) + " parameters, torch " +
                         std::to_string(row->torch[0].parameters));
  }
  return OkStatus();
}

double MedianOf(const std::vector<TrainRun>& runs, double TrainRun::*field) {
  std::vector<double> values;
  for (const TrainRun& run : runs) values.push_back(run.*field);
  return Median(values);
}

// ZeRO's goals (issue 6): a stage's step time at most this many times --mode allreduce's.
double StepTimeGoal(const std::string& mode) { return mode == "zero3" ? 1.35 : 1.10; }

nlohmann::json StateBytesJson(const double (&bytes)[3]) {
  nlohmann::json j = {{"total", bytes[0] + bytes[1] + bytes[2]}};
  for (int k = 0; k < 3; ++k) j[kStateKinds[k]] = bytes[k];
  return j;
}

// --mode zero1|zero2|zero3: per (batch, optimizer) row, `repeats` runs of np workers in
// --mode allreduce and in the ZeRO mode, alternating which goes first; the medians of step
// time and rate, and the per-rank model-state bytes (the same every run: the first run's).
Status RunZeroBench(const TrainBenchOptions& o) {
  ASSIGN_OR_RETURN(std::string launch, FindRunfile("tools/tessera-launch"));
  ASSIGN_OR_RETURN(auto scratch, ScratchDirectory::Create());
  std::vector<int64_t> layers = {o.input_dim};
  layers.insert(layers.end(), o.hidden.begin(), o.hidden.end());
  layers.push_back(o.classes);
  const std::string modes[2] = {"allreduce", o.mode};
  struct ZeroRow {
    int64_t batch = 0;
    std::string optimizer;
    std::vector<TrainRun> runs[2];  // by modes[]
  };
  std::vector<ZeroRow> rows;
  for (int64_t batch : o.batch_sizes) {
    const std::string data_path = scratch->path() + "/pool-" + std::to_string(batch) + ".bin";
    RETURN_IF_ERROR(WriteBatchPool(o, batch, data_path).status());
    for (const std::string& optimizer : o.optimizers) {
      ZeroRow row;
      row.batch = batch;
      row.optimizer = optimizer;
      for (int r = 0; r < o.repeats; ++r) {
        for (int turn = 0; turn < 2; ++turn) {
          const int m = (turn + r) % 2;  // allreduce first on even repeats
          if (!o.json) {
            std::cerr << "batch " << batch << " " << optimizer << ": " << modes[m] << " x"
                      << o.np << " run " << r + 1 << "/" << o.repeats << "\n";
          }
          ASSIGN_OR_RETURN(TrainRun run, RunTessera("", launch, data_path, o, batch, optimizer,
                                                    o.np, modes[m]));
          row.runs[m].push_back(std::move(run));
        }
      }
      rows.push_back(std::move(row));
    }
  }
  const int64_t parameters = rows.front().runs[0].front().parameters;
  const double goal = StepTimeGoal(o.mode);
  if (!o.json) {
    std::cout << "train --mode " << o.mode << " vs --mode allreduce: mlp " << JoinInts(layers, "-")
              << " (" << parameters << " parameters) on the CPU, tessera-launch --workers "
              << o.np << ", " << o.threads << (o.threads == 1 ? " thread" : " threads")
              << " per worker\n"
              << o.steps << " timed steps after " << o.warmup_steps << " warm-up, median of "
              << o.repeats << (o.repeats == 1 ? " run" : " runs")
              << " per mode, alternating; batch per rank, samples/s global; model state per "
              << "rank (the largest over ranks), MB = 1e6 bytes\n"
              << "goal (issue 6): " << o.mode << " ms/step <= " << std::fixed
              << std::setprecision(2) << goal << " x allreduce's\n\n"
              << std::left << std::setw(7) << "batch" << std::setw(11) << "optimizer"
              << std::setw(11) << "mode" << std::right << std::setw(10) << "ms/step"
              << std::setw(12) << "samples/s" << std::setw(11) << "held MB" << std::setw(11)
              << "peak MB" << std::setw(8) << "time" << std::setw(8) << "held" << std::setw(8)
              << "peak" << std::setw(7) << "goal" << "\n";
  }
  nlohmann::json json_rows = nlohmann::json::array();
  for (const ZeroRow& row : rows) {
    double ms[2], rate[2];
    nlohmann::json j = {{"batch_size", row.batch},
                        {"optimizer", row.optimizer},
                        {"lr", DefaultLr(row.optimizer)}};
    for (int m = 0; m < 2; ++m) {
      // The rate from the median step time, so the two columns agree for even repeats too.
      ms[m] = MedianOf(row.runs[m], &TrainRun::ms_per_step);
      rate[m] = 1000.0 * static_cast<double>(row.batch * o.np) / ms[m];
      nlohmann::json runs = nlohmann::json::array();
      for (const TrainRun& run : row.runs[m]) runs.push_back(run.ms_per_step);
      j[modes[m]] = {{"ms_per_step", ms[m]},
                     {"samples_per_second", rate[m]},
                     {"runs_ms_per_step", runs},
                     {"model_state_bytes",
                      {{"held", StateBytesJson(row.runs[m].front().held_bytes)},
                       {"peak", StateBytesJson(row.runs[m].front().peak_bytes)}}}};
    }
    const TrainRun& base = row.runs[0].front();
    const TrainRun& zero = row.runs[1].front();
    const double time_ratio = ms[1] / ms[0];
    const double held_ratio = zero.held_total() / base.held_total();
    const double peak_ratio = zero.peak_total() / base.peak_total();
    const bool met = time_ratio <= goal;
    j["step_time_ratio"] = time_ratio;
    j["held_bytes_ratio"] = held_ratio;
    j["peak_bytes_ratio"] = peak_ratio;
    j["goal_step_time_ratio"] = goal;
    j["goal_met"] = met;
    json_rows.push_back(std::move(j));
    if (o.json) continue;
    for (int m = 0; m < 2; ++m) {
      const TrainRun& first = row.runs[m].front();
      std::cout << std::left << std::setw(7) << row.batch << std::setw(11) << row.optimizer
                << std::setw(11) << modes[m] << std::right << std::fixed << std::setprecision(2)
                << std::setw(10) << ms[m] << std::setprecision(0) << std::setw(12) << rate[m]
                << std::setprecision(2) << std::setw(11) << first.held_total() / 1e6
                << std::setw(11) << first.peak_total() / 1e6;
      if (m == 0) {
        std::cout << std::setw(8) << "1" << std::setw(8) << "1" << std::setw(8) << "1"
                  << std::setw(7) << "" << "\n";
      } else {
        std::cout << std::setw(8) << time_ratio << std::setw(8) << held_ratio << std::setw(8)
                  << peak_ratio << std::setw(7) << (met ? "met" : "NOT") << "\n";
      }
    }
  }
  if (o.json) {
    nlohmann::json j = {{"benchmark", "train"},
                        {"mode", o.mode},
                        {"np", o.np},
                        {"model", "mlp"},
                        {"layers", layers},
                        {"parameters", parameters},
                        {"threads", o.threads},
                        {"steps", o.steps},
                        {"warmup_steps", o.warmup_steps},
                        {"repeats", o.repeats},
                        {"batch_pool", kBatchPool},
                        {"rows", json_rows}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "\ntime, held, peak: " << o.mode << " / allreduce (ms/step; model-state "
              << "bytes per rank between steps and at the peak)\n";
  }
  return OkStatus();
}

Status RunTrainBench(const TrainBenchOptions& o) {
  if (o.zero()) return RunZeroBench(o);
  ASSIGN_OR_RETURN(std::string worker, FindRunfile("worker/tessera-worker"));
  std::string launch;
  if (o.distributed()) {
    ASSIGN_OR_RETURN(launch, FindRunfile("tools/tessera-launch"));
  }
  std::string script;
  if (!o.no_torch) {
    RETURN_IF_ERROR(CheckTorch());
    ASSIGN_OR_RETURN(script, FindRunfile("tools/bench/torch_mlp.py"));
  }
  ASSIGN_OR_RETURN(auto scratch, ScratchDirectory::Create());
  std::vector<int64_t> layers = {o.input_dim};
  layers.insert(layers.end(), o.hidden.begin(), o.hidden.end());
  layers.push_back(o.classes);

  std::vector<TrainRow> rows;
  for (int64_t batch : o.batch_sizes) {
    const std::string data_path = scratch->path() + "/pool-" + std::to_string(batch) + ".bin";
    ASSIGN_OR_RETURN(double synthetic_ms, WriteBatchPool(o, batch, data_path));
    for (const std::string& optimizer : o.optimizers) {
      TrainRow row;
      row.batch = batch;
      row.optimizer = optimizer;
      row.synthetic_ms_per_batch = synthetic_ms;
      RETURN_IF_ERROR(MeasureRow(worker, launch, script, data_path, o, &row));
      rows.push_back(std::move(row));
    }
  }

  const int64_t parameters = rows.front().tessera.front().parameters;
  std::string torch_version, openblas_core;
  if (!o.no_torch) {
    const nlohmann::json& report = rows.front().torch.front().report;
    torch_version = report.value("torch_version", "");
    openblas_core = report.value("openblas_core", "");
    WarnOnGenericOpenBlasCore(openblas_core);
  }
  nlohmann::json json_rows = nlohmann::json::array();
  if (!o.json) {
    std::cout << "train: mlp " << JoinInts(layers, "-") << " (" << parameters
              << " parameters, ReLU, softmax cross-entropy) on the CPU, " << o.threads
              << (o.threads == 1 ? " thread" : " threads") << ", " << o.steps
              << " timed steps after " << o.warmup_steps << " warm-up, median of " << o.repeats
              << (o.repeats == 1 ? " run" : " runs") << "\n"
              << (o.no_torch ? "" : "PyTorch " + torch_version + ", OpenBLAS core " +
                                        (openblas_core.empty() ? "?" : openblas_core) + "\n")
              << "\n"
              << std::left << std::setw(7) << "batch" << std::setw(11) << "optimizer"
              << std::right << std::setw(19) << "tessera samples/s" << std::setw(17)
              << "torch samples/s" << std::setw(15) << "tessera/torch" << std::setw(17)
              << "tessera ms/step" << std::setw(15) << "torch ms/step" << "\n";
  }
  for (const TrainRow& row : rows) {
    const double tessera_rate = MedianOf(row.tessera, &TrainRun::samples_per_second);
    const double tessera_ms = MedianOf(row.tessera, &TrainRun::ms_per_step);
    nlohmann::json tessera_runs = nlohmann::json::array(), torch_runs = nlohmann::json::array();
    for (const TrainRun& run : row.tessera) tessera_runs.push_back(run.samples_per_second);
    for (const TrainRun& run : row.torch) torch_runs.push_back(run.samples_per_second);
    nlohmann::json j = {{"batch_size", row.batch},
                        {"optimizer", row.optimizer},
                        {"lr", DefaultLr(row.optimizer)},
                        {"tessera_samples_per_second", tessera_rate},
                        {"tessera_ms_per_step", tessera_ms},
                        {"tessera_runs_samples_per_second", tessera_runs},
                        {"synthetic_data_ms_per_batch_untimed", row.synthetic_ms_per_batch}};
    double torch_rate = 0, torch_ms = 0;
    if (!row.torch.empty()) {
      torch_rate = MedianOf(row.torch, &TrainRun::samples_per_second);
      torch_ms = MedianOf(row.torch, &TrainRun::ms_per_step);
      j["torch_samples_per_second"] = torch_rate;
      j["torch_ms_per_step"] = torch_ms;
      j["torch_runs_samples_per_second"] = torch_runs;
      j["tessera_over_torch"] = tessera_rate / torch_rate;
    }
    if (o.distributed()) {
      j["np"] = o.np;
      j["tessera_allreduce_samples_per_second"] =
          MedianOf(row.tessera_np, &TrainRun::samples_per_second);
      j["tessera_allreduce_ms_per_step"] = MedianOf(row.tessera_np, &TrainRun::ms_per_step);
      if (!row.torch_np.empty()) {
        j["torch_ddp_samples_per_second"] = MedianOf(row.torch_np, &TrainRun::samples_per_second);
        j["torch_ddp_ms_per_step"] = MedianOf(row.torch_np, &TrainRun::ms_per_step);
        j["tessera_allreduce_over_torch_ddp"] =
            MedianOf(row.tessera_np, &TrainRun::samples_per_second) /
            MedianOf(row.torch_np, &TrainRun::samples_per_second);
      }
    }
    json_rows.push_back(std::move(j));
    if (!o.json) {
      std::cout << std::left << std::setw(7) << row.batch << std::setw(11) << row.optimizer
                << std::right << std::fixed << std::setprecision(0) << std::setw(19)
                << tessera_rate;
      if (row.torch.empty()) {
        std::cout << std::setw(17) << "-" << std::setw(15) << "-" << std::setprecision(2)
                  << std::setw(17) << tessera_ms << std::setw(15) << "-" << "\n";
      } else {
        std::cout << std::setw(17) << torch_rate << std::setprecision(2) << std::setw(15)
                  << tessera_rate / torch_rate << std::setw(17) << tessera_ms << std::setw(15)
                  << torch_ms << "\n";
      }
    }
  }
  if (o.distributed() && !o.json) {
    std::cout << "\ndata parallel: " << o.np << " processes on each side, the batch per rank "
              << "(global batch np x batch), samples/s global; tessera-launch --mode allreduce "
              << "vs PyTorch DistributedDataParallel (gloo); x1: the single-process figures "
              << "above\n\n"
              << std::left << std::setw(7) << "batch" << std::setw(11) << "optimizer"
              << std::right << std::setw(14) << "tessera x" + std::to_string(o.np)
              << std::setw(14) << "torch DDP x" + std::to_string(o.np) << std::setw(11)
              << "ratio" << std::setw(13) << "tessera x1" << std::setw(11) << "torch x1"
              << std::setw(17) << "tessera ms/step" << std::setw(13) << "DDP ms/step" << "\n";
    for (const TrainRow& row : rows) {
      const double t = MedianOf(row.tessera_np, &TrainRun::samples_per_second);
      std::cout << std::left << std::setw(7) << row.batch << std::setw(11) << row.optimizer
                << std::right << std::fixed << std::setprecision(0) << std::setw(14) << t;
      if (row.torch_np.empty()) {
        std::cout << std::setw(14) << "-" << std::setw(11) << "-";
      } else {
        const double d = MedianOf(row.torch_np, &TrainRun::samples_per_second);
        std::cout << std::setw(14) << d << std::setprecision(2) << std::setw(11) << t / d;
      }
      std::cout << std::setprecision(0) << std::setw(13)
                << MedianOf(row.tessera, &TrainRun::samples_per_second) << std::setw(11);
      if (row.torch.empty()) {
        std::cout << "-";
      } else {
        std::cout << MedianOf(row.torch, &TrainRun::samples_per_second);
      }
      std::cout << std::setprecision(2) << std::setw(17)
                << MedianOf(row.tessera_np, &TrainRun::ms_per_step) << std::setw(13);
      if (row.torch_np.empty()) {
        std::cout << "-";
      } else {
        std::cout << MedianOf(row.torch_np, &TrainRun::ms_per_step);
      }
      std::cout << "\n";
    }
  }
  if (o.json) {
    nlohmann::json j = {{"benchmark", "train"},
                        {"model", "mlp"},
                        {"layers", layers},
                        {"parameters", parameters},
                        {"threads", o.threads},
                        {"steps", o.steps},
                        {"warmup_steps", o.warmup_steps},
                        {"repeats", o.repeats},
                        {"batch_pool", kBatchPool},
                        {"rows", json_rows}};
    if (!o.no_torch) {
      j["torch_version"] = torch_version;
      j["openblas_core"] = openblas_core;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    // One figure per batch size (rows of one size are adjacent).
    std::ostringstream costs;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i > 0 && rows[i].batch == rows[i - 1].batch) continue;
      costs << (i > 0 ? ", " : "") << std::fixed << std::setprecision(2)
            << rows[i].synthetic_ms_per_batch << " ms per batch of " << rows[i].batch;
    }
    std::cout << "\nNot timed: making the " << kBatchPool << " batches each side cycles "
              << "through. Generating them as --dataset synthetic does every step would add "
              << costs.str() << ".\n";
  }
  return OkStatus();
}
StatusOr<std::string> ParseOptimizerName(const std::string& item) {
  if (item == "sgd" || item == "adam") return item;
  return InvalidArgumentError("\"" + item + "\" is not sgd or adam");
}

}  // namespace

BenchCommand AddTrainBench(CLI::App* parent) {
  struct Flags {
    TrainBenchOptions options;
    std::string batch_sizes = "64", optimizers = "sgd", hidden = "1024,1024";
  };
  auto flags = std::make_shared<Flags>();
  TrainBenchOptions& train_options = flags->options;
  CLI::App* train = parent->add_subcommand(
      "train",
      "Training throughput of the mlp model on the CPU vs PyTorch (--mode allreduce: also vs "
      "DDP); --mode zero1|zero2|zero3: a ZeRO stage vs --mode allreduce, Tessera only");
  train->add_option("--batch-size", flags->batch_sizes, "Batch size(s), comma-separated: a row each")
      ->capture_default_str();
  train->add_option("--optimizer", flags->optimizers,
                    "sgd and/or adam, comma-separated: a row each (--mode zero*: default adam)")
      ->capture_default_str();
  train->add_option("--hidden", flags->hidden, "Hidden widths, comma-separated")->capture_default_str();
  train->add_option("--input-dim", train_options.input_dim, "Input features")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--classes", train_options.classes, "Classes")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--steps", train_options.steps, "Timed steps per run")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  train->add_option("--warmup-steps", train_options.warmup_steps, "Untimed steps before them")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  train_options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  train->add_option("--threads", train_options.threads,
                    "Threads for both sides (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, "
                    "torch.set_num_threads); default: all cores")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  train->add_option("--repeats", train_options.repeats, "Runs per side per row; the median counts")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  train->add_flag("--json", train_options.json, "Print one JSON object instead of the table");
  train->add_flag("--no-torch", train_options.no_torch, "Measure Tessera alone");
  train->add_option("--mode", train_options.mode,
                    "local: single process; allreduce: also --np processes on each side "
                    "(tessera-launch --mode allreduce vs PyTorch DDP over gloo); zero1, zero2, "
                    "zero3: Tessera only (no PyTorch run), --np processes of --mode allreduce "
                    "against that ZeRO stage (step time, model-state bytes per rank, issue 6's "
                    "goal); --optimizer defaults to adam there")
      ->check(CLI::IsMember({"local", "allreduce", "zero1", "zero2", "zero3"}))
      ->capture_default_str();
  train->add_option("--np", train_options.np, "Processes per side with --mode allreduce|zero*")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  return {train, [flags, train]() -> int {
    TrainBenchOptions train_options = flags->options;
    // ZeRO partitions the optimizer state: Adam's, unless --optimizer says otherwise.
    if (train_options.zero() && train->count("--optimizer") == 0) flags->optimizers = "adam";
    auto batches = ParseList<int64_t>("--batch-size", flags->batch_sizes, ParsePositive);
    auto kinds = ParseList<std::string>("--optimizer", flags->optimizers, ParseOptimizerName);
    auto widths = ParseList<int64_t>("--hidden", flags->hidden, ParsePositive);
    for (const Status& status : {batches.status(), kinds.status(), widths.status()}) {
      if (!status.ok()) {
        std::cerr << "tessera-bench train: " << status.message() << "\n";
        return 2;
      }
    }
    train_options.batch_sizes = *batches;
    train_options.optimizers = *kinds;
    train_options.hidden = *widths;
    Status status = RunTrainBench(train_options);
    if (!status.ok()) {
      std::cerr << "tessera-bench train: " << status << "\n";
      return 1;
    }
    return 0;
  }};
}

}  // namespace tessera::tools
