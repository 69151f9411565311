#include "tools/bench/memory_bench.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace tessera::tools {
namespace {

struct MemoryBenchOptions {
  std::string np_text = "1,2,4";
  std::string stages_text = "0,1,2,3";
  std::string hidden = "1024,1024";
  int shard_group_size = 0;  // hsdp's --shard-group-size; 0: the host's workers (all of them)
  int64_t steps = 3;
  int timeout_s = 600;
  bool json = false;
};

constexpr const char* kKinds[3] = {"parameters", "gradients", "optimizer_state"};

// --stages hsdp: ZeRO-3 within each shard group, replicated across them.
constexpr int64_t kHsdp = 4;

const char* ModeOf(int64_t stage) {
  static const char* modes[] = {"allreduce", "zero1", "zero2", "zero3", "hsdp"};
  return modes[stage];
}

// The ranks one rank's state is partitioned across: the world, or hsdp's shard group (the
// world too when the bench's one host is one group).
double PartitionedAcross(int64_t stage, int64_t np, const MemoryBenchOptions& o) {
  if (stage == kHsdp && o.shard_group_size > 0) return o.shard_group_size;
  return static_cast<double>(np);
}

// ZeRO's per-rank bytes for Adam in float32: {parameters, gradients, optimizer state}; hsdp's
// are stage 3's with n its shard group's size.
std::vector<double> Theory(int64_t stage, double psi, double n) {
  if (stage == kHsdp) stage = 3;
  return {stage == 3 ? 4 * psi / n : 4 * psi, stage >= 2 ? 4 * psi / n : 4 * psi,
          stage >= 1 ? 8 * psi / n : 8 * psi};
}

// The most a rank holds during a step (ZeroEngine's bound, zero_engine.h): what it holds
// between steps plus, at stage 3, the current and the prefetched parameter block, and at
// stages 2 and 3 the two gradient blocks backward may hold (the one it writes, one awaiting its
// reduce-scatter); each at most the two largest layers' parameters. Stages 0 and 1 hold
// nothing transient.
std::vector<double> PeakBound(int64_t stage, double psi, double n,
                              const std::vector<double>& layer_sizes) {
  if (stage == kHsdp) stage = 3;
  std::vector<double> sorted = layer_sizes;
  std::sort(sorted.rbegin(), sorted.rend());
  const double two_largest =
      (sorted.size() > 0 ? sorted[0] : 0) + (sorted.size() > 1 ? sorted[1] : 0);
  std::vector<double> bound = Theory(stage, psi, n);
  if (stage == 3) bound[0] += 4 * two_largest;
  if (stage >= 2) bound[1] += 4 * two_largest;
  return bound;
}

// The parameters of each Linear layer of the mlp 784-`hidden`-10.
StatusOr<std::vector<double>> LayerSizes(const std::string& hidden) {
  std::vector<double> widths = {784};
  size_t begin = 0;
  while (begin <= hidden.size()) {
    const size_t end = std::min(hidden.find(',', begin), hidden.size());
    const std::string item = hidden.substr(begin, end - begin);
    char* rest = nullptr;
    const long width = std::strtol(item.c_str(), &rest, 10);
    if (item.empty() || *rest != '\0' || width < 1) {
      return InvalidArgumentError("--hidden: '" + item + "' is not a positive width");
    }
    widths.push_back(static_cast<double>(width));
    begin = end + 1;
  }
  widths.push_back(10);
  std::vector<double> sizes;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    sizes.push_back(widths[i] * widths[i + 1] + widths[i + 1]);
  }
  return sizes;
}

struct Row {
  int64_t stage = 0;
  int64_t np = 0;
  double psi = 0;
  // by kind; held and peak: the largest over ranks
  std::vector<double> held, peak, theory, peak_bound;
  double total(const std::vector<double>& v) const { return v[0] + v[1] + v[2]; }
};

// Every worker's summary: the {"batch_size"...} JSON lines after a "[worker r] " prefix.
StatusOr<std::vector<nlohmann::json>> WorkerSummaries(const std::vector<ChildOutput>& outputs) {
  std::vector<nlohmann::json> summaries;
  for (const ChildOutput& output : outputs) {
    for (const std::string& line : output.stdout_lines) {
      const size_t start = line.find("{\"");
      if (start == std::string::npos) continue;
      nlohmann::json j = nlohmann::json::parse(line.substr(start), nullptr, false);
      if (j.is_object() && j.contains("model_state_bytes")) summaries.push_back(std::move(j));
    }
  }
  return summaries;
}

