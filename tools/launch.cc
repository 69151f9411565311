// tessera-launch: starts a local Tessera fleet (one coordinator, S servers, W workers) as child
// processes, forwards their output line by line with a "[role rank] " prefix, and supervises
// it: the first process to fail stops the whole fleet, and nothing is left running on any path.
//
// Sequence: coordinator -> its TESSERA_READY line gives the address -> servers and workers ->
// every worker exits -> optional linger (a last metrics scrape) -> SIGTERM to the workers (if
// any still run), then to the servers, then to the coordinator, all within --grace, then
// SIGKILL to whatever still runs. The exit status is 0 only when every worker exited 0.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/and_list.h"
#include "common/base/deadline.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/quote.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/config/flag_checks.h"
#include "common/config/slurm.h"
#include "common/messages/fleet_view.h"
#include "common/security/credentials.h"
#include "common/security/job_key.h"
#include "tools/process_group.h"

namespace tessera {
namespace tools {
namespace {

constexpr std::string_view kReadyPrefix = "TESSERA_READY";
// The coordinator's line when a server joined in a failed one's place (coordinator_main.cc).
constexpr std::string_view kJoinedPrefix = "TESSERA_JOINED";
// Largest --servers, --workers, --nnodes, --nproc-per-node; and of any time in seconds (a
// week). Far past any real job, so that a few digits too many are caught.
constexpr int kMaxProcesses = 65536;
constexpr double kMaxSeconds = 7 * 24 * 3600;
// When the fleet stops, the part of --grace the workers leave to the servers and the
// coordinator (at most half of it); see StopFleetAndReport.
constexpr std::chrono::milliseconds kStopReserve{1000};

// ---------------------------------------------------------------------------------------------
// Configuration: parsed from flags in one place, validated once.

struct LaunchConfig {
  int servers = 0;
  int replicas = 1;  // of each key range (ps-* modes); passed to the coordinator
  int workers = 1;
  std::string mode = "local";
  double linger_s = 0;
  std::string bin_dir;
  double start_timeout_s = 60;
  std::string log_level;  // empty: children use their own default
  std::optional<int64_t> heartbeat_timeout_ms;  // absent: the children's default
  double grace_s = 5;
  int max_restarts = 0;
  // Elastic jobs (issue 47): 0, the default, any worker's death stops the job.
  int min_workers = 0;
  int max_workers = 0;         // 0: --workers
  std::string membership_log;  // the coordinator writes each membership change here (JSON lines)
  // Multi-node (torchrun's --nnodes/--node-rank/--nproc-per-node/--rdzv-endpoint).
  int nnodes = 1;
  int node_rank = 0;
  std::optional<int> nproc_per_node;  // absent: --workers is this node's count
  std::string coordinator;   // HOST:PORT; empty: 127.0.0.1:0 on a single node
  std::string attach;        // HOST:PORT of a running fleet's coordinator
  int add_servers = 0;       // with attach: servers joining in failed ones' places
  std::string bind_host;     // empty: the children's default (auto)
  // Security: the job's key file (empty: TESSERA_AUTH_KEY_FILE, else one made for this job),
  // --insecure, and --encrypt for every child (empty: their default, auto).
  std::string auth_key_file;
  bool insecure = false;
  std::string encrypt;
  std::string make_key_file;  // write a new key file here and exit
  std::vector<std::string> worker_args;  // forwarded unchanged to every worker

