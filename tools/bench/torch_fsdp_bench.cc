#include "tools/bench/torch_fsdp_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/security/job_key.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/emulated_hosts.h"
#include "tools/bench/memory_limiter.h"

namespace tessera::tools {
namespace {

constexpr char kScript[] = "tools/bench/torch_fsdp_bench.py";
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                              "HYBRID_SHARD"};
// Parameter, gradient and momentum: float32 each.
constexpr double kStateBytesPerParameter = 12.0;

std::string Fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

std::string MiB(double bytes) { return Fixed(bytes / (1 << 20), 0); }

StatusOr<int64_t> ParseMemoryLimit(const std::string& text) {
  size_t end = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &end);
  } catch (const std::exception&) {
    return InvalidArgumentError("--memory-limit=\"" + text + "\": not a size (e.g. 1536M, 2G)");
  }
  const std::string unit = text.substr(end);
  int shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  else if (!unit.empty()) {
    return InvalidArgumentError("--memory-limit=\"" + text + "\": unit \"" + unit +
                                "\" is not K, M or G");
  }
  if (value < 0 || value > (int64_t{1} << (40 - shift))) {
    return InvalidArgumentError("--memory-limit=\"" + text + "\": not in [0, 1T]");
  }
  value <<= shift;
  if (value != 0 && value < (int64_t{256} << 20)) {
    return InvalidArgumentError("--memory-limit=\"" + text + "\": below 256M, less than a "
                                "process of torch holds before any model");
  }
  return value;
}

// One set of rank processes: the model's shape and what runs.
struct RunSpec {
  std::string config;  // ddp-tessera, ddp-gloo or a strategy
  int np = 2;
  int dim = 0, layers = 0, heads = 0, vocab = 0, seq = 0, batch_size = 0;
  int steps = 0, warmup_steps = 0;
  int hybrid_shard_size = 0;
  int64_t memory_limit = 0;  // 0: none
  int64_t malloc_mmap_threshold = 0;  // 0: glibc's default
  // FSDP builds the model on the meta device and materializes it unit by unit (param_init_fn),
  // as a model larger than a rank's memory must be made.
  bool meta_init = false;
  const EmulatedHosts* hosts = nullptr;  // not null: np / kHosts consecutive ranks per host
};

constexpr char kHostsSuffix[] = "@hosts";

class Runner {
 public:
  Runner(const TorchRankSetup& setup, std::string script, std::unique_ptr<ScratchDirectory> dir)
      : setup_(setup), script_(std::move(script)), scratch_(std::move(dir)) {}

