#include "worker/torch/backend_config.h"

#include <charconv>

#include "common/base/host_port.h"
#include "common/base/quote.h"
#include "common/transport/bind_address.h"

namespace tessera::worker {
namespace {

// The backend's default timeout: a dead peer is noticed at once (its links close, its pid is
// gone), so this bounds only a live peer that stopped calling, e.g. one still saving a large
// checkpoint while the others wait in a barrier.
constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

StatusOr<int64_t> ParseInteger(const std::string& name, const std::string& text, int64_t min,
                               int64_t max, const std::string& what) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return InvalidArgumentError(name + "=" + Quote(text) + " is not " + what);
  }
  return value;
}

// Why a rank found no key, for the error: which of its launchers' ways of starting ranks come
// with one (tessera/torch/__init__.py).
std::string NoKeyHint(const Environment& env) {
  static constexpr const char* kRankVariables[] = {
      "RANK", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
      "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  std::string launcher;
  for (const char* name : kRankVariables) {
    if (env.count(name) != 0) {
      launcher = name;
      break;
    }
  }
  const std::string spawned =
      "Ranks started with torch.multiprocessing.spawn, multiprocessing or subprocess by a "
      "process that imported tessera.torch inherit that process's key";
  if (launcher.empty()) {
    return spawned + "; this process was not started that way (or it was, and " +
           kAuthKeyFileVariable + " was removed from its environment)";
  }
  return spawned + "; this one was started by a launcher (" + launcher +
         " is set), whose ranks need one key file given to them all";
}

}  // namespace

StatusOr<Credentials> CredentialsFromEnvironment(const Environment& env,
                                                 std::string_view listen_host,
                                                 std::string_view rendezvous_host) {
  auto value = [&env](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  const std::string insecure = value("TESSERA_INSECURE");
  if (insecure != "" && insecure != "0" && insecure != "1") {
    return InvalidArgumentError("TESSERA_INSECURE=" + Quote(insecure) + " is not 0 or 1");
  }
  const std::string encrypt = value("TESSERA_ENCRYPT");
  StatusOr<Credentials> credentials =
      ResolveCredentials(insecure == "1", encrypt.empty() ? "auto" : encrypt,
                         value(kAuthKeyFileVariable), listen_host, rendezvous_host);
  if (!credentials.ok()) {
    Status status = credentials.status();
    if (status.code() == StatusCode::kFailedPrecondition && insecure != "1" &&
        value(kAuthKeyFileVariable).empty()) {
      status = Status(status.code(), status.message() + ". " + NoKeyHint(env));
    }
    return status.WithContext("the tessera backend");
  }
  return credentials;
}

StatusOr<BackendConfig> BackendConfigFrom(const Environment& env, std::string_view store_host) {
  BackendConfig config;
  GroupMemberOptions& member = config.member;
  member.timeout_ms = kDefaultTimeoutMs;
  {
    // As --bind-host: auto aims at the rendezvous host torch was given: MASTER_ADDR (env://),
    // else its TCPStore's host (tcp://, which sets no MASTER_ADDR).
    auto given = env.find("TESSERA_BIND_HOST");
    if (given == env.end()) given = env.find("TESSERA_SOCKET_IFNAME");
    const std::string choice = given == env.end() ? "auto" : given->second;
    auto master = env.find("MASTER_ADDR");
    const std::string rendezvous_host =
        master != env.end() ? master->second : std::string(store_host);
    StatusOr<BindAddress> bind = ResolveBindAddress(choice, rendezvous_host);
    if (!bind.ok()) {
      return bind.status().WithContext(
          given != env.end()    ? given->first + "=" + Quote(choice)
          : master != env.end() ? "MASTER_ADDR=" + Quote(master->second)
                                : "the host of torch's TCPStore, " + Quote(rendezvous_host));
    }
    // Every socket of a rank binds the address its peers are given.
    member.bind_host = bind->advertise;
    ASSIGN_OR_RETURN(member.credentials,
                     CredentialsFromEnvironment(env, member.bind_host, rendezvous_host));
  }
  if (auto it = env.find("TESSERA_RING_TRANSPORT"); it != env.end()) {
    const std::string& kind = it->second;
    if (kind != "auto" && kind != "shm" && kind != "links" && kind != "zmq") {
      return InvalidArgumentError("TESSERA_RING_TRANSPORT=" + Quote(kind) +
                                  " is not one of auto, shm, links, zmq");
    }
    member.ring_transport = kind;
  }
  if (auto it = env.find("TESSERA_DIRECT_READ_MIN_BYTES"); it != env.end()) {
    ASSIGN_OR_RETURN(int64_t bytes,
                     ParseInteger("TESSERA_DIRECT_READ_MIN_BYTES", it->second, 0,
                                  int64_t{1} << 50, "a number of bytes (0: never)"));
    member.direct_read_min_bytes = static_cast<size_t>(bytes);
  }
  if (auto it = env.find("TESSERA_ONE_SHOT_MAX_BYTES"); it != env.end()) {
    ASSIGN_OR_RETURN(int64_t bytes,
                     ParseInteger("TESSERA_ONE_SHOT_MAX_BYTES", it->second, 0,
                                  int64_t{1} << 40, "a number of bytes (0: never)"));
    member.one_shot_max_bytes = static_cast<size_t>(bytes);
  }
  if (auto it = env.find("TESSERA_COMM_SPIN_US"); it != env.end()) {
    ASSIGN_OR_RETURN(member.comm_spin_us,
                     ParseInteger("TESSERA_COMM_SPIN_US", it->second, 0, kMaxCommSpinUs,
                                  "a number of microseconds from 0 (never spin) to " +
                                      std::to_string(kMaxCommSpinUs)));
  }
  if (auto it = env.find("TESSERA_TIMEOUT_MS"); it != env.end()) {
    ASSIGN_OR_RETURN(member.timeout_ms,
                     ParseInteger("TESSERA_TIMEOUT_MS", it->second, 1, int64_t{1} << 40,
                                  "a positive number of milliseconds"));
  }
  if (auto it = env.find("TESSERA_METRICS_PORT"); it != env.end()) {
    ASSIGN_OR_RETURN(int64_t port, ParseInteger("TESSERA_METRICS_PORT", it->second, 0, 65535,
                                                "a port (0-65535; 0: the OS picks one)"));
    config.metrics = MetricsHttpSettings::FromEnvironment(static_cast<int>(port), env);
  }
  if (auto it = env.find("TESSERA_COORDINATOR"); it != env.end() && !it->second.empty()) {
    StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(it->second);
    if (!host_port.ok() || host_port->second == 0) {
      return InvalidArgumentError(
          "TESSERA_COORDINATOR=" + Quote(it->second) +
          " is not the HOST:PORT of a running tessera-coordinator" +
          (host_port.ok() ? std::string(" (port 0)") : ": " + host_port.status().message()));
    }
    config.coordinator = it->second;
    // The coordinator lists each rank by its /metrics: one is served if none was asked for.
    if (!config.metrics) config.metrics = MetricsHttpSettings::FromEnvironment(0, env);
  }
  return config;
}

int64_t EffectiveTimeoutMs(const BackendConfig& config, int64_t torch_ms) {
  return torch_ms == kTorchDefaultTimeoutMs ? config.member.timeout_ms : torch_ms;
}

}  // namespace tessera::worker
