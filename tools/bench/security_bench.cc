#include "tools/bench/security_bench.h"

#include <algorithm>
#include <array>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <CLI/CLI.hpp>

#include "common/config/flag_checks.h"
#include "common/security/credentials.h"
#include "common/security/job_key.h"
#include "tools/bench/transport_bench.h"

namespace tessera::tools {
namespace {

enum Setting { kInsecure, kAuthenticated, kEncrypted, kSettings };
constexpr std::array<const char*, kSettings> kSettingNames = {"insecure", "authenticated",
                                                             "encrypted"};

struct SecurityBenchOptions {
  std::string sizes_text = "64K,1M,16M";
  std::vector<size_t> sizes;
  std::vector<std::string> paths = {"transport", "ps", "allreduce"};
  double seconds = 1;
  int repeats = 3;
  int window = 8;
  int timeout_s = 600;
  bool json = false;
};

// Best bytes/s per (path, bytes, setting).
using Best = std::map<std::pair<std::string, size_t>, std::array<double, kSettings>>;

void Keep(Best* best, const std::string& path, size_t bytes, Setting setting, double rate) {
  auto& row = (*best)[{path, bytes}];
  row[setting] = std::max(row[setting], rate);
}

// The launcher's flags for `setting`; `key_file` is the job's key.
std::vector<std::string> SettingFlags(Setting setting, const std::string& key_file) {
  switch (setting) {
    case kInsecure: return {"--insecure"};
    case kAuthenticated: return {"--auth-key-file", key_file, "--encrypt", "off"};
    case kEncrypted: return {"--auth-key-file", key_file, "--encrypt", "on"};
    default: return {};
  }
}

// Runs one tessera-launch benchmark job and keeps, per size, bytes / the slowest worker's
// median time.
Status MeasureLaunched(const SecurityBenchOptions& o, const std::string& path,
                       const std::string& key_file, Setting setting, Best* best) {
  ASSIGN_OR_RETURN(std::string launch, FindRunfile("tools/tessera-launch"));
  const bool ps = path == "ps";
  std::vector<std::string> argv = {launch, "--workers", "2", "--log-level", "warning"};
  if (ps) argv.insert(argv.end(), {"--servers", "1"});
  argv.insert(argv.end(), {"--mode", ps ? "bench-ps" : "bench-allreduce"});
  for (const std::string& flag : SettingFlags(setting, key_file)) argv.push_back(flag);
  argv.insert(argv.end(), {"--", "--bench-sizes=" + JoinSizes(o.sizes), "--bench-warmup=3",
                           "--bench-iters=0", "--bench-seconds=" + std::to_string(o.seconds)});
  argv.push_back(ps ? "--ps-shared-memory=false" : "--ring-transport=links");
  const std::string what = "tessera-launch --mode " + std::string(ps ? "bench-ps" : "bench-allreduce") +
                           " (" + kSettingNames[setting] + ")";
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion({{what, argv}}, int64_t{o.timeout_s} * 1000));
  std::map<size_t, double> slowest;
  for (const nlohmann::json& line : BenchLines(outputs, ps ? "ps" : "allreduce")) {
    double& median = slowest[line.value("bytes", size_t{0})];
    median = std::max(median, line.value("median_s", 0.0));
  }
  for (size_t size : o.sizes) {
    auto it = slowest.find(size);
    if (it == slowest.end() || !(it->second > 0)) {
      return DataLossError(what + ": reported no time for " + std::to_string(size) + " bytes");
    }
    Keep(best, path, size, setting, static_cast<double>(size) / it->second);
  }
  return OkStatus();
}

int RunSecurity(SecurityBenchOptions o) {
  StatusOr<std::vector<size_t>> sizes = ParseList<size_t>("--sizes", o.sizes_text, ParseByteSize);
  if (!sizes.ok()) {
    std::cerr << "tessera-bench security: " << sizes.status().message() << "\n";
    return 2;
  }
  o.sizes = *sizes;
  StatusOr<std::unique_ptr<ScratchDirectory>> scratch = ScratchDirectory::Create();
  if (!scratch.ok()) {
    std::cerr << "tessera-bench security: " << scratch.status() << "\n";
    return 1;
  }
  const JobKey key = JobKey::Generate();
  const std::string key_file = (*scratch)->path() + "/job.key";
  if (Status written = WriteKeyFile(key_file, key); !written.ok()) {
    std::cerr << "tessera-bench security: " << written << "\n";
    return 1;
  }
  const std::array<Credentials, kSettings> credentials = {
      Credentials::None(), Credentials::Authenticate(key), Credentials::Encrypt(key)};
  Best best;
  for (int repeat = 0; repeat < o.repeats; ++repeat) {
    // Each repeat starts with the next setting, so none always runs first (or after another).
    for (int turn = 0; turn < kSettings; ++turn) {
      const int s = (repeat + turn) % kSettings;
      const Setting setting = static_cast<Setting>(s);
      if (!o.json) {
        std::cerr << "repeat " << repeat + 1 << "/" << o.repeats << ": " << kSettingNames[s]
                  << "...\n";
      }
      const auto wanted = [&o](const std::string& path) {
        return std::find(o.paths.begin(), o.paths.end(), path) != o.paths.end();
      };
      for (size_t size : wanted("transport") ? o.sizes : std::vector<size_t>{}) {
        StatusOr<double> rate = TesseraTransportRate(size, o.seconds, o.window, credentials[s]);
        if (!rate.ok()) {
          std::cerr << "tessera-bench security: transport (" << kSettingNames[s]
                    << "): " << rate.status() << "\n";
          return 1;
        }
        Keep(&best, "transport", size, setting, *rate);
      }
      for (const char* path : {"ps", "allreduce"}) {
        if (!wanted(path)) continue;
        Status measured = MeasureLaunched(o, path, key_file, setting, &best);
        if (!measured.ok()) {
          std::cerr << "tessera-bench security: " << measured << "\n";
          return 1;
        }
      }
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::cout << "security: best of " << o.repeats << ", " << o.seconds
              << " s per figure; ratios to insecure in the same run\n\n"
              << std::left << std::setw(11) << "path" << std::setw(10) << "bytes" << std::right
              << std::setw(15) << "insecure GB/s" << std::setw(16) << "authenticated"
              << std::setw(12) << "encrypted" << "\n";
  }
  for (const std::string& path : o.paths) {
    for (size_t size : o.sizes) {
      const auto& row = best[{path, size}];
      const double base = row[kInsecure];
      rows.push_back({{"path", path},
                      {"bytes", size},
                      {"insecure_bytes_per_second", base},
                      {"authenticated_bytes_per_second", row[kAuthenticated]},
                      {"encrypted_bytes_per_second", row[kEncrypted]},
                      {"authenticated_over_insecure", row[kAuthenticated] / base},
                      {"encrypted_over_insecure", row[kEncrypted] / base}});
      if (!o.json) {
        std::cout << std::left << std::setw(11) << path << std::setw(10) << HumanBytes(size)
                  << std::right << std::fixed << std::setprecision(3) << std::setw(15)
                  << base / 1e9 << std::setw(15) << row[kAuthenticated] / base << "x"
                  << std::setw(11) << row[kEncrypted] / base << "x\n";
      }
    }
  }
  if (o.json) {
    std::cout << nlohmann::json({{"benchmark", "security"},
                                 {"repeats", o.repeats},
                                 {"seconds_per_figure", o.seconds},
                                 {"rows", rows}})
                     .dump(2)
              << "\n";
  }
  return 0;
}

}  // namespace

BenchCommand AddSecurityBench(CLI::App* parent) {
  auto o = std::make_shared<SecurityBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "security",
      "What authentication and encryption cost on the transport, PS and all-reduce paths, "
      "beside no security in the same run");
  app->add_option("--sizes", o->sizes_text, "Comma-separated sizes (4K, 1M, 16M ...)")
      ->capture_default_str();
  app->add_option("--seconds", o->seconds, "Time per figure")
      ->check(FiniteRange(0.05, 600))
      ->capture_default_str();
  app->add_option("--repeats", o->repeats, "Rounds of all three settings; the best counts")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app->add_option("--paths", o->paths, "Which paths to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"transport", "ps", "allreduce"}))
      ->capture_default_str();
  app->add_option("--timeout", o->timeout_s, "Seconds one launched job may take")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return {app, [o] { return RunSecurity(*o); }};
}

}  // namespace tessera::tools
