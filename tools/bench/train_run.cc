#include "tools/bench/train_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "tools/bench/bench_util.h"
#include "worker/data/binary_dataset.h"
#include "worker/data/synthetic_classification.h"
#include "worker/modes/mode_registry.h"

namespace tessera::tools {

using worker::ModeEntry;

bool TrainBenchOptions::distributed() const {
  const ModeEntry* entry = worker::FindMode(mode);
  return entry != nullptr && entry->Has(worker::kReducesGradientsAcrossRanks);
}

namespace {

// Debian's pthread OpenBLAS; first on the children's library path, so PyTorch's libblas.so.3 is
// OpenBLAS rather than the reference BLAS (and tessera-worker loads the same libopenblas).
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";

}  // namespace

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

StatusOr<TrainRun> RunTessera(const std::string& worker, const std::string& launch,
                              const std::string& data_path, const TrainBenchOptions& o,
                              int64_t batch, const std::string& optimizer, int np,
                              const std::string& mode,
                              const std::vector<std::string>& worker_args) {
  const int64_t total = o.warmup_steps + o.steps;
  const ModeEntry* entry = worker::FindMode(mode);
  const bool ps = entry != nullptr && entry->Has(worker::kNeedsServers);
  std::vector<std::string> argv = ChildEnvironment(o.threads);
  if (np > 1) {
    for (const std::string& arg : {launch, std::string("--workers"), std::to_string(np),
                                   std::string("--servers"), std::string(ps ? "1" : "0"),
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
  // The shard groups are the mode under test's (hsdp's), never its allreduce reference's.
  if (o.shard_group_size > 0 && mode == o.mode) {
    argv.push_back("--shard-group-size=" + std::to_string(o.shard_group_size));
  }
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
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
  if (np > 1 && !ps && reports != np) {  // ps-* summaries carry no model-state bytes
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

double MedianOf(const std::vector<TrainRun>& runs, double TrainRun::*field) {
  std::vector<double> values;
  for (const TrainRun& run : runs) values.push_back(run.*field);
  return Median(values);
}

}  // namespace tessera::tools
