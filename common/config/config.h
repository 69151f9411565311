// ProcessConfig: the one configuration struct of a Tessera process (coordinator, server or
// worker), built once in main() from flags and the environment, validated once, and logged.
//
// Precedence: command-line flags > environment variables > defaults. A bad value is rejected
// with the name of its flag (or environment variable) and the value; nothing is clamped.
// This file (and config.cc) is the only place that reads the process environment, and even
// here the environment is a map handed in, so tests pass a fake one.
//
// Typical main():
//
//   CLI::App app("tessera worker");
//   std::string model;
//   app.add_option("--model", model, "...");          // binary-specific flags, same App
//   bool help = false;
//   StatusOr<ProcessConfig> config = ParseProcessConfig(
//       Role::kWorker, argc, argv, CurrentEnvironment(), &app, &help);
//   if (help) return 0;                                // help was printed to stdout
//   if (!config.ok()) { std::cerr << config.status() << "\n"; return 2; }
//   TLOG(INFO) << "effective config:\n" << DescribeConfig(*config);
//
// Environment variables read (only for fields whose flag was not given):
//
//   field          torchrun      OpenMPI                      Slurm
//   rank           RANK          OMPI_COMM_WORLD_RANK         SLURM_PROCID     (workers only)
//   local_rank     LOCAL_RANK    OMPI_COMM_WORLD_LOCAL_RANK   SLURM_LOCALID    (workers only)
//   num_workers    WORLD_SIZE    OMPI_COMM_WORLD_SIZE         SLURM_NTASKS
//   coordinator    MASTER_ADDR + MASTER_PORT (both or neither); for a worker inside a Slurm
//                  step without them, the step's head node on the job's port (common/config/
//                  slurm.h), which worker rank 0 then hosts (slurm_rendezvous)
//   bind_host      TESSERA_SOCKET_IFNAME
//   num_servers    TESSERA_NUM_SERVERS
//   job            TESSERA_JOB
//   log_level      TESSERA_LOG_LEVEL
//   cuda_tf32      TESSERA_CUDA_TF32                                           (workers only)
//   auth_key_file  TESSERA_AUTH_KEY_FILE
//   insecure       TESSERA_INSECURE
//   encrypt        TESSERA_ENCRYPT
//   metrics_bind_host  TESSERA_METRICS_BIND_HOST
//   metrics_tls_cert   TESSERA_METRICS_TLS_CERT
//   metrics_tls_key    TESSERA_METRICS_TLS_KEY
//   metrics_auth_file  TESSERA_METRICS_AUTH_FILE
//
// Launcher families: rank, local_rank and num_workers are read from ONE family, the first of
// torchrun > OpenMPI > Slurm that has any of its three variables set; the other families are
// ignored entirely. (mpirun or torchrun inside a Slurm allocation therefore wins over the
// allocation's SLURM_* variables, and a rank is never paired with another launcher's size.)
// The rank variables describe the launcher's processes, which are the workers: a server or a
// coordinator never takes its rank or local rank from the environment (a server's shard index
// comes from --rank or the coordinator), though it does take num_workers from it.
//
// Thread-safety: plain functions on values; CurrentEnvironment() must not race with setenv().
#ifndef TESSERA_COMMON_CONFIG_CONFIG_H_
#define TESSERA_COMMON_CONFIG_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/base/role.h"
#include "common/base/status.h"
#include "common/config/environment.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tessera {

// The largest accepted --max-message-bytes: the FlatBuffers 2.0.8 Verifier asserts on buffers
// of 2 GiB or more, so a received header must stay below that.
inline constexpr uint64_t kMaxMessageBytesLimit = (uint64_t{1} << 31) - 1;
inline constexpr uint64_t kMinMessageBytes = 4096;
// Upper bound of every *_ms timeout and of --linger: a week. Far from any overflow in deadline
// arithmetic, and catches a few zeros too many.
inline constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;

struct ProcessConfig {
  Role role = Role::kWorker;