  // Workers this launcher starts.
  int LocalWorkers() const { return nproc_per_node.value_or(workers); }
  // Workers in the job, over all nodes (0: a long-running fleet with no job of its own).
  int WorldSize() const { return attach.empty() ? nnodes * LocalWorkers() : LocalWorkers(); }
  int FirstRank() const { return node_rank * LocalWorkers(); }
  // Whether this launcher starts the coordinator (and the servers): node 0, unless attaching.
  bool HostsCoordinator() const { return attach.empty() && node_rank == 0; }
  std::string CoordinatorAddress() const {
    if (!attach.empty()) return attach;
    return coordinator.empty() ? "127.0.0.1:0" : coordinator;
  }
};

constexpr char kDescription[] =
    "tessera-launch starts a local Tessera fleet on this machine -- one coordinator, --servers\n"
    "servers and --workers workers -- as child processes, prints each child's output prefixed\n"
    "with \"[role rank] \", and stops the whole fleet as soon as any process fails. With\n"
    "--nnodes it starts this node's part of a multi-node job; with --attach, a job of a\n"
    "long-running fleet.\n";

constexpr char kFooter[] = R"(Examples:
  # single-process training; everything after -- goes to every worker unchanged
  tessera-launch --workers 1 --mode local -- --model mlp --steps 500 --optimizer adam --lr 1e-3
  # 2 parameter servers and 3 workers; keep the fleet up 30 s after training for a scrape
  tessera-launch --servers 2 --workers 3 --mode ps-sync --linger 30 -- --steps 500
  # 4 data-parallel workers, optimizer state partitioned (ZeRO stage 2)
  tessera-launch --workers 4 --mode zero2 -- --optimizer adam --lr 1e-3 --steps 500
  # a long-running server fleet, until Ctrl-C; then jobs attach to it one after another
  tessera-launch --servers 4 --workers 0 --coordinator 127.0.0.1:29500
  tessera-launch --attach 127.0.0.1:29500 --workers 2 --mode ps-sync -- --steps 500
  # two nodes x 4 workers; node 0 (10.0.0.1) hosts the coordinator and the servers
  node0$ tessera-launch --nnodes 2 --node-rank 0 --nproc-per-node 4 --coordinator 10.0.0.1:29500 \
           --servers 2 --mode ps-sync -- --steps 500
  node1$ tessera-launch --nnodes 2 --node-rank 1 --nproc-per-node 4 --coordinator 10.0.0.1:29500 \
           --mode ps-sync -- --steps 500

Multi-node (as torchrun --nnodes/--node-rank/--nproc-per-node/--rdzv-endpoint):
  Run one launcher per node with the same --nnodes, --nproc-per-node, --mode and training
  flags. Node 0 starts the coordinator, listening at --coordinator HOST:PORT (port 0: the OS
  picks one, printed as "[launch] coordinator address tcp://HOST:PORT" for the other nodes),
  and all --servers servers; the other nodes start only workers, which connect there. Node R
  starts the workers with global ranks R*P .. R*P+P-1 (--rank) and local ranks 0 .. P-1
  (--local-rank, which picks the GPU), all with --num-workers NNODES*P. Node 0 keeps the
  coordinator and servers until every worker of every node has left (the coordinator's
  --exit-when-workers-leave). A worker failing anywhere fails the job: its own launcher exits 1
  naming it, the coordinator tells every other worker which rank failed, they exit with that
  error, and so do their launchers. Each process listens on its node's address on the route
  to the coordinator (--bind-host auto); name an interface (--bind-host eth1, or
  TESSERA_SOCKET_IFNAME) when that is not the network the nodes should use.

Elastic job (ps-sync, ps-async; docs/parameter-server.md):
  --min-workers N: a worker that leaves or dies is a membership change the other workers
  survive (the servers stop counting it at once), while at least N remain; below N the job
  stops, naming who left, why and after which step. --membership-log PATH: the changes, a
  line of JSON each. --max-workers M: the most it may have (joining is not done yet).

Long-running fleet:
  --workers 0 starts a coordinator (with --num-workers 0) and the servers and runs until
  interrupted. Jobs then attach one at a time with --attach HOST:PORT (or plain tessera-worker
  --coordinator HOST:PORT --rank R --num-workers W, or mpirun/Slurm/torchrun variables): the
  coordinator takes the job's size from its workers, gives them the servers, and when all of
  them have left frees the ranks for the next job. The servers start each job afresh from its
  rank 0's initial parameters (a new job token) and never treat a worker leaving as a failure.

How it works:
  The coordinator starts first, on an OS-picked port (--coordinator 127.0.0.1:0). Every
  child prints one line when it is ready:
    TESSERA_READY role=R rank=N address=tcp://HOST:PORT metrics=http://HOST:PORT/metrics pid=P
  and the launcher then prints
    [launch] <role> <rank> pid=<pid> metrics=<url>
  Servers and workers get --coordinator HOST:PORT from the coordinator's line, plus --rank,
  --num-servers, --num-workers, --bind-host and --log-level; workers also get --local-rank,
  --mode and the forwarded flags (any flag the launcher does not know, and everything
  after --).
  Binaries are looked up in --bin-dir, else in the launcher's Bazel runfiles, else next to it
  in bazel-bin (../coordinator/tessera-coordinator, ../server/ps/tessera-server,
  ../worker/tessera-worker).

Exit status:
  0    every worker exited 0 (the coordinator and servers are then stopped); in an elastic
       job, every worker that did not leave the job
  1    a child failed, did not become ready in time, or could not be started: the last line
       names it, e.g. "[launch] worker 1 (pid 1234) exited with status 3; stopped the rest
       of the fleet"
  2    bad flags
  130  interrupted by SIGINT (143: SIGTERM)

Security:
  Every job has a key; only processes holding it can register, exchange a message or join a
  ring. On one node the launcher makes a key for the job, in a private directory it removes
  at exit, and gives the children its path as TESSERA_AUTH_KEY_FILE (never the key itself,
  never in argv). Several nodes, --attach and other launchers (torchrun, mpirun, srun) need a
  key file they share: create one with --make-key-file PATH, copy it to every node (mode
  0600), and give --auth-key-file PATH (or TESSERA_AUTH_KEY_FILE) everywhere. Traffic is
  encrypted when the children listen off the loopback (--encrypt auto). --insecure turns
  authentication off. See docs/security.md.

Stopping (Ctrl-C, SIGTERM, a failure, or the end of the job): the workers get SIGTERM
first, then, once they have exited, the servers, then the coordinator; the whole stop takes at
most --grace seconds, after which whatever still runs gets SIGKILL (a second SIGINT/SIGTERM
skips the grace). The workers may use all of it but 1 s (half of a shorter grace), e.g. to
finish their step together and write a --checkpoint-on-sigterm checkpoint through the servers
(docs/checkpoints.md). Every child also dies with the launcher (PR_SET_PDEATHSIG), so none is
left behind.
)";

void AddFlags(CLI::App& app, LaunchConfig* config) {
  app.description(kDescription);
  app.footer(kFooter);
  app.allow_extras();  // unknown flags are forwarded to workers
  // A later flag overrides an earlier one, so wrappers can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--servers", config->servers, "Parameter servers to start")
      ->type_name("N")
      ->check(CLI::Range(0, kMaxProcesses))
      ->capture_default_str();
  app.add_option("--replicas", config->replicas,
                 "ps-* modes: copies of each key range, on consecutive servers (the "
                 "coordinator's --replicas); with 2 or more a server's death is survived while "
                 "every range has a live copy (the launcher and the workers carry on without it)")
      ->type_name("R")
      ->check(CLI::Range(1, kMaxProcesses))
      ->capture_default_str();
  CLI::Option* workers =
      app.add_option("--workers", config->workers,
                     "Workers to start (0: a long-running fleet, until interrupted)")
          ->type_name("N")
          ->check(CLI::Range(0, kMaxProcesses))
          ->capture_default_str();
  app.add_option("--mode", config->mode,
                 "Passed to workers as --mode: local (train alone; use --workers 1), ps-sync, "
                 "ps-async, ps-ssp (need --servers), allreduce, zero1, zero2, zero3, hsdp, or "
                 "smoke (the fleet smoke job)")
      ->type_name("MODE")
      ->capture_default_str();
  app.add_option("--linger", config->linger_s,
                 "Keep coordinator and servers up this long after the workers succeed")
      ->type_name("SECONDS")
      ->check(FiniteRange(0, kMaxSeconds))
      ->capture_default_str();
  app.add_option("--bin-dir", config->bin_dir, "Where tessera-{coordinator,server,worker} are")
      ->type_name("DIR");
  app.add_option("--start-timeout", config->start_timeout_s,
                 "Time each child has to print TESSERA_READY (more than 0)")
      ->type_name("SECONDS")
      ->check(FiniteRange(0, kMaxSeconds))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", config->heartbeat_timeout_ms,
                 "Every child's --heartbeat-timeout-ms (default theirs, 4000): the silence after "
                 "which the coordinator declares a process failed")
      ->type_name("MS")
      ->check(CLI::Range(int64_t{1001}, static_cast<int64_t>(kMaxSeconds) * 1000));
  app.add_option("--log-level", config->log_level, "debug|info|warning|error, for every child")
      ->type_name("LEVEL");
  app.add_option("--grace", config->grace_s,
                 "Time the fleet has to stop (workers, then servers, then the coordinator get "
                 "SIGTERM) before SIGKILL")
      ->type_name("SECONDS")
      ->check(FiniteRange(0, kMaxSeconds))
      ->capture_default_str();
  app.add_option("--max-restarts", config->max_restarts,
                 "When a process fails, stop the fleet and start it again, up to N times; the "
                 "workers get --resume, so with --checkpoint-dir they continue from the last "
                 "checkpoint (as torchrun's --max-restarts)")
      ->type_name("N")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--min-workers", config->min_workers,
                 "Elastic job (ps-sync, ps-async): keep training while at least N workers "
                 "remain; a worker that leaves or dies is a membership change the others "
                 "survive, not the job's end (default 0: any worker's death stops the job)")
      ->type_name("N")
      ->check(CLI::Range(0, kMaxProcesses));
  app.add_option("--max-workers", config->max_workers,
                 "Elastic job: the most workers it may have (default --workers)")
      ->type_name("N")
      ->check(CLI::Range(0, kMaxProcesses));
  app.add_option("--membership-log", config->membership_log,
                 "Elastic job: write each membership change (epoch, step, kind, rank, reason, "
                 "world size, time) to this file as a line of JSON")
      ->type_name("PATH");
  app.add_option("--nnodes", config->nnodes, "Nodes in the job, one launcher on each")
      ->type_name("N")
      ->check(CLI::Range(1, kMaxProcesses))
      ->capture_default_str();
  app.add_option("--node-rank", config->node_rank,
                 "This node's index in [0, --nnodes); node 0 hosts the coordinator and servers")
      ->type_name("R")
      ->check(CLI::Range(0, kMaxProcesses - 1))
      ->capture_default_str();
  app.add_option_function<int>(
         "--nproc-per-node", [config](const int& n) { config->nproc_per_node = n; },
         "Workers on each node (instead of --workers)")
      ->type_name("P")
      ->check(CLI::Range(1, kMaxProcesses))
      ->excludes(workers);
  app.add_option("--coordinator", config->coordinator,
                 "Where the coordinator listens (node 0) and every node connects; required with "
                 "--nnodes > 1. Port 0 (node 0 only): the OS picks, and the address is printed "
                 "(default on one node: 127.0.0.1:0)")
      ->type_name("HOST:PORT");
  app.add_option("--attach", config->attach,
                 "Start only the workers, as a job of the running fleet whose coordinator is "
                 "at HOST:PORT (see \"Long-running fleet\"); with --add-servers, only servers")
      ->type_name("HOST:PORT");
  app.add_option("--add-servers", config->add_servers,
                 "With --attach HOST:PORT: start N servers that join the running fleet there, "
                 "each in the place of a failed server (tessera-server --join); with --replicas "
                 "2 or more the workers copy its key ranges to it while training goes on. Runs "
                 "until the fleet stops")
      ->type_name("N")
      ->check(CLI::Range(0, kMaxProcesses));
  app.add_option("--bind-host", config->bind_host,
                 "Where the children listen (their --bind-host): auto (default: the address on "
                 "this node's route to the coordinator), an IP address or an interface name")
      ->type_name("HOST");
  app.add_option("--auth-key-file", config->auth_key_file,
                 "The job's key file, shared by every node (default: TESSERA_AUTH_KEY_FILE; on "
                 "one node without either, a key made for this job)")
      ->type_name("PATH");
  app.add_flag("--insecure", config->insecure,
               "No authentication: any process that reaches a port is trusted");
  app.add_option("--encrypt", config->encrypt,
                 "Every child's --encrypt: auto (default: when listening off the loopback), "
                 "on or off")
      ->type_name("auto|on|off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--make-key-file", config->make_key_file,
                 "Write a new job key to PATH (mode 0600; never overwrites) and exit")
      ->type_name("PATH");
}

