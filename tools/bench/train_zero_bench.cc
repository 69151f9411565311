#include "tools/bench/train_zero_bench.h"

#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/train_run.h"

namespace tessera::tools {
namespace {

// ZeRO's goals (issue 6): a stage's step time at most this many times --mode allreduce's;
// hsdp's (zero3 within its shard groups) is zero3's.
double StepTimeGoal(const std::string& mode) {
  return mode == "zero3" || mode == "hsdp" ? 1.35 : 1.10;
}

nlohmann::json StateBytesJson(const double (&bytes)[3]) {
  nlohmann::json j = {{"total", bytes[0] + bytes[1] + bytes[2]}};
  for (int k = 0; k < 3; ++k) j[kStateKinds[k]] = bytes[k];
  return j;
}

}  // namespace

// --mode zero1|zero2|zero3|hsdp: per (batch, optimizer) row, `repeats` runs of np workers in
// --mode allreduce and in the ZeRO mode, alternating which goes first; the medians of step
// time and rate, and the per-rank model-state bytes (the same every run: the first run's).
Status RunTrainZeroBench(const TrainBenchOptions& o) {
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

}  // namespace tessera::tools
