#include "tools/bench/torch_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/security/job_key.h"
#include "common/config/flag_checks.h"
#include "tools/bench/torch_fsdp_bench.h"
#include "tools/bench/torch_python.h"

namespace tessera::tools {
namespace {

constexpr char kScript[] = "tools/bench/torch_dist_bench.py";
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
const std::vector<std::string> kBackends = {"gloo", "tessera"};

struct TorchBenchOptions {
  std::string np_text = "2,4";
  std::string ops_text = "all_reduce,all_gather,broadcast";
  std::string sizes_text = "4K,64K,1M,16M,64M";
  int warmup = 5;
  int iters = 0;  // 0: from seconds
  double seconds = 1.0;  // shorter runs let one slow stretch set a large size's median
  std::string models_text = "mlp,cnn";
  std::string ddp_np_text = "2";
  int batch_size = 64;
  int steps = 60;
  int warmup_steps = 10;
  int repeats = 3;
  int threads = 1;
  std::string ring_transport = "auto";
  bool no_collectives = false;
  bool no_train = false;
  bool no_single = false;
  int timeout_s = 600;
  bool json = false;

  // Parsed from the texts above.
  std::vector<int64_t> nps, ddp_nps;
  std::vector<std::string> ops, models;
  std::vector<size_t> sizes;
};

std::function<StatusOr<std::string>(const std::string&)> OneOf(std::vector<std::string> names) {
  return [names](const std::string& item) -> StatusOr<std::string> {
    if (std::find(names.begin(), names.end(), item) != names.end()) return item;
    std::string all;
    for (const std::string& name : names) all += (all.empty() ? "" : ", ") + name;
    return InvalidArgumentError("\"" + item + "\" is not one of " + all);
  };
}

StatusOr<int64_t> ParseProcesses(const std::string& item) {
  ASSIGN_OR_RETURN(int64_t n, ParsePositive(item));
  if (n < 2 || n > 64) return InvalidArgumentError("\"" + item + "\" is not in [2, 64]");
  return n;
}

Status ParseOptions(TorchBenchOptions* o) {
  ASSIGN_OR_RETURN(o->nps, ParseList<int64_t>("--np", o->np_text, ParseProcesses));
  ASSIGN_OR_RETURN(o->ddp_nps, ParseList<int64_t>("--ddp-np", o->ddp_np_text, ParseProcesses));
  ASSIGN_OR_RETURN(o->ops, ParseList<std::string>(
                               "--ops", o->ops_text,
                               OneOf({"all_reduce", "all_gather", "broadcast"})));
  ASSIGN_OR_RETURN(o->models,
                   ParseList<std::string>("--models", o->models_text, OneOf({"mlp", "cnn"})));
  ASSIGN_OR_RETURN(o->sizes, ParseList<size_t>("--sizes", o->sizes_text, ParseByteSize));
  if (o->no_collectives && o->no_train) {
    return InvalidArgumentError("--no-collectives and --no-train together leave nothing to run");
  }
  return OkStatus();
}

template <typename T>
std::string Join(const std::vector<T>& values) {
  std::ostringstream text;
  for (size_t i = 0; i < values.size(); ++i) text << (i ? "," : "") << values[i];
  return text.str();
}

// One run's children: `np` ranks of torch_dist_bench.py with `mode_args`.
StatusOr<std::vector<nlohmann::json>> RunRanks(const TorchBenchOptions& o, const PythonSetup& py,
                                               const std::string& script,
                                               const std::string& store_dir, int np,
                                               const std::string& what,
                                               const std::vector<std::string>& mode_args) {
  // The ranks' job key (the tessera backend refuses to start without one), beside the store.
  const std::string key_file = store_dir + "/job.key";
  if (access(key_file.c_str(), F_OK) != 0) {
    RETURN_IF_ERROR(WriteKeyFile(key_file, JobKey::Generate()));
  }
  std::vector<ChildSpec> children;
  for (int rank = 0; rank < np; ++rank) {
    std::vector<std::string> argv = {"/usr/bin/env", "TESSERA_AUTH_KEY_FILE=" + key_file,
                                     "OMP_NUM_THREADS=" + std::to_string(o.threads),
                                     "OPENBLAS_NUM_THREADS=" + std::to_string(o.threads),
                                     "OMP_WAIT_POLICY=PASSIVE",
                                     "TESSERA_RING_TRANSPORT=" + o.ring_transport};
    // The OpenBLAS tessera-bench train uses too (tools/bench/train_run.cc).
    if (access(kOpenBlasPthreadDir, R_OK) == 0) {
      argv.push_back(std::string("LD_LIBRARY_PATH=") + kOpenBlasPthreadDir);
    }
    if (!py.pythonpath.empty()) argv.push_back("PYTHONPATH=" + py.pythonpath);
    for (const std::string& arg :
         {std::string(kPython), script, "--rank=" + std::to_string(rank),
          "--world=" + std::to_string(np), "--store-dir=" + store_dir,
          "--threads=" + std::to_string(o.threads), "--timeout-s=" + std::to_string(o.timeout_s),
          "--backends=" + std::string(np > 1 ? "gloo,tessera" : "")}) {
      argv.push_back(arg);
    }
    argv.insert(argv.end(), mode_args.begin(), mode_args.end());
    children.push_back({"torch_dist_bench.py " + what + " rank " + std::to_string(rank) + " of " +
                            std::to_string(np),
                        std::move(argv)});
  }
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion(children, int64_t{o.timeout_s} * 1000));
  std::vector<nlohmann::json> lines;
  for (const std::string& line : outputs[0].stdout_lines) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("bench")) lines.push_back(std::move(j));
  }
  return lines;
}

