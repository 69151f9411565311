#include "tools/bench/pipeline_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/config/flag_checks.h"
#include "common/security/job_key.h"
#include "tools/bench/torch_python.h"

namespace tessera::tools {
namespace {

constexpr char kScript[] = "tools/bench/torch_pipeline_bench.py";
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
const std::vector<std::string> kSchedules = {"gpipe", "1f1b", "interleaved", "zb-h1"};
constexpr int kInterleavedStagesPerRank = 2;
// Issue 46: GPipe's and 1F1B's measured bubble within 5 points of the formula.
constexpr double kBubbleTolerance = 0.05;
// Issue 46: tensor parallelism over T = 2 processes at >= 0.8x data parallelism's samples/s.
constexpr int kTensorParallel = 2;
constexpr double kTpOverDdpGoal = 0.8;
// TP's and DDP's losses after the same steps differ only by float32 rounding (the sums run in
// other orders); a TP that computes something else is far off.
constexpr double kLossRelTolerance = 1e-3;

struct PipelineBenchOptions {
  std::string stages_text = "2";
  std::string micro_batches_text = "4,8";
  std::string schedules_text = "gpipe,1f1b,interleaved,zb-h1";
  int dim = 1024;
  int layers = 16;
  int batch_size = 256;
  int steps = 10;
  int warmup_steps = 2;
  int threads = 1;
  std::string ring_transport = "auto";
  int timeout_s = 600;
  bool json = false;
  bool no_tp = false;
  int tp_dim = 4096;
  int tp_batch = 128;  // a one-process step of about 0.4 s at d = 4096 on one core

  // Parsed from the texts above.
  std::vector<int64_t> stages, micro_batches;
  std::vector<std::string> schedules;
};

int StagesPerRank(const std::string& schedule) {
  return schedule == "interleaved" ? kInterleavedStagesPerRank : 1;
}

template <typename T>
std::string Join(const std::vector<T>& values) {
  std::ostringstream text;
  for (size_t i = 0; i < values.size(); ++i) text << (i ? "," : "") << values[i];
  return text.str();
}

std::string Fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

StatusOr<int64_t> ParseStages(const std::string& item) {
  ASSIGN_OR_RETURN(int64_t p, ParsePositive(item));
  if (p < 2 || p > 16) return InvalidArgumentError("\"" + item + "\" is not in [2, 16]");
  return p;
}

StatusOr<std::string> ParseSchedule(const std::string& item) {
  if (std::find(kSchedules.begin(), kSchedules.end(), item) != kSchedules.end()) return item;
  return InvalidArgumentError("\"" + item + "\" is not one of " + Join(kSchedules));
}

Status ParseOptions(PipelineBenchOptions* o) {
  if (!o->no_tp) {
    if (o->tp_dim % kTensorParallel != 0) {
      return InvalidArgumentError("--tp-dim " + std::to_string(o->tp_dim) +
                                  " is odd: tensor parallelism T = 2 halves the layers' rows "
                                  "and columns");
    }
    if (o->tp_batch % kTensorParallel != 0) {
      return InvalidArgumentError("--tp-batch " + std::to_string(o->tp_batch) +
                                  " is odd: it does not split over the 2 data-parallel ranks "
                                  "(the DDP reference)");
    }
  }
  ASSIGN_OR_RETURN(o->stages, ParseList<int64_t>("--stages", o->stages_text, ParseStages));
  ASSIGN_OR_RETURN(o->micro_batches,
                   ParseList<int64_t>("--micro-batches", o->micro_batches_text, ParsePositive));
  ASSIGN_OR_RETURN(o->schedules,
                   ParseList<std::string>("--schedules", o->schedules_text, ParseSchedule));
  // Every shape is checked here, so that no run fails half-way through the benchmark.
  for (int64_t p : o->stages) {
    if (o->batch_size % p != 0) {
      return InvalidArgumentError("--batch-size " + std::to_string(o->batch_size) +
                                  " does not split over --stages " + std::to_string(p) +
                                  " data-parallel ranks (the DDP reference)");
    }
    for (const std::string& schedule : o->schedules) {
      const int64_t stages = p * StagesPerRank(schedule);
      if (o->layers % stages != 0) {
        return InvalidArgumentError("--layers " + std::to_string(o->layers) +
                                    " does not cut evenly into " + schedule + "'s " +
                                    std::to_string(stages) + " stages at --stages " +
                                    std::to_string(p));
      }
      for (int64_t m : o->micro_batches) {
        if ((schedule == "1f1b" || schedule == "zb-h1") && m < p) {
          return InvalidArgumentError("--micro-batches " + std::to_string(m) + " < --stages " +
                                      std::to_string(p) + ": " + schedule +
                                      " needs at least as many micro-batches as ranks");
        }
        if (schedule == "interleaved" && m % p != 0) {
          return InvalidArgumentError("--micro-batches " + std::to_string(m) +
                                      ": interleaved needs a multiple of --stages " +
                                      std::to_string(p));
        }
      }
    }
  }
  for (int64_t m : o->micro_batches) {
    if (o->batch_size % m != 0) {
      return InvalidArgumentError("--batch-size " + std::to_string(o->batch_size) +
                                  " does not cut into --micro-batches " + std::to_string(m) +
                                  " equal micro-batches");
    }
  }
  return OkStatus();
}

// Rows by (P, schedule, M); the references by P (DDP) and once (one process).
using RowKey = std::tuple<int64_t, std::string, int64_t>;

struct Results {
  nlohmann::json single;
  std::map<int64_t, nlohmann::json> ddp;
  std::map<RowKey, nlohmann::json> rows;
  nlohmann::json info;  // the first pipeline run's torch_pipeline_info
  // The tensor-parallel part (absent with --no-tp): one process, DDP and TP at T = 2.
  nlohmann::json tp_single, tp_ddp, tp;
};

class Runner {
 public:
  Runner(const PipelineBenchOptions& o, const PythonSetup& py, std::string script,
         std::unique_ptr<ScratchDirectory> scratch)
      : o_(o), py_(py), script_(std::move(script)), scratch_(std::move(scratch)) {}