StatusOr<Row> Measure(const std::string& launch, const MemoryBenchOptions& o, int64_t stage,
                      int64_t np) {
  const std::string label =
      "tessera-launch --workers " + std::to_string(np) + " --mode " + ModeOf(stage);
  std::vector<std::string> argv = {launch, "--workers", std::to_string(np), "--mode",
                                   ModeOf(stage), "--log-level", "warning", "--",
                                   "--json", "--device", "cpu", "--optimizer", "adam",
                                   "--hidden", o.hidden, "--steps", std::to_string(o.steps),
                                   "--batch-size", "16", "--log-every", "0",
                                   "--eval-samples", "16"};
  if (stage == kHsdp && o.shard_group_size > 0) {
    argv.push_back("--shard-group-size=" + std::to_string(o.shard_group_size));
  }
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion({{label, argv}}, int64_t{o.timeout_s} * 1000));
  ASSIGN_OR_RETURN(std::vector<nlohmann::json> summaries, WorkerSummaries(outputs));
  if (summaries.size() != static_cast<size_t>(np)) {
    return DataLossError(label + ": " + std::to_string(summaries.size()) + " of " +
                         std::to_string(np) + " workers reported their model-state bytes");
  }
  Row row;
  row.stage = stage;
  row.np = np;
  row.psi = summaries.front().value("parameters", 0.0);
  row.held.assign(3, 0);
  row.peak.assign(3, 0);
  for (const nlohmann::json& s : summaries) {
    const nlohmann::json& bytes = s["model_state_bytes"];
    for (int k = 0; k < 3; ++k) {
      row.held[k] = std::max(row.held[k], bytes["held"].value(kKinds[k], 0.0));
      row.peak[k] = std::max(row.peak[k], bytes["peak"].value(kKinds[k], 0.0));
    }
  }
  const double n = PartitionedAcross(stage, np, o);
  row.theory = Theory(stage, row.psi, n);
  ASSIGN_OR_RETURN(std::vector<double> layer_sizes, LayerSizes(o.hidden));
  row.peak_bound = PeakBound(stage, row.psi, n, layer_sizes);
  return row;
}

std::string Mb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes / 1e6);
  return text;
}

