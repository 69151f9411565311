#include "tools/bench/groups_bench.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/security/job_key.h"
#include "tools/bench/point_to_point_bench.h"
#include "tools/bench/torch_python.h"

namespace tessera::tools {
namespace {

constexpr char kScript[] = "tools/bench/torch_groups_bench.py";
constexpr char kBench[] = "torch_groups";

struct GroupsBenchOptions {
  std::string np_text = "2,4";
  int groups = 16;
  std::string concurrent_bytes_text = "1M";
  int concurrent_iters = 20;
  int repeats = 3;
  int latency_iters = 2000;
  std::string bandwidth_bytes_text = "16M";
  int bandwidth_iters = 20;
  bool no_torch = false;
  bool no_p2p = false;
  int timeout_s = 300;
  bool json = false;
  PointToPointPeerFlags peer;  // set only in the children of the point-to-point part

  // Parsed from the texts above.
  std::vector<int64_t> nps;
  size_t concurrent_bytes = 0, bandwidth_bytes = 0;
};

StatusOr<int64_t> ParseProcesses(const std::string& item) {
  ASSIGN_OR_RETURN(int64_t n, ParsePositive(item));
  if (n < 2 || n > 64) return InvalidArgumentError("\"" + item + "\" is not in [2, 64]");
  return n;
}

Status ParseOptions(GroupsBenchOptions* o) {
  ASSIGN_OR_RETURN(o->nps, ParseList<int64_t>("--np", o->np_text, ParseProcesses));
  StatusOr<size_t> bytes = ParseByteSize(o->concurrent_bytes_text);
  if (!bytes.ok()) return InvalidArgumentError("--concurrent-bytes: " + bytes.status().message());
  o->concurrent_bytes = *bytes;
  bytes = ParseByteSize(o->bandwidth_bytes_text);
  if (!bytes.ok()) return InvalidArgumentError("--bandwidth-bytes: " + bytes.status().message());
  o->bandwidth_bytes = *bytes;
  if (o->concurrent_iters > 0 && o->groups < 2) {
    return InvalidArgumentError("--concurrent-iters " + std::to_string(o->concurrent_iters) +
                                " needs --groups of at least 2 (two groups run at once)");
  }
  if (o->no_torch && o->no_p2p) {
    return InvalidArgumentError("--no-torch and --no-p2p together leave nothing to run");
  }
  return OkStatus();
}

// One set of `np` ranks of torch_groups_bench.py on `backend`; rank 0's record.
StatusOr<nlohmann::json> RunRanks(const GroupsBenchOptions& o, const PythonSetup& py,
                                  const std::string& script, const std::string& store_dir,
                                  int np, const std::string& backend) {
  // The ranks' job key (the tessera backend refuses to start without one), beside the store.
  const std::string key_file = store_dir + "/job.key";
  RETURN_IF_ERROR(WriteKeyFile(key_file, JobKey::Generate()));
  std::vector<ChildSpec> children;
  for (int rank = 0; rank < np; ++rank) {
    std::vector<std::string> argv = {"/usr/bin/env", "TESSERA_AUTH_KEY_FILE=" + key_file,
                                     "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1",
                                     "OMP_WAIT_POLICY=PASSIVE"};
    if (!py.pythonpath.empty()) argv.push_back("PYTHONPATH=" + py.pythonpath);
    for (const std::string& arg :
         {std::string(kPython), script, "--rank=" + std::to_string(rank),
          "--world=" + std::to_string(np), "--store-dir=" + store_dir, "--backend=" + backend,
          "--groups=" + std::to_string(o.groups),
          "--concurrent-bytes=" + std::to_string(o.concurrent_bytes),
          "--concurrent-iters=" + std::to_string(o.concurrent_iters),
          "--repeats=" + std::to_string(o.repeats),
          "--timeout-s=" + std::to_string(o.timeout_s)}) {
      argv.push_back(arg);
    }
    children.push_back({"torch_groups_bench.py " + backend + " rank " + std::to_string(rank) +
                            " of " + std::to_string(np),
                        std::move(argv)});
  }
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion(children, int64_t{o.timeout_s} * 1000));
  const std::vector<nlohmann::json> lines = BenchLines(outputs, kBench);
  if (lines.size() != 1 || lines[0].value("new_group_ms", nlohmann::json::array()).size() !=
                               static_cast<size_t>(o.groups)) {
    return DataLossError("torch_groups_bench.py on " + backend + ", np " + std::to_string(np) +
                         ": rank 0 reported no figures");
  }
  return lines[0];
}

// Figures per (np, backend): rank 0's record of torch_groups_bench.py.
using Records = std::map<std::pair<int64_t, std::string>, nlohmann::json>;

Status MeasureGroups(const GroupsBenchOptions& o, const PythonSetup& py, Records* records) {
  ASSIGN_OR_RETURN(std::string script, FindRunfile(kScript));
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchDirectory> scratch, ScratchDirectory::Create());
  int run = 0;
  for (int64_t np : o.nps) {
    // The backend that goes first alternates from one np to the next.
    std::vector<std::string> backends = {"gloo", "tessera"};
    if (run / 2 % 2 == 1) std::swap(backends[0], backends[1]);
    for (const std::string& backend : backends) {
      // A fresh directory per run: the file store must not hold a previous run's keys.
      const std::string dir = scratch->path() + "/run" + std::to_string(run++);
      if (mkdir(dir.c_str(), 0700) != 0) {
        return UnavailableError("mkdir " + dir + ": " + std::strerror(errno));
      }
      if (!o.json) std::cerr << "measuring groups, " << backend << ", np " << np << "...\n";
      ASSIGN_OR_RETURN(nlohmann::json record,
                       RunRanks(o, py, script, dir, static_cast<int>(np), backend));
      (*records)[{np, backend}] = std::move(record);
    }
  }
  return OkStatus();
}

