#include "common/config/config.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <type_traits>

#include "common/base/host_port.h"
#include "common/base/quote.h"
#include "common/config/slurm.h"

// The process environment; read in CurrentEnvironment() only.
extern char** environ;

namespace tessera {
namespace {

// ---------------------------------------------------------------------------------------------
// Value parsing shared by flags and environment variables. `name` is the flag or variable
// ("--rank", "RANK"), so every message says where the bad value came from.

Status BadValue(std::string_view name, std::string_view text, std::string_view why) {
  return InvalidArgumentError(std::string(name) + "=" + Quote(text) + ": " + std::string(why));
}

// Strict decimal: optional '-', digits, nothing else (no spaces, '+', hex or octal).
template <typename T>
Status ParseInteger(std::string_view name, std::string_view text, T* out) {
  static_assert(std::is_integral_v<T>);
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const std::string range_why = std::is_signed_v<T>
                                    ? "out of range for a " + std::to_string(8 * sizeof(T)) +
                                          "-bit integer"
                                    : "out of range";
  if (std::is_unsigned_v<T> && !text.empty() && text.front() == '-') {
    return BadValue(name, text, "must not be negative");
  }
  T value{};
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range) return BadValue(name, text, range_why);
  if (ec != std::errc() || ptr != last || text.empty()) {
    return BadValue(name, text, "not an integer");
  }
  *out = value;
  return OkStatus();
}

Status ParseSeconds(std::string_view name, std::string_view text, double* out) {
  const char* last = text.data() + text.size();
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), last, value, std::chars_format::general);
  if (ec != std::errc() || ptr != last || text.empty()) return BadValue(name, text, "not a number");
  if (!std::isfinite(value)) return BadValue(name, text, "not a finite number");
  *out = value;
  return OkStatus();
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

std::string FormatSeconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// The field table: one row per flag, shared by registration, --help, parsing, DescribeConfig
// and ValidateConfig's messages.

enum FieldId : int {
  kRank,
  kLocalRank,
  kNumWorkers,
  kNumServers,
  kCoordinator,
  kBindHost,
  kPort,
  kMetricsPort,
  kMetricsBindHost,
  kMetricsTlsCert,
  kMetricsTlsKey,
  kMetricsAuthFile,
  kJob,
  kRendezvousTimeout,
  kHeartbeatInterval,
  kHeartbeatTimeout,
  kRequestTimeout,
  kMaxMessageBytes,
  kLogLevel,
  kLinger,
  kCudaTf32,
  kAuthKeyFile,
  kInsecure,
  kEncrypt,
  kNumFields,
};

constexpr unsigned kForCoordinator = 1u << static_cast<int>(Role::kCoordinator);
constexpr unsigned kForServer = 1u << static_cast<int>(Role::kServer);
constexpr unsigned kForWorker = 1u << static_cast<int>(Role::kWorker);
constexpr unsigned kForAll = kForCoordinator | kForServer | kForWorker;

using Setter = Status (*)(std::string_view name, std::string_view text, ProcessConfig* config);
using Getter = std::string (*)(const ProcessConfig& config);
using HelpText = const char* (*)(Role role);

struct Field {
  FieldId id;
  const char* flag;
  const char* alias;  // nullptr: none
  const char* type_name;
  unsigned roles;     // which roles have this flag
  bool is_text;       // quoted in messages
  Setter set;
  Getter get;
  HelpText help;
};

