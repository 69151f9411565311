// BackendConfig: how the "tessera" torch.distributed backend is set up, from the environment
// of the process that imports tessera.torch (torchrun, mp.spawn and plain processes have no
// flags to give it):
//
//   TESSERA_BIND_HOST       where each rank's transport and ring links listen, and the
//                           address its peers get (default auto: the local end of the route
//                           to MASTER_ADDR, else to the host of torch's TCPStore (a tcp://
//                           init method), else 127.0.0.1 (a file store: one host))
//   TESSERA_RING_TRANSPORT  auto (default), shm, links or zmq, as tessera-worker's flag
//   TESSERA_METRICS_PORT    serve Prometheus /metrics on this port (0: the OS picks one, and
//                           the URL is logged); unset: no /metrics
//   TESSERA_METRICS_BIND_HOST  where /metrics listens: loopback (default), auto (where the
//   TESSERA_METRICS_TLS_CERT   transport does) or as TESSERA_BIND_HOST; HTTPS and basic auth,
//   TESSERA_METRICS_TLS_KEY    as tessera-worker's --metrics-* flags
//   TESSERA_METRICS_AUTH_FILE  (common/process/metrics_http_settings.h)
//   TESSERA_COORDINATOR     HOST:PORT of a running tessera-coordinator: each rank registers
//                           there as a worker, so its dashboard and /sd list the ranks
//                           (needs TESSERA_METRICS_PORT, which a default of 0 supplies)
//   TESSERA_COMM_SPIN_US    how long an idle comm thread polls for the next op, and a Work's
//                           wait() for its op's end, before sleeping (default 0: at once),
//                           as tessera-worker's --comm-spin-us (spin_wait.h)
//   TESSERA_TIMEOUT_MS      the default timeout of every operation when init_process_group is
//                           given none (default 300000, 5 minutes, instead of torch's 30)
//   TESSERA_AUTH_KEY_FILE   the job's key file (required unless TESSERA_INSECURE=1), as
//   TESSERA_INSECURE        tessera-worker's --auth-key-file, --insecure and --encrypt
//   TESSERA_ENCRYPT         (common/security/credentials.h)
//
// Thread-safety: a pure function of the environment it is given.
#ifndef TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_
#define TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/process/metrics_http_settings.h"
#include "common/security/credentials.h"
#include "worker/torch/group_member.h"

namespace tessera::worker {

// torch's default process-group timeout (30 minutes), which the backend replaces with its
// own: a process group created with exactly this timeout was given none.
inline constexpr int64_t kTorchDefaultTimeoutMs = 30 * 60 * 1000;

// The credentials the environment asks for (see above), for a process listening on
// `listen_host` whose rendezvous is at `rendezvous_host` (they decide TESSERA_ENCRYPT=auto).
StatusOr<Credentials> CredentialsFromEnvironment(const Environment& env,
                                                 std::string_view listen_host,
                                                 std::string_view rendezvous_host);

struct BackendConfig {
  // What every process group of this process starts from (rank, world size, store come from
  // torch; timeout_ms from torch unless it is torch's default).
  GroupMemberOptions member;
  std::optional<MetricsHttpSettings> metrics;  // unset: no /metrics
  std::string coordinator;                     // HOST:PORT; empty: none
};

// InvalidArgument naming the variable and what it should hold for a bad value. `store_host`:
// the host of the TCPStore torch gave the group ("" for other stores), which auto aims at
// when MASTER_ADDR is unset.
StatusOr<BackendConfig> BackendConfigFrom(const Environment& env,
                                          std::string_view store_host = "");

// The timeout a group gets: `torch_ms` unless it is torch's default, then the backend's.
int64_t EffectiveTimeoutMs(const BackendConfig& config, int64_t torch_ms);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_