// CLI11 keeps the "--" separator among the extras; everything else is forwarded as is.
std::vector<std::string> ForwardedArgs(std::vector<std::string> extras) {
  for (auto it = extras.begin(); it != extras.end(); ++it) {
    if (*it == "--") {
      extras.erase(it);
      break;
    }
  }
  return extras;
}

Status Validate(const LaunchConfig& config) {
  auto reject = [](const std::string& flag, const std::string& rule, double value) {
    std::ostringstream message;
    message << flag << " must be " << rule << " (got " << value << ")";
    return InvalidArgumentError(message.str());
  };
  if (config.servers < 0) return reject("--servers", "0 or more", config.servers);
  if (config.workers < 0) return reject("--workers", "0 or more", config.workers);
  if (config.replicas > 1 && config.replicas > config.servers) {
    return reject("--replicas", "at most --servers=" + std::to_string(config.servers),
                  config.replicas);
  }
  if (config.nnodes < 1) return reject("--nnodes", "1 or more", config.nnodes);
  if (config.node_rank < 0 || config.node_rank >= config.nnodes) {
    return reject("--node-rank", "in [0, --nnodes=" + std::to_string(config.nnodes) + ")",
                  config.node_rank);
  }
  auto check_address = [](const std::string& flag, const std::string& value,
                           bool port_zero_ok) -> Status {
    StatusOr<std::pair<std::string, int>> parsed = ParseHostPort(value);
    if (!parsed.ok()) return parsed.status().WithContext(flag + "=" + value);
    if (parsed->second == 0 && !port_zero_ok) {
      return InvalidArgumentError(flag + "=" + value +
                                  ": port 0 cannot be connected to; give the coordinator's port");
    }
    return OkStatus();
  };
  if (config.nnodes > 1) {
    if (!config.attach.empty()) {
      return InvalidArgumentError("--attach and --nnodes > 1 do not mix: every node of an "
                                  "attaching job connects with --coordinator");
    }
    if (config.coordinator.empty()) {
      return InvalidArgumentError("--nnodes=" + std::to_string(config.nnodes) +
                                  " needs --coordinator HOST:PORT (node 0's address)");
    }
    if (config.LocalWorkers() < 1) {
      return InvalidArgumentError("--nnodes > 1 needs --nproc-per-node 1 or more");
    }
    if (config.node_rank > 0 && config.servers > 0) {
      return InvalidArgumentError("--servers=" + std::to_string(config.servers) +
                                  " on --node-rank=" + std::to_string(config.node_rank) +
                                  ": node 0 starts all the servers; give --servers there only");
    }
  }
  if (config.min_workers > 0 || config.max_workers > 0 || !config.membership_log.empty()) {
    // The coordinator checks min <= workers <= max; what only this launcher knows is here.
    if (config.min_workers == 0) {
      return InvalidArgumentError("--max-workers and --membership-log are for an elastic job: "
                                  "give --min-workers too");
    }
    if (config.mode.rfind("ps-", 0) != 0) {
      return InvalidArgumentError("--min-workers=" + std::to_string(config.min_workers) +
                                  " with --mode=" + config.mode + ": only the parameter-server "
                                  "modes (ps-sync, ps-async, ps-ssp) go on without a worker yet");
    }
    if (config.nnodes > 1 || !config.attach.empty() || config.max_restarts > 0) {
      return InvalidArgumentError("--min-workers=" + std::to_string(config.min_workers) +
                                  ": an elastic job is one launcher's fleet for now (not with "
                                  "--nnodes > 1, --attach or --max-restarts)");
    }
  }
  if (config.max_restarts > 0 && (config.nnodes > 1 || !config.attach.empty())) {
    return InvalidArgumentError("--max-restarts restarts a fleet this launcher owns whole; not "
                                "with --nnodes > 1 or --attach (restart the whole job instead)");
  }
  if (!config.coordinator.empty()) {
    RETURN_IF_ERROR(check_address("--coordinator", config.coordinator, config.node_rank == 0));
  }
  if (config.add_servers > 0 && config.attach.empty()) {
    return InvalidArgumentError("--add-servers joins a running fleet: give its coordinator with "
                                "--attach HOST:PORT");
  }
  if (config.add_servers > 0 && config.workers > 0) {
    return InvalidArgumentError("--add-servers starts servers only; drop --workers (or give "
                                "--workers 0)");
  }
  if (!config.attach.empty()) {
    RETURN_IF_ERROR(check_address("--attach", config.attach, false));
    if (!config.coordinator.empty()) {
      return InvalidArgumentError("give --attach or --coordinator, not both");
    }
    if (config.servers > 0) {
      return InvalidArgumentError("--attach joins a running fleet, which has its servers; "
                                  "drop --servers");
    }
    if (config.LocalWorkers() < 1 && config.add_servers == 0) {
      return InvalidArgumentError("--attach needs --workers 1 or more (or --add-servers N)");
    }
  }
  if (!(config.linger_s >= 0)) return reject("--linger", "0 or more", config.linger_s);
  if (config.max_restarts < 0) return reject("--max-restarts", "0 or more", config.max_restarts);
  if (!(config.start_timeout_s > 0)) {
    return reject("--start-timeout", "more than 0", config.start_timeout_s);
  }
  if (!(config.grace_s >= 0)) return reject("--grace", "0 or more", config.grace_s);
  if (config.mode.empty()) return InvalidArgumentError("--mode must not be empty");
  if (!config.log_level.empty()) {
    StatusOr<LogLevel> level = ParseLogLevel(config.log_level);
    if (!level.ok()) return level.status().WithContext("--log-level");
  }
  return OkStatus();
}

