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

#include "common/base/status.h"
#include "tools/bench/train_run.h"
#include "tools/bench/train_nonfinite_bench.h"
#include "tools/bench/train_zero_bench.h"

namespace tessera::tools {
namespace {

constexpr char kTorchInstallHint[] = "tools/install_deps.sh bench";

// Fails with the install command when Debian's PyTorch cannot be imported.
Status CheckTorch() {
  const std::string hint = std::string("; install it with `") + kTorchInstallHint +
                           "`, or pass --no-torch to measure Tessera alone";
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


Status RunTrainBench(const TrainBenchOptions& o) {
  if (o.nonfinite_check) return RunTrainNonFiniteBench(o);
  if (o.zero()) return RunTrainZeroBench(o);
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
      "DDP); --mode zero1|zero2|zero3|hsdp: a ZeRO stage (or hsdp) vs --mode allreduce, "
      "Tessera only");
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
  train->add_flag("--nonfinite-check", train_options.nonfinite_check,
                  "Instead: what --on-nonfinite error costs against off (no check), Tessera "
                  "alone, in --mode local, allreduce and ps-sync (--np workers, 1 server)");
  train->add_option("--mode", train_options.mode,
                    "local: single process; allreduce: also --np processes on each side "
                    "(tessera-launch --mode allreduce vs PyTorch DDP over gloo); zero1, zero2, "
                    "zero3: Tessera only (no PyTorch run), --np processes of --mode allreduce "
                    "against that ZeRO stage (step time, model-state bytes per rank, issue 6's "
                    "goal); --optimizer defaults to adam there; hsdp: the same for --mode hsdp")
      ->check(CLI::IsMember({"local", "allreduce", "zero1", "zero2", "zero3", "hsdp"}))
      ->capture_default_str();
  train->add_option("--shard-group-size", train_options.shard_group_size,
                    "--mode hsdp: passed to the workers (0: each host's workers)")
      ->check(CLI::Range(0, 64))
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