  // Worker: rank in [0, num_workers); server: shard index in [0, num_servers); -1: the
  // coordinator assigns one. Flag --rank; env (workers only) RANK | OMPI_COMM_WORLD_RANK |
  // SLURM_PROCID. The coordinator has no rank (no flag; must stay -1).
  int rank = -1;
  // Rank among this host's workers (selects the GPU); -1 = unknown. Flag --local-rank; env
  // (workers only) LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_RANK | SLURM_LOCALID. Not for the
  // coordinator.
  int local_rank = -1;
  // Flag --num-workers (alias --world-size); env WORLD_SIZE | OMPI_COMM_WORLD_SIZE | SLURM_NTASKS.
  // >= 1 for a worker. A coordinator or server with 0 serves a long-running fleet: successive
  // jobs' workers attach, train and leave (see coordinator/coordinator.h).
  int num_workers = 1;
  // Flag --num-servers; env TESSERA_NUM_SERVERS. 0 for all-reduce and ZeRO modes.
  int num_servers = 0;
  // HOST:PORT (IPv6 as [addr]:port). Server/worker: the coordinator to register with, required.
  // Coordinator: where its rendezvous socket listens; default 127.0.0.1:0 (port 0 = OS picks).
  // Flag --coordinator; env MASTER_ADDR + MASTER_PORT (both needed).
  std::string coordinator;
  // A worker in a Slurm step given neither: `coordinator` is the step's head node on the job's
  // port, and worker rank 0 hosts the rendezvous there (as torch's TCPStore on rank 0).
  bool slurm_rendezvous = false;
  // Where this process's listening sockets bind (transport and HTTP /metrics; for the
  // coordinator only /metrics, its rendezvous socket listens on `coordinator`): "auto" (the
  // local end of the route to the coordinator; the loopback when that is local), an IP address
  // or an interface name (common/transport/bind_address.h). Flag --bind-host; env
  // TESSERA_SOCKET_IFNAME.
  std::string bind_host = "auto";
  // Transport port, 0 = OS picks. Flag --port. Not for the coordinator (must stay 0).
  int port = 0;
  // HTTP /metrics port, 0 = OS picks. Flag --metrics-port.
  int metrics_port = 0;
  // Where HTTP (/metrics; the coordinator's /sd and /dashboard) listens: "loopback"
  // (127.0.0.1, whatever --bind-host says), "auto" (the transport's address, as --bind-host
  // resolves it: what a Prometheus on another host needs), or an IP address or interface name
  // as for --bind-host. Flag --metrics-bind-host; env TESSERA_METRICS_BIND_HOST.
  std::string metrics_bind_host = "loopback";
  // HTTPS: PEM certificate (chain) and its key; both or neither. Flags --metrics-tls-cert,
  // --metrics-tls-key; env TESSERA_METRICS_TLS_CERT, TESSERA_METRICS_TLS_KEY.
  std::string metrics_tls_cert;
  std::string metrics_tls_key;
  // HTTP basic auth: a file of user:password lines, mode 0600 (common/metrics/
  // http_basic_auth.h). Flag --metrics-auth-file; env TESSERA_METRICS_AUTH_FILE.
  std::string metrics_auth_file;
  // Job name: 1..64 of [A-Za-z0-9._-]. Flag --job; env TESSERA_JOB.
  std::string job = "tessera";
  // How long to wait for the whole fleet to register. Flag --rendezvous-timeout-ms.
  int64_t rendezvous_timeout_ms = 60000;
  // Flag --heartbeat-interval-ms.
  int64_t heartbeat_interval_ms = 1000;
  // Silence after which a process is declared failed; > heartbeat_interval_ms.
  // Flag --heartbeat-timeout-ms.
  int64_t heartbeat_timeout_ms = 4000;
  // Longest wait for any single request's reply. Flag --request-timeout-ms.
  int64_t request_timeout_ms = 30000;
  // Cap on one received message (header + payloads), in [kMinMessageBytes,
  // kMaxMessageBytesLimit]. Flag --max-message-bytes.
  uint64_t max_message_bytes = uint64_t{1} << 30;
  // Flag --log-level debug|info|warning|error; env TESSERA_LOG_LEVEL.
  LogLevel log_level = LogLevel::kInfo;
  // Seconds to keep serving (e.g. /metrics for a last scrape) after the work is done.
  // Flag --linger.
  double linger_seconds = 0;
  // Worker: GEMMs on a CUDA device may use TF32 tensor cores (~1e-3 relative error: a 10-bit
  // mantissa on the inputs) instead of float32. Flag --cuda-tf32 0|1; env TESSERA_CUDA_TF32
  // (empty counts as 0). Not for servers or the coordinator, which compute on the CPU.
  bool cuda_tf32 = false;
  // The job's key file (common/security/job_key.h). Flag --auth-key-file; env
  // TESSERA_AUTH_KEY_FILE. Required unless `insecure`.
  std::string auth_key_file;
  // Admit any process that reaches a port (warned about on every process). Flag --insecure;
  // env TESSERA_INSECURE=1.
  bool insecure = false;
  // "auto" (encrypt when listening off the loopback), "on" or "off". Flag --encrypt; env
  // TESSERA_ENCRYPT.
  std::string encrypt = "auto";

  // Where each value came from, keyed by flag name: "flag" (given on the command line) or
  // "env RANK" (etc.); fields absent here hold their default. Filled by ProcessFlags::ApplyTo
  // and ApplyEnvironment; read by ApplyEnvironment (a flag beats the environment), by
  // ValidateConfig's messages and by DescribeConfig.
  std::map<std::string, std::string> sources;
};

// The defaults for `role` (the struct's defaults, plus coordinator = "127.0.0.1:0" for the
// coordinator itself).
ProcessConfig DefaultProcessConfig(Role role);