  // Runs `np` ranks of the script in `mode`; rank 0's bench lines.
  StatusOr<std::vector<nlohmann::json>> Run(const std::string& mode, int np) {
    // A fresh directory per run: the file store must not hold a previous run's keys.
    const std::string store_dir = scratch_->path() + "/run" + std::to_string(run_++);
    if (mkdir(store_dir.c_str(), 0700) != 0) {
      return UnavailableError("mkdir " + store_dir + ": " + std::strerror(errno));
    }
    // The ranks' job key (the tessera backend refuses to start without one).
    const std::string key_file = scratch_->path() + "/job.key";
    if (access(key_file.c_str(), F_OK) != 0) {
      RETURN_IF_ERROR(WriteKeyFile(key_file, JobKey::Generate()));
    }
    std::vector<ChildSpec> children;
    for (int rank = 0; rank < np; ++rank) {
      std::vector<std::string> argv = {"/usr/bin/env", "TESSERA_AUTH_KEY_FILE=" + key_file,
                                       "OMP_NUM_THREADS=" + std::to_string(o_.threads),
                                       "OPENBLAS_NUM_THREADS=" + std::to_string(o_.threads),
                                       "OMP_WAIT_POLICY=PASSIVE",
                                       "TESSERA_RING_TRANSPORT=" + o_.ring_transport};
      // The OpenBLAS the other torch benchmarks use (torch_bench.cc).
      if (access(kOpenBlasPthreadDir, R_OK) == 0) {
        argv.push_back(std::string("LD_LIBRARY_PATH=") + kOpenBlasPthreadDir);
      }
      if (!py_.pythonpath.empty()) argv.push_back("PYTHONPATH=" + py_.pythonpath);
      for (const std::string& arg :
           {std::string(kPython), script_, "--mode=" + mode, "--rank=" + std::to_string(rank),
            "--world=" + std::to_string(np), "--store-dir=" + store_dir,
            "--threads=" + std::to_string(o_.threads),
            "--timeout-s=" + std::to_string(o_.timeout_s), "--dim=" + std::to_string(o_.dim),
            "--layers=" + std::to_string(o_.layers),
            "--batch-size=" + std::to_string(o_.batch_size), "--schedules=" + Join(o_.schedules),
            "--micro-batches=" + Join(o_.micro_batches), "--steps=" + std::to_string(o_.steps),
            "--warmup-steps=" + std::to_string(o_.warmup_steps),
            "--tp-dim=" + std::to_string(o_.tp_dim),
            "--tp-batch=" + std::to_string(o_.tp_batch)}) {
        argv.push_back(arg);
      }
      children.push_back({"torch_pipeline_bench.py " + mode + " rank " + std::to_string(rank) +
                              " of " + std::to_string(np),
                          std::move(argv)});
    }
    ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                     RunAllToCompletion(children, int64_t{o_.timeout_s} * 1000));
    for (const nlohmann::json& j : BenchLines({outputs[0]}, "torch_pipeline_info")) {
      if (info_.is_null() && np > 1) info_ = j;
    }
    return BenchLines({outputs[0]}, "torch_pipeline");
  }

