#include "tools/bench/allreduce_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/config/flag_checks.h"

namespace tessera::tools {
namespace {

constexpr char kDefaultSizes[] = "4K,16K,64K,256K,1M,4M,16M,64M,256M";

struct AllReduceBenchOptions {
  int np = 2;
  std::string sizes_text = kDefaultSizes;
  std::vector<size_t> sizes;
  int warmup = 3;
  int iters = 0;  // 0: from seconds
  double seconds = 0.5;
  int segment_kb = 1024;
  std::string ring_transport = "auto";
  int ring_spin_us = 200;  // tessera-worker's default (kDefaultRingSpinCapUs)
  // tessera-worker --direct-read-min-bytes; when not 0, Tessera also runs with 0 (the ring
  // alone, "ring" in the table) unless no_ring_baseline.
  uint64_t direct_read_min_bytes = 3 << 20;  // tessera-worker's (kDefaultDirectReadMinBytes)
  bool no_ring_baseline = false;
  uint64_t one_shot_max_bytes = 16 << 10;  // tessera-worker's (kDefaultOneShotMaxBytes)
  int timeout_s = 600;
  bool json = false;
  bool no_mpi = false;
  bool no_mpi_shm = false;
  bool no_gloo = false;
};

// One system's figures: the child's JSON line per size, or why it was not measured.
struct SystemResult {
  std::string name;     // in the JSON report
  std::string label;    // in the table
  std::string skipped;  // non-empty: not measured, and why
  std::map<size_t, nlohmann::json> by_size;
  std::string channel;  // Tessera's ring channel, as its rank 0 reported it
};

// Bytes per second of one memcpy of `bytes` between two buffers touched first (no page faults
// in the copies), median of `iters` copies: the machine's memory bound beside the table.
double MemcpyBytesPerSecond(size_t bytes, int iters) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> seconds;
  for (int i = 0; i <= iters; ++i) {
    from[static_cast<size_t>(i) % bytes] = static_cast<char>(i);  // a copy that is not elided
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (i > 0) seconds.push_back(took.count());  // the first one warms up
  }
  volatile char sink = to[bytes / 2];
  (void)sink;
  std::sort(seconds.begin(), seconds.end());
  return static_cast<double>(bytes) / seconds[seconds.size() / 2];
}

// "4096", "4K", "16M" (binary units), comma-separated.
StatusOr<std::vector<size_t>> ParseSizes(const std::string& text) {
  return ParseList<size_t>("--sizes", text, ParseByteSize);
}

// An executable named `name` on PATH, or nothing.
std::optional<std::string> FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream in(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(in, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// Collects the {"bench":"allreduce",...} lines (after any "[worker 0] " prefix) of `outputs`
// and checks that every size was reported.
Status CollectLines(const std::vector<ChildOutput>& outputs, const AllReduceBenchOptions& o,
                    SystemResult* result) {
  for (const ChildOutput& output : outputs) {
    for (const std::vector<std::string>* lines : {&output.stdout_lines, &output.stderr_lines}) {
      for (const std::string& line : *lines) {
        const size_t at = line.find("{\"bench\"");
        const size_t spaced = line.find("{\"bench\": ");
        const size_t start = std::min(at, spaced);
        if (start == std::string::npos) continue;
        nlohmann::json j = nlohmann::json::parse(line.substr(start), nullptr, false);
        if (j.is_object() && j.value("bench", "") == "ring_channel") {
          result->channel = j.value("channel", "");
          continue;
        }
        if (!j.is_object() || j.value("bench", "") != "allreduce") continue;
        result->by_size[j.value("bytes", size_t{0})] = j;
      }
    }
  }
  for (size_t size : o.sizes) {
    const auto row = result->by_size.find(size);
    if (row == result->by_size.end() || !(row->second.value("median_s", 0.0) > 0)) {
      return DataLossError(result->name + ": reported no time for " + std::to_string(size) +
                           " bytes");
    }
  }
  return OkStatus();
}

Status MeasureTessera(const AllReduceBenchOptions& o, uint64_t direct_read_min_bytes,
                      SystemResult* result) {
  ASSIGN_OR_RETURN(std::string launch, FindRunfile("tools/tessera-launch"));
  std::vector<std::string> argv = {launch,
                                   "--workers", std::to_string(o.np),
                                   "--mode", "bench-allreduce",
                                   "--log-level", "warning",
                                   "--",
                                   "--bench-sizes=" + JoinSizes(o.sizes),
                                   "--bench-warmup=" + std::to_string(o.warmup),
                                   "--bench-iters=" + std::to_string(o.iters),
                                   "--bench-seconds=" + std::to_string(o.seconds),
                                   "--segment-kb=" + std::to_string(o.segment_kb),
                                   "--ring-transport=" + o.ring_transport,
                                   "--ring-spin-us=" + std::to_string(o.ring_spin_us),
                                   "--direct-read-min-bytes=" +
                                       std::to_string(direct_read_min_bytes),
                                   "--one-shot-max-bytes=" +
                                       std::to_string(o.one_shot_max_bytes)};
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion({{"tessera-launch --workers " + std::to_string(o.np) +
                                            " --mode bench-allreduce",
                                        argv}},
                                      int64_t{o.timeout_s} * 1000));
  return CollectLines(outputs, o, result);
}

// `btl`: "self,tcp" (loopback TCP, what the goals compare with) or "self,vader"
// (OpenMPI's shared-memory transport, what Tessera's shm channel compares with).
Status MeasureMpi(const AllReduceBenchOptions& o, const std::string& scratch,
                  const std::string& btl, SystemResult* result) {
  std::optional<std::string> mpicc = FindInPath("mpicc"), mpirun = FindInPath("mpirun");
  if (!mpicc || !mpirun) {
    result->skipped = std::string("no ") + (!mpicc ? "mpicc" : "mpirun") +
                      " on PATH (tools/install_deps.sh bench installs OpenMPI)";
    return OkStatus();
  }
  ASSIGN_OR_RETURN(std::string source, FindRunfile("tools/bench/mpi_allreduce.c"));
  const std::string binary = scratch + "/mpi_allreduce";
  if (access(binary.c_str(), X_OK) != 0) {
    RETURN_IF_ERROR(RunToCompletion("mpicc mpi_allreduce.c", {*mpicc, "-O2", "-o", binary, source},
                                    int64_t{o.timeout_s} * 1000)
                        .status());
  }
  std::vector<std::string> argv = {*mpirun};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  for (const std::string& arg :
       {std::string("--oversubscribe"), std::string("--bind-to"), std::string("none"),
        std::string("--mca"), std::string("pml"), std::string("ob1"), std::string("--mca"),
        std::string("btl"), btl, std::string("-np"), std::to_string(o.np),
        binary, JoinSizes(o.sizes), std::to_string(o.warmup), std::to_string(o.iters),
        std::to_string(o.seconds)}) {
    argv.push_back(arg);
  }
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion({{"mpirun --mca btl " + btl + " -np " +
                                            std::to_string(o.np) + " mpi_allreduce",
                                        argv}},
                                      int64_t{o.timeout_s} * 1000));
  return CollectLines(outputs, o, result);
}

Status MeasureGloo(const AllReduceBenchOptions& o, SystemResult* result) {
  if (access(kPython, X_OK) != 0) {
    result->skipped = std::string(kPython) + " is missing (tools/install_deps.sh bench installs PyTorch)";
    return OkStatus();
  }
  if (!RunToCompletion("python3 -c 'import torch.distributed'",
                       {kPython, "-c", "import torch.distributed"}, 120'000)
           .ok()) {
    result->skipped = std::string(kPython) +
                      " cannot import torch.distributed (tools/install_deps.sh bench installs PyTorch)";
    return OkStatus();
  }
  ASSIGN_OR_RETURN(std::string script, FindRunfile("tools/bench/gloo_allreduce.py"));
  ASSIGN_OR_RETURN(int port, FreePort());
  std::vector<ChildSpec> children;
  for (int rank = 0; rank < o.np; ++rank) {
    children.push_back(
        {"gloo_allreduce.py rank " + std::to_string(rank) + " of " + std::to_string(o.np),
         {"/usr/bin/env", "OMP_NUM_THREADS=1", kPython, script, "--rank=" + std::to_string(rank),
          "--world=" + std::to_string(o.np), "--port=" + std::to_string(port),
          "--sizes=" + JoinSizes(o.sizes), "--warmup=" + std::to_string(o.warmup),
          "--iters=" + std::to_string(o.iters), "--seconds=" + std::to_string(o.seconds)}});
  }
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion(children, int64_t{o.timeout_s} * 1000));
  return CollectLines(outputs, o, result);
}

double TimeOf(const SystemResult& r, size_t size) { return r.by_size.at(size).at("median_s"); }

// The goals, from the measured ratios: {name, met, detail}.
nlohmann::json CheckGoals(const AllReduceBenchOptions& o, const SystemResult& tessera,
                          const SystemResult& mpi, const SystemResult& gloo) {
  nlohmann::json goals = nlohmann::json::array();
  // The lowest ratio peer_time / tessera_time over sizes >= min_bytes, against `minimum`.
  auto check = [&](const std::string& name, const SystemResult& peer, size_t min_bytes,
                   double minimum) {
    if (!peer.skipped.empty()) return;
    std::optional<std::pair<double, size_t>> worst;
    for (size_t size : o.sizes) {
      if (size < min_bytes) continue;
      const double ratio = TimeOf(peer, size) / TimeOf(tessera, size);
      if (!worst || ratio < worst->first) worst = {ratio, size};
    }
    if (!worst) return;
    std::ostringstream detail;
    detail << "lowest " << std::fixed << std::setprecision(2) << worst->first << "x at "
           << HumanBytes(worst->second);
    goals.push_back({{"goal", name}, {"met", worst->first >= minimum}, {"detail", detail.str()}});
  };
  check("busbw >= 1.0x OpenMPI (btl tcp) at >= 64 KiB", mpi, 64 << 10, 1.0);
  check("busbw >= 1.5x OpenMPI (btl tcp) at >= 16 MiB", mpi, 16 << 20, 1.5);
  check("busbw >= 2x Gloo at every size", gloo, 0, 2.0);
  const size_t kLatencySize = 4096;
  if (mpi.skipped.empty() && std::count(o.sizes.begin(), o.sizes.end(), kLatencySize) > 0) {
    const double ratio = TimeOf(tessera, kLatencySize) / TimeOf(mpi, kLatencySize);
    std::ostringstream detail;
    detail << std::fixed << std::setprecision(1) << TimeOf(tessera, kLatencySize) * 1e6
           << " us vs " << TimeOf(mpi, kLatencySize) * 1e6 << " us (" << std::setprecision(2)
           << ratio << "x)";
    goals.push_back({{"goal", "4 KiB latency <= 2x OpenMPI's (btl tcp)"},
                     {"met", ratio <= 2.0},
                     {"detail", detail.str()}});
  }
  return goals;
}

int RunAllReduceBench(const AllReduceBenchOptions& o) {
  const double bus_factor = 2.0 * (o.np - 1) / o.np;
  auto scratch = ScratchDirectory::Create();
  if (!scratch.ok()) {
    std::cerr << "tessera-bench allreduce: " << scratch.status() << "\n";
    return 1;
  }
  SystemResult tessera{"tessera", "tessera", "", {}, ""}, mpi{"mpi", "mpi-tcp", "", {}, ""},
      mpi_shm{"mpi_shm", "mpi-shm", "", {}, ""}, gloo{"gloo", "gloo", "", {}, ""},
      ring{"tessera_ring", "ring", "", {}, ""};
  if (o.direct_read_min_bytes == 0 || o.no_ring_baseline) {
    ring.skipped = o.no_ring_baseline ? "--no-ring-baseline" : "--direct-read-min-bytes 0";
  }
  if (o.no_mpi) mpi.skipped = "--no-mpi";
  if (o.no_mpi || o.no_mpi_shm) mpi_shm.skipped = o.no_mpi ? "--no-mpi" : "--no-mpi-shm";
  if (o.no_gloo) gloo.skipped = "--no-gloo";
  const std::vector<const SystemResult*> peers = {&ring, &mpi, &mpi_shm, &gloo};
  // One system at a time: the machine's cores are shared by the N processes of each.
  struct Step {
    SystemResult* result;
    std::function<Status()> measure;
  };
  const std::vector<Step> steps = {
      {&tessera, [&] { return MeasureTessera(o, o.direct_read_min_bytes, &tessera); }},
      {&ring, [&] { return MeasureTessera(o, 0, &ring); }},
      {&mpi, [&] { return MeasureMpi(o, (*scratch)->path(), "self,tcp", &mpi); }},
      {&mpi_shm, [&] { return MeasureMpi(o, (*scratch)->path(), "self,vader", &mpi_shm); }},
      {&gloo, [&] { return MeasureGloo(o, &gloo); }},
  };
  for (const Step& step : steps) {
    if (!step.result->skipped.empty()) continue;
    if (!o.json) std::cerr << "measuring " << step.result->name << " (np " << o.np << ")...\n";
    Status status = step.measure();
    if (!status.ok()) {
      std::cerr << "tessera-bench allreduce: " << step.result->name << ": " << status << "\n";
      return 1;
    }
    if (!step.result->skipped.empty()) {
      std::cerr << "tessera-bench allreduce: skipping " << step.result->name << ": "
                << step.result->skipped << "\n";
    }
  }

  const double memcpy_rate = MemcpyBytesPerSecond(size_t{64} << 20, 9);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t size : o.sizes) {
    nlohmann::json row = {{"bytes", size}};
    const double t = TimeOf(tessera, size);
    for (const SystemResult* r : {&tessera, &ring, &mpi, &mpi_shm, &gloo}) {
      if (!r->skipped.empty()) continue;
      const double time = TimeOf(*r, size);
      row[r->name] = {{"time_s", time},
                      {"algbw_bytes_per_second", static_cast<double>(size) / time},
                      {"busbw_bytes_per_second", bus_factor * static_cast<double>(size) / time},
                      {"iters", r->by_size.at(size).value("iters", 0)}};
      if (r != &tessera) row["tessera_over_" + r->name] = time / t;
    }
    rows.push_back(std::move(row));
  }
  const nlohmann::json goals = CheckGoals(o, tessera, mpi, gloo);
  if (o.json) {
    nlohmann::json skipped = nlohmann::json::object();
    for (const SystemResult* r : peers) {
      if (!r->skipped.empty()) skipped[r->name] = r->skipped;
    }
    std::cout << nlohmann::json({{"benchmark", "allreduce"},
                                 {"np", o.np},
                                 {"dtype", "float32"},
                                 {"op", "sum"},
                                 {"segment_kb", o.segment_kb},
                                 {"ring_transport", o.ring_transport},
                                 {"ring_channel", tessera.channel},
                                 {"ring_spin_us", o.ring_spin_us},
                                 {"direct_read_min_bytes", o.direct_read_min_bytes},
                                 {"one_shot_max_bytes", o.one_shot_max_bytes},
                                 {"memcpy_bytes_per_second", memcpy_rate},
                                 {"busbw_factor", bus_factor},
                                 {"skipped", skipped},
                                 {"rows", rows},
                                 {"goals", goals}})
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << "allreduce: float32 sum among " << o.np << " processes on this host; time = "
            << "median over iterations of the slowest rank; busbw = algbw x 2(n-1)/n = "
            << std::setprecision(3) << bus_factor << " x algbw\n"
            << "tessera: --ring-transport " << o.ring_transport << " --direct-read-min-bytes "
            << o.direct_read_min_bytes << " --one-shot-max-bytes " << o.one_shot_max_bytes
            << ", ring channel: "
            << (tessera.channel.empty() ? "(not reported)" : tessera.channel) << "\n"
            << (ring.skipped.empty() ? "ring: tessera with --direct-read-min-bytes 0\n" : "")
            << "memcpy (64 MiB, one thread): " << std::setprecision(3) << memcpy_rate / 1e9
            << " GB/s\n"
            << "mpi-tcp: OpenMPI --mca btl self,tcp (loopback TCP; the issue's goals); "
            << "mpi-shm: --mca btl self,vader (shared memory); gloo: torch.distributed TCP\n";
  for (const SystemResult* r : peers) {
    if (!r->skipped.empty()) std::cout << r->name << ": skipped (" << r->skipped << ")\n";
  }
  std::cout << "\n" << std::left << std::setw(9) << "size" << std::right << std::setw(11)
            << "tessera us" << std::setw(9) << "algbw" << std::setw(9) << "busbw";
  for (const SystemResult* r : peers) {
    if (!r->skipped.empty()) continue;
    std::cout << std::setw(11) << (r->label + " us") << std::setw(9) << "busbw";
  }
  for (const SystemResult* r : peers) {
    if (r->skipped.empty()) std::cout << std::setw(12) << ("vs " + r->label);
  }
  std::cout << "\n" << std::left << std::setw(9) << "" << std::right << std::setw(11) << ""
            << std::setw(9) << "GB/s" << std::setw(9) << "GB/s";
  for (const SystemResult* r : peers) {
    if (r->skipped.empty()) std::cout << std::setw(11) << "" << std::setw(9) << "GB/s";
  }
  std::cout << "\n";
  for (size_t size : o.sizes) {
    const double t = TimeOf(tessera, size);
    std::cout << std::left << std::setw(9) << HumanBytes(size) << std::right << std::fixed
              << std::setprecision(1) << std::setw(11) << t * 1e6 << std::setprecision(3)
              << std::setw(9) << size / t / 1e9 << std::setw(9) << bus_factor * size / t / 1e9;
    for (const SystemResult* r : peers) {
      if (!r->skipped.empty()) continue;
      const double time = TimeOf(*r, size);
      std::cout << std::setprecision(1) << std::setw(11) << time * 1e6 << std::setprecision(3)
                << std::setw(9) << bus_factor * size / time / 1e9;
    }
    for (const SystemResult* r : peers) {
      if (r->skipped.empty()) {
        std::cout << std::setprecision(2) << std::setw(11) << TimeOf(*r, size) / t << "x";
      }
    }
    std::cout << "\n";
  }
  if (!goals.empty()) std::cout << "\ngoals (issue 5, against OpenMPI over TCP):\n";
  for (const nlohmann::json& goal : goals) {
    std::cout << "  " << (goal.at("met").get<bool>() ? "met    " : "MISSED ")
              << goal.at("goal").get<std::string>() << ": " << goal.at("detail").get<std::string>()
              << "\n";
  }
  return 0;
}

}  // namespace