const Field kFields[kNumFields] = {
    {kRank, "--rank", nullptr, "INT", kForServer | kForWorker, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->rank);
     },
     [](const ProcessConfig& c) { return std::to_string(c.rank); },
     [](Role role) -> const char* {
       if (role == Role::kServer) {
         return "This server's shard index, 0 .. --num-servers - 1 (default: the coordinator "
                "assigns one). Never read from RANK etc. (those describe workers)";
       }
       return "This worker's rank, 0 .. --num-workers - 1 (default: the coordinator assigns "
              "one). Env: RANK | OMPI_COMM_WORLD_RANK | SLURM_PROCID";
     }},
    {kLocalRank, "--local-rank", nullptr, "INT", kForServer | kForWorker, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->local_rank);
     },
     [](const ProcessConfig& c) { return std::to_string(c.local_rank); },
     [](Role role) -> const char* {
       if (role == Role::kServer) {
         return "Index among this host's processes (default: unknown). Not read from the "
                "environment";
       }
       return "Rank among this host's workers (picks the GPU; default: unknown). "
              "Env: LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_RANK | SLURM_LOCALID";
     }},
    {kNumWorkers, "--num-workers", "--world-size", "INT", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->num_workers);
     },
     [](const ProcessConfig& c) { return std::to_string(c.num_workers); },
     [](Role role) -> const char* {
       if (role == Role::kWorker) {
         return "Number of workers in the job. Env: WORLD_SIZE | OMPI_COMM_WORLD_SIZE | "
                "SLURM_NTASKS";
       }
       return "Number of workers in the job; 0: a long-running fleet that successive jobs' "
              "workers attach to (each job's size comes from its workers). Env: WORLD_SIZE | "
              "OMPI_COMM_WORLD_SIZE | SLURM_NTASKS";
     }},
    {kNumServers, "--num-servers", nullptr, "INT", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->num_servers);
     },
     [](const ProcessConfig& c) { return std::to_string(c.num_servers); },
     [](Role) -> const char* {
       return "Number of parameter servers (0 for all-reduce and ZeRO). Env: TESSERA_NUM_SERVERS";
     }},
    {kCoordinator, "--coordinator", nullptr, "HOST:PORT", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->coordinator = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.coordinator; },
     [](Role role) -> const char* {
       if (role == Role::kCoordinator) {
         return "Address the rendezvous socket listens on; port 0: the OS picks. "
                "Env: MASTER_ADDR + MASTER_PORT";
       }
       if (role == Role::kWorker) {
         return "Address of the coordinator (required except for a standalone --mode local "
                "worker). Env: MASTER_ADDR + MASTER_PORT; in a Slurm step without either, the "
                "step's head node on the job's port, where rank 0 hosts it";
       }
       return "Address of the coordinator (required). Env: MASTER_ADDR + MASTER_PORT";
     }},
    {kBindHost, "--bind-host", nullptr, "HOST", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->bind_host = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.bind_host; },
     [](Role role) -> const char* {
       if (role == Role::kCoordinator) {
         return "Where /metrics listens: auto (the --coordinator host), an IP address or an "
                "interface name (eth0); 0.0.0.0: every interface. Env: TESSERA_SOCKET_IFNAME";
       }
       return "Where this process listens (transport, /metrics): auto (the local address of the "
              "route to the coordinator; the loopback for a local one), an IP address or an "
              "interface name (eth0); 0.0.0.0: every interface, advertising the auto address. "
              "Env: TESSERA_SOCKET_IFNAME";
     }},
    {kPort, "--port", nullptr, "PORT", kForServer | kForWorker, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->port);
     },
     [](const ProcessConfig& c) { return std::to_string(c.port); },
     [](Role) -> const char* { return "Transport port to listen on; 0: the OS picks a free one"; }},
    {kMetricsPort, "--metrics-port", nullptr, "PORT", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->metrics_port);
     },
     [](const ProcessConfig& c) { return std::to_string(c.metrics_port); },
     [](Role) -> const char* { return "HTTP port serving /metrics; 0: the OS picks a free one"; }},
    {kMetricsBindHost, "--metrics-bind-host", nullptr, "HOST", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->metrics_bind_host = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.metrics_bind_host; },
     [](Role role) -> const char* {
       if (role == Role::kCoordinator) {
         return "Where HTTP (/metrics, /sd, /dashboard) listens: loopback (127.0.0.1), auto "
                "(the --bind-host address: for a Prometheus on another host), an IP address or "
                "an interface name. Env: TESSERA_METRICS_BIND_HOST";
       }
       return "Where HTTP /metrics listens: loopback (127.0.0.1), auto (the transport's "
              "address: for a Prometheus on another host), an IP address or an interface name. "
              "Env: TESSERA_METRICS_BIND_HOST";
     }},
    {kMetricsTlsCert, "--metrics-tls-cert", nullptr, "PATH", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->metrics_tls_cert = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.metrics_tls_cert; },
     [](Role) -> const char* {
       return "Serve HTTP over TLS with this PEM certificate (chain); needs --metrics-tls-key. "
              "Env: TESSERA_METRICS_TLS_CERT";
     }},
    {kMetricsTlsKey, "--metrics-tls-key", nullptr, "PATH", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->metrics_tls_key = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.metrics_tls_key; },
     [](Role) -> const char* {
       return "The PEM private key of --metrics-tls-cert. Env: TESSERA_METRICS_TLS_KEY";
     }},
    {kMetricsAuthFile, "--metrics-auth-file", nullptr, "PATH", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->metrics_auth_file = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.metrics_auth_file; },
     [](Role) -> const char* {
       return "HTTP basic auth: a file of user:password lines (mode 0600); requests without "
              "one get 401. Env: TESSERA_METRICS_AUTH_FILE";
     }},
    {kJob, "--job", nullptr, "NAME", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->job = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.job; },
     [](Role) -> const char* {
       return "Job name (1-64 of A-Z a-z 0-9 . _ -), in logs and metrics. Env: TESSERA_JOB";
     }},
    {kRendezvousTimeout, "--rendezvous-timeout-ms", nullptr, "MS", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->rendezvous_timeout_ms);
     },
     [](const ProcessConfig& c) { return std::to_string(c.rendezvous_timeout_ms); },
     [](Role) -> const char* { return "How long to wait for the whole fleet to register"; }},
    {kHeartbeatInterval, "--heartbeat-interval-ms", nullptr, "MS", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->heartbeat_interval_ms);
     },
     [](const ProcessConfig& c) { return std::to_string(c.heartbeat_interval_ms); },
     [](Role) -> const char* { return "Time between two heartbeats"; }},
    {kHeartbeatTimeout, "--heartbeat-timeout-ms", nullptr, "MS", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->heartbeat_timeout_ms);
     },
     [](const ProcessConfig& c) { return std::to_string(c.heartbeat_timeout_ms); },
     [](Role) -> const char* {
       return "Silence after which a process is declared failed; > --heartbeat-interval-ms";
     }},
    {kRequestTimeout, "--request-timeout-ms", nullptr, "MS", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->request_timeout_ms);
     },
     [](const ProcessConfig& c) { return std::to_string(c.request_timeout_ms); },
     [](Role) -> const char* { return "Longest wait for the reply to any single request"; }},
    {kMaxMessageBytes, "--max-message-bytes", nullptr, "BYTES", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseInteger(n, t, &c->max_message_bytes);
     },
     [](const ProcessConfig& c) { return std::to_string(c.max_message_bytes); },
     [](Role) -> const char* {
       return "Largest message accepted (header + payloads), 4096..2147483647 (< 2 GiB: "
              "the FlatBuffers Verifier limit)";
     }},
    {kLogLevel, "--log-level", nullptr, "LEVEL", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       StatusOr<LogLevel> level = ParseLogLevel(t);
       if (!level.ok()) return BadValue(n, t, "expected debug, info, warning or error");
       c->log_level = *level;
       return OkStatus();
     },
     [](const ProcessConfig& c) { return std::string(LogLevelName(c.log_level)); },
     [](Role) -> const char* {
       return "debug, info, warning or error. Env: TESSERA_LOG_LEVEL";
     }},
    {kLinger, "--linger", nullptr, "SECONDS", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       return ParseSeconds(n, t, &c->linger_seconds);
     },
     [](const ProcessConfig& c) { return FormatSeconds(c.linger_seconds); },
     [](Role) -> const char* {
       return "Keep serving (e.g. /metrics) this long after the work is done, then exit";
     }},
    {kCudaTf32, "--cuda-tf32", nullptr, "0|1", kForWorker, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       if (t != "" && t != "0" && t != "1") return BadValue(n, t, "expected 0 or 1");
       c->cuda_tf32 = t == "1";
       return OkStatus();
     },
     [](const ProcessConfig& c) { return std::string(c.cuda_tf32 ? "1" : "0"); },
     [](Role) -> const char* {
       return "1: GEMMs on a CUDA device may use TF32 tensor cores (~1e-3 relative error); "
              "0: float32. Env: TESSERA_CUDA_TF32";
     }},
    {kAuthKeyFile, "--auth-key-file", nullptr, "PATH", kForAll, true,
     [](std::string_view, std::string_view t, ProcessConfig* c) {
       c->auth_key_file = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.auth_key_file; },
     [](Role) -> const char* {
       return "The job's key file (mode 0600; make one with tessera-launch --make-key-file): "
              "only processes holding it may connect. Env: TESSERA_AUTH_KEY_FILE";
     }},
    {kInsecure, "--insecure", nullptr, "", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       if (t != "" && t != "0" && t != "1") return BadValue(n, t, "expected 0 or 1 (or nothing)");
       c->insecure = t != "0";
       return OkStatus();
     },
     [](const ProcessConfig& c) { return std::string(c.insecure ? "1" : "0"); },
     [](Role) -> const char* {
       return "Turn authentication off: any process that reaches a port is trusted (warned "
              "about at start). Env: TESSERA_INSECURE=1";
     }},
    {kEncrypt, "--encrypt", nullptr, "auto|on|off", kForAll, false,
     [](std::string_view n, std::string_view t, ProcessConfig* c) {
       if (t != "auto" && t != "on" && t != "off") return BadValue(n, t, "expected auto, on or off");
       c->encrypt = std::string(t);
       return OkStatus();
     },
     [](const ProcessConfig& c) { return c.encrypt; },
     [](Role) -> const char* {
       return "Encrypt traffic (CURVE): auto does when listening off the loopback. Every "
              "process of a job must resolve it alike. Env: TESSERA_ENCRYPT";
     }},
};