// Keys of the measured figures: (op, bytes, np, backend) and (model, np, backend), where np 1
// and backend "none" is the single-process reference.
using CollectiveKey = std::tuple<std::string, size_t, int64_t, std::string>;
using TrainKey = std::tuple<std::string, int64_t, std::string>;

struct Results {
  std::map<CollectiveKey, nlohmann::json> collectives;
  std::map<TrainKey, nlohmann::json> train;
  std::string tessera_channel;
};

void Collect(const std::vector<nlohmann::json>& lines, Results* results) {
  for (const nlohmann::json& j : lines) {
    const std::string bench = j.value("bench", "");
    if (bench == "torch_info") {
      if (results->tessera_channel.empty()) {
        results->tessera_channel = j.value("tessera_channel", "");
      }
    } else if (bench == "torch_collective") {
      results->collectives[{j.value("op", ""), j.value("bytes", size_t{0}),
                            j.value("world", int64_t{0}), j.value("backend", "")}] = j;
    } else if (bench == "torch_train") {
      results->train[{j.value("model", ""), j.value("world", int64_t{0}),
                      j.value("backend", "")}] = j;
    }
  }
}

Status Measure(const TorchBenchOptions& o, const PythonSetup& py, Results* results) {
  ASSIGN_OR_RETURN(std::string script, FindRunfile(kScript));
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchDirectory> scratch, ScratchDirectory::Create());
  int run = 0;
  // A fresh directory per run: the file store must not hold a previous run's keys.
  auto store_dir = [&]() -> StatusOr<std::string> {
    const std::string dir = scratch->path() + "/run" + std::to_string(run++);
    if (mkdir(dir.c_str(), 0700) != 0) {
      return UnavailableError("mkdir " + dir + ": " + std::strerror(errno));
    }
    return dir;
  };
  auto progress = [&](const std::string& what) {
    if (!o.json) std::cerr << "measuring " << what << "...\n";
  };
  if (!o.no_collectives) {
    for (int64_t np : o.nps) {
      ASSIGN_OR_RETURN(std::string dir, store_dir());
      progress("collectives, np " + std::to_string(np));
      ASSIGN_OR_RETURN(
          std::vector<nlohmann::json> lines,
          RunRanks(o, py, script, dir, static_cast<int>(np), "collectives",
                   {"--mode=collectives", "--ops=" + Join(o.ops), "--sizes=" + Join(o.sizes),
                    "--warmup=" + std::to_string(o.warmup), "--iters=" + std::to_string(o.iters),
                    "--seconds=" + std::to_string(o.seconds)}));
      Collect(lines, results);
      for (const std::string& op : o.ops) {
        for (size_t size : o.sizes) {
          for (const std::string& backend : kBackends) {
            const auto row = results->collectives.find({op, size, np, backend});
            if (row == results->collectives.end() || !(row->second.value("median_s", 0.0) > 0)) {
              return DataLossError("torch_dist_bench.py reported no time for " + op + " of " +
                                   std::to_string(size) + " bytes on " + backend + ", np " +
                                   std::to_string(np));
            }
          }
        }
      }
    }
  }
  if (o.no_train) return OkStatus();
  const std::vector<std::string> train_args = {
      "--mode=train", "--models=" + Join(o.models), "--batch-size=" + std::to_string(o.batch_size),
      "--steps=" + std::to_string(o.steps), "--warmup-steps=" + std::to_string(o.warmup_steps),
      "--repeats=" + std::to_string(o.repeats)};
  for (size_t i = 0; i < o.ddp_nps.size(); ++i) {
    const int64_t np = o.ddp_nps[i];
    // The single-process reference once, by rank 0 of the first DDP run, between its runs.
    const bool single = i == 0 && !o.no_single;
    std::vector<std::string> args = train_args;
    if (single) args.push_back("--single");
    ASSIGN_OR_RETURN(std::string dir, store_dir());
    progress("DDP training, np " + std::to_string(np) +
             (single ? " (and the single-process reference)" : ""));
    ASSIGN_OR_RETURN(std::vector<nlohmann::json> lines,
                     RunRanks(o, py, script, dir, static_cast<int>(np), "train", args));
    Collect(lines, results);
    std::vector<std::pair<int64_t, std::string>> expected = {{np, "gloo"}, {np, "tessera"}};
    if (single) expected.push_back({1, "none"});
    for (const std::string& model : o.models) {
      for (const auto& [n, backend] : expected) {
        const auto row = results->train.find({model, n, backend});
        if (row == results->train.end() || !(row->second.value("samples_per_second", 0.0) > 0)) {
          return DataLossError("torch_dist_bench.py reported no samples/s for " + model + " on " +
                               backend + ", np " + std::to_string(n));
        }
      }
    }
  }
  return OkStatus();
}