BenchCommand AddAllReduceBench(CLI::App* parent) {
  auto o = std::make_shared<AllReduceBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "allreduce",
      "Ring all-reduce of N processes (busbw per size, nccl-tests style) vs OpenMPI and Gloo");
  app->add_option("--np", o->np, "Processes (ranks)")->required()->check(CLI::Range(2, 64));
  app->add_option("--sizes", o->sizes_text,
                  "Buffer sizes in bytes, comma-separated; K, M, G suffixes (binary)")
      ->capture_default_str();
  app->add_option("--warmup", o->warmup, "Untimed all-reduces per size")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app->add_option("--iters", o->iters, "Timed all-reduces per size; 0: as fit in --seconds")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app->add_option("--seconds", o->seconds,
                  "Time per size and system when --iters is 0 (at least 5 iterations)")
      ->check(FiniteRange(0, 600))
      ->capture_default_str();
  app->add_option("--segment-kb", o->segment_kb, "Tessera's ring segment (tessera-worker flag)")
      ->check(CLI::Range(1, 64 << 10))
      ->capture_default_str();
  app->add_option("--ring-transport", o->ring_transport,
                  "Tessera's ring transport: auto, shm, links or zmq (tessera-worker flag)")
      ->check(CLI::IsMember({"auto", "shm", "links", "zmq"}))
      ->capture_default_str();
  app->add_option("--ring-spin-us", o->ring_spin_us,
                  "Tessera's cap of the adaptive busy-poll before sleeping, links only (tessera-worker flag)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app->add_option("--direct-read-min-bytes", o->direct_read_min_bytes,
                  "Tessera's threshold for direct reads (tessera-worker flag); unless 0 or "
                  "--no-ring-baseline, Tessera runs again with 0 (the ring alone, column ring)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  app->add_option("--one-shot-max-bytes", o->one_shot_max_bytes,
                  "Tessera's largest one-shot all-reduce (tessera-worker flag; 0: never), in "
                  "both of its runs")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  app->add_flag("--no-ring-baseline", o->no_ring_baseline,
                "Do not measure Tessera a second time with direct reads off");
  app->add_option("--timeout-s", o->timeout_s, "Deadline of each system's run")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--json", o->json, "Print one JSON object instead of the table");
  app->add_flag("--no-mpi", o->no_mpi, "Do not measure OpenMPI (neither tcp nor shared memory)");
  app->add_flag("--no-mpi-shm", o->no_mpi_shm,
                "Do not measure OpenMPI over shared memory (btl vader), only over TCP");
  app->add_flag("--no-gloo", o->no_gloo, "Do not measure Gloo");
  return {app, [o]() -> int {
            StatusOr<std::vector<size_t>> sizes = ParseSizes(o->sizes_text);
            if (!sizes.ok()) {
              std::cerr << "tessera-bench allreduce: " << sizes.status().message() << "\n";
              return 2;
            }
            o->sizes = *sizes;
            return RunAllReduceBench(*o);
          }};
}

}  // namespace tessera::tools