  // Runs `spec`'s ranks; returns rank 0's torch_fsdp line, or the failure.
  StatusOr<nlohmann::json> Run(const RunSpec& spec, MemoryLimiter* limiter) {
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
    for (int rank = 0; rank < spec.np; ++rank) {
      std::vector<std::string> argv = {
          "/usr/bin/env", "TESSERA_AUTH_KEY_FILE=" + key_file,
          "OMP_NUM_THREADS=" + std::to_string(setup_.threads),
          "OPENBLAS_NUM_THREADS=" + std::to_string(setup_.threads), "OMP_WAIT_POLICY=PASSIVE",
          "TESSERA_RING_TRANSPORT=" + setup_.ring_transport};
      if (access(kOpenBlasPthreadDir, R_OK) == 0) {
        argv.push_back(std::string("LD_LIBRARY_PATH=") + kOpenBlasPthreadDir);
      }
      if (!setup_.python.pythonpath.empty()) {
        argv.push_back("PYTHONPATH=" + setup_.python.pythonpath);
      }
      if (spec.malloc_mmap_threshold > 0) {
        // A fixed threshold: every larger block is its own mapping, returned when freed.
        // glibc's default raises the threshold to the largest block freed so far (up to 32
        // MiB), after which unit-sized tensors come from the heap, which then grows with
        // fragmentation (measured at 4 blocks of dim 768, 2 ranks: FULL_SHARD's peak 579 MiB
        // with the default, 350 MiB with 128 KiB; DDP's 688 and 610).
        argv.push_back("MALLOC_MMAP_THRESHOLD_=" + std::to_string(spec.malloc_mmap_threshold));
      }
      const int host = spec.np > 0 ? rank / std::max(1, spec.np / EmulatedHosts::kHosts) : 0;
      if (spec.hosts != nullptr) {
        argv.push_back("TESSERA_BIND_HOST=" + EmulatedHosts::Address(host));
        argv.push_back("GLOO_SOCKET_IFNAME=eth0");
      }
      for (const std::string& arg :
           {std::string(kPython), script_, "--config=" + spec.config,
            "--rank=" + std::to_string(rank), "--world=" + std::to_string(spec.np),
            "--store-dir=" + store_dir, "--threads=" + std::to_string(setup_.threads),
            "--timeout-s=" + std::to_string(setup_.timeout_s),
            "--dim=" + std::to_string(spec.dim), "--layers=" + std::to_string(spec.layers),
            "--heads=" + std::to_string(spec.heads), "--vocab=" + std::to_string(spec.vocab),
            "--seq=" + std::to_string(spec.seq),
            "--batch-size=" + std::to_string(spec.batch_size),
            "--steps=" + std::to_string(spec.steps),
            "--warmup-steps=" + std::to_string(spec.warmup_steps),
            "--hybrid-shard-size=" + std::to_string(spec.hybrid_shard_size)}) {
        argv.push_back(arg);
      }
      if (spec.meta_init) argv.push_back("--meta-init");
      if (spec.hosts != nullptr) argv = spec.hosts->Wrap(host, argv);
      if (spec.memory_limit > 0) {
        ASSIGN_OR_RETURN(argv, limiter->Wrap("r" + std::to_string(rank), spec.memory_limit,
                                             std::move(argv)));
      }
      children.push_back({"torch_fsdp_bench.py " + spec.config + " (" +
                              std::to_string(spec.layers) + " layers) rank " +
                              std::to_string(rank) + " of " + std::to_string(spec.np),
                          std::move(argv)});
    }
    StatusOr<std::vector<ChildOutput>> outputs =
        RunAllToCompletion(children, int64_t{setup_.timeout_s} * 1000);
    if (!outputs.ok()) return outputs.status();
    std::optional<nlohmann::json> row;
    for (const nlohmann::json& j : BenchLines({(*outputs)[0]}, "torch_fsdp_info")) {
      // The first run's (on one host), with the first FSDP run's wrap policy source.
      if (info_.is_null()) info_ = j;
      if (info_.value("wrap_policy", "").empty()) info_["wrap_policy"] = j.value("wrap_policy", "");
    }
    for (const nlohmann::json& j : BenchLines({(*outputs)[0]}, "torch_fsdp")) row = j;
    if (!row || !(row->value("step_s", 0.0) > 0)) {
      return DataLossError("torch_fsdp_bench.py " + spec.config + " at np " +
                           std::to_string(spec.np) + " reported no step time");
    }
    return *row;
  }

  const nlohmann::json& info() const { return info_; }
  const TorchRankSetup& setup() const { return setup_; }

 private:
  const TorchRankSetup& setup_;
  const std::string script_;
  std::unique_ptr<ScratchDirectory> scratch_;
  int run_ = 0;
  nlohmann::json info_;
};

// The measured rows, by (np, config), each the median of --repeats runs.
using Rows = std::map<std::pair<int64_t, std::string>, nlohmann::json>;

std::vector<std::string> Configs(const TorchFsdpOptions& o) {
  std::vector<std::string> configs = {"ddp-tessera", "ddp-gloo"};
  if (o.hybrid_netns) configs.push_back(std::string("ddp-tessera") + kHostsSuffix);
  configs.insert(configs.end(), o.strategies.begin(), o.strategies.end());
  return configs;
}

// HYBRID_SHARD runs where the hosts divide np into shard groups of at least 2 ranks.
bool HybridRuns(const TorchFsdpOptions& o, int64_t np) {
  return np % o.hybrid_hosts == 0 && np / o.hybrid_hosts >= 2;
}

// config: a configuration, or ddp-tessera@hosts (DDP across the emulated hosts).
RunSpec ModelSpec(const TorchFsdpOptions& o, const std::string& config, int64_t np,
                  const EmulatedHosts* hosts) {
  RunSpec spec;
  const size_t at = config.find(kHostsSuffix);
  spec.config = config.substr(0, at);
  if (at != std::string::npos || (config == "HYBRID_SHARD" && o.hybrid_netns)) {
    spec.hosts = hosts;
  }
  spec.np = static_cast<int>(np);
  spec.dim = o.dim;
  spec.layers = o.layers;
  spec.heads = o.heads;
  spec.vocab = o.vocab;
  spec.seq = o.seq;
  spec.batch_size = o.batch_size;
  spec.steps = o.steps;
  spec.warmup_steps = o.warmup_steps;
  spec.malloc_mmap_threshold = o.malloc_mmap_threshold;
  // Across network-namespace hosts hybrid_groups() finds the hosts by hostname.
  if (config == "HYBRID_SHARD" && spec.hosts == nullptr) {
    spec.hybrid_shard_size = static_cast<int>(np / o.hybrid_hosts);
  }
  return spec;
}