bool HasField(Role role, const Field& field) {
  return (field.roles & (1u << static_cast<int>(role))) != 0;
}

constexpr std::string_view kFromFlag = "flag";
// The --help group of the process fields' flags; DescribeSettings tells them from the binary's
// own options by it.
constexpr char kProcessOptionsGroup[] = "Tessera process options";
constexpr std::string_view kEnvPrefix = "env ";

bool GivenAsFlag(const ProcessConfig& config, FieldId id) {
  auto it = config.sources.find(kFields[id].flag);
  return it != config.sources.end() && it->second == kFromFlag;
}

// "--rank=5", plus " (from RANK)" when the value came from the environment.
std::string Named(const ProcessConfig& config, FieldId id) {
  const Field& field = kFields[id];
  std::string value = field.get(config);
  std::string out = std::string(field.flag) + "=" + (field.is_text ? Quote(value) : value);
  auto it = config.sources.find(field.flag);
  if (it != config.sources.end() && it->second.rfind(kEnvPrefix, 0) == 0) {
    out += " (from " + it->second.substr(kEnvPrefix.size()) + ")";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Environment.

// One launcher's variables. Order of kFamilies = precedence.
struct LauncherFamily {
  const char* rank;
  const char* local_rank;
  const char* size;
};

constexpr LauncherFamily kFamilies[] = {
    {"RANK", "LOCAL_RANK", "WORLD_SIZE"},                                           // torchrun
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},  // OpenMPI
    {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},                              // Slurm
};

const std::string* Lookup(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

// Sets field `id` from variable `var` when the variable is set and the flag was not given.
Status ApplyVariable(const Environment& env, const char* var, FieldId id, ProcessConfig* config) {
  if (GivenAsFlag(*config, id)) return OkStatus();
  const std::string* value = Lookup(env, var);
  if (value == nullptr) return OkStatus();
  RETURN_IF_ERROR(kFields[id].set(var, *value, config));
  config->sources[kFields[id].flag] = std::string(kEnvPrefix) + var;
  return OkStatus();
}

Status ApplyMasterAddress(const Environment& env, ProcessConfig* config) {
  if (GivenAsFlag(*config, kCoordinator)) return OkStatus();
  const std::string* addr = Lookup(env, "MASTER_ADDR");
  const std::string* port_text = Lookup(env, "MASTER_PORT");
  if (addr == nullptr && port_text == nullptr) return OkStatus();
  if (port_text == nullptr) {
    return InvalidArgumentError("MASTER_ADDR=" + Quote(*addr) +
                                " is set but MASTER_PORT is not: set both, or pass --coordinator");
  }
  if (addr == nullptr) {
    return InvalidArgumentError("MASTER_PORT=" + Quote(*port_text) +
                                " is set but MASTER_ADDR is not: set both, or pass --coordinator");
  }
  int port = 0;
  RETURN_IF_ERROR(ParseInteger("MASTER_PORT", *port_text, &port));
  if (port < 1 || port > 65535) return BadValue("MASTER_PORT", *port_text, "must be 1..65535");

  std::string_view host = Unbracketed(*addr);
  if (host.empty()) return BadValue("MASTER_ADDR", *addr, "empty host");
  for (char c : host) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '[' || c == ']') {
      return BadValue("MASTER_ADDR", *addr, "not a host name or IP address");
    }
  }
  size_t colons = 0;
  for (char c : host) colons += (c == ':');
  if (colons == 1) {
    return BadValue("MASTER_ADDR", *addr,
                    "must be a host without a port (the port goes in MASTER_PORT)");
  }
  config->coordinator = JoinHostPort(host, port);
  config->sources[kFields[kCoordinator].flag] = std::string(kEnvPrefix) + "MASTER_ADDR+MASTER_PORT";
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Validation helpers.

Status OutOfRange(const ProcessConfig& config, FieldId id, std::string_view requirement) {
  return InvalidArgumentError(Named(config, id) + " is out of range: " + std::string(requirement));
}

Status CheckTimeoutMs(const ProcessConfig& config, FieldId id, int64_t value) {
  if (value <= 0 || value > kMaxTimeoutMs) {
    return OutOfRange(config, id, "must be 1.." + std::to_string(kMaxTimeoutMs) + " (a week)");
  }
  return OkStatus();
}

Status CheckPort(const ProcessConfig& config, FieldId id, int value) {
  if (value < 0 || value > 65535) {
    return OutOfRange(config, id, "must be 0..65535 (0: the OS picks)");
  }
  return OkStatus();
}

bool IsJobChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

}  // namespace