// Inside a Slurm step that spans several nodes (`srun --ntasks-per-node=1 tessera-launch ...`),
// what --nnodes, --node-rank and --coordinator would say: the step's nodes, this node's index,
// and the head node's address on the job's port (MASTER_PORT when set). Flags given win.
Status ApplySlurm(const CLI::App& app, const Environment& env, LaunchConfig* config) {
  StatusOr<std::optional<SlurmJob>> read = ReadSlurmJob(env);
  if (!read.ok()) return read.status().WithContext("reading Slurm's variables");
  if (!read->has_value() || !config->attach.empty()) return OkStatus();
  const SlurmJob& job = **read;
  const int nodes = static_cast<int>(job.nodes.size());
  if (!job.in_step || nodes < 2) return OkStatus();  // one node: the local defaults serve
  if (job.num_tasks && *job.num_tasks != nodes) {
    return InvalidArgumentError(
        "this Slurm step runs " + std::to_string(*job.num_tasks) + " tasks on " +
        std::to_string(nodes) + " nodes; tessera-launch starts a node's processes itself, so run "
        "one per node: srun --ntasks-per-node=1 tessera-launch --nproc-per-node P ...");
  }
  if (app.count("--nnodes") == 0) config->nnodes = nodes;
  if (app.count("--node-rank") == 0) config->node_rank = job.node_id;
  if (config->coordinator.empty()) {
    int port = SlurmJobPort(job.job_id);
    if (auto it = env.find("MASTER_PORT"); it != env.end()) {
      StatusOr<std::pair<std::string, int>> parsed = ParseHostPort("x:" + it->second);
      if (!parsed.ok() || parsed->second == 0) {
        return InvalidArgumentError("MASTER_PORT=" + Quote(it->second) + ": not a port 1-65535");
      }
      port = parsed->second;
    }
    StatusOr<std::string> head = ResolveSlurmNode(job.nodes[0], RunCommand);
    if (!head.ok()) return head.status().WithContext("finding the Slurm job's head node");
    config->coordinator = JoinHostPort(*head, port);
  }
  // The same command runs on every node; node 0 starts every server (the other nodes' workers
  // learn them from the coordinator).
  if (config->node_rank > 0) config->servers = 0;
  return OkStatus();
}

std::string FormatSeconds(double seconds) {
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

std::chrono::milliseconds ToMillis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// ---------------------------------------------------------------------------------------------
// Finding the fleet's binaries.

struct FleetBinaries {
  std::string coordinator;
  std::string server;
  std::string worker;
};

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

StatusOr<std::string> SelfExecutable() {
  std::vector<char> buffer(4096);
  ssize_t length = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) {
    return UnavailableError(std::string("readlink /proc/self/exe: ") + strerror(errno));
  }
  return std::string(buffer.data(), static_cast<size_t>(length));
}

// Where the three binaries are under `root` when it is laid out like the workspace.
FleetBinaries WorkspaceLayout(const std::string& root) {
  return {root + "/coordinator/tessera-coordinator",
          root + "/server/ps/tessera-server",
          root + "/worker/tessera-worker"};
}

// Returns "" when all three exist and are executable, else the names of the missing ones.
std::string Missing(const FleetBinaries& binaries) {
  std::string missing;
  for (const std::string* path : {&binaries.coordinator, &binaries.server, &binaries.worker}) {
    if (IsExecutable(*path)) continue;
    std::string name = path->substr(path->rfind('/') + 1);
    missing += (missing.empty() ? "" : ", ") + name;
  }
  return missing;
}

StatusOr<FleetBinaries> FindBinaries(const std::string& bin_dir) {
  if (!bin_dir.empty()) {
    FleetBinaries binaries{bin_dir + "/tessera-coordinator", bin_dir + "/tessera-server",
                           bin_dir + "/tessera-worker"};
    std::string missing = Missing(binaries);
    if (!missing.empty()) return NotFoundError("--bin-dir " + bin_dir + ": no " + missing);
    return binaries;
  }
  ASSIGN_OR_RETURN(std::string self, SelfExecutable());
  std::string self_dir = self.substr(0, self.rfind('/'));
  std::string tried;
  for (const std::string& root : {self + ".runfiles/tessera", self_dir + "/.."}) {
    FleetBinaries binaries = WorkspaceLayout(root);
    std::string missing = Missing(binaries);
    if (missing.empty()) return binaries;
    tried += "\n  " + root + "/{server,worker}/: no " + missing;
  }
  return NotFoundError(
      "cannot find the fleet's binaries; build them with `bazel build //tools:tessera-launch` "
      "or pass --bin-dir DIR. Looked in:" +
      tried);
}

// ---------------------------------------------------------------------------------------------
// The ready line: "TESSERA_READY role=worker rank=1 address=tcp://HOST:PORT
// metrics=http://HOST:PORT/metrics pid=123". Unknown keys are ignored.

struct ReadyInfo {
  std::string role;
  int rank = -1;
  std::string address;  // tcp://HOST:PORT
  std::string metrics;  // http://HOST:PORT/metrics
  int64_t pid = -1;
};

StatusOr<int64_t> ParseInteger(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    int64_t number = std::stoll(value, &used);
    if (used == value.size() && number >= 0) return number;
  } catch (const std::exception&) {
  }
  return InvalidArgumentError(key + "=" + value + " is not a non-negative integer");
}

// The key=value tokens after a line's prefix (role, rank, address, metrics, pid).
StatusOr<ReadyInfo> ParseFields(const std::string& fields) {
  ReadyInfo info;
  std::istringstream tokens(fields);
  std::string token;
  while (tokens >> token) {
    size_t equals = token.find('=');
    if (equals == std::string::npos) continue;
    std::string key = token.substr(0, equals), value = token.substr(equals + 1);
    if (key == "role") info.role = value;
    if (key == "address") info.address = value;
    if (key == "metrics") info.metrics = value;
    if (key == "rank") {
      ASSIGN_OR_RETURN(int64_t rank, ParseInteger(key, value));
      info.rank = static_cast<int>(rank);
    }
    if (key == "pid") {
      ASSIGN_OR_RETURN(info.pid, ParseInteger(key, value));
    }
  }
  if (info.role.empty()) return InvalidArgumentError("no role=");
  if (info.rank < 0) return InvalidArgumentError("no rank=");
  return info;
}

StatusOr<ReadyInfo> ParseJoinedLine(const std::string& line) {
  return ParseFields(line.substr(kJoinedPrefix.size()));
}

StatusOr<ReadyInfo> ParseReadyLine(const std::string& line) {
  ASSIGN_OR_RETURN(ReadyInfo info, ParseFields(line.substr(kReadyPrefix.size())));
  if (info.address.rfind("tcp://", 0) != 0 ||
      info.address.find(':', std::string("tcp://").size()) == std::string::npos) {
    return InvalidArgumentError("address= must be tcp://HOST:PORT, got '" + info.address + "'");
  }
  if (info.metrics.rfind("http://", 0) != 0) {
    return InvalidArgumentError("metrics= must be an http:// URL, got '" + info.metrics + "'");
  }
  return info;
}

// "tcp://HOST:PORT" -> "HOST:PORT"; a wildcard host becomes 127.0.0.1 (the fleet is local).
std::string ConnectAddress(const std::string& address) {
  std::string host_port = address.substr(std::string("tcp://").size());
  for (std::string_view wildcard : {"*:", "0.0.0.0:"}) {
    if (host_port.rfind(wildcard, 0) == 0) {
      return "127.0.0.1:" + host_port.substr(wildcard.size());
    }
  }
  return host_port;
}