// The two largest units unsharded: their gathered parameters and full gradients (float32), what
// a unit holds while its backward runs (the one computing, the one prefetched or reducing).
double TwoUnitsBytes(const nlohmann::json& row) {
  std::vector<int64_t> numels = row.value("unit_numels", std::vector<int64_t>{});
  std::sort(numels.rbegin(), numels.rend());
  double bytes = 0;
  for (size_t i = 0; i < numels.size() && i < 2; ++i) bytes += 8.0 * numels[i];
  return bytes;
}

// What the formula expects of FULL_SHARD's state at np ranks: 12 P / N plus two units.
double ExpectedFullShardBytes(const nlohmann::json& row, int64_t np) {
  return kStateBytesPerParameter * row.value("parameters", 0.0) / np + TwoUnitsBytes(row);
}

Status Measure(const TorchFsdpOptions& o, Runner* runner, const EmulatedHosts* hosts,
               Rows* rows) {
  for (int64_t np : o.nps) {
    std::map<std::string, std::vector<nlohmann::json>> runs;
    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      std::vector<std::string> order = Configs(o);
      if (repeat % 2 == 1) std::reverse(order.begin(), order.end());
      for (const std::string& config : order) {
        const bool across_hosts = config == "HYBRID_SHARD" ||
                                  config.find(kHostsSuffix) != std::string::npos;
        if (across_hosts && !HybridRuns(o, np)) continue;
        if (!runner->setup().json) {
          std::cerr << "measuring " << config << " at np " << np << " (run " << repeat + 1
                    << " of " << o.repeats << ")...\n";
        }
        ASSIGN_OR_RETURN(nlohmann::json row, runner->Run(ModelSpec(o, config, np, hosts), nullptr));
        runs[config].push_back(std::move(row));
      }
    }
    for (auto& [config, list] : runs) {
      // The run of median step time stands for the config; the figures of every run are kept.
      std::vector<double> steps, peaks;
      for (const nlohmann::json& run : list) {
        steps.push_back(run.at("step_s").get<double>());
        peaks.push_back(run.at("peak_bytes").get<double>());
      }
      nlohmann::json row = list[0];
      row["step_s"] = Median(steps);
      row["peak_bytes"] = Median(peaks);
      row["runs_step_s"] = steps;
      (*rows)[{np, config}] = row;
    }
  }
  return OkStatus();
}

// The memory-limit search for one config: the largest depth that trains under the limit.
struct LimitResult {
  std::string config;
  int layers = 0;  // 0: not even one layer fits
  int64_t parameters = 0;
  bool capped = false;  // --memory-max-layers fit: the largest is at least that
  std::vector<nlohmann::json> probes;  // {layers, parameters?, fits, reason?}
};