// a / b, or null when b is 0 (Gloo added no socket, say): no ratio to state.
nlohmann::json Ratio(double a, double b) {
  if (b == 0) return nullptr;
  return a / b;
}

double MedianOf(const nlohmann::json& values) {
  return Median(values.get<std::vector<double>>());
}

double MaxOf(const nlohmann::json& values) {
  double max = 0;
  for (const nlohmann::json& v : values) max = std::max(max, v.get<double>());
  return max;
}

// One backend's new_group figures, per group where they are added amounts.
nlohmann::json NewGroupFigures(const nlohmann::json& r) {
  const double groups = r.at("groups").get<double>();
  return {{"new_group_ms_median", MedianOf(r.at("new_group_ms"))},
          {"new_group_ms_max", MaxOf(r.at("new_group_ms"))},
          {"sockets_before", r.at("sockets_before")},
          {"sockets_after", r.at("sockets_after")},
          {"threads_before", r.at("threads_before")},
          {"threads_after", r.at("threads_after")},
          {"rss_kib_before", r.at("rss_kib_before")},
          {"rss_kib_after", r.at("rss_kib_after")},
          {"sockets_per_group", r.at("added_sockets").get<double>() / groups},
          {"threads_per_group", r.at("added_threads").get<double>() / groups},
          {"rss_kib_per_group", r.at("added_rss_kib").get<double>() / groups}};
}

nlohmann::json ConcurrentFigures(const nlohmann::json& r) {
  const double concurrent = r.at("concurrent_s").get<double>();
  const double single = r.at("single_s").get<double>();
  return {{"concurrent_s", concurrent},
          {"single_s", single},
          {"concurrent_runs_s", r.at("concurrent_runs_s")},
          {"single_runs_s", r.at("single_runs_s")},
          {"concurrent_over_single", Ratio(concurrent, single)}};
}

std::string Fixed(const nlohmann::json& value, int digits, const std::string& suffix = "") {
  if (value.is_null()) return "-";
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value.get<double>() << suffix;
  return text.str();
}