// ---------------------------------------------------------------------------------------------
// Output: one write(2) per line, so lines never interleave. Errors (a closed pipe) are ignored:
// supervision goes on even when nobody reads our output.

void WriteLine(int fd, std::string line) {
  line += '\n';
  size_t done = 0;
  while (done < line.size()) {
    ssize_t wrote = write(fd, line.data() + done, line.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;
    done += static_cast<size_t>(wrote);
  }
}

void Announce(const std::string& text) { WriteLine(STDOUT_FILENO, "[launch] " + text); }

// ---------------------------------------------------------------------------------------------
// Signals. The handler only records, and wakes the supervision loop's poll() through a pipe
// (ProcessGroup::WakeOn: a signal just before poll() interrupts nothing); the loop acts on it.
// These three words are the launcher's only global state: a signal handler has nowhere else to
// write.

volatile sig_atomic_t g_first_signal = 0;
volatile sig_atomic_t g_signal_count = 0;
int g_wake_write_fd = -1;  // set before the handlers are installed, never changed after

void OnSignal(int signal) {
  const int saved_errno = errno;
  if (g_first_signal == 0) g_first_signal = signal;
  g_signal_count = g_signal_count + 1;
  const char byte = 0;
  if (g_wake_write_fd >= 0 && write(g_wake_write_fd, &byte, 1) < 0) {
    // A full pipe already wakes the loop.
  }
  errno = saved_errno;
}

// The read end of the pipe OnSignal writes to (-1 when it cannot be made: a signal then waits
// for the loop's next wake-up), then the handlers.
int InstallSignalHandlers() {
  int wake[2] = {-1, -1};
  if (pipe2(wake, O_NONBLOCK | O_CLOEXEC) == 0) g_wake_write_fd = wake[1];
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR and the loop looks at once
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, nullptr);  // children get SIG_DFL back before exec
  return wake[0];
}

// ---------------------------------------------------------------------------------------------
// The fleet.

enum class Role { kCoordinator, kServer, kWorker };

const char* RoleName(Role role) {
  switch (role) {
    case Role::kCoordinator: return "coordinator";
    case Role::kServer: return "server";
    case Role::kWorker: return "worker";
  }
  return "?";
}

struct Member {
  Role role = Role::kWorker;
  int rank = 0;
  pid_t pid = -1;
  Deadline ready_deadline = Deadline::AfterMillis(0);
  bool ready = false;
  bool exited = false;
  std::string prefix;  // "[worker 1] "
};

// "worker 1 (pid 1234)", "coordinator (pid 1200)".
std::string Describe(const Member& member) {
  std::string name = RoleName(member.role);
  if (member.rank < 0) name = "joining " + name;  // its rank not known yet
  if (member.role != Role::kCoordinator && member.rank >= 0) {
    name += " " + std::to_string(member.rank);
  }
  return name + " (pid " + std::to_string(member.pid) + ")";
}

// Supervises one fleet from start to stop. Single-threaded; Run() is called once.
class Launcher {
 public:
  // `wake_fd`: InstallSignalHandlers' pipe, which ends the supervision loop's waits.
  Launcher(LaunchConfig config, FleetBinaries binaries, int wake_fd)
      : config_(std::move(config)), binaries_(std::move(binaries)) {
    group_.WakeOn(wake_fd);
  }

  // Returns the process exit status.
  int Run() {
    if (StartCoordinator()) {
      StartServersAndWorkers();
      SuperviseUntilWorkersFinish();
      AwaitOtherNodes();
      Linger();
    }
    return StopFleetAndReport();
  }

 private:
  // A failure or a signal has decided the outcome: the fleet is to be stopped.
  bool ShouldStop() const { return failure_.has_value() || interrupted_by_ != 0; }

  // --- phases -----------------------------------------------------------------------------

  bool StartCoordinator() {
    if (!config_.HostsCoordinator()) {
      coordinator_address_ = config_.CoordinatorAddress();
      Announce(std::string(config_.attach.empty() ? "node " + std::to_string(config_.node_rank)
                                                  : "attaching") +
               ": workers connect to the coordinator at " + coordinator_address_);
      return true;
    }
    // Port 0: the OS picks a free one, and the ready line tells us which.
    std::vector<std::string> args = {binaries_.coordinator, "--coordinator",
                                     config_.CoordinatorAddress()};
    AppendFleetSize(&args);
    AppendCommonFlags(&args);
    // Several nodes: the coordinator stays until the other nodes' workers are done too.
    if (config_.nnodes > 1) args.push_back("--exit-when-workers-leave");
    if (config_.replicas > 1) {
      args.insert(args.end(), {"--replicas", std::to_string(config_.replicas)});
    }
    if (config_.min_workers > 0) {
      args.insert(args.end(), {"--min-workers", std::to_string(config_.min_workers)});
    }
    if (config_.max_workers > 0) {
      args.insert(args.end(), {"--max-workers", std::to_string(config_.max_workers)});
    }
    if (!config_.membership_log.empty()) {
      args.insert(args.end(), {"--membership-log", config_.membership_log});
    }
    if (!Spawn(Role::kCoordinator, 0, std::move(args))) return false;
    while (!ShouldStop() && !members_[0].ready) PollOnce(Deadline::AfterMillis(1000));
    return !ShouldStop();
  }

  void StartServersAndWorkers() {
    // Joining servers: the coordinator gives each a failed server's rank (their ready lines
    // say which).
    for (int joined = 0; joined < config_.add_servers && !ShouldStop(); ++joined) {
      std::vector<std::string> args = {binaries_.server, "--coordinator", coordinator_address_,
                                       "--join"};
      AppendCommonFlags(&args);
      Spawn(Role::kServer, -1 - joined, std::move(args));
    }
    for (int rank = 0; rank < config_.servers && !ShouldStop(); ++rank) {
      std::vector<std::string> args = {binaries_.server};
      AppendRankAndFleet(rank, &args);
      AppendCommonFlags(&args);
      Spawn(Role::kServer, rank, std::move(args));
    }
    for (int local = 0; local < config_.LocalWorkers() && !ShouldStop(); ++local) {
      const int rank = config_.FirstRank() + local;
      std::vector<std::string> args = {binaries_.worker};
      AppendRankAndFleet(rank, &args);
      AppendCommonFlags(&args);
      args.insert(args.end(), {"--local-rank", std::to_string(local), "--mode", config_.mode});
      args.insert(args.end(), config_.worker_args.begin(), config_.worker_args.end());
      Spawn(Role::kWorker, rank, std::move(args));
    }
  }

  void SuperviseUntilWorkersFinish() {
    const int workers = config_.LocalWorkers();
    if (config_.add_servers > 0 && !ShouldStop()) {
      Announce(std::to_string(config_.add_servers) + " servers joining the fleet at " +
               coordinator_address_ + ", each in a failed server's place; serving until the "
               "fleet stops (or Ctrl-C)");
      while (!ShouldStop() && group_.RunningCount() > 0) PollOnce(Deadline::AfterMillis(1000));
      return;
    }
    if (workers == 0 && !ShouldStop()) {
      Announce("no workers: a long-running fleet, until interrupted (Ctrl-C); jobs attach with "
               "tessera-launch --attach " + coordinator_address_ + " --workers N ...");
    }
    while (!ShouldStop() && (workers == 0 || workers_finished_ + workers_lost_ < workers)) {
      PollOnce(Deadline::AfterMillis(1000));
    }
    if (below_minimum_.has_value()) Fail(*below_minimum_);
  }