// -----------------------------------------------------------------------------------------------

ProcessConfig DefaultProcessConfig(Role role) {
  ProcessConfig config;
  config.role = role;
  if (role == Role::kCoordinator) config.coordinator = "127.0.0.1:0";
  return config;
}

ProcessFlags::ProcessFlags(Role role, CLI::App* app) : role_(role) {
  const ProcessConfig defaults = DefaultProcessConfig(role);
  for (const Field& field : kFields) {
    if (!HasField(role, field)) continue;
    std::string names = field.flag;
    if (field.alias != nullptr) names += std::string(",") + field.alias;
    CLI::Option* option = app->add_option(names);
    option->description(field.help(role));
    option->type_name(field.type_name);
    // An empty default shows nothing: so for the ranks, whose -1 stands for "not given" only.
    option->default_str(field.id == kRank || field.id == kLocalRank ? "" : field.get(defaults));
    option->group(kProcessOptionsGroup);
    if (field.id == kInsecure) {
      // A switch: `--insecure` alone (CLI11 would fill a missing value with the default).
      option->expected(0, 1);
      option->default_str("");
    }
    bindings_.push_back({option, field.id});
  }
  std::string footer =
      "Precedence: flags > environment > defaults. --rank, --local-rank and --num-workers come "
      "from ONE launcher's variables: the first of torchrun (RANK, LOCAL_RANK, WORLD_SIZE) > "
      "OpenMPI (OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE) > Slurm (SLURM_PROCID, SLURM_LOCALID, "
      "SLURM_NTASKS) that has any of them set; rank variables apply to workers only.";
  std::string existing = app->get_footer();
  app->footer(existing.empty() ? footer : existing + "\n\n" + footer);
  app->get_formatter()->column_width(40);
}