StatusOr<LimitResult> SearchLimit(const TorchFsdpOptions& o, Runner* runner,
                                  MemoryLimiter* limiter, const std::string& config) {
  LimitResult result;
  result.config = config;
  auto probe = [&](int layers) -> StatusOr<bool> {
    RunSpec spec;
    spec.config = config;
    spec.np = o.memory_np;
    spec.dim = o.memory_dim;
    spec.layers = layers;
    spec.heads = o.memory_heads;
    spec.vocab = o.vocab;
    spec.seq = o.memory_seq;
    spec.batch_size = 1;
    spec.steps = o.memory_steps;
    spec.warmup_steps = 1;
    spec.memory_limit = o.memory_limit;
    spec.malloc_mmap_threshold = o.malloc_mmap_threshold;
    spec.meta_init = true;  // the rank script builds DDP's model whole either way
    if (!runner->setup().json) {
      std::cerr << "memory limit " << HumanBytes(o.memory_limit) << ": " << config << " with "
                << layers << " layers...\n";
    }
    StatusOr<nlohmann::json> row = runner->Run(spec, limiter);
    const bool oom = limiter->OomKilled();
    limiter->Clear();
    nlohmann::json record = {{"layers", layers}, {"fits", row.ok()}};
    if (row.ok()) {
      record["parameters"] = row->value("parameters", int64_t{0});
      record["peak_bytes"] = row->value("peak_bytes", 0.0);
      if (layers > result.layers) {
        result.layers = layers;
        result.parameters = row->value("parameters", int64_t{0});
      }
    } else {
      std::string reason(row.status().message());
      record["reason"] = (oom ? "OOM-killed: " : "") + reason.substr(0, reason.find('\n'));
      // A failure that is not the limit's (cgroups tell) is a failure of the benchmark.
      if (!oom && limiter->method().rfind("cgroup", 0) == 0) return row.status();
    }
    result.probes.push_back(record);
    return row.ok();
  };
  int good = 0, bad = 0;
  for (int layers = 1; layers <= o.memory_max_layers; layers *= 2) {
    ASSIGN_OR_RETURN(bool fits, probe(layers));
    if (!fits) {
      bad = layers;
      break;
    }
    good = layers;
  }
  result.capped = bad == 0;
  // Bisect between the last depth that fit and the first that did not, to within an eighth.
  while (bad > 0 && good > 0 && bad - good > std::max(1, good / 8)) {
    const int middle = (good + bad) / 2;
    ASSIGN_OR_RETURN(bool fits, probe(middle));
    (fits ? good : bad) = middle;
  }
  return result;
}

struct Report {
  Rows rows;
  std::vector<LimitResult> limits;
  std::string limit_method;
};

nlohmann::json Goal(const std::string& goal, bool met, const std::string& detail) {
  return {{"benchmark", "torch"}, {"kind", "goal"}, {"goal", goal}, {"met", met},
          {"detail", detail}};
}

std::vector<nlohmann::json> CheckGoals(const TorchFsdpOptions& o, const Report& r) {
  std::vector<nlohmann::json> goals;
  for (int64_t np : o.nps) {
    const std::string at = " (np " + std::to_string(np) + ")";
    const double ddp = r.rows.at({np, "ddp-tessera"}).at("step_s").get<double>();
    for (const auto& [strategy, bound] : std::vector<std::pair<std::string, double>>{
             {"SHARD_GRAD_OP", 1.1}, {"FULL_SHARD", 1.3}, {"HYBRID_SHARD", 1.2}}) {
      const auto row = r.rows.find({np, strategy});
      if (row == r.rows.end()) continue;
      double ratio = row->second.at("step_s").get<double>() / ddp;
      std::string what = strategy + " step time <= " + Fixed(bound, 1) + "x DDP on tessera";
      if (strategy == "HYBRID_SHARD" && o.hybrid_netns) {
        ratio = row->second.at("step_s").get<double>() /
                r.rows.at({np, std::string("ddp-tessera") + kHostsSuffix})
                    .at("step_s")
                    .get<double>();
        what += " across 2 emulated hosts (network namespaces; DDP across the same)";
      } else if (strategy == "HYBRID_SHARD") {
        what += " (" + std::to_string(o.hybrid_hosts) + " hosts emulated as rank blocks)";
      }
      goals.push_back(Goal(what + at, ratio <= bound, Fixed(ratio, 2) + "x"));
    }
    const auto full = r.rows.find({np, "FULL_SHARD"});
    if (full != r.rows.end()) {
      const double state = full->second.at("peak_bytes").get<double>() -
                           full->second.value("activation_bytes", 0.0);
      const double expected = ExpectedFullShardBytes(full->second, np);
      goals.push_back(Goal("FULL_SHARD peak memory (less activations) within 10% of 12P/N + "
                           "two units" + at,
                           state <= 1.1 * expected,
                           MiB(state) + " MiB vs " + MiB(expected) + " MiB: " +
                               Fixed(state / expected, 2) + "x"));
    }
  }
  if (r.limits.size() == 2) {
    const LimitResult& ddp = r.limits[0];
    const LimitResult& full = r.limits[1];
    const double ratio = ddp.parameters > 0
                             ? static_cast<double>(full.parameters) / ddp.parameters : 0.0;
    const std::string what = "FULL_SHARD's largest model >= 3x DDP's under " +
                             HumanBytes(o.memory_limit) + " per rank (np " +
                             std::to_string(o.memory_np) + ")";
    if (ddp.capped) {
      // DDP's own largest is unknown: no ratio.
      goals.push_back(Goal(what, false,
                           "not measured: DDP fit the deepest model tried (" +
                               std::to_string(ddp.layers) + " layers); raise "
                               "--memory-max-layers or lower --memory-limit"));
    } else {
      goals.push_back(Goal(what, ratio >= 3.0,
                           Fixed(ratio, 2) + "x" + (full.capped ? " or more" : "") + ": " +
                               std::to_string(full.layers) + " vs " +
                               std::to_string(ddp.layers) + " layers, " +
                               Fixed(full.parameters / 1e6, 1) + "M vs " +
                               Fixed(ddp.parameters / 1e6, 1) + "M parameters"));
    }
  }
  return goals;
}