  const nlohmann::json& info() const { return info_; }

 private:
  const PipelineBenchOptions& o_;
  const PythonSetup& py_;
  const std::string script_;
  std::unique_ptr<ScratchDirectory> scratch_;
  int run_ = 0;
  nlohmann::json info_;
};

Status Measure(const PipelineBenchOptions& o, const PythonSetup& py, Results* results) {
  ASSIGN_OR_RETURN(std::string script, FindRunfile(kScript));
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchDirectory> scratch, ScratchDirectory::Create());
  Runner runner(o, py, script, std::move(scratch));
  auto progress = [&](const std::string& what) {
    if (!o.json) std::cerr << "measuring " << what << "...\n";
  };
  auto positive = [](const nlohmann::json& line, const char* key) {
    return line.is_object() && line.contains(key) && line.at(key).is_number() &&
           line.at(key).get<double>() > 0;
  };
  progress("one process");
  ASSIGN_OR_RETURN(std::vector<nlohmann::json> lines, runner.Run("single", 1));
  for (const nlohmann::json& j : lines) {
    if (j.value("config", "") == "single") results->single = j;
  }
  if (!positive(results->single, "samples_per_second")) {
    return DataLossError("torch_pipeline_bench.py reported no samples/s for one process");
  }
  for (int64_t p : o.stages) {
    progress("DDP and the schedules at P = " + std::to_string(p));
    ASSIGN_OR_RETURN(lines, runner.Run("pipeline", static_cast<int>(p)));
    for (const nlohmann::json& j : lines) {
      const std::string config = j.value("config", "");
      if (config == "ddp") {
        results->ddp[p] = j;
      } else {
        results->rows[{p, config, j.value("micro_batches", int64_t{0})}] = j;
      }
    }
    if (!positive(results->ddp[p], "samples_per_second")) {
      return DataLossError("torch_pipeline_bench.py reported no DDP samples/s at P = " +
                           std::to_string(p));
    }
    for (const std::string& schedule : o.schedules) {
      for (int64_t m : o.micro_batches) {
        const auto row = results->rows.find({p, schedule, m});
        if (row == results->rows.end() || !positive(row->second, "samples_per_second") ||
            !row->second.contains("bubble_measured")) {
          return DataLossError("torch_pipeline_bench.py reported no figures for " + schedule +
                               " at P = " + std::to_string(p) + ", M = " + std::to_string(m));
        }
      }
    }
  }
  if (!o.no_tp) {
    progress("tensor parallel: one process, then DDP and TP T = 2 on 2 processes");
    ASSIGN_OR_RETURN(lines, runner.Run("tp", 1));
    for (const nlohmann::json& j : lines) {
      if (j.value("config", "") == "tp_single") results->tp_single = j;
    }
    ASSIGN_OR_RETURN(lines, runner.Run("tp", kTensorParallel));
    for (const nlohmann::json& j : lines) {
      if (j.value("config", "") == "tp_ddp") results->tp_ddp = j;
      if (j.value("config", "") == "tp") results->tp = j;
    }
    for (const auto& [line, what] : {std::pair{&results->tp_single, "one process"},
                                     std::pair{&results->tp_ddp, "DDP"},
                                     std::pair{&results->tp, "TP"}}) {
      if (!positive(*line, "samples_per_second") || !line->contains("loss") ||
          !line->at("loss").is_number()) {
        return DataLossError(std::string("torch_pipeline_bench.py reported no samples/s or "
                                         "loss for the tensor-parallel part's ") +
                             what);
      }
    }
  }
  results->info = runner.info();
  return OkStatus();
}