// The report's rows: one JSON object per line, or the table from the same objects.
std::vector<nlohmann::json> Rows(const GroupsBenchOptions& o, const Records& records,
                                 const std::optional<PointToPointFigures>& p2p) {
  std::vector<nlohmann::json> rows;
  for (int64_t np : o.nps) {
    if (records.empty()) break;
    const nlohmann::json& g = records.at({np, "gloo"});
    const nlohmann::json& t = records.at({np, "tessera"});
    nlohmann::json gloo = NewGroupFigures(g), tessera = NewGroupFigures(t);
    nlohmann::json ratios;
    for (const char* key : {"new_group_ms_median", "sockets_per_group", "threads_per_group",
                            "rss_kib_per_group"}) {
      ratios[key] = Ratio(tessera.at(key).get<double>(), gloo.at(key).get<double>());
    }
    rows.push_back({{"benchmark", "groups"}, {"kind", "new_group"}, {"np", np},
                    {"groups", o.groups}, {"gloo", gloo}, {"tessera", tessera},
                    {"tessera_over_gloo", ratios}});
  }
  for (int64_t np : o.nps) {
    if (records.empty() || o.concurrent_iters == 0) break;
    nlohmann::json gloo = ConcurrentFigures(records.at({np, "gloo"}));
    nlohmann::json tessera = ConcurrentFigures(records.at({np, "tessera"}));
    rows.push_back({{"benchmark", "groups"}, {"kind", "concurrent"}, {"np", np},
                    {"bytes", o.concurrent_bytes}, {"iters_per_group", o.concurrent_iters},
                    {"repeats", o.repeats}, {"gloo", gloo}, {"tessera", tessera},
                    {"tessera_over_gloo_concurrent_s",
                     Ratio(tessera.at("concurrent_s").get<double>(),
                           gloo.at("concurrent_s").get<double>())}});
  }
  if (p2p) {
    rows.push_back({{"benchmark", "groups"}, {"kind", "p2p_latency"}, {"bytes", 8},
                    {"iters", o.latency_iters}, {"tessera_s", p2p->tessera_latency_s},
                    {"zmq_s", p2p->zmq_latency_s}, {"shm_s", p2p->shm_latency_s},
                    {"tessera_over_zmq", Ratio(p2p->tessera_latency_s, p2p->zmq_latency_s)},
                    {"tessera_over_shm", Ratio(p2p->tessera_latency_s, p2p->shm_latency_s)}});
    rows.push_back(
        {{"benchmark", "groups"}, {"kind", "p2p_bandwidth"}, {"bytes", o.bandwidth_bytes},
         {"iters", o.bandwidth_iters},
         {"tessera_bytes_per_second", p2p->tessera_bytes_per_second},
         {"zmq_bytes_per_second", p2p->zmq_bytes_per_second},
         {"memcpy_bytes_per_second", p2p->memcpy_bytes_per_second},
         {"tessera_over_zmq", Ratio(p2p->tessera_bytes_per_second, p2p->zmq_bytes_per_second)},
         {"tessera_over_memcpy",
          Ratio(p2p->tessera_bytes_per_second, p2p->memcpy_bytes_per_second)}});
  }
  return rows;
}