Status ProcessFlags::ApplyTo(ProcessConfig* config) const {
  for (const Binding& binding : bindings_) {
    if (binding.option->count() == 0) continue;
    const Field& field = kFields[binding.field];
    const std::vector<std::string>& results = binding.option->results();
    std::string text = results.empty() ? std::string() : results.back();
    RETURN_IF_ERROR(field.set(field.flag, text, config));
    config->sources[field.flag] = std::string(kFromFlag);
  }
  return OkStatus();
}

Environment CurrentEnvironment() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    size_t eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

Status ApplySlurmRendezvous(const Environment& env, ProcessConfig* config) {
  if (config->role != Role::kWorker || !config->coordinator.empty()) return OkStatus();
  StatusOr<std::optional<SlurmJob>> job = ReadSlurmJob(env);
  if (!job.ok()) return job.status().WithContext("reading Slurm's variables");
  if (!job->has_value() || !(*job)->in_step) return OkStatus();
  const std::string& head = (*job)->nodes[0];
  StatusOr<std::string> address = ResolveSlurmNode(head, RunCommand);
  if (!address.ok()) {
    return address.status().WithContext("the rendezvous of Slurm job " +
                                        std::to_string((*job)->job_id) +
                                        " (no --coordinator or MASTER_ADDR)");
  }
  const int port = SlurmJobPort((*job)->job_id);
  config->coordinator = JoinHostPort(*address, port);
  config->slurm_rendezvous = true;
  config->sources[kFields[kCoordinator].flag] =
      "Slurm: head node " + head + ", port " + std::to_string(port) + " from SLURM_JOB_ID";
  return OkStatus();
}

Status ApplyEnvironment(const Environment& env, ProcessConfig* config) {
  for (const LauncherFamily& family : kFamilies) {
    if (Lookup(env, family.rank) == nullptr && Lookup(env, family.local_rank) == nullptr &&
        Lookup(env, family.size) == nullptr) {
      continue;
    }
    if (config->role == Role::kWorker) {
      RETURN_IF_ERROR(ApplyVariable(env, family.rank, kRank, config));
      RETURN_IF_ERROR(ApplyVariable(env, family.local_rank, kLocalRank, config));
    }
    // A server or coordinator started as a Slurm step (`srun -n 2 tessera-server`) sees the
    // step's task count, not the job's workers.
    const bool slurm_step = std::string_view(family.size) == "SLURM_NTASKS" &&
                            Lookup(env, "SLURM_STEP_ID") != nullptr;
    if (config->role == Role::kWorker || !slurm_step) {
      RETURN_IF_ERROR(ApplyVariable(env, family.size, kNumWorkers, config));
    }
    break;  // the first family present wins; the others are ignored
  }
  RETURN_IF_ERROR(ApplyMasterAddress(env, config));
  RETURN_IF_ERROR(ApplySlurmRendezvous(env, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_NUM_SERVERS", kNumServers, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_JOB", kJob, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_LOG_LEVEL", kLogLevel, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_SOCKET_IFNAME", kBindHost, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_AUTH_KEY_FILE", kAuthKeyFile, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_INSECURE", kInsecure, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_ENCRYPT", kEncrypt, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_METRICS_BIND_HOST", kMetricsBindHost, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_METRICS_TLS_CERT", kMetricsTlsCert, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_METRICS_TLS_KEY", kMetricsTlsKey, config));
  RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_METRICS_AUTH_FILE", kMetricsAuthFile, config));
  if (config->role == Role::kWorker) {
    RETURN_IF_ERROR(ApplyVariable(env, "TESSERA_CUDA_TF32", kCudaTf32, config));
  }
  return OkStatus();
}