// The tensor-parallel row of --json and of the table: TP beside its references, and whether
// its loss after the timed steps is DDP's (else TP computed something else).
nlohmann::json TensorParallelRow(const PipelineBenchOptions& o, const Results& r,
                                 unsigned cores) {
  const double rate = r.tp.at("samples_per_second").get<double>();
  const double ddp_rate = r.tp_ddp.at("samples_per_second").get<double>();
  const double single_rate = r.tp_single.at("samples_per_second").get<double>();
  const double loss = r.tp.at("loss").get<double>();
  const double ddp_loss = r.tp_ddp.at("loss").get<double>();
  const bool matches = std::abs(loss - ddp_loss) <= kLossRelTolerance * std::abs(ddp_loss);
  return {{"benchmark", "pipeline"},
          {"kind", "tensor_parallel"},
          {"tp", kTensorParallel},
          {"dim", o.tp_dim},
          {"batch_size", o.tp_batch},
          {"parameters", 2 * (int64_t{o.tp_dim} * o.tp_dim + o.tp_dim)},
          {"shard_parameters", r.tp.value("shard_parameters", int64_t{0})},
          {"step_s", r.tp.at("step_s")},
          {"samples_per_second", rate},
          {"step_s_ddp", r.tp_ddp.at("step_s")},
          {"samples_per_second_ddp", ddp_rate},
          {"step_s_one_process", r.tp_single.at("step_s")},
          {"samples_per_second_one_process", single_rate},
          {"throughput_over_ddp", rate / ddp_rate},
          {"throughput_over_one_process", rate / single_rate},
          {"loss", loss},
          {"loss_per_rank", r.tp.value("loss_per_rank", nlohmann::json::array())},
          {"loss_ddp", ddp_loss},
          {"loss_one_process", r.tp_single.at("loss")},
          {"loss_rel_tolerance", kLossRelTolerance},
          {"loss_matches_ddp", matches},
          {"oversubscribed", cores > 0 && kTensorParallel > static_cast<int64_t>(cores)}};
}

// (P-1)/(M+P-1): GPipe's and 1F1B's bubble with stages of equal cost and free messages.
double TextbookBubble(int64_t p, int64_t m) {
  return static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
}

bool HasTextbookBubble(const std::string& schedule) {
  return schedule == "gpipe" || schedule == "1f1b";
}

int64_t MaxOf(const nlohmann::json& row, const char* key) {
  int64_t most = 0;
  for (const nlohmann::json& v : row.value(key, nlohmann::json::array())) {
    most = std::max(most, v.get<int64_t>());
  }
  return most;
}

// The row of --json and of the table: the rank script's figures and the ratios.
nlohmann::json Row(const Results& r, int64_t p, const std::string& schedule, int64_t m,
                   unsigned cores) {
  const nlohmann::json& line = r.rows.at({p, schedule, m});
  const double rate = line.at("samples_per_second").get<double>();
  nlohmann::json row = {
      {"benchmark", "pipeline"},
      {"kind", "row"},
      {"schedule", schedule},
      {"stages", p},
      {"stages_per_rank", StagesPerRank(schedule)},
      {"micro_batches", m},
      {"bubble_measured", line.at("bubble_measured")},
      {"bubble_per_rank", line.at("bubble_per_rank")},
      {"bubble_formula", line.at("bubble_formula")},
      {"bubble_textbook",
       HasTextbookBubble(schedule) ? nlohmann::json(TextbookBubble(p, m)) : nlohmann::json()},
      {"step_s", line.at("step_s")},
      {"schedule_step_s", line.at("schedule_step_s")},
      {"samples_per_second", rate},
      {"throughput_over_one_process", rate / r.single.at("samples_per_second").get<double>()},
      {"throughput_over_ddp", rate / r.ddp.at(p).at("samples_per_second").get<double>()},
      {"peak_activation_bytes", MaxOf(line, "peak_activation_bytes_per_rank")},
      {"peak_activation_bytes_per_rank", line.at("peak_activation_bytes_per_rank")},
      {"peak_activation_measured_by", "saved_tensors_hooks"},
      {"activation_bytes_left_after_step", line.at("activation_bytes_left_after_step")},
      {"peak_held_per_rank", line.at("peak_held_per_rank")},
      {"expected_peak_held_per_rank", line.at("expected_peak_held_per_rank")},
      {"oversubscribed", cores > 0 && p > static_cast<int64_t>(cores)}};
  return row;
}

nlohmann::json Goal(const std::string& goal, bool met, const std::string& detail) {
  return {{"benchmark", "pipeline"}, {"kind", "goal"}, {"goal", goal}, {"met", met},
          {"detail", detail}};
}

