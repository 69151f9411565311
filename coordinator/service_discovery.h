// Prometheus service discovery for one Tessera job: the coordinator lists the /metrics endpoint
// of every live process, so a single scrape config finds the whole fleet.
//
// The same target groups go out two ways:
//   - HTTP SD: GET /sd on the coordinator's metrics port, for Prometheus' http_sd_configs;
//   - file SD: a targets file (tessera-coordinator --file-sd PATH), rewritten atomically
//     whenever the fleet changes, for file_sd_configs.
// Both use the JSON format the two mechanisms share, one target group per process:
//
//   [{"targets": ["127.0.0.1:40123"],
//     "labels": {"__metrics_path__": "/metrics", "rank": "0", "role": "coordinator",
//                "tessera_job": "tessera"}},
//    {"targets": ["127.0.0.1:40187"],
//     "labels": {"__metrics_path__": "/metrics", "rank": "1", "role": "worker",
//                "tessera_job": "tessera"}}, ...]
//
// The coordinator comes first (rank "0", as in its TESSERA_READY line), then the members in
// (role, rank) order. A member is listed from its registration (joining or alive) until it
// fails or leaves. The job's name is in `tessera_job` because Prometheus sets `job` itself, from
// the scrape config's job_name. A process whose metrics URL has an unspecified host (0.0.0.0,
// ::) is listed under the host name it registered with (the coordinator: its own host name).
#ifndef TESSERA_COORDINATOR_SERVICE_DISCOVERY_H_
#define TESSERA_COORDINATOR_SERVICE_DISCOVERY_H_

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metrics_http.h"

namespace tessera::coordinator {

struct ScrapeTarget {
  std::string address;       // HOST:PORT, what Prometheus connects to
  std::string metrics_path;  // "/metrics"
  std::string scheme = "http";  // "https" for a member serving TLS (--metrics-tls-cert)
  std::string role;          // "coordinator", "server", "worker"
  int rank = 0;
  std::string job;  // the Tessera job's name
};

// The parts of "http://HOST:PORT/PATH" or "https://HOST:PORT/PATH" (PATH "/" when absent). An
// unspecified host (0.0.0.0, ::) becomes `fallback_host` when that is not empty.
// InvalidArgument quoting the URL when it is not of that form.
struct MetricsUrlParts {
  std::string scheme;   // "http" or "https"
  std::string address;  // HOST:PORT
  std::string path;
};
StatusOr<MetricsUrlParts> SplitMetricsUrl(std::string_view url, std::string_view fallback_host);

// The coordinator's target, then one per joining or alive member of `view`. Members whose
// metrics address cannot be parsed are left out and named, with the reason, in `*skipped`
// (when not null).
std::vector<ScrapeTarget> ScrapeTargets(const FleetView& view, const ScrapeTarget& coordinator,
                                        std::vector<std::string>* skipped);

// The JSON array of target groups described in the file comment.
std::string TargetGroupsJson(const std::vector<ScrapeTarget>& targets);

struct ServiceDiscoveryOptions {
  std::string job = "tessera";
  // The coordinator's own "http://HOST:PORT/metrics".
  std::string coordinator_metrics_url;
  // Stands in for an unspecified host in the coordinator's URL; empty: this machine's host name.
  std::string coordinator_host;
  // Where to keep the file SD targets file; empty: no file.
  std::string file_sd_path;
};

// Keeps the current target groups, serves them over HTTP and mirrors them to the file.
//
// Thread-safety: thread-safe. Update() is meant for the coordinator's fleet-change hook,
// Serve() for the HTTP server's threads.
class ServiceDiscovery {
 public:
  // InvalidArgument naming the URL when the coordinator's metrics URL is not http://HOST:PORT/...
  static StatusOr<std::unique_ptr<ServiceDiscovery>> Create(const ServiceDiscoveryOptions& options);

  // Recomputes the target groups from `view` (the coordinator's current membership) and, when
  // they changed, rewrites the file. Returns the file's write error, naming it; the groups that
  // Serve() answers with are updated either way.
  Status Update(const FleetView& view);

  // The current target groups as JSON.
  std::string Json() const;

  // GET: 200 with the JSON (application/json); other methods: 405.
  HttpResponse Serve(const HttpRequest& request) const;

 private:
  ServiceDiscovery(const ServiceDiscoveryOptions& options, ScrapeTarget coordinator)
      : options_(options), coordinator_(std::move(coordinator)) {}

  const ServiceDiscoveryOptions options_;
  const ScrapeTarget coordinator_;

  mutable std::mutex mu_;
  std::string json_;          // guarded by mu_
  std::string written_json_;  // guarded by mu_; what the file holds, empty before the first write
  std::string skipped_;       // guarded by mu_; the last warning about unlisted members
};

}  // namespace tessera::coordinator

#endif  // TESSERA_COORDINATOR_SERVICE_DISCOVERY_H_