  // Node 0 of several: the coordinator exits by itself once every node's workers have left
  // (0), or one of them failed (1, naming it); the servers must serve until then.
  void AwaitOtherNodes() {
    if (ShouldStop() || config_.nnodes == 1 || !config_.HostsCoordinator()) return;
    if (!coordinator_done_) {
      Announce("this node's " + std::to_string(config_.LocalWorkers()) +
               " workers finished; waiting for the other nodes' workers to leave");
    }
    while (!ShouldStop() && !coordinator_done_) PollOnce(Deadline::AfterMillis(1000));
  }

  void Linger() {
    lingering_ = true;
    if (ShouldStop() || config_.linger_s <= 0 || group_.RunningCount() == 0) return;
    Announce("all " + std::to_string(config_.LocalWorkers()) + " workers finished; lingering " +
             FormatSeconds(config_.linger_s) + " before stopping the fleet");
    Deadline deadline = Deadline::After(ToMillis(config_.linger_s));
    while (!ShouldStop() && !deadline.Expired() && group_.RunningCount() > 0) PollOnce(deadline);
  }

  int StopFleetAndReport() {
    stopping_ = true;
    int signals_before = g_signal_count;
    auto sink = [this](const ChildEvent& event) { HandleEvent(event); };
    auto hurry = [signals_before] { return g_signal_count > signals_before; };
    // In stages, all within one --grace: the workers first, for they may still need the
    // servers (a ps-* step they finish together, the --checkpoint-on-sigterm checkpoint the
    // servers write); then the servers; the coordinator last, as everyone deregisters through
    // it. Each stage ends when its processes have exited, or at its share of the grace: the
    // workers may use all of it but kStopReserve (or half, for a short grace), the servers all
    // but half of that, so that the later stages still get their SIGTERM and a moment to leave.
    std::vector<int> stages[3];  // workers, servers, coordinator
    for (size_t id = 0; id < members_.size(); ++id) {
      const Role role = members_[id].role;
      stages[role == Role::kWorker ? 0 : role == Role::kServer ? 1 : 2].push_back(
          static_cast<int>(id));
    }
    const std::chrono::milliseconds grace = ToMillis(config_.grace_s);
    const std::chrono::milliseconds reserve = std::min(kStopReserve, grace / 2);
    const std::chrono::milliseconds keep[3] = {reserve, reserve / 2, std::chrono::milliseconds(0)};
    const Deadline end = Deadline::After(grace);
    StopReport report;
    std::map<int, double> killed_after_s;  // by child: how long after its SIGTERM
    for (int stage = 0; stage < 3; ++stage) {
      const std::chrono::milliseconds share =
          std::max(std::chrono::milliseconds(0),
                   std::chrono::milliseconds(end.RemainingMillis()) - keep[stage]);
      StopReport part = group_.Stop(stages[stage], share, sink, hurry);
      for (int id : part.killed) killed_after_s[id] = static_cast<double>(share.count()) / 1000;
      report.killed.insert(report.killed.end(), part.killed.begin(), part.killed.end());
      report.unreaped.insert(report.unreaped.end(), part.unreaped.begin(), part.unreaped.end());
    }
    bool hurried = g_signal_count > signals_before;
    for (int id : report.killed) {
      Announce(Describe(members_[id]) + " was still running " +
               (hurried ? std::string("at the second signal")
                        : FormatSeconds(killed_after_s[id]) + " after SIGTERM (--grace " +
                              FormatSeconds(config_.grace_s) + " for the whole fleet)") +
               "; sent SIGKILL");
    }
    for (int id : report.unreaped) {
      Announce(Describe(members_[id]) + " did not exit even after SIGKILL");
    }
    NoteSignal();
    if (interrupted_by_ != 0) {
      Announce("received " + SignalName(interrupted_by_) + "; stopped the fleet");
      return 128 + interrupted_by_;
    }
    if (failure_.has_value()) {
      Announce(*failure_ +
               (members_.size() > 1 ? "; stopped the rest of the fleet" : "; stopped the fleet"));
      return 1;
    }
    if (config_.add_servers > 0) {
      Announce("the " + std::to_string(config_.add_servers) + " servers added to the fleet at " +
               coordinator_address_ + " have left; done");
      return 0;
    }
    Announce("all " + std::to_string(config_.LocalWorkers()) + " workers" +
             (config_.nnodes > 1 ? " of node " + std::to_string(config_.node_rank) : "") +
             " finished; " + (members_.size() > static_cast<size_t>(config_.LocalWorkers())
                                  ? "fleet stopped"
                                  : "done"));
    return 0;
  }

  // --- spawning ---------------------------------------------------------------------------

  void AppendFleetSize(std::vector<std::string>* args) const {
    // Attaching workers take the servers from the running fleet's view.
    if (config_.attach.empty()) {
      args->insert(args->end(), {"--num-servers", std::to_string(config_.servers)});
    }
    args->insert(args->end(), {"--num-workers", std::to_string(config_.WorldSize())});
  }

  // "range 1 was lost with its replicas, servers 1 and 2": the first range all of whose
  // replicas are among lost_servers_; empty while every range has one.
  std::string LostRange() const {
    for (int range = 0; range < config_.servers; ++range) {
      std::vector<int> servers;
      bool lost = true;
      for (int k = 0; k < config_.replicas && lost; ++k) {
        const int server = RangeReplicaServer(range, k, config_.servers);
        lost = lost_servers_.count(server) > 0;
        servers.push_back(server);
      }
      if (lost) {
        return "range " + std::to_string(range) + " was lost with its replicas, servers " +
               AndList(servers);
      }
    }
    return "";
  }

  void AppendRankAndFleet(int rank, std::vector<std::string>* args) const {
    args->insert(args->end(),
                 {"--coordinator", coordinator_address_, "--rank", std::to_string(rank)});
    AppendFleetSize(args);
  }

  void AppendCommonFlags(std::vector<std::string>* args) const {
    if (!config_.log_level.empty()) args->insert(args->end(), {"--log-level", config_.log_level});
    if (config_.heartbeat_timeout_ms) {
      args->insert(args->end(),
                   {"--heartbeat-timeout-ms", std::to_string(*config_.heartbeat_timeout_ms)});
    }
    if (!config_.bind_host.empty()) args->insert(args->end(), {"--bind-host", config_.bind_host});
    if (config_.insecure) args->push_back("--insecure");
    if (!config_.encrypt.empty()) args->insert(args->end(), {"--encrypt", config_.encrypt});
  }

  // `rank` < 0: a joining server, its rank not known yet (-1 for the first, -2, ...).
  bool Spawn(Role role, int rank, std::vector<std::string> args) {
    std::string label = rank < 0 ? "joining server " + std::to_string(-rank)
                                 : std::string(RoleName(role)) + " " + std::to_string(rank);
    if (LogLevelEnabled(LogLevel::kDebug)) {
      std::string command;
      for (const std::string& arg : args) command += " " + arg;
      TLOG(DEBUG) << "starting " << label << ":" << command;
    }
    StatusOr<int> id = group_.Spawn(label, args);
    if (!id.ok()) {
      Fail(id.status().message());
      return false;
    }
    Member member;
    member.role = role;
    member.rank = rank;
    member.pid = group_.Pid(*id);
    member.ready_deadline = Deadline::After(ToMillis(config_.start_timeout_s));
    member.prefix = "[" + label + "] ";
    members_.push_back(std::move(member));  // ids are dense and in spawn order: index == id
    return true;
  }