// The common flags, registered on a CLI::App next to the binary's own flags.
//
// Flags are only collected while CLI11 parses; they are converted and checked afterwards by
// ApplyTo, so `--help` works even when another flag's value is bad.
class ProcessFlags {
 public:
  // Registers the flags that `role` uses on `app` (the coordinator has no --rank, --local-rank
  // or --port), each with a one-line help naming its default and environment variables; adds a
  // footer on precedence and widens the help's name column. REQUIRES: `app` outlives this object
  // and has none of these flags yet. CLI11 throws CLI::OptionAlreadyAdded otherwise.
  ProcessFlags(Role role, CLI::App* app);

  // REQUIRES: app->parse() has returned. For each of the flags that was given, parses its value
  // into `config` and records sources[flag] = "flag". Errors name the flag and quote the value:
  // `--rank="abc": not an integer`. Ranges are ValidateConfig's job.
  Status ApplyTo(ProcessConfig* config) const;

 private:
  struct Binding {
    CLI::Option* option;
    int field;  // index into config.cc's field table
  };
  Role role_;
  std::vector<Binding> bindings_;
};

// A binary's own few flags, declared without including CLI11: CLI11 2.1 builds its validators
// in every source that includes it, about 6 CPU-seconds each at -O2, so the coordinator's and
// the server's mains declare theirs here and CLI11 is compiled in config.cc alone. (The
// launcher and the worker, with dozens of flags each, use CLI11 in one source each.)
//
//   CommandLine command_line("tessera-server: ...");
//   bool join = false;
//   command_line.AddFlag("--join", &join, "Join a running fleet ...");
//   return RunProcess(Role::kServer, argc, argv, command_line.app(), ...);
//
// Each call registers exactly what the CLI11 call it stands for would, so --help is the same.
class CommandLine {
 public:
  // `name` is the program name --help shows (CLI11 takes argv[0]'s when it is empty).
  explicit CommandLine(const std::string& description, const std::string& name = "");
  ~CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // `names` as CLI11 spells them: "--flag", or "--on,!--off" for a pair.
  void AddFlag(const std::string& names, bool* value, const std::string& help);
  void AddOption(const std::string& name, std::string* value, const std::string& help);
  // An integer in [min, max] (CLI::Range); with show_default, --help states the default.
  void AddOption(const std::string& name, int* value, const std::string& help, int min, int max,
                 bool show_default);
  void AddOption(const std::string& name, uint64_t* value, const std::string& help, uint64_t min,
                 uint64_t max, bool show_default);

  // For RunProcess and ParseProcessConfig; owned by this object.
  CLI::App* app() { return app_.get(); }

 private:
  std::unique_ptr<CLI::App> app_;
};

// A copy of this process's environment. The only place that reads `environ`.
Environment CurrentEnvironment();

// Applies the environment variables listed above to the fields whose flag was not given
// (config->sources says so), recording sources[flag] = "env VAR". config->role decides whether
// the rank variables apply. Errors name the variable and quote the value:
// `RANK="abc": not an integer`, `MASTER_ADDR is set but MASTER_PORT is not`.
Status ApplyEnvironment(const Environment& env, ProcessConfig* config);

// Checks every range and relation; the first violation is returned, naming the flag, its value
// and (when it came from the environment) the variable:
// `--rank=5 (from RANK) is out of range: must be < --num-workers=4 (from WORLD_SIZE)`.
Status ValidateConfig(const ProcessConfig& config);

// All of the above: DefaultProcessConfig(role), ProcessFlags on `app` (a fresh App when null),
// app->parse(argc, argv), ApplyTo, ApplyEnvironment, ValidateConfig. Also registers
// --print-config.
// On -h/--help, and on --print-config once the config is valid (which prints
// DescribeAllSettings), prints to stdout, sets *help_requested (when not null) and returns
// CANCELLED; main() should then exit 0. Every other failure (an unknown flag, a bad value) is
// INVALID_ARGUMENT naming the flag or variable; *help_requested is false then.
// REQUIRES: `app`, when given, has not been through ParseProcessConfig before.
StatusOr<ProcessConfig> ParseProcessConfig(Role role, int argc, const char* const* argv,
                                           const Environment& env, CLI::App* app,
                                           bool* help_requested);

// One line per field, "--flag=value (source)", for the startup log, e.g.
//   role: worker
//   --rank=3 (env RANK)
//   --num-workers=4 (env WORLD_SIZE)
//   --port=0 (default)
std::string DescribeConfig(const ProcessConfig& config);

// The one start-up line: every setting that is not at its default and where it came from, the
// process fields and the binary's own options on `app` alike, e.g.
//   --num-workers=4 --mode=allreduce --steps=500 (flags); --rank=3 (env RANK)
// or "all defaults". REQUIRES: `app` is the App the config was parsed with.
std::string DescribeSettings(const ProcessConfig& config, const CLI::App& app);

// The full table (--print-config, and the start-up log at --log-level debug): DescribeConfig,
// then every other option of `app`, one per line, "--flag=value (flag)" or "(default)".
std::string DescribeAllSettings(const ProcessConfig& config, const CLI::App& app);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_CONFIG_H_