double TimeOf(const Results& r, const std::string& op, size_t size, int64_t np,
              const std::string& backend) {
  return r.collectives.at({op, size, np, backend}).at("median_s").get<double>();
}

double RateOf(const Results& r, const std::string& model, int64_t np, const std::string& backend) {
  return r.train.at({model, np, backend}).at("samples_per_second").get<double>();
}

nlohmann::json Goal(const std::string& goal, bool met, const std::string& detail) {
  return {{"benchmark", "torch"}, {"kind", "goal"}, {"goal", goal}, {"met", met},
          {"detail", detail}};
}

// The goals, from the measured ratios, for what was measured.
std::vector<nlohmann::json> CheckGoals(const TorchBenchOptions& o, const Results& r) {
  std::vector<nlohmann::json> goals;
  auto fixed = [](double value, int digits) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(digits) << value;
    return text.str();
  };
  const bool all_reduce = std::count(o.ops.begin(), o.ops.end(), "all_reduce") > 0;
  if (!o.no_collectives && all_reduce) {
    for (int64_t np : o.nps) {
      const std::string at = " (np " + std::to_string(np) + ")";
      if (std::count(o.sizes.begin(), o.sizes.end(), size_t{4096}) > 0) {
        const double g = TimeOf(r, "all_reduce", 4096, np, "gloo");
        const double t = TimeOf(r, "all_reduce", 4096, np, "tessera");
        goals.push_back(Goal("all_reduce >= 5x Gloo at 4 KiB" + at, g / t >= 5.0,
                             fixed(g / t, 2) + "x: " + fixed(t * 1e6, 1) + " us vs " +
                                 fixed(g * 1e6, 1) + " us"));
      }
      std::optional<std::pair<double, size_t>> worst;
      for (size_t size : o.sizes) {
        if (size < (1u << 20)) continue;
        const double ratio = TimeOf(r, "all_reduce", size, np, "gloo") /
                             TimeOf(r, "all_reduce", size, np, "tessera");
        if (!worst || ratio < worst->first) worst = {ratio, size};
      }
      if (worst) {
        goals.push_back(Goal("all_reduce >= 2x Gloo from 1 MiB" + at, worst->first >= 2.0,
                             "lowest " + fixed(worst->first, 2) + "x at " +
                                 HumanBytes(worst->second)));
      }
    }
  }
  if (!o.no_train && std::count(o.ddp_nps.begin(), o.ddp_nps.end(), 2) > 0) {
    for (const std::string& model : o.models) {
      const double g = RateOf(r, model, 2, "gloo"), t = RateOf(r, model, 2, "tessera");
      goals.push_back(Goal("DDP " + model + " samples/s >= 1.8x Gloo at 2 processes",
                           t / g >= 1.8,
                           fixed(t / g, 2) + "x: " + fixed(t, 0) + " vs " + fixed(g, 0) +
                               " samples/s"));
    }
  }
  return goals;
}