nlohmann::json JsonRow(const TorchFsdpOptions& o, const Report& r, int64_t np,
                       const std::string& config) {
  const nlohmann::json& m = r.rows.at({np, config});
  const double ddp = r.rows.at({np, "ddp-tessera"}).at("step_s").get<double>();
  const double gloo = r.rows.at({np, "ddp-gloo"}).at("step_s").get<double>();
  const double step = m.at("step_s").get<double>();
  const double peak = m.at("peak_bytes").get<double>();
  const double activations = m.value("activation_bytes", 0.0);
  nlohmann::json row = {{"benchmark", "torch"},
                        {"kind", "fsdp"},
                        {"config", config},
                        {"strategy", m.value("strategy", "")},
                        {"backend", m.value("backend", "")},
                        {"np", np},
                        {"parameters", m.value("parameters", int64_t{0})},
                        {"step_s", step},
                        {"runs_step_s", m.value("runs_step_s", std::vector<double>{})},
                        {"steps_s", m.value("steps_s", std::vector<double>{})},
                        {"step_time_over_ddp", step / ddp},
                        {"step_time_over_gloo_ddp", step / gloo},
                        {"peak_bytes", peak},
                        {"peak_bytes_per_rank", m.value("peak_bytes_per_rank",
                                                        std::vector<double>{})},
                        {"activation_bytes", activations},
                        {"state_bytes", peak - activations},
                        {"ddp_state_bytes", kStateBytesPerParameter *
                                                m.value("parameters", 0.0)},
                        {"two_units_bytes", TwoUnitsBytes(m)},
                        {"rank0_losses", m.value("rank0_losses", std::vector<double>{})}};
  if (config == "FULL_SHARD") row["expected_state_bytes"] = ExpectedFullShardBytes(m, np);
  if (config == "HYBRID_SHARD" && o.hybrid_netns) {
    row["hybrid_hosts"] = EmulatedHosts::kHosts;
    row["hosts_emulated"] = "network namespaces (own net, /dev/shm, hostname)";
    const nlohmann::json& same_hosts = r.rows.at({np, std::string("ddp-tessera") + kHostsSuffix});
    row["step_time_over_ddp_same_hosts"] = step / same_hosts.at("step_s").get<double>();
  } else if (config == "HYBRID_SHARD") {
    row["hybrid_hosts"] = o.hybrid_hosts;
    row["hosts_emulated"] = "rank blocks on one machine (hybrid_groups(shard_size))";
  }
  if (config.find(kHostsSuffix) != std::string::npos) {
    row["hosts_emulated"] = "network namespaces (own net, /dev/shm, hostname)";
  }
  return row;
}