Status ValidateConfig(const ProcessConfig& c) {
  const bool is_coordinator = c.role == Role::kCoordinator;
  if (is_coordinator) {
    if (c.rank != -1) {
      return InvalidArgumentError(Named(c, kRank) + ": the coordinator has no rank; leave it -1");
    }
    if (c.local_rank != -1) {
      return InvalidArgumentError(Named(c, kLocalRank) +
                                  ": the coordinator has no local rank; leave it -1");
    }
    if (c.port != 0) {
      return InvalidArgumentError(Named(c, kPort) +
                                  ": the coordinator listens on --coordinator, not --port");
    }
  }

  if (c.role == Role::kWorker && c.num_workers < 1) {
    return OutOfRange(c, kNumWorkers, "must be >= 1");
  }
  if (c.num_workers < 0) {
    return OutOfRange(c, kNumWorkers,
                      "must be >= 0 (0: a long-running fleet that jobs' workers attach to)");
  }
  if (c.num_servers < 0) return OutOfRange(c, kNumServers, "must be >= 0");
  // -1 means "not given" (the coordinator assigns one), never a value a user gives.
  if (c.rank < 0 && (c.rank != -1 || c.sources.count(kFields[kRank].flag) != 0)) {
    return OutOfRange(c, kRank, "must be >= 0 (leave it out to let the coordinator assign one)");
  }
  if (c.role == Role::kWorker && c.rank >= c.num_workers) {
    return OutOfRange(c, kRank, "must be < " + Named(c, kNumWorkers));
  }
  if (c.role == Role::kServer && c.rank >= c.num_servers) {
    return OutOfRange(c, kRank, "must be < " + Named(c, kNumServers));
  }
  if (c.local_rank < 0 && (c.local_rank != -1 || c.sources.count(kFields[kLocalRank].flag) != 0)) {
    return OutOfRange(c, kLocalRank, "must be >= 0 (leave it out when unknown)");
  }
  if (c.role == Role::kWorker && c.local_rank >= c.num_workers) {
    return OutOfRange(c, kLocalRank, "must be < " + Named(c, kNumWorkers));
  }

  // A worker without a coordinator runs standalone (tessera-worker --mode local); the worker
  // rejects the fleet modes without one.
  int coordinator_port = 0;
  if (!c.coordinator.empty()) {
    StatusOr<std::pair<std::string, int>> coordinator = ParseHostPort(c.coordinator);
    if (!coordinator.ok()) return coordinator.status().WithContext(Named(c, kCoordinator));
    coordinator_port = coordinator->second;
    if (!is_coordinator && coordinator_port == 0) {
      return InvalidArgumentError(Named(c, kCoordinator) +
                                  ": port 0 cannot be connected to; give the coordinator's port");
    }
  } else if (c.role != Role::kWorker) {
    return InvalidArgumentError(
        "--coordinator is required for a " + std::string(RoleName(c.role)) +
        ": HOST:PORT of the coordinator (or set MASTER_ADDR and MASTER_PORT)");
  }

  if (c.bind_host.empty()) return InvalidArgumentError("--bind-host is empty");
  for (char ch : c.bind_host) {
    if (std::isspace(static_cast<unsigned char>(ch)) || ch == '/') {
      return InvalidArgumentError(Named(c, kBindHost) + ": not a host name or IP address");
    }
  }
  if (c.metrics_bind_host.empty()) return InvalidArgumentError("--metrics-bind-host is empty");
  for (char ch : c.metrics_bind_host) {
    if (std::isspace(static_cast<unsigned char>(ch)) || ch == '/') {
      return InvalidArgumentError(Named(c, kMetricsBindHost) +
                                  ": not loopback, auto, a host name or an IP address");
    }
  }
  if (c.metrics_tls_cert.empty() != c.metrics_tls_key.empty()) {
    return InvalidArgumentError(
        (c.metrics_tls_cert.empty() ? Named(c, kMetricsTlsKey) : Named(c, kMetricsTlsCert)) +
        " needs " + (c.metrics_tls_cert.empty() ? "--metrics-tls-cert" : "--metrics-tls-key") +
        " too: TLS takes a certificate and its key");
  }
  RETURN_IF_ERROR(CheckPort(c, kPort, c.port));
  RETURN_IF_ERROR(CheckPort(c, kMetricsPort, c.metrics_port));
  if (c.metrics_port != 0 && c.metrics_port == c.port) {
    return InvalidArgumentError(Named(c, kMetricsPort) + " is the same port as " + Named(c, kPort));
  }
  if (is_coordinator && c.metrics_port != 0 && c.metrics_port == coordinator_port) {
    return InvalidArgumentError(Named(c, kMetricsPort) + " is the same port as " +
                                Named(c, kCoordinator));
  }

  if (c.job.empty() || c.job.size() > 64) {
    return InvalidArgumentError(Named(c, kJob) + ": must be 1-64 characters");
  }
  for (char ch : c.job) {
    if (!IsJobChar(ch)) {
      return InvalidArgumentError(Named(c, kJob) +
                                  ": may only contain letters, digits, '.', '_' and '-'");
    }
  }

  RETURN_IF_ERROR(CheckTimeoutMs(c, kRendezvousTimeout, c.rendezvous_timeout_ms));
  RETURN_IF_ERROR(CheckTimeoutMs(c, kHeartbeatInterval, c.heartbeat_interval_ms));
  RETURN_IF_ERROR(CheckTimeoutMs(c, kHeartbeatTimeout, c.heartbeat_timeout_ms));
  RETURN_IF_ERROR(CheckTimeoutMs(c, kRequestTimeout, c.request_timeout_ms));
  if (c.heartbeat_timeout_ms <= c.heartbeat_interval_ms) {
    return InvalidArgumentError(Named(c, kHeartbeatTimeout) + " must be greater than " +
                                Named(c, kHeartbeatInterval) +
                                ", or a live process is declared failed between two heartbeats");
  }

  if (c.max_message_bytes < kMinMessageBytes) {
    return OutOfRange(c, kMaxMessageBytes, "must be >= " + std::to_string(kMinMessageBytes));
  }
  if (c.max_message_bytes > kMaxMessageBytesLimit) {
    return OutOfRange(c, kMaxMessageBytes,
                      "must be <= " + std::to_string(kMaxMessageBytesLimit) +
                          " (below 2 GiB): the FlatBuffers 2.0.8 Verifier asserts on buffers of "
                          "2 GiB or more");
  }

  switch (c.log_level) {
    case LogLevel::kDebug:
    case LogLevel::kInfo:
    case LogLevel::kWarning:
    case LogLevel::kError:
      break;
    default:
      return InvalidArgumentError("--log-level=" + std::to_string(static_cast<int>(c.log_level)) +
                                  " is not a log level");
  }

  if (!std::isfinite(c.linger_seconds) || c.linger_seconds < 0 ||
      c.linger_seconds > kMaxTimeoutMs / 1000) {
    return OutOfRange(c, kLinger, "must be 0.." + std::to_string(kMaxTimeoutMs / 1000) +
                                      " seconds (a week)");
  }
  return OkStatus();
}