void PrintTable(const GroupsBenchOptions& o, const PythonSetup* py, const std::string& skipped,
                const std::vector<nlohmann::json>& rows) {
  std::cout << "groups: what a group adds and gives, tessera beside Gloo and the limits, in "
            << "the same run (" << std::thread::hardware_concurrency() << " cores)\n";
  if (!skipped.empty()) {
    std::cout << "\nnew_group, concurrent groups: skipped (" << skipped << ")\n";
  }
  if (py != nullptr && !o.no_torch && skipped.empty()) {
    std::cout << "PyTorch " << py->torch_version << "; tessera package " << py->tessera_package
              << "\n\nnew_group: " << o.groups << " dist.new_group(all ranks) per rank after "
              << "init and one all_reduce, each used by one all_reduce; a set of processes "
              << "per backend; ms = the slowest rank's time of a new_group, median (max) over "
              << "the groups; sockets (listening TCP), threads and KiB (VmRSS) each group "
              << "added, the most any rank added / " << o.groups << "; before -> after: rank "
              << "0's counts; ratio = tessera / gloo\n\n"
              << std::left << std::setw(4) << "np" << std::setw(9) << "backend" << std::right
              << std::setw(18) << "ms/new_group" << std::setw(14) << "sockets/grp"
              << std::setw(12) << "threads/grp" << std::setw(10) << "KiB/grp" << std::setw(12)
              << "sockets" << std::setw(12) << "threads" << "\n";
    for (const nlohmann::json& row : rows) {
      if (row.at("kind") != "new_group") continue;
      for (const char* backend : {"gloo", "tessera"}) {
        const nlohmann::json& f = row.at(backend);
        std::cout << std::left << std::setw(4) << row.at("np").get<int>() << std::setw(9)
                  << backend << std::right << std::setw(18)
                  << Fixed(f.at("new_group_ms_median"), 2) + " (" +
                         Fixed(f.at("new_group_ms_max"), 1) + ")"
                  << std::setw(14) << Fixed(f.at("sockets_per_group"), 2) << std::setw(12)
                  << Fixed(f.at("threads_per_group"), 2) << std::setw(10)
                  << Fixed(f.at("rss_kib_per_group"), 0) << std::setw(12)
                  << std::to_string(f.at("sockets_before").get<int>()) + " -> " +
                         std::to_string(f.at("sockets_after").get<int>())
                  << std::setw(12)
                  << std::to_string(f.at("threads_before").get<int>()) + " -> " +
                         std::to_string(f.at("threads_after").get<int>())
                  << "\n";
      }
      const nlohmann::json& r = row.at("tessera_over_gloo");
      std::cout << std::left << std::setw(4) << "" << std::setw(9) << "ratio" << std::right
                << std::setw(18) << Fixed(r.at("new_group_ms_median"), 2, "x") << std::setw(14)
                << Fixed(r.at("sockets_per_group"), 2, "x") << std::setw(12)
                << Fixed(r.at("threads_per_group"), 2, "x") << std::setw(10)
                << Fixed(r.at("rss_kib_per_group"), 2, "x") << "\n";
    }
    if (o.concurrent_iters > 0) {
      std::cout << "\nconcurrent groups: two groups all-reducing " << HumanBytes(o.concurrent_bytes)
                << " (float32) " << o.concurrent_iters << " times each from two threads at "
                << "once vs one group doing both shares from one thread; the slowest rank's "
                << "time, median of " << o.repeats << "; concurrent/single below 1: the "
                << "groups overlap, 2: they take turns\n\n"
                << std::left << std::setw(4) << "np" << std::setw(9) << "backend" << std::right
                << std::setw(16) << "concurrent ms" << std::setw(12) << "single ms"
                << std::setw(20) << "concurrent/single" << "\n";
      for (const nlohmann::json& row : rows) {
        if (row.at("kind") != "concurrent") continue;
        for (const char* backend : {"gloo", "tessera"}) {
          const nlohmann::json& f = row.at(backend);
          std::cout << std::left << std::setw(4) << row.at("np").get<int>() << std::setw(9)
                    << backend << std::right << std::setw(16)
                    << Fixed(f.at("concurrent_s").get<double>() * 1e3, 2) << std::setw(12)
                    << Fixed(f.at("single_s").get<double>() * 1e3, 2) << std::setw(19)
                    << Fixed(f.at("concurrent_over_single"), 2) << "x\n";
        }
        std::cout << std::left << std::setw(4) << "" << "tessera / gloo concurrent time: "
                  << Fixed(row.at("tessera_over_gloo_concurrent_s"), 2, "x") << "\n";
      }
    }
  }
  for (const nlohmann::json& row : rows) {
    if (row.at("kind") == "p2p_latency") {
      std::cout << "\npoint-to-point between two processes, ping-pong (one way = half the "
                << "median round trip): tessera = Communicator Send/Recv over its endpoint; "
                << "zmq = raw PAIR sockets over tcp://127.0.0.1; shm = a spun-on word in "
                << "shared memory; memcpy = one copy in one process\n\n"
                << std::left << std::setw(12) << "" << std::right << std::setw(12) << "tessera"
                << std::setw(12) << "zmq" << std::setw(12) << "limit" << std::setw(14)
                << "tessera/zmq" << std::setw(16) << "tessera/limit" << "\n"
                << std::left << std::setw(12) << "8 B us" << std::right << std::setw(12)
                << Fixed(row.at("tessera_s").get<double>() * 1e6, 1) << std::setw(12)
                << Fixed(row.at("zmq_s").get<double>() * 1e6, 1) << std::setw(12)
                << Fixed(row.at("shm_s").get<double>() * 1e6, 2) << std::setw(14)
                << Fixed(row.at("tessera_over_zmq"), 2, "x") << std::setw(16)
                << Fixed(row.at("tessera_over_shm"), 1, "x") << "  (limit: shm)\n";
    } else if (row.at("kind") == "p2p_bandwidth") {
      std::cout << std::left << std::setw(12)
                << HumanBytes(row.at("bytes").get<size_t>()) + " GB/s" << std::right
                << std::setw(12) << Fixed(row.at("tessera_bytes_per_second").get<double>() / 1e9, 2)
                << std::setw(12) << Fixed(row.at("zmq_bytes_per_second").get<double>() / 1e9, 2)
                << std::setw(12)
                << Fixed(row.at("memcpy_bytes_per_second").get<double>() / 1e9, 2)
                << std::setw(14) << Fixed(row.at("tessera_over_zmq"), 2, "x") << std::setw(16)
                << Fixed(row.at("tessera_over_memcpy"), 2, "x") << "  (limit: memcpy)\n";
    }
  }
}