void Print(const TorchFsdpOptions& o, const TorchRankSetup& setup, const nlohmann::json& info,
           const Report& r) {
  const std::vector<nlohmann::json> goals = CheckGoals(o, r);
  const nlohmann::json& any = r.rows.begin()->second;
  if (setup.json) {
    std::cout << nlohmann::json({{"benchmark", "torch"},
                                 {"kind", "config"},
                                 {"mode", "fsdp"},
                                 {"torch_version", setup.python.torch_version},
                                 {"tessera_package", setup.python.tessera_package},
                                 {"tessera_channel", info.value("tessera_channel", "")},
                                 {"wrap_policy", info.value("wrap_policy", "")},
                                 {"peak_reset", info.value("peak_reset", false)},
                                 {"threads_per_rank", setup.threads},
                                 {"dim", o.dim},
                                 {"layers", o.layers},
                                 {"heads", o.heads},
                                 {"vocab", o.vocab},
                                 {"seq", o.seq},
                                 {"parameters", any.value("parameters", int64_t{0})},
                                 {"batch_size", o.batch_size},
                                 {"steps", o.steps},
                                 {"warmup_steps", o.warmup_steps},
                                 {"repeats", o.repeats},
                                 {"hybrid_hosts", o.hybrid_hosts},
                                 {"malloc_mmap_threshold", o.malloc_mmap_threshold}})
                     .dump()
              << "\n";
    for (int64_t np : o.nps) {
      for (const std::string& config : Configs(o)) {
        if (r.rows.count({np, config})) std::cout << JsonRow(o, r, np, config).dump() << "\n";
      }
    }
    for (const LimitResult& limit : r.limits) {
      std::cout << nlohmann::json({{"benchmark", "torch"},
                                   {"kind", "fsdp_memory_limit"},
                                   {"config", limit.config},
                                   {"strategy", limit.config == "ddp-tessera" ? "DDP"
                                                                              : limit.config},
                                   {"np", o.memory_np},
                                   {"memory_limit_bytes", o.memory_limit},
                                   {"method", r.limit_method},
                                   {"dim", o.memory_dim},
                                   {"largest_layers", limit.layers},
                                   {"largest_parameters", limit.parameters},
                                   {"capped_by_max_layers", limit.capped},
                                   {"probes", limit.probes}})
                       .dump()
                << "\n";
    }
    for (const nlohmann::json& goal : goals) std::cout << goal.dump() << "\n";
    return;
  }
  std::cout << "torch --fsdp: a GPT-like model under DDP (tessera, gloo) and tessera's FSDP; "
            << "one run of np processes per configuration\n"
            << "PyTorch " << setup.python.torch_version << " (CPU); each rank: "
            << setup.threads << " thread(s); tessera ring "
            << info.value("tessera_channel", "(not reported)") << "; wrap policy from "
            << info.value("wrap_policy", "?") << "\n"
            << "model: dim " << o.dim << ", " << o.layers << " blocks, " << o.heads
            << " heads, vocab " << o.vocab << ", seq " << o.seq << ", tied head: "
            << Fixed(any.value("parameters", 0.0) / 1e6, 1) << "M parameters; batch "
            << o.batch_size << " per rank; SGD momentum 0.9\n"
            << "step = median over " << o.steps << " timed steps (after " << o.warmup_steps
            << ") of the slowest rank";
  if (o.repeats > 1) std::cout << ", median of " << o.repeats << " runs";
  std::cout << "; glibc MALLOC_MMAP_THRESHOLD_ "
            << (o.malloc_mmap_threshold > 0 ? std::to_string(o.malloc_mmap_threshold)
                                            : std::string("default (dynamic)"))
            << "; x ddp = step / DDP-on-tessera's step; peak = VmHWM growth over the steps "
            << "(max over ranks" << (info.value("peak_reset", false) ? "" : "; NOT reset after "
                                                                           "construction")
            << "); act = activations autograd saved; state = peak - act; formula = 12P/N + two "
            << "largest units (FULL_SHARD)\n";
  if (std::count(o.strategies.begin(), o.strategies.end(), "HYBRID_SHARD") &&
      o.hybrid_netns) {
    std::cout << "HYBRID_SHARD and ddp-tessera@hosts: ranks on 2 emulated hosts (network, mount "
              << "and UTS namespaces: own addresses, /dev/shm and hostnames); hybrid_groups() "
              << "by hostname; x ddp of HYBRID_SHARD's goal: over ddp-tessera@hosts\n";
  } else if (std::count(o.strategies.begin(), o.strategies.end(), "HYBRID_SHARD")) {
    std::cout << "HYBRID_SHARD: " << o.hybrid_hosts << " hosts emulated as blocks of np/"
              << o.hybrid_hosts << " consecutive ranks on this machine "
              << "(hybrid_groups(shard_size)), not separate hosts\n";
  }
  std::cout << "\n"
            << std::left << std::setw(18) << "config" << std::right << std::setw(4) << "np"
            << std::setw(10) << "step ms" << std::setw(8) << "x ddp" << std::setw(8) << "x gloo"
            << std::setw(10) << "peak MiB" << std::setw(9) << "act MiB" << std::setw(11)
            << "state MiB" << std::setw(13) << "formula MiB" << std::setw(11) << "last loss"
            << "\n";
  for (int64_t np : o.nps) {
    for (const std::string& config : Configs(o)) {
      if (!r.rows.count({np, config})) continue;
      const nlohmann::json row = JsonRow(o, r, np, config);
      const std::vector<double> losses = row.at("rank0_losses").get<std::vector<double>>();
      std::cout << std::left << std::setw(18) << config << std::right << std::setw(4) << np
                << std::setw(10) << Fixed(row.at("step_s").get<double>() * 1e3, 0)
                << std::setw(7) << Fixed(row.at("step_time_over_ddp").get<double>(), 2) << "x"
                << std::setw(7) << Fixed(row.at("step_time_over_gloo_ddp").get<double>(), 2)
                << "x" << std::setw(10) << MiB(row.at("peak_bytes").get<double>())
                << std::setw(9) << MiB(row.at("activation_bytes").get<double>())
                << std::setw(11) << MiB(row.at("state_bytes").get<double>()) << std::setw(13)
                << (row.contains("expected_state_bytes")
                        ? MiB(row.at("expected_state_bytes").get<double>())
                        : std::string("-"))
                << std::setw(11) << (losses.empty() ? "-" : Fixed(losses.back(), 4)) << "\n";
    }
  }
  if (!r.limits.empty()) {
    std::cout << "\nlargest model under " << HumanBytes(o.memory_limit) << " per rank ("
              << r.limit_method << "), np " << o.memory_np << ", dim " << o.memory_dim
              << ", seq " << o.memory_seq << ", batch 1, " << o.memory_steps
              << " steps after 1; depth doubled, then bisected:\n";
    for (const LimitResult& limit : r.limits) {
      std::cout << "  " << std::left << std::setw(13) << limit.config << std::right
                << std::setw(5) << limit.layers << " layers, " << std::setw(7)
                << Fixed(limit.parameters / 1e6, 1) << "M parameters"
                << (limit.capped ? " or more (--memory-max-layers fit)" : "") << "  (probes:";
      for (const nlohmann::json& p : limit.probes) {
        std::cout << " " << p.at("layers").get<int>() << (p.at("fits").get<bool>() ? "+" : "-");
      }
      std::cout << ")\n";
    }
  }
  if (!goals.empty()) std::cout << "\ngoals:\n";
  for (const nlohmann::json& goal : goals) {
    std::cout << "  " << (goal.at("met").get<bool>() ? "met    " : "MISSED ")
              << goal.at("goal").get<std::string>() << ": " << goal.at("detail").get<std::string>()
              << "\n";
  }
}

}  // namespace

