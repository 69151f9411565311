// FleetPresence: what a process using the "tessera" torch.distributed backend shows the
// outside, one per process, made when its first (world) process group is created:
//
//   - the process's metrics registry (its own, or the one the options name, which the
//     extension module makes first so FSDP's instruments exist before any group), which
//     every group's BackendMetrics and transport add to;
//   - with a metrics port (TESSERA_METRICS_PORT), Prometheus /metrics over HTTP, its URL
//     logged ("rank 1 serves metrics at http://127.0.0.1:41234/metrics");
//   - with a coordinator (TESSERA_COORDINATOR), a registration there as worker <rank> of a job
//     of <world size> workers, heartbeats while the process lives and a goodbye when it ends,
//     so the coordinator's dashboard and /sd list the torch ranks beside native processes.
//     Start waits until every rank has registered (the coordinator's rendezvous), bounded by
//     the group's timeout, and fails naming the coordinator when it cannot be reached.
//
// Thread-safety: metrics() from any thread; Leave from one thread at a time.
#ifndef TESSERA_WORKER_TORCH_FLEET_PRESENCE_H_
#define TESSERA_WORKER_TORCH_FLEET_PRESENCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "common/process/metrics_http_settings.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/transport/rpc_endpoint.h"
#include "common/security/credentials.h"
#include "worker/torch/backend_metrics.h"

namespace tessera::worker {

struct FleetPresenceOptions {
  int rank = 0;
  int world_size = 1;
  std::string bind_host = "127.0.0.1";
  Credentials credentials;  // for the coordinator
  std::optional<MetricsHttpSettings> metrics;  // unset: no HTTP server
  std::string coordinator;                     // HOST:PORT; empty: no registration
  int64_t timeout_ms = 60000;                  // bounds the registration
  // The process's registry, which must outlive the presence; null: the presence owns one.
  MetricsRegistry* registry = nullptr;
};

class FleetPresence {
 public:
  static StatusOr<std::unique_ptr<FleetPresence>> Start(const FleetPresenceOptions& options);
  // Says goodbye to the coordinator (Leave), then stops serving.
  ~FleetPresence();

  // Tells the coordinator this process is leaving cleanly (not failed) and stops heartbeats;
  // /metrics stays up. Idempotent; the Python module calls it at interpreter exit.
  void Leave(const std::string& reason);
  // Leaves because the process is failing with `error` (RendezvousClient::LeaveWithError).
  void LeaveWithError(const Status& error);

  MetricsRegistry* metrics() { return registry_; }
  BackendMetrics* backend_metrics() { return backend_metrics_.get(); }
  // True when registered with a coordinator (TESSERA_COORDINATOR).
  bool registered() const { return client_ != nullptr; }
  // http://HOST:PORT/metrics, or empty without a metrics port.
  std::string metrics_url() const { return http_ ? http_->url() : std::string(); }

 private:
  FleetPresence() = default;

  std::unique_ptr<MetricsRegistry> own_registry_;  // when the options named none
  MetricsRegistry* registry_ = nullptr;            // own_registry_ or the options'
  std::unique_ptr<BackendMetrics> backend_metrics_;
  std::unique_ptr<MetricsHttpServer> http_;
  std::unique_ptr<RpcEndpoint> endpoint_;      // to the coordinator
  std::unique_ptr<RendezvousClient> client_;  // after endpoint_: goes first
  bool left_ = false;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_FLEET_PRESENCE_H_