int RunGroupsBench(const GroupsBenchOptions& o) {
  std::optional<PythonSetup> py;
  std::string skipped;
  Records records;
  if (!o.no_torch) {
    StatusOr<PythonSetup> probe = ProbePython();
    if (!probe.ok()) {
      std::cerr << "tessera-bench groups: " << probe.status() << "\n";
      return 1;
    }
    py = *probe;
    skipped = py->skipped;
    if (skipped.empty()) {
      Status status = MeasureGroups(o, *py, &records);
      if (!status.ok()) {
        std::cerr << "tessera-bench groups: " << status << "\n";
        return 1;
      }
    } else if (o.json) {
      std::cerr << "tessera-bench groups: new_group and concurrent groups skipped: " << skipped
                << "\n";
    }
  }
  std::optional<PointToPointFigures> p2p;
  if (!o.no_p2p) {
    PointToPointOptions p2p_options;
    p2p_options.bandwidth_bytes = o.bandwidth_bytes;
    p2p_options.latency_iters = o.latency_iters;
    p2p_options.bandwidth_iters = o.bandwidth_iters;
    p2p_options.timeout_ms = int64_t{o.timeout_s} * 1000;
    p2p_options.progress = !o.json;
    StatusOr<PointToPointFigures> figures = MeasurePointToPoint(p2p_options);
    if (!figures.ok()) {
      std::cerr << "tessera-bench groups: " << figures.status() << "\n";
      return 1;
    }
    p2p = *figures;
  }
  const std::vector<nlohmann::json> rows = Rows(o, records, p2p);
  if (!o.json) {
    PrintTable(o, py ? &*py : nullptr, skipped, rows);
    return 0;
  }
  nlohmann::json config = {{"benchmark", "groups"},
                           {"kind", "config"},
                           {"cores", std::thread::hardware_concurrency()},
                           {"nps", o.nps},
                           {"groups", o.groups},
                           {"concurrent_bytes", o.concurrent_bytes},
                           {"concurrent_iters", o.concurrent_iters},
                           {"repeats", o.repeats},
                           {"latency_bytes", 8},
                           {"latency_iters", o.latency_iters},
                           {"bandwidth_bytes", o.bandwidth_bytes},
                           {"bandwidth_iters", o.bandwidth_iters}};
  if (py && skipped.empty()) {
    config["torch_version"] = py->torch_version;
    config["tessera_package"] = py->tessera_package;
  }
  std::cout << config.dump() << "\n";
  if (!skipped.empty()) {
    std::cout << nlohmann::json({{"benchmark", "groups"}, {"kind", "skipped"},
                                 {"parts", {"new_group", "concurrent"}}, {"skipped", skipped}})
                     .dump()
              << "\n";
  }
  for (const nlohmann::json& row : rows) std::cout << row.dump() << "\n";
  return 0;
}

}  // namespace