void AddTorchFsdpOptions(CLI::App* app, TorchFsdpOptions* o) {
  app->add_flag("--fsdp", o->enabled,
                "FSDP mode (issue 44): a GPT-like model under DDP on tessera and Gloo and "
                "tessera's FSDP strategies; uses the --fsdp-*, --memory-* and --hybrid-hosts "
                "flags and --batch-size, --steps, --warmup-steps, --repeats (with defaults of "
                "their own: 2, 5, 2, 1), --threads, --ring-transport, --timeout-s, --json");
  app->add_option("--fsdp-np", o->np_text, "--fsdp: processes, comma-separated (2-64)")
      ->capture_default_str();
  app->add_option("--strategies", o->strategies_text,
                  "--fsdp: FSDP strategies beside DDP, comma-separated: FULL_SHARD, "
                  "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD")
      ->capture_default_str();
  app->add_option("--fsdp-dim", o->dim, "--fsdp: model width")
      ->check(CLI::Range(8, 16384))
      ->capture_default_str();
  app->add_option("--fsdp-layers", o->layers, "--fsdp: transformer blocks")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--fsdp-heads", o->heads, "--fsdp: attention heads (divide --fsdp-dim)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--fsdp-vocab", o->vocab, "--fsdp: vocabulary (tied embedding and head)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app->add_option("--fsdp-seq", o->seq, "--fsdp: sequence length")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app->add_option("--hybrid-hosts", o->hybrid_hosts,
                  "--fsdp: hosts HYBRID_SHARD emulates as blocks of np/H consecutive ranks "
                  "(runs at each np that H divides into blocks of 2 or more)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_flag("--hybrid-netns", o->hybrid_netns,
                "--fsdp: HYBRID_SHARD across 2 emulated hosts (network namespaces; needs root), "
                "beside DDP on tessera across them (ddp-tessera@hosts)");
  app->add_option("--memory-limit", o->memory_limit_text,
                  "--fsdp: per-rank memory limit (e.g. 1536M, 2G) of the largest-model search "
                  "for DDP and FULL_SHARD; 0: no search")
      ->capture_default_str();
  app->add_option("--memory-np", o->memory_np, "--fsdp: processes of the memory-limit search")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app->add_option("--memory-dim", o->memory_dim, "--fsdp: model width of the search")
      ->check(CLI::Range(8, 16384))
      ->capture_default_str();
  app->add_option("--memory-heads", o->memory_heads, "--fsdp: attention heads of the search")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--memory-seq", o->memory_seq, "--fsdp: sequence length of the search")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app->add_option("--memory-steps", o->memory_steps,
                  "--fsdp: steps a model must train (after one) to fit")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--malloc-mmap-threshold", o->malloc_mmap_threshold,
                  "--fsdp: the ranks' MALLOC_MMAP_THRESHOLD_ (bytes); 0: glibc's dynamic "
                  "default, which lets FSDP's unit-sized temporaries grow the heap")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  app->add_option("--memory-max-layers", o->memory_max_layers,
                  "--fsdp: deepest model the search tries")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
}