std::vector<nlohmann::json> CheckGoals(const PipelineBenchOptions& o, const Results& r,
                                       unsigned cores) {
  std::vector<nlohmann::json> goals;
  auto has = [&](const std::string& schedule) {
    return std::count(o.schedules.begin(), o.schedules.end(), schedule) > 0;
  };
  for (int64_t p : o.stages) {
    for (int64_t m : o.micro_batches) {
      const std::string shape = "P=" + std::to_string(p) + " M=" + std::to_string(m);
      for (const std::string schedule : {"gpipe", "1f1b"}) {
        if (!has(schedule)) continue;
        const nlohmann::json& row = r.rows.at({p, schedule, m});
        const double measured = row.at("bubble_measured").get<double>();
        const double formula = row.at("bubble_formula").get<double>();
        goals.push_back(Goal(schedule + " bubble within " + Fixed(kBubbleTolerance, 2) +
                                 " of the formula, " + shape,
                             std::abs(measured - formula) <= kBubbleTolerance,
                             "measured " + Fixed(measured, 3) + ", formula " +
                                 Fixed(formula, 3)));
      }
      if (has("zb-h1") && has("1f1b")) {
        const nlohmann::json& zb = r.rows.at({p, "zb-h1", m});
        const nlohmann::json& one = r.rows.at({p, "1f1b", m});
        const double zb_bubble = zb.at("bubble_measured").get<double>();
        const double one_bubble = one.at("bubble_measured").get<double>();
        // Equal memory: the most micro-batches a rank holds at once, what each rank must
        // have room for (ZB-H1 holds P on every rank where 1F1B's rank r holds P - r).
        const int64_t zb_held = MaxOf(zb, "peak_held_per_rank");
        const int64_t one_held = MaxOf(one, "peak_held_per_rank");
        goals.push_back(Goal(
            "zb-h1 bubble below 1f1b's at equal peak_held (the most any rank holds), " + shape,
            zb_held == one_held && zb_bubble < one_bubble,
            "zb-h1 " + Fixed(zb_bubble, 3) + " vs 1f1b " + Fixed(one_bubble, 3) +
                "; peak_held per rank " + zb.at("peak_held_per_rank").dump() + " vs " +
                one.at("peak_held_per_rank").dump() + "; peak activations " +
                HumanBytes(MaxOf(zb, "peak_activation_bytes_per_rank")) + " vs " +
                HumanBytes(MaxOf(one, "peak_activation_bytes_per_rank"))));
      }
    }
  }
  if (!o.no_tp) {
    const nlohmann::json row = TensorParallelRow(o, r, cores);
    const double ratio = row.at("throughput_over_ddp").get<double>();
    const bool matches = row.at("loss_matches_ddp").get<bool>();
    std::string detail = Fixed(ratio, 2) + "x";
    if (!matches) {
      detail += ", but TP's loss after the timed steps " + Fixed(row.at("loss").get<double>(), 6) +
                " is not DDP's " + Fixed(row.at("loss_ddp").get<double>(), 6) +
                ": TP computed something else";
    }
    goals.push_back(Goal("tensor parallel T=" + std::to_string(kTensorParallel) + " >= " +
                             Fixed(kTpOverDdpGoal, 1) + "x DDP on the same " +
                             std::to_string(kTensorParallel) + " processes (d=" +
                             std::to_string(o.tp_dim) + ")",
                         matches && ratio >= kTpOverDdpGoal, detail));
  }
  return goals;
}

std::string PerRank(const nlohmann::json& values, int digits) {
  std::string text;
  for (const nlohmann::json& v : values) {
    text += (text.empty() ? "" : "/") + Fixed(v.get<double>(), digits);
  }
  return text;
}

std::string MiBPerRank(const nlohmann::json& values) {
  std::string text;
  for (const nlohmann::json& v : values) {
    text += (text.empty() ? "" : "/") + Fixed(v.get<double>() / (1 << 20), 1);
  }
  return text;
}