nlohmann::json Figures(const nlohmann::json& line, const std::vector<std::string>& keys) {
  nlohmann::json figures = nlohmann::json::object();
  for (const std::string& key : keys) {
    if (line.contains(key)) figures[key] = line.at(key);
  }
  return figures;
}

// The report: one JSON object per line (config, rows, goals) or the table.
void Report(const TorchBenchOptions& o, const PythonSetup& py, const Results& r) {
  const unsigned cores = std::thread::hardware_concurrency();
  const std::vector<nlohmann::json> goals = CheckGoals(o, r);
  if (o.json) {
    std::cout << nlohmann::json({{"benchmark", "torch"},
                                 {"kind", "config"},
                                 {"torch_version", py.torch_version},
                                 {"tessera_package", py.tessera_package},
                                 {"tessera_channel", r.tessera_channel},
                                 {"ring_transport", o.ring_transport},
                                 {"threads_per_rank", o.threads},
                                 {"cores", cores},
                                 {"dtype", "float32"},
                                 {"batch_size", o.batch_size},
                                 {"steps", o.steps},
                                 {"warmup_steps", o.warmup_steps},
                                 {"repeats", o.repeats}})
                     .dump()
              << "\n";
    for (const std::string& op : o.no_collectives ? std::vector<std::string>{} : o.ops) {
      for (int64_t np : o.nps) {
        for (size_t size : o.sizes) {
          const double g = TimeOf(r, op, size, np, "gloo");
          const double t = TimeOf(r, op, size, np, "tessera");
          nlohmann::json row = {{"benchmark", "torch"}, {"kind", "collective"}, {"op", op},
                                {"bytes", size},        {"np", np},           {"gloo_s", g},
                                {"tessera_s", t},       {"tessera_speedup", g / t}};
          for (const std::string& backend : kBackends) {
            row[backend] = Figures(r.collectives.at({op, size, np, backend}),
                                   {"iters", "median_s", "min_s", "mean_s"});
          }
          std::cout << row.dump() << "\n";
        }
      }
    }
    for (const std::string& model : o.no_train ? std::vector<std::string>{} : o.models) {
      for (int64_t np : o.ddp_nps) {
        const double g = RateOf(r, model, np, "gloo"), t = RateOf(r, model, np, "tessera");
        nlohmann::json row = {{"benchmark", "torch"},
                              {"kind", "train"},
                              {"model", model},
                              {"np", np},
                              {"batch_size", o.batch_size},
                              {"gloo_samples_per_second", g},
                              {"tessera_samples_per_second", t},
                              {"tessera_speedup", t / g}};
        for (const std::string& backend : kBackends) {
          row[backend] = Figures(r.train.at({model, np, backend}),
                                 {"samples_per_second", "runs_samples_per_second", "ms_per_step",
                                  "cpu_ms_per_step", "parameters"});
        }
        if (!o.no_single) {
          const double single = RateOf(r, model, 1, "none");
          row["single_samples_per_second"] = single;
          row["single"] = Figures(r.train.at({model, 1, "none"}),
                                  {"samples_per_second", "runs_samples_per_second",
                                   "ms_per_step", "cpu_ms_per_step", "parameters"});
          row["gloo_scaling"] = g / single;
          row["tessera_scaling"] = t / single;
        }
        std::cout << row.dump() << "\n";
      }
    }
    for (const nlohmann::json& goal : goals) std::cout << goal.dump() << "\n";
    return;
  }

  std::cout << "torch: torch.distributed on backends gloo and tessera, both groups in the same "
            << "rank processes, measured alternately\n"
            << "PyTorch " << py.torch_version << " (CPU) on " << cores << " cores; each rank: "
            << "torch.set_num_threads(" << o.threads << "), OMP_NUM_THREADS=" << o.threads
            << "; rendezvous through a file store\n"
            << "tessera: ring "
            << (r.tessera_channel.empty() ? "(not reported)" : r.tessera_channel)
            << "; package " << py.tessera_package << "\n";
  if (!o.no_collectives) {
    std::cout << "\ncollectives: float32, size = bytes of each rank's tensor (all_gather "
              << "returns np x size); time = median over iterations of the slowest rank, an "
              << "iteration being a barrier of the backend's group, then one call timed; "
              << "speedup = gloo time / tessera time\n\n"
              << std::left << std::setw(12) << "op" << std::setw(9) << "size" << std::right
              << std::setw(4) << "np" << std::setw(12) << "gloo us" << std::setw(12)
              << "tessera us" << std::setw(10) << "speedup" << "\n";
    for (const std::string& op : o.ops) {
      for (int64_t np : o.nps) {
        for (size_t size : o.sizes) {
          const double g = TimeOf(r, op, size, np, "gloo");
          const double t = TimeOf(r, op, size, np, "tessera");
          std::cout << std::left << std::setw(12) << op << std::setw(9) << HumanBytes(size)
                    << std::right << std::setw(4) << np << std::fixed << std::setprecision(1)
                    << std::setw(12) << g * 1e6 << std::setw(12) << t * 1e6
                    << std::setprecision(2) << std::setw(9) << g / t << "x\n";
        }
      }
    }
  }
  if (!o.no_train) {
    std::cout << "\nDDP training: SGD lr 0.01, batch " << o.batch_size << " per rank, synthetic "
              << "data; samples/s of all ranks over the slowest rank's time, median of "
              << o.repeats << " runs of " << o.steps << " steps (after " << o.warmup_steps
              << " untimed) per backend, alternating; single = rank 0 alone without DDP ("
              << o.threads << " thread(s)) after each pair of runs; scaling = samples/s / "
              << "single's; cpu ms/step = CPU time per step of the busiest rank, all its "
              << "threads (single/gloo/tessera): "
              << "a wall time per step well above it is time spent waiting\n"
              << "mlp: 784-1024-1024-10; cnn: conv3x3 1-32, pool, conv3x3 32-64, pool, "
              << "fc 3136-128, fc 128-10 on 1x28x28\n\n"
              << std::left << std::setw(7) << "model" << std::right << std::setw(4) << "np"
              << std::setw(12) << "single/s" << std::setw(12) << "gloo/s" << std::setw(12)
              << "tessera/s" << std::setw(10) << "speedup";
    if (!o.no_single) {
      std::cout << std::setw(14) << "gloo scaling" << std::setw(17) << "tessera scaling";
    }
    std::cout << "  cpu ms/step\n";
    for (const std::string& model : o.models) {
      for (int64_t np : o.ddp_nps) {
        const double g = RateOf(r, model, np, "gloo"), t = RateOf(r, model, np, "tessera");
        std::cout << std::left << std::setw(7) << model << std::right << std::setw(4) << np
                  << std::fixed << std::setprecision(0) << std::setw(12);
        if (o.no_single) std::cout << "-";
        else std::cout << RateOf(r, model, 1, "none");
        std::cout << std::setw(12) << g << std::setw(12) << t << std::setprecision(2)
                  << std::setw(9) << t / g << "x";
        if (!o.no_single) {
          const double single = RateOf(r, model, 1, "none");
          std::cout << std::setw(13) << g / single << "x" << std::setw(16) << t / single << "x";
        }
        auto cpu = [&](int64_t n, const std::string& backend) {
          std::ostringstream text;
          text << std::fixed << std::setprecision(1)
               << r.train.at({model, n, backend}).value("cpu_ms_per_step", 0.0);
          return text.str();
        };
        std::cout << "  " << (o.no_single ? "-" : cpu(1, "none")) << "/" << cpu(np, "gloo") << "/"
                  << cpu(np, "tessera") << "\n";
      }
    }
  }
  if (!goals.empty()) std::cout << "\ngoals:\n";
  for (const nlohmann::json& goal : goals) {
    std::cout << "  " << (goal.at("met").get<bool>() ? "met    " : "MISSED ")
              << goal.at("goal").get<std::string>() << ": " << goal.at("detail").get<std::string>()
              << "\n";
  }
}