Status ParseTorchFsdpOptions(TorchFsdpOptions* o) {
  ASSIGN_OR_RETURN(o->nps, ParseList<int64_t>("--fsdp-np", o->np_text,
                                              [](const std::string& item) -> StatusOr<int64_t> {
                                                ASSIGN_OR_RETURN(int64_t n, ParsePositive(item));
                                                if (n < 2 || n > 64) {
                                                  return InvalidArgumentError(
                                                      "\"" + item + "\" is not in [2, 64]");
                                                }
                                                return n;
                                              }));
  ASSIGN_OR_RETURN(o->strategies,
                   ParseList<std::string>(
                       "--strategies", o->strategies_text,
                       [](const std::string& item) -> StatusOr<std::string> {
                         if (std::count(kStrategies.begin(), kStrategies.end(), item)) {
                           return item;
                         }
                         return InvalidArgumentError("\"" + item + "\" is not one of "
                                                     "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                                                     "HYBRID_SHARD");
                       }));
  if (o->dim % o->heads != 0) {
    return InvalidArgumentError("--fsdp-dim " + std::to_string(o->dim) +
                                " is not a multiple of --fsdp-heads " + std::to_string(o->heads));
  }
  if (o->memory_dim % o->memory_heads != 0) {
    return InvalidArgumentError("--memory-dim " + std::to_string(o->memory_dim) +
                                " is not a multiple of --memory-heads " +
                                std::to_string(o->memory_heads));
  }
  ASSIGN_OR_RETURN(o->memory_limit, ParseMemoryLimit(o->memory_limit_text));
  if (o->hybrid_netns && o->hybrid_hosts != EmulatedHosts::kHosts) {
    return InvalidArgumentError("--hybrid-netns emulates 2 hosts, not --hybrid-hosts " +
                                std::to_string(o->hybrid_hosts));
  }
  return OkStatus();
}

int RunTorchFsdpBench(const TorchFsdpOptions& o, const TorchRankSetup& setup) {
  auto fail = [](const Status& status) {
    std::cerr << "tessera-bench torch --fsdp: " << status << "\n";
    return 1;
  };
  StatusOr<std::string> script = FindRunfile(kScript);
  if (!script.ok()) return fail(script.status());
  StatusOr<std::unique_ptr<ScratchDirectory>> scratch = ScratchDirectory::Create();
  if (!scratch.ok()) return fail(scratch.status());
  Runner runner(setup, *script, std::move(*scratch));
  Report report;
  std::unique_ptr<EmulatedHosts> hosts;
  if (o.hybrid_netns) {
    StatusOr<std::unique_ptr<EmulatedHosts>> made = EmulatedHosts::Create();
    if (!made.ok()) return fail(made.status());
    hosts = std::move(*made);
  }
  if (Status status = Measure(o, &runner, hosts.get(), &report.rows); !status.ok()) {
    return fail(status);
  }
  if (o.memory_limit > 0) {
    StatusOr<MemoryLimiter> limiter = MemoryLimiter::Find();
    if (!limiter.ok()) return fail(limiter.status());
    report.limit_method = limiter->method();
    for (const char* config : {"ddp-tessera", "FULL_SHARD"}) {
      StatusOr<LimitResult> result = SearchLimit(o, &runner, &*limiter, config);
      if (!result.ok()) return fail(result.status());
      report.limits.push_back(std::move(*result));
    }
  }
  Print(o, setup, runner.info(), report);
  return 0;
}

}  // namespace tessera::tools