  // --- supervision ------------------------------------------------------------------------

  void PollOnce(Deadline deadline) {
    for (const ChildEvent& event : group_.Poll(deadline)) HandleEvent(event);
    NoteSignal();
    CheckReadyDeadlines();
  }

  void NoteSignal() {
    if (interrupted_by_ == 0 && !failure_.has_value() && g_first_signal != 0) {
      interrupted_by_ = g_first_signal;
      if (stopping_) return;
      Announce("received " + SignalName(interrupted_by_) +
               "; stopping the fleet: workers, then servers, then the coordinator (SIGKILL to "
               "what still runs after " + FormatSeconds(config_.grace_s) +
               ", or at once on a second signal)");
    }
  }

  // Keeps the first failure only: it is the root cause, the rest are its consequences.
  void Fail(std::string what) {
    if (!ShouldStop()) failure_ = std::move(what);
  }

  void HandleEvent(const ChildEvent& event) {
    Member& member = members_[event.child];
    if (event.kind == ChildEvent::Kind::kExit) {
      HandleExit(member, event.exit);
      return;
    }
    if (event.stream == ChildStream::kStdout && !member.ready && !stopping_ &&
        event.line.rfind(kReadyPrefix, 0) == 0) {
      HandleReady(member, event.line);
      return;
    }
    if (event.stream == ChildStream::kStdout && member.role == Role::kCoordinator &&
        event.line.rfind(kJoinedPrefix, 0) == 0) {
      HandleJoined(event.line);
      return;
    }
    int fd = event.stream == ChildStream::kStdout ? STDOUT_FILENO : STDERR_FILENO;
    WriteLine(fd, member.prefix + event.line);
  }

  void HandleReady(Member& member, const std::string& line) {
    StatusOr<ReadyInfo> info = ParseReadyLine(line);
    if (!info.ok()) {
      Fail(Describe(member) + " printed a malformed ready line (" + info.status().message() +
           "): " + line);
      return;
    }
    if (member.rank < 0 && member.role == Role::kServer && info->role == RoleName(member.role)) {
      // A joining server: the coordinator chose its rank.
      member.rank = info->rank;
      member.prefix = "[server " + std::to_string(member.rank) + "] ";
    }
    if (info->role != RoleName(member.role) || info->rank != member.rank) {
      Fail(Describe(member) + " announced itself as role=" + info->role +
           " rank=" + std::to_string(info->rank));
      return;
    }
    member.ready = true;
    Announce(std::string(RoleName(member.role)) + " " + std::to_string(member.rank) +
             " pid=" + std::to_string(member.pid) + " metrics=" + info->metrics);
    if (member.role == Role::kCoordinator) {
      coordinator_address_ = ConnectAddress(info->address);
      Announce("coordinator address " + info->address + " (children get --coordinator " +
               coordinator_address_ + ")");
    }
  }

  // The coordinator's "TESSERA_JOINED role=server rank=1 ...": a server took a failed one's
  // place (tessera-server --join), so that rank's ranges have their copy again.
  void HandleJoined(const std::string& line) {
    StatusOr<ReadyInfo> info = ParseJoinedLine(line);
    if (!info.ok()) {
      Announce("the coordinator printed a malformed line (" + info.status().message() + "): " +
               line);
      return;
    }
    lost_servers_.erase(info->rank);
    Announce("server " + std::to_string(info->rank) + " joined the fleet (pid " +
             std::to_string(info->pid) + " at " + info->address +
             ") in the place of the failed one; the workers copy its key ranges to it");
  }

  void HandleExit(Member& member, const ChildExit& exit) {
    member.exited = true;
    std::string what = Describe(member) + " " + exit.Describe();
    if (stopping_) {
      TLOG(DEBUG) << what;
      return;
    }
    if (member.role == Role::kWorker) {
      // Elastic: the coordinator told the others, who go on while --min-workers remain. Below
      // that it stops the job, and the remaining workers fail quoting its reason (who left
      // why, after which step), which is worth more than this exit status: they are waited
      // for, and the job fails once they are done (SuperviseUntilWorkersFinish).
      if (!exit.success() && config_.min_workers > 0) {
        ++workers_lost_;
        const int remaining = config_.LocalWorkers() - workers_finished_ - workers_lost_;
        const std::string minimum = "--min-workers " + std::to_string(config_.min_workers);
        // As the coordinator counts: workers that finished did their part (in ps-async the
        // fast ones finish long before the slow ones); only losses take a job below it.
        if (config_.LocalWorkers() - workers_lost_ >= config_.min_workers) {
          Announce(what + "; an elastic job (" + minimum + "): the other workers go on");
          return;
        }
        if (!below_minimum_.has_value()) {
          below_minimum_ = what + "; " + std::to_string(remaining) + " workers remain, below " +
                           minimum + ": the job stopped";
        }
        Announce(what + "; below " + minimum + ": the coordinator stops the job");
        return;
      }
      if (!exit.success()) return Fail(what);
      ++workers_finished_;
      Announce(what + (member.ready ? "" : " (it never printed TESSERA_READY)"));
      return;
    }
    // The coordinator and servers must outlive the workers; after that, a clean exit is fine.
    // With --replicas, a server may go while its ranges have other live copies.
    if (!exit.success() && member.role == Role::kServer && config_.replicas > 1) {
      lost_servers_.insert(member.rank);
      const std::string lost = LostRange();
      if (lost.empty()) {
        Announce(what + ": its key ranges go on with their other replicas (--replicas " +
                 std::to_string(config_.replicas) + ")");
        return;
      }
      return Fail(what + "; " + lost);
    }
    if (!exit.success()) return Fail(what);
    if (config_.add_servers > 0) {  // a joined server leaves when the fleet's coordinator stops
      Announce(what + ": the fleet it joined is over");
      return;
    }
    // Several nodes: a clean exit of the coordinator means every node's workers have left.
    if (member.role == Role::kCoordinator && config_.nnodes > 1) {
      coordinator_done_ = true;
      Announce(what + ": every node's workers have left");
      return;
    }
    if (!lingering_) return Fail(what + " before the workers finished");
    Announce(what);
  }

  void CheckReadyDeadlines() {
    for (const Member& member : members_) {
      if (member.ready || member.exited || !member.ready_deadline.Expired()) continue;
      Fail(Describe(member) + " did not print TESSERA_READY within " +
           FormatSeconds(config_.start_timeout_s));
    }
  }

  const LaunchConfig config_;
  const FleetBinaries binaries_;
  ProcessGroup group_;
  std::vector<Member> members_;      // indexed by ProcessGroup child id
  std::string coordinator_address_;  // HOST:PORT, from the coordinator's ready line
  int workers_finished_ = 0;         // workers that exited 0
  int workers_lost_ = 0;             // elastic: workers that failed or were killed
  std::optional<std::string> below_minimum_;  // elastic: the loss that took the job below it
  std::set<int> lost_servers_;       // servers that died (--replicas > 1)
  bool lingering_ = false;           // every worker has finished
  bool coordinator_done_ = false;    // several nodes: the coordinator exited 0
  bool stopping_ = false;            // StopAll() is under way: exits are expected
  std::optional<std::string> failure_;
  int interrupted_by_ = 0;  // the signal that ended the run, if one did
};

