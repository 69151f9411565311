#include "worker/torch/fleet_presence.h"

#include <algorithm>
#include <chrono>

#include "common/base/logging.h"
#include "common/base/role.h"
#include "common/base/version.h"
#include "common/metrics/metric_names.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::worker {

StatusOr<std::unique_ptr<FleetPresence>> FleetPresence::Start(
    const FleetPresenceOptions& options) {
  namespace names = metric_names;
  std::unique_ptr<FleetPresence> presence(new FleetPresence());
  if (options.registry == nullptr) presence->own_registry_ = std::make_unique<MetricsRegistry>();
  presence->registry_ =
      options.registry != nullptr ? options.registry : presence->own_registry_.get();
  MetricsRegistry& registry = *presence->registry_;
  ASSIGN_OR_RETURN(GaugeFamily * start_time,
                   registry.RegisterGauge(names::kProcessStartTimeSeconds.name,
                                          names::kProcessStartTimeSeconds.help));
  ASSIGN_OR_RETURN(Gauge * start, start_time->WithLabels({}));
  start->Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                 .count());
  ASSIGN_OR_RETURN(GaugeFamily * build_info,
                   registry.RegisterGauge(names::kBuildInfo.name, names::kBuildInfo.help,
                                          {"role", "version"}));
  ASSIGN_OR_RETURN(Gauge * info, build_info->WithLabels({"worker", kVersion}));
  info->Set(1);
  ASSIGN_OR_RETURN(presence->backend_metrics_, BackendMetrics::Register(&registry));

  if (options.metrics) {
    const std::string coordinator_host =
        options.coordinator.substr(0, options.coordinator.rfind(':'));
    // The transport binds the address its peers are given.
    StatusOr<MetricsHttpOptions> http = ResolveMetricsHttpOptions(
        *options.metrics, BindAddress{options.bind_host, options.bind_host, "TESSERA_BIND_HOST"},
        coordinator_host);
    StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        http.ok() ? MetricsHttpServer::Start(*http, &registry)
                  : StatusOr<std::unique_ptr<MetricsHttpServer>>(http.status());
    if (!server.ok()) {
      return Status(server.status().code(),
                    "TESSERA_METRICS_PORT=" + std::to_string(options.metrics->port) + ": " +
                        server.status().message());
    }
    presence->http_ = std::move(server).value();
    TLOG(INFO) << "rank " << options.rank << " serves metrics at " << presence->http_->url();
  }

  if (!options.coordinator.empty()) {
    ZmqTransportOptions transport;
    transport.credentials = options.credentials;
    transport.bind_host = options.bind_host;
    transport.role = Role::kWorker;
    transport.rank = options.rank;
    ASSIGN_OR_RETURN(presence->endpoint_, StartZmqEndpoint(transport, &registry));
    RendezvousOptions join;
    join.coordinator_address = "tcp://" + options.coordinator;
    join.role = Role::kWorker;
    join.requested_rank = options.rank;
    join.num_workers = options.world_size;
    join.metrics_address = presence->metrics_url();
    join.rendezvous_timeout_ms = options.timeout_ms;
    join.request_timeout_ms = std::min<int64_t>(options.timeout_ms, 30000);
    // The torch ranks detect their own failures (the ring); another member's failure is the
    // coordinator's news to show, not a reason to end this process.
    join.peer_failures_are_fatal = false;
    StatusOr<std::unique_ptr<RendezvousClient>> client =
        RendezvousClient::Join(presence->endpoint_.get(), join, &registry);
    if (!client.ok()) {
      return Status(client.status().code(), "registering rank " + std::to_string(options.rank) +
                                                " with the coordinator at " +
                                                options.coordinator + " (TESSERA_COORDINATOR): " +
                                                client.status().message());
    }
    presence->client_ = std::move(client).value();
    TLOG(INFO) << "rank " << options.rank << " registered with the coordinator at "
               << options.coordinator << " as worker " << presence->client_->rank();
  }
  return presence;
}

FleetPresence::~FleetPresence() { Leave("the torch process is exiting"); }

void FleetPresence::Leave(const std::string& reason) {
  if (client_ && !left_) client_->Leave(reason);
  left_ = true;
}

void FleetPresence::LeaveWithError(const Status& error) {
  if (client_ && !left_) client_->LeaveWithError(error);
  left_ = true;
}

}  // namespace tessera::worker