int RunMemoryBench(const MemoryBenchOptions& o) {
  auto fail = [](const Status& status) {
    std::cerr << "tessera-bench memory: " << status << "\n";
    return 1;
  };
  const std::function<StatusOr<int64_t>(const std::string&)> positive = ParsePositive;
  StatusOr<std::vector<int64_t>> nps = ParseList<int64_t>("--np", o.np_text, positive);
  if (!nps.ok()) return fail(nps.status());
  StatusOr<std::vector<int64_t>> stages = ParseList<int64_t>(
      "--stages", o.stages_text, [](const std::string& item) -> StatusOr<int64_t> {
        if (item == "hsdp") return kHsdp;
        if (item.size() != 1 || item[0] < '0' || item[0] > '3') {
          return InvalidArgumentError("'" + item + "' is not a ZeRO stage (0, 1, 2 or 3) "
                                      "or hsdp");
        }
        return int64_t{item[0] - '0'};
      });
  if (!stages.ok()) return fail(stages.status());
  StatusOr<std::string> launch = FindRunfile("tools/tessera-launch");
  if (!launch.ok()) return fail(launch.status());

  std::vector<Row> rows;
  for (int64_t stage : *stages) {
    for (int64_t np : *nps) {
      if (!o.json) {
        std::cerr << "measuring stage " << stage << " (--mode " << ModeOf(stage) << ") with "
                  << np << " workers...\n";
      }
      StatusOr<Row> row = Measure(*launch, o, stage, np);
      if (!row.ok()) return fail(row.status());
      rows.push_back(*row);
    }
  }
  nlohmann::json report = {{"bench", "memory"}, {"optimizer", "adam"}, {"dtype", "float32"},
                           {"rows", nlohmann::json::array()}};
  bool all_within = true, all_peaks_within = true;
  for (const Row& r : rows) {
    const double ratio = r.total(r.held) / r.total(r.theory);
    const bool within = ratio >= 0.9 && ratio <= 1.1;
    // Slices differ by at most one element per tensor from Ψ/N: 10% of slack as for held.
    const bool peak_within = r.total(r.peak) <= 1.1 * r.total(r.peak_bound);
    all_within = all_within && within;
    all_peaks_within = all_peaks_within && peak_within;
    nlohmann::json j = {{"stage", r.stage == kHsdp ? 3 : r.stage}, {"mode", ModeOf(r.stage)},
                        {"np", r.np},
                        {"parameters", r.psi}, {"held_vs_theory", ratio},
                        {"within_10_percent", within},
                        {"peak_vs_bound", r.total(r.peak) / r.total(r.peak_bound)},
                        {"peak_within_bound", peak_within}};
    for (int k = 0; k < 3; ++k) {
      j["held_bytes"][kKinds[k]] = r.held[k];
      j["peak_bytes"][kKinds[k]] = r.peak[k];
      j["theory_bytes"][kKinds[k]] = r.theory[k];
      j["peak_bound_bytes"][kKinds[k]] = r.peak_bound[k];
    }
    report["rows"].push_back(j);
  }
  report["all_within_10_percent"] = all_within;
  report["all_peaks_within_bound"] = all_peaks_within;
  if (o.json) {
    std::cout << report.dump() << "\n";
    return 0;
  }
  std::cout << "Model-state bytes per rank (MB = 1e6 bytes), Adam float32, Ψ = "
            << (rows.empty() ? 0 : static_cast<int64_t>(rows.front().psi)) << " parameters\n\n";
  std::cout << "| stage | N | params | grads | optim | held | theory | held/theory | peak | "
               "peak bound | peak/bound |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    char ratio[16];
    std::snprintf(ratio, sizeof(ratio), "%.3f", r.total(r.held) / r.total(r.theory));
    const std::string stage = r.stage == kHsdp ? "hsdp" : std::to_string(r.stage);
    std::cout << "| " << stage << " | " << r.np << " | " << Mb(r.held[0]) << " | "
              << Mb(r.held[1]) << " | " << Mb(r.held[2]) << " | " << Mb(r.total(r.held)) << " | "
              << Mb(r.total(r.theory)) << " | " << ratio << " | " << Mb(r.total(r.peak))
              << " | " << Mb(r.total(r.peak_bound)) << " | ";
    std::snprintf(ratio, sizeof(ratio), "%.3f", r.total(r.peak) / r.total(r.peak_bound));
    std::cout << ratio << " |\n";
  }
  std::cout << "\nheld within 10% of the theory everywhere: " << (all_within ? "yes" : "NO")
            << "\npeak within the bound (theory + stage 3's two gathered blocks + stage 2-3's "
               "two gradient blocks, each at most the two largest layers) everywhere: "
            << (all_peaks_within ? "yes" : "NO") << "\n";
  return 0;
}

}  // namespace

BenchCommand AddMemoryBench(CLI::App* parent) {
  auto o = std::make_shared<MemoryBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "memory", "Model-state bytes per rank in ZeRO stages 0-3, measured vs the formulas");
  app->add_option("--np", o->np_text, "World sizes, comma-separated")->capture_default_str();
  app->add_option("--stages", o->stages_text,
                  "ZeRO stages (0 = --mode allreduce), and hsdp for --mode hsdp")
      ->capture_default_str();
  app->add_option("--shard-group-size", o->shard_group_size,
                  "--stages hsdp: passed to the workers, which must divide every --np; 0: each "
                  "host's workers (here all of them)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app->add_option("--hidden", o->hidden, "The mlp's hidden widths (784-...-10)")
      ->capture_default_str();
  app->add_option("--steps", o->steps, "Training steps per run (the peak is the last step's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}))
      ->capture_default_str();
  app->add_option("--timeout-s", o->timeout_s, "Deadline of each run")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return {app, [o]() -> int { return RunMemoryBench(*o); }};
}

}  // namespace tessera::tools