void ReportTensorParallel(const PipelineBenchOptions& o, const Results& r, unsigned cores) {
  const nlohmann::json row = TensorParallelRow(o, r, cores);
  std::cout << "\ntensor parallel T = " << kTensorParallel << " (tessera.torch.tensor_parallel)"
            << ": Linear(" << o.tp_dim << ", " << o.tp_dim << ") ColwiseParallel + ReLU + Linear("
            << o.tp_dim << ", " << o.tp_dim << ") RowwiseParallel, "
            << row.at("parameters").get<int64_t>() << " parameters ("
            << row.at("shard_parameters").get<int64_t>() << " per TP rank), MSE loss, SGD "
            << "momentum 0.9; global batch " << o.tp_batch << " (DDP: "
            << o.tp_batch / kTensorParallel << " per rank; TP: all of it on each rank, the "
            << "weights halved); steps timed as above; loss: on the whole batch after the "
            << "timed steps\n\n"
            << std::left << std::setw(26) << "config" << std::right << std::setw(9) << "step ms"
            << std::setw(11) << "samples/s" << std::setw(14) << "loss" << "\n";
  auto line = [&](const std::string& config, const char* step, const char* rate,
                  const char* loss) {
    std::cout << std::left << std::setw(26) << config << std::right << std::setw(9)
              << Fixed(row.at(step).get<double>() * 1e3, 1) << std::setw(11)
              << Fixed(row.at(rate).get<double>(), 1) << std::setw(14)
              << Fixed(row.at(loss).get<double>(), 6) << "\n";
  };
  line("one process", "step_s_one_process", "samples_per_second_one_process",
       "loss_one_process");
  line("DDP, 2 processes", "step_s_ddp", "samples_per_second_ddp", "loss_ddp");
  line("TP T=2, 2 processes", "step_s", "samples_per_second", "loss");
  std::cout << "TP: " << Fixed(row.at("throughput_over_ddp").get<double>(), 2) << "x DDP, "
            << Fixed(row.at("throughput_over_one_process").get<double>(), 2)
            << "x one process; loss "
            << (row.at("loss_matches_ddp").get<bool>() ? "matches" : "DOES NOT match")
            << " DDP's (relative tolerance " << kLossRelTolerance << ")\n";
}