CommandLine::CommandLine(const std::string& description, const std::string& name)
    : app_(std::make_unique<CLI::App>(description, name)) {}

CommandLine::~CommandLine() = default;

void CommandLine::AddFlag(const std::string& names, bool* value, const std::string& help) {
  app_->add_flag(names, *value, help);
}

void CommandLine::AddOption(const std::string& name, std::string* value, const std::string& help) {
  app_->add_option(name, *value, help);
}

void CommandLine::AddOption(const std::string& name, int* value, const std::string& help, int min,
                            int max, bool show_default) {
  CLI::Option* option = app_->add_option(name, *value, help)->check(CLI::Range(min, max));
  if (show_default) option->capture_default_str();
}

void CommandLine::AddOption(const std::string& name, uint64_t* value, const std::string& help,
                            uint64_t min, uint64_t max, bool show_default) {
  CLI::Option* option = app_->add_option(name, *value, help)->check(CLI::Range(min, max));
  if (show_default) option->capture_default_str();
}

StatusOr<ProcessConfig> ParseProcessConfig(Role role, int argc, const char* const* argv,
                                           const Environment& env, CLI::App* app,
                                           bool* help_requested) {
  if (help_requested != nullptr) *help_requested = false;
  std::unique_ptr<CLI::App> own_app;
  if (app == nullptr) {
    own_app = std::make_unique<CLI::App>("tessera " + std::string(RoleName(role)));
    app = own_app.get();
  }
  ProcessConfig config = DefaultProcessConfig(role);
  std::optional<ProcessFlags> flags;
  bool print_config = false;
  try {
    flags.emplace(role, app);
    app->add_flag("--print-config", print_config,
                  "Print every setting (flags, environment, defaults) with where it came from, "
                  "and exit")
        ->group(kProcessOptionsGroup);
    app->parse(argc, argv);
  } catch (const CLI::Success& success) {  // --help, --help-all, --version
    app->exit(success, std::cout, std::cerr);
    if (help_requested != nullptr) *help_requested = true;
    return CancelledError("help requested: printed to stdout");
  } catch (const CLI::ParseError& error) {
    return InvalidArgumentError(std::string(error.what()) + " (run with --help to list the flags)");
  } catch (const CLI::Error& error) {  // e.g. a binary's flag that clashes with ours
    return InternalError(std::string("command-line setup: ") + error.what());
  }
  RETURN_IF_ERROR(flags->ApplyTo(&config));
  RETURN_IF_ERROR(ApplyEnvironment(env, &config));
  RETURN_IF_ERROR(ValidateConfig(config));
  if (config.role == Role::kWorker && config.coordinator.empty() && config.rank < 0) {
    // Standalone (--mode local): the only worker of its job, so its lines say "worker 0".
    config.rank = 0;
    config.sources[kFields[kRank].flag] = "standalone";
  }
  if (print_config) {
    std::cout << DescribeAllSettings(config, *app) << std::flush;
    if (help_requested != nullptr) *help_requested = true;
    return CancelledError("--print-config: printed to stdout");
  }
  return config;
}