// The job's key for the children: a key file they find through TESSERA_AUTH_KEY_FILE, which
// the launcher sets in its own environment (the children inherit it; nothing else does).
class JobKeyForChildren {
 public:
  JobKeyForChildren() = default;
  JobKeyForChildren(const JobKeyForChildren&) = delete;
  JobKeyForChildren& operator=(const JobKeyForChildren&) = delete;
  ~JobKeyForChildren() {
    if (made_dir_.empty()) return;
    unlink(path_.c_str());
    rmdir(made_dir_.c_str());
  }

  // Checks the given key file, or makes one in a private directory when the job is this
  // launcher's alone. Errors say what to give instead.
  Status Prepare(const LaunchConfig& config, const Environment& env) {
    if (config.insecure) {
      if (config.encrypt == "on") {
        return InvalidArgumentError("--insecure and --encrypt on contradict each other");
      }
      return OkStatus();
    }
    path_ = config.auth_key_file;
    if (path_.empty()) {
      auto given = env.find(kAuthKeyFileVariable);
      if (given != env.end()) path_ = given->second;
    }
    if (!path_.empty()) {
      StatusOr<JobKey> key = ReadKeyFile(path_);
      if (!key.ok()) return key.status().WithContext("--auth-key-file");
      fingerprint_ = key->Fingerprint();
      if (path_[0] != '/') {
        char cwd[4096];
        if (getcwd(cwd, sizeof(cwd)) != nullptr) path_ = std::string(cwd) + "/" + path_;
      }
      setenv(kAuthKeyFileVariable, path_.c_str(), 1);
      return OkStatus();
    }
    if (config.nnodes > 1 || !config.attach.empty()) {
      return FailedPreconditionError(
          std::string(config.nnodes > 1 ? "--nnodes > 1" : "--attach") +
          " needs the job's key file, shared with the other launchers: create one with "
          "`tessera-launch --make-key-file PATH`, copy it to every node, and give "
          "--auth-key-file PATH (or TESSERA_AUTH_KEY_FILE=PATH); or --insecure");
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                      "/tessera-launch-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      return FailedPreconditionError("cannot make a private directory for the job key (" + dir +
                                     "): " + strerror(errno));
    }
    made_dir_ = dir;
    path_ = dir + "/job.key";
    const JobKey key = JobKey::Generate();
    RETURN_IF_ERROR(WriteKeyFile(path_, key));
    fingerprint_ = key.Fingerprint();
    setenv(kAuthKeyFileVariable, path_.c_str(), 1);
    return OkStatus();
  }

  // For the log: "key 1a2b3c4d from /path (made for this job)".
  std::string Describe() const {
    if (path_.empty()) return "--insecure: no key, any process that reaches a port is trusted";
    return "key " + fingerprint_ + " in " + path_ +
           (made_dir_.empty() ? "" : " (made for this job, removed at exit)");
  }
  bool made() const { return !made_dir_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string made_dir_;
  std::string fingerprint_;
};

std::string DescribeConfig(const LaunchConfig& config, const FleetBinaries& binaries) {
  std::ostringstream out;
  out << "servers=" << config.servers << " workers=" << config.LocalWorkers()
      << " nnodes=" << config.nnodes << " node-rank=" << config.node_rank
      << " coordinator=" << config.CoordinatorAddress()
      << (config.attach.empty() ? "" : " (attach)") << " mode=" << config.mode
      << " linger=" << config.linger_s << "s start-timeout=" << config.start_timeout_s
      << "s grace=" << config.grace_s
      << "s log-level=" << (config.log_level.empty() ? "(children's default)" : config.log_level)
      << " coordinator-binary=" << binaries.coordinator << " worker-args=[";
  for (size_t i = 0; i < config.worker_args.size(); ++i) {
    out << (i == 0 ? "" : " ") << config.worker_args[i];
  }
  out << "]";
  return out.str();
}

int Main(int argc, char** argv) {
  LaunchConfig config;
  CLI::App app("", "tessera-launch");
  AddFlags(app, &config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    int status = app.exit(error);  // prints the help, or the error
    return status == 0 ? 0 : 2;
  }
  config.worker_args = ForwardedArgs(app.remaining());
  // Adding servers starts no workers unless asked to (which Validate refuses).
  if (config.add_servers > 0 && app.count("--workers") == 0) config.workers = 0;
  if (!config.make_key_file.empty()) {
    Status made = WriteKeyFile(config.make_key_file, JobKey::Generate());
    WriteLine(made.ok() ? STDOUT_FILENO : STDERR_FILENO,
              made.ok() ? "tessera-launch: wrote a new job key to " + config.make_key_file +
                              " (mode 0600); give every process of the job --auth-key-file " +
                              config.make_key_file + " or TESSERA_AUTH_KEY_FILE"
                        : "tessera-launch: " + made.message());
    return made.ok() ? 0 : 1;
  }
  Status valid = ApplySlurm(app, CurrentEnvironment(), &config);
  if (valid.ok()) valid = Validate(config);
  if (!valid.ok()) {
    WriteLine(STDERR_FILENO,
              "tessera-launch: " + valid.message() + "\nRun with --help for more information.");
    return 2;
  }
  SetLogIdentity("launch", -1);
  if (!config.log_level.empty()) SetMinLogLevel(*ParseLogLevel(config.log_level));

  StatusOr<FleetBinaries> binaries = FindBinaries(config.bin_dir);
  if (!binaries.ok()) {
    WriteLine(STDOUT_FILENO, "[launch] " + binaries.status().message());
    return 1;
  }
  TLOG(INFO) << "config: " << DescribeConfig(config, *binaries);
  JobKeyForChildren job_key;
  Status keyed = job_key.Prepare(config, CurrentEnvironment());
  if (!keyed.ok()) {
    WriteLine(STDERR_FILENO,
              "tessera-launch: " + keyed.message() + "\nRun with --help for more information.");
    return 2;
  }
  TLOG(INFO) << "security: " << job_key.Describe();
  if (config.insecure) {
    TLOG(WARNING) << "--insecure: authentication is off for every child; any process that "
                     "reaches their ports can join the job";
  } else if (config.workers == 0 && job_key.made()) {
    Announce("a long-running fleet's key is " + job_key.path() +
             ": jobs that attach need it (tessera-launch --attach ... --auth-key-file " +
             job_key.path() + ")");
  }
  const int wake_fd = InstallSignalHandlers();
  const bool checkpoints =
      std::find(config.worker_args.begin(), config.worker_args.end(), "--checkpoint-dir") !=
      config.worker_args.end();
  for (int attempt = 0;; ++attempt) {
    Launcher launcher(config, *binaries, wake_fd);
    const int status = launcher.Run();
    // Success, bad usage and a signal (128 + N) end the job; a failure may be retried.
    if (status != 1 || attempt >= config.max_restarts || g_signal_count > 0) return status;
    Announce("restart " + std::to_string(attempt + 1) + " of " +
             std::to_string(config.max_restarts) + ": starting the fleet again" +
             (checkpoints ? ", workers resuming from their last checkpoint"
                          : " (no --checkpoint-dir in the worker flags: from step 1)"));
    if (std::find(config.worker_args.begin(), config.worker_args.end(), "--resume") ==
        config.worker_args.end()) {
      config.worker_args.push_back("--resume");
    }
  }
}

}  // namespace
}  // namespace tools
}  // namespace tessera

int main(int argc, char** argv) { return tessera::tools::Main(argc, argv); }