void Report(const PipelineBenchOptions& o, const PythonSetup& py, const Results& r) {
  const unsigned cores = std::thread::hardware_concurrency();
  const std::vector<nlohmann::json> goals = CheckGoals(o, r, cores);
  std::vector<int64_t> oversubscribed;
  for (int64_t p : o.stages) {
    if (cores > 0 && p > static_cast<int64_t>(cores)) oversubscribed.push_back(p);
  }
  const int64_t parameters = r.single.value("parameters", int64_t{0});
  if (o.json) {
    std::cout << nlohmann::json({{"benchmark", "pipeline"},
                                 {"kind", "config"},
                                 {"torch_version", py.torch_version},
                                 {"tessera_package", r.info.value("tessera_package", "")},
                                 {"tessera_channel", r.info.value("tessera_channel", "")},
                                 {"threads_per_rank", o.threads},
                                 {"cores", cores},
                                 {"dim", o.dim},
                                 {"layers", o.layers},
                                 {"parameters", parameters},
                                 {"batch_size", o.batch_size},
                                 {"steps", o.steps},
                                 {"warmup_steps", o.warmup_steps},
                                 {"stages_oversubscribed", oversubscribed}})
                     .dump()
              << "\n";
    std::cout << nlohmann::json({{"benchmark", "pipeline"},
                                 {"kind", "reference"},
                                 {"config", "one_process"},
                                 {"step_s", r.single.at("step_s")},
                                 {"samples_per_second", r.single.at("samples_per_second")}})
                     .dump()
              << "\n";
    for (int64_t p : o.stages) {
      std::cout << nlohmann::json({{"benchmark", "pipeline"},
                                   {"kind", "reference"},
                                   {"config", "ddp"},
                                   {"stages", p},
                                   {"step_s", r.ddp.at(p).at("step_s")},
                                   {"samples_per_second", r.ddp.at(p).at("samples_per_second")}})
                       .dump()
                << "\n";
    }
    for (int64_t p : o.stages) {
      for (const std::string& schedule : o.schedules) {
        for (int64_t m : o.micro_batches) {
          std::cout << Row(r, p, schedule, m, cores).dump() << "\n";
        }
      }
    }
    if (!o.no_tp) std::cout << TensorParallelRow(o, r, cores).dump() << "\n";
    for (const nlohmann::json& goal : goals) std::cout << goal.dump() << "\n";
    return;
  }

  std::cout << "pipeline: tessera.torch.pipelining's schedules on the tessera backend (issue "
            << "46)\nPyTorch " << py.torch_version << " (CPU) on " << cores << " cores; each "
            << "rank: " << o.threads << " thread(s); tessera ring "
            << r.info.value("tessera_channel", "(not reported)") << "\n"
            << "model: " << o.layers << " x (Linear(" << o.dim << ", " << o.dim << ") + ReLU), "
            << parameters << " parameters, MSE loss, SGD momentum 0.9; global batch "
            << o.batch_size << "; step = zero_grad, step, optimizer.step, median of " << o.steps
            << " timed steps (after " << o.warmup_steps << " and a memory step) of the "
            << "slowest rank, each after a barrier\n"
            << "one process (whole model, whole batch): "
            << Fixed(r.single.at("samples_per_second").get<double>(), 1) << " samples/s\n";
  for (int64_t p : o.stages) {
    std::cout << "DDP on tessera, " << p << " processes, batch/" << p << " each: "
              << Fixed(r.ddp.at(p).at("samples_per_second").get<double>(), 1) << " samples/s\n";
  }
  for (int64_t p : oversubscribed) {
    std::cout << "NOTE: P = " << p << " runs " << p << " processes on " << cores
              << " cores: they share cores, so its bubble and throughput are not a pipeline's "
              << "of " << p << " stages on " << p << " cores\n";
  }
  std::cout << "\nbubble = 1 - busy / step length per rank (busy: the timeline's F, B, I, W; "
            << "length: the longest rank's schedule.step), median over steps, mean over ranks; "
            << "formula: the schedule library's bubble_fraction (F = 1, B = 2), and "
            << "(P-1)/(M+P-1) for gpipe and 1f1b; peak act = most activation bytes autograd "
            << "held at once per rank (saved_tensors_hooks over one step); held = micro-batches "
            << "held at once per rank (interleaved: stage micro-batches, each half a rank's "
            << "layers)\n\n"
            << std::left << std::setw(12) << "schedule" << std::right << std::setw(3) << "P"
            << std::setw(4) << "M" << std::setw(8) << "bubble" << std::setw(9) << "formula"
            << std::setw(11) << "(P-1)/..." << "  " << std::left << std::setw(13)
            << "bubble/rank" << std::right << std::setw(9) << "step ms" << std::setw(11)
            << "samples/s" << std::setw(8) << "x1proc" << std::setw(7) << "xDDP" << "  "
            << std::left << std::setw(17) << "peak act MiB" << "held\n";
  for (int64_t p : o.stages) {
    for (const std::string& schedule : o.schedules) {
      for (int64_t m : o.micro_batches) {
        const nlohmann::json row = Row(r, p, schedule, m, cores);
        std::cout << std::left << std::setw(12) << schedule << std::right << std::setw(3) << p
                  << std::setw(4) << m << std::setw(8)
                  << Fixed(row.at("bubble_measured").get<double>(), 3) << std::setw(9)
                  << Fixed(row.at("bubble_formula").get<double>(), 3) << std::setw(11)
                  << (HasTextbookBubble(schedule) ? Fixed(TextbookBubble(p, m), 3) : "-")
                  << "  " << std::left << std::setw(13) << PerRank(row.at("bubble_per_rank"), 2)
                  << std::right << std::setw(9)
                  << Fixed(row.at("step_s").get<double>() * 1e3, 1) << std::setw(11)
                  << Fixed(row.at("samples_per_second").get<double>(), 1) << std::setw(7)
                  << Fixed(row.at("throughput_over_one_process").get<double>(), 2) << "x"
                  << std::setw(6) << Fixed(row.at("throughput_over_ddp").get<double>(), 2) << "x"
                  << "  " << std::left << std::setw(17)
                  << MiBPerRank(row.at("peak_activation_bytes_per_rank"))
                  << PerRank(row.at("peak_held_per_rank"), 0) << "\n";
      }
    }
  }
  if (!o.no_tp) ReportTensorParallel(o, r, cores);
  if (!goals.empty()) std::cout << "\ngoals (issue 46):\n";
  for (const nlohmann::json& goal : goals) {
    std::cout << "  " << (goal.at("met").get<bool>() ? "met    " : "MISSED ")
              << goal.at("goal").get<std::string>() << ": " << goal.at("detail").get<std::string>()
              << "\n";
  }
}

int RunPipelineBench(const PipelineBenchOptions& o) {
  StatusOr<PythonSetup> py = ProbePython();
  if (!py.ok()) {
    std::cerr << "tessera-bench pipeline: " << py.status() << "\n";
    return 1;
  }
  if (!py->skipped.empty()) {
    if (o.json) {
      std::cerr << "tessera-bench pipeline: skipped: " << py->skipped << "\n";
      std::cout << nlohmann::json({{"benchmark", "pipeline"}, {"kind", "skipped"},
                                   {"skipped", py->skipped}})
                       .dump()
                << "\n";
    } else {
      std::cout << "pipeline: skipped (" << py->skipped << ")\n";
    }
    return 0;
  }
  Results results;
  Status status = Measure(o, *py, &results);
  if (!status.ok()) {
    std::cerr << "tessera-bench pipeline: " << status << "\n";
    return 1;
  }
  Report(o, *py, results);
  return 0;
}

}  // namespace