std::string DescribeConfig(const ProcessConfig& config) {
  std::string out = "role: " + std::string(RoleName(config.role)) + "\n";
  for (const Field& field : kFields) {
    if (!HasField(config.role, field)) continue;
    std::string value = field.get(config);
    out += std::string(field.flag) + "=" + (field.is_text ? Quote(value) : value);
    auto it = config.sources.find(field.flag);
    out += " (" + (it == config.sources.end() ? std::string("default") : it->second) + ")\n";
  }
  return out;
}

namespace {

// Every option of `app`, those in its option groups (nameless subcommands) included, in the
// order they were added.
std::vector<const CLI::Option*> AllOptions(const CLI::App& app) {
  std::vector<const CLI::Option*> options = app.get_options();
  for (const CLI::App* group :
       app.get_subcommands([](const CLI::App* sub) { return sub->get_name().empty(); })) {
    std::vector<const CLI::Option*> more = AllOptions(*group);
    options.insert(options.end(), more.begin(), more.end());
  }
  return options;
}

// The binary's own options (not the process fields, not --help or --print-config).
std::vector<const CLI::Option*> BinaryOptions(const CLI::App& app) {
  std::vector<const CLI::Option*> options;
  for (const CLI::Option* option : AllOptions(app)) {
    if (option->get_group() == kProcessOptionsGroup) continue;
    if (option->get_lnames().empty()) continue;  // positionals and short-only flags
    const std::string& name = option->get_lnames().front();
    if (name == "help" || name == "help-all" || name == "version") continue;
    options.push_back(option);
  }
  return options;
}

// A flag: an option that takes no value (--layer-norm, --json).
bool IsFlag(const CLI::Option& option) {
  return option.get_expected_min() == 0 && option.get_expected_max() == 0;
}

// "--name=value" for an option given on the command line: a flag without a value is "--name".
std::string GivenOption(const CLI::Option& option) {
  std::string name = "--" + option.get_lnames().front();
  std::string value;
  for (const std::string& result : option.results()) {
    value += (value.empty() ? "" : ",") + result;
  }
  if (IsFlag(option) && (value == "true" || value == "1" || value.empty())) {
    return name;
  }
  return name + "=" + value;
}

}  // namespace

std::string DescribeSettings(const ProcessConfig& config, const CLI::App& app) {
  std::string flags;
  for (const CLI::Option* option : AllOptions(app)) {
    if (option->count() == 0 || option->get_lnames().empty()) continue;
    flags += (flags.empty() ? "" : " ") + GivenOption(*option);
  }
  std::string out = flags.empty() ? "" : flags + " (flags)";
  for (const Field& field : kFields) {
    if (!HasField(config.role, field)) continue;
    auto it = config.sources.find(field.flag);
    if (it == config.sources.end() || it->second.rfind(kEnvPrefix, 0) != 0) continue;
    std::string value = field.get(config);
    out += std::string(out.empty() ? "" : "; ") + field.flag + "=" +
           (field.is_text ? Quote(value) : value) + " (" + it->second + ")";
  }
  return out.empty() ? "all defaults" : out;
}

std::string DescribeAllSettings(const ProcessConfig& config, const CLI::App& app) {
  std::string out = DescribeConfig(config);
  for (const CLI::Option* option : BinaryOptions(app)) {
    if (option->count() > 0) {
      out += GivenOption(*option) + " (flag)\n";
      continue;
    }
    std::string name = "--" + option->get_lnames().front();
    std::string value = option->get_default_str();
    if (IsFlag(*option) && value.empty()) value = "off";
    out += name + (value.empty() ? " unset" : "=" + value) + " (default)\n";
  }
  return out;
}

}  // namespace tessera