int RunTorchBench(const TorchBenchOptions& o, const TorchFsdpOptions& fsdp) {
  StatusOr<PythonSetup> py = ProbePython();
  if (!py.ok()) {
    std::cerr << "tessera-bench torch: " << py.status() << "\n";
    return 1;
  }
  if (!py->skipped.empty()) {
    if (o.json) {
      std::cerr << "tessera-bench torch: skipped: " << py->skipped << "\n";
      std::cout << nlohmann::json({{"benchmark", "torch"}, {"kind", "skipped"},
                                   {"skipped", py->skipped}})
                       .dump()
                << "\n";
    } else {
      std::cout << "torch: skipped (" << py->skipped << ")\n";
    }
    return 0;
  }
  if (fsdp.enabled) {
    return RunTorchFsdpBench(fsdp, {*py, o.threads, o.ring_transport, o.timeout_s, o.json});
  }
  Results results;
  Status status = Measure(o, *py, &results);
  if (!status.ok()) {
    std::cerr << "tessera-bench torch: " << status << "\n";
    return 1;
  }
  Report(o, *py, results);
  return 0;
}

}  // namespace

BenchCommand AddTorchBench(CLI::App* parent) {
  auto o = std::make_shared<TorchBenchOptions>();
  auto fsdp = std::make_shared<TorchFsdpOptions>();
  CLI::App* app = parent->add_subcommand(
      "torch",
      "torch.distributed from Python on backend tessera vs gloo, side by side: collectives "
      "(all_reduce, all_gather, broadcast) and DDP training samples/s; with --fsdp, FSDP "
      "beside DDP on a GPT-like model");
  app->footer(
      "Every rank is /usr/bin/python3 tools/bench/torch_dist_bench.py holding one group of each "
      "backend; they alternate in the same processes. Skips (exit 0, saying why) when "
      "/usr/bin/python3 cannot import torch.distributed or tessera.torch (taken from this "
      "binary's runfiles, else the interpreter's path: tools/install_python.sh).\n"
      "Quick look:  tessera-bench torch --np 2 --sizes 4K,1M --models mlp --repeats 1\n"
      "FSDP (issue 44), ranks of tools/bench/torch_fsdp_bench.py:  tessera-bench torch --fsdp "
      "[--fsdp-np 2,4] [--strategies ...] [--memory-limit 1536M]");
  app->add_option("--np", o->np_text, "Processes of the collectives, comma-separated (2-64)")
      ->capture_default_str();
  app->add_option("--ops", o->ops_text,
                  "Collectives, comma-separated: all_reduce (sum), all_gather, broadcast (root 0)")
      ->capture_default_str();
  app->add_option("--sizes", o->sizes_text,
                  "Bytes of each rank's float32 tensor, comma-separated; K, M, G suffixes "
                  "(binary)")
      ->capture_default_str();
  app->add_option("--warmup", o->warmup, "Untimed calls per (op, size, backend); at least 1")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--iters", o->iters,
                  "Timed calls per (op, size, backend); 0: as fit in --seconds")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app->add_option("--seconds", o->seconds,
                  "Time per (op, size, backend) when --iters is 0 (5 to 10000 iterations)")
      ->check(FiniteRange(0, 600))
      ->capture_default_str();
  app->add_option("--models", o->models_text, "DDP models, comma-separated: mlp, cnn")
      ->capture_default_str();
  app->add_option("--ddp-np", o->ddp_np_text, "Processes of DDP training, comma-separated (2-64)")
      ->capture_default_str();
  app->add_option("--batch-size", o->batch_size, "Samples per rank and step")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app->add_option("--steps", o->steps, "Timed training steps per run")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app->add_option("--warmup-steps", o->warmup_steps, "Untimed training steps before each run")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app->add_option("--repeats", o->repeats,
                  "Training runs per (model, np, backend), alternating the backends; the median "
                  "counts")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--threads", o->threads,
                  "torch threads of each rank and of the single process (torch.set_num_threads, "
                  "OMP_NUM_THREADS)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--ring-transport", o->ring_transport,
                  "The tessera backend's ring: auto, shm, links or zmq (TESSERA_RING_TRANSPORT)")
      ->check(CLI::IsMember({"auto", "shm", "links", "zmq"}))
      ->capture_default_str();
  app->add_flag("--no-collectives", o->no_collectives, "Only DDP training");
  app->add_flag("--no-train", o->no_train, "Only the collectives");
  app->add_flag("--no-single", o->no_single,
                "No single-process training reference (and no scaling columns)");
  app->add_option("--timeout-s", o->timeout_s, "Deadline of each run of the rank processes")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--json", o->json,
                "One JSON object per line (config, then a row per collective and model, then "
                "the goals) instead of the table");
  AddTorchFsdpOptions(app, fsdp.get());
  return {app, [o, fsdp, app]() -> int {
            Status status =
                fsdp->enabled ? ParseTorchFsdpOptions(fsdp.get()) : ParseOptions(o.get());
            if (!status.ok()) {
              std::cerr << "tessera-bench torch: " << status.message() << "\n";
              return 2;
            }
            // --fsdp has defaults of its own for the training flags it shares.
            if (app->count("--batch-size")) fsdp->batch_size = o->batch_size;
            if (app->count("--steps")) fsdp->steps = o->steps;
            if (app->count("--warmup-steps")) fsdp->warmup_steps = o->warmup_steps;
            if (app->count("--repeats")) fsdp->repeats = o->repeats;
            return RunTorchBench(*o, *fsdp);
          }};
}

}  // namespace tessera::tools