BenchCommand AddPipelineBench(CLI::App* parent) {
  auto o = std::make_shared<PipelineBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "pipeline",
      "tessera.torch.pipelining's schedules (gpipe, 1f1b, interleaved, zb-h1) on the tessera "
      "backend: each one's measured bubble beside its formula, samples/s beside one process "
      "and beside DDP on the same processes, peak activation memory per rank (issue 46)");
  app->footer(
      "Ranks are /usr/bin/python3 tools/bench/torch_pipeline_bench.py (its docstring says how "
      "each figure is taken). One process trains the whole model first; then, per P of "
      "--stages, P processes run DDP and every schedule at every M. interleaved runs 2 stages "
      "per rank. Skips (exit 0, saying why) when /usr/bin/python3 cannot import torch or "
      "tessera.torch.\n"
      "Then, unless --no-tp, the tensor-parallel part: a Linear(--tp-dim, --tp-dim) colwise, "
      "ReLU, Linear rowwise pair trained by one process, by DDP over 2 processes and by "
      "tensor parallelism T = 2 over the same 2.\n"
      "The defaults take about 3 minutes on 2 cores (the tensor-parallel part about 1). "
      "Quick look:  tessera-bench pipeline "
      "--dim 256 --layers 8 --steps 3 --tp-dim 1024");
  app->add_option("--stages", o->stages_text,
                  "P: pipeline processes (stages; interleaved runs 2P), comma-separated, 2-16; "
                  "above the machine's cores the ranks share cores (the output says so)")
      ->capture_default_str();
  app->add_option("--micro-batches", o->micro_batches_text,
                  "M: micro-batches per step, comma-separated; 1f1b and zb-h1 need M >= P, "
                  "interleaved a multiple of P")
      ->capture_default_str();
  app->add_option("--schedules", o->schedules_text,
                  "Comma-separated: gpipe, 1f1b, interleaved, zb-h1")
      ->capture_default_str();
  app->add_option("--dim", o->dim, "Width d of each Linear(d, d) + ReLU block")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app->add_option("--layers", o->layers,
                  "Blocks L, cut evenly into the stages (a multiple of P, of 2P for interleaved)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app->add_option("--batch-size", o->batch_size,
                  "Global batch (rows) per step: cut into M micro-batches, or P DDP shares")
      ->check(CLI::Range(1, 1048576))
      ->capture_default_str();
  app->add_option("--steps", o->steps, "Timed steps per configuration (the median counts)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app->add_option("--warmup-steps", o->warmup_steps,
                  "Untimed steps before each configuration's memory step and timed steps")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app->add_option("--threads", o->threads,
                  "torch threads of each rank and of the one process (torch.set_num_threads, "
                  "OMP_NUM_THREADS)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--ring-transport", o->ring_transport,
                  "The tessera backend's ring: auto, shm, links or zmq (TESSERA_RING_TRANSPORT)")
      ->check(CLI::IsMember({"auto", "shm", "links", "zmq"}))
      ->capture_default_str();
  app->add_option("--timeout-s", o->timeout_s,
                  "Deadline of each run of the rank processes, and their groups' timeout")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--no-tp", o->no_tp,
                "Skip the tensor-parallel part (one process, DDP and TP T = 2 on a Megatron "
                "pair of Linear(--tp-dim, --tp-dim))");
  app->add_option("--tp-dim", o->tp_dim,
                  "d of the tensor-parallel part's two Linear(d, d) (even: T = 2 halves them)")
      ->check(CLI::Range(2, 65536))
      ->capture_default_str();
  app->add_option("--tp-batch", o->tp_batch,
                  "Global batch (rows) per step of the tensor-parallel part (even: DDP halves "
                  "it)")
      ->check(CLI::Range(2, 1048576))
      ->capture_default_str();
  app->add_flag("--json", o->json,
                "One JSON object per line (config, the references, a row per schedule, P and "
                "M, the tensor_parallel row, then the goals) instead of the table");
  return {app, [o]() -> int {
            Status status = ParseOptions(o.get());
            if (!status.ok()) {
              std::cerr << "tessera-bench pipeline: " << status.message() << "\n";
              return 2;
            }
            return RunPipelineBench(*o);
          }};
}

}  // namespace tessera::tools