BenchCommand AddGroupsBench(CLI::App* parent) {
  auto o = std::make_shared<GroupsBenchOptions>();
  CLI::App* app = parent->add_subcommand(
      "groups",
      "Communicator groups (issue 50): new_group()'s time, sockets, threads and memory and two "
      "groups at once, tessera vs gloo from Python; point-to-point vs raw ZeroMQ and shm");
  app->footer(
      "The torch parts run /usr/bin/python3 tools/bench/torch_groups_bench.py ranks, a set of "
      "processes per backend; they are skipped (saying why) when /usr/bin/python3 cannot "
      "import torch.distributed or tessera.torch. The point-to-point part runs this binary as "
      "its two peers.\n"
      "Quick look:  tessera-bench groups --np 2 --groups 4 --concurrent-iters 5 --repeats 1 "
      "--latency-iters 200 --bandwidth-iters 5");
  app->add_option("--np", o->np_text, "Processes of the torch parts, comma-separated (2-64)")
      ->capture_default_str();
  app->add_option("--groups", o->groups, "dist.new_group()s per set of processes")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--concurrent-bytes", o->concurrent_bytes_text,
                  "Bytes of each concurrent all_reduce's float32 tensor; K, M suffixes (binary)")
      ->capture_default_str();
  app->add_option("--concurrent-iters", o->concurrent_iters,
                  "All-reduces per group in the concurrent part; 0: no concurrent part")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app->add_option("--repeats", o->repeats,
                  "Concurrent / single pairs, alternating which goes first; the medians count")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_option("--latency-iters", o->latency_iters, "Timed 8-byte round trips per peer kind")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  app->add_option("--bandwidth-bytes", o->bandwidth_bytes_text,
                  "Bytes of each bandwidth message; K, M, G suffixes (binary)")
      ->capture_default_str();
  app->add_option("--bandwidth-iters", o->bandwidth_iters,
                  "Timed bandwidth round trips per peer kind (and memcpys)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app->add_flag("--no-torch", o->no_torch, "Only point-to-point (no Python)");
  app->add_flag("--no-p2p", o->no_p2p, "Only the torch parts");
  app->add_option("--timeout-s", o->timeout_s,
                  "Deadline of each set of rank processes and each point-to-point pair")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app->add_flag("--json", o->json,
                "One JSON object per line (config, then a row per np and part) instead of the "
                "table");
  AddPointToPointPeerFlags(app, &o->peer);
  return {app, [o]() -> int {
            if (!o->peer.kind.empty()) return RunPointToPointPeer(o->peer);
            Status status = ParseOptions(o.get());
            if (!status.ok()) {
              std::cerr << "tessera-bench groups: " << status.message() << "\n";
              return 2;
            }
            return RunGroupsBench(*o);
          }};
}

}  // namespace tessera::tools
