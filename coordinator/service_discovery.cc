#include "coordinator/service_discovery.h"

#include <nlohmann/json.hpp>

#include "common/base/atomic_file.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/quote.h"

namespace tessera::coordinator {
namespace {


}  // namespace

StatusOr<MetricsUrlParts> SplitMetricsUrl(std::string_view url, std::string_view fallback_host) {
  auto fail = [url](std::string_view why) {
    return InvalidArgumentError("metrics URL " + Quote(url) +
                                " is not http(s)://HOST:PORT/PATH: " + std::string(why));
  };
  MetricsUrlParts parts;
  const size_t separator = url.find("://");
  if (separator != std::string_view::npos) parts.scheme = std::string(url.substr(0, separator));
  if (parts.scheme != "http" && parts.scheme != "https") {
    return fail("not an http:// or https:// URL");
  }
  std::string_view rest = url.substr(separator + 3);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(authority);
  if (!host_port.ok()) return fail(host_port.status().message());
  auto [host, port] = *host_port;
  if (port == 0) return fail("port 0");
  if (IsUnspecifiedHost(host) && !fallback_host.empty()) host = std::string(fallback_host);
  parts.address = JoinHostPort(host, port);
  parts.path = path;
  return parts;
}

std::vector<ScrapeTarget> ScrapeTargets(const FleetView& view, const ScrapeTarget& coordinator,
                                        std::vector<std::string>* skipped) {
  std::vector<ScrapeTarget> targets = {coordinator};
  for (const MemberInfo& member : view.members) {
    if (member.state != MemberState::kJoining && member.state != MemberState::kAlive) continue;
    StatusOr<MetricsUrlParts> split = SplitMetricsUrl(member.metrics_address, member.host);
    if (!split.ok()) {
      if (skipped != nullptr) skipped->push_back(member.Name() + ": " + split.status().message());
      continue;
    }
    ScrapeTarget target;
    target.address = split->address;
    target.metrics_path = split->path;
    target.scheme = split->scheme;
    target.role = std::string(RoleName(member.role));
    target.rank = member.rank;
    target.job = view.job;
    targets.push_back(std::move(target));
  }
  return targets;
}

std::string TargetGroupsJson(const std::vector<ScrapeTarget>& targets) {
  nlohmann::json groups = nlohmann::json::array();
  for (const ScrapeTarget& target : targets) {
    nlohmann::json labels = {{"__metrics_path__", target.metrics_path},
                             {"role", target.role},
                             {"rank", std::to_string(target.rank)},
                             {"tessera_job", target.job}};
    // Prometheus' own label for the scheme; absent means http.
    if (target.scheme != "http") labels["__scheme__"] = target.scheme;
    groups.push_back({{"targets", {target.address}}, {"labels", labels}});
  }
  return groups.dump() + "\n";
}

StatusOr<std::unique_ptr<ServiceDiscovery>> ServiceDiscovery::Create(
    const ServiceDiscoveryOptions& options) {
  ServiceDiscoveryOptions resolved = options;
  if (resolved.coordinator_host.empty()) resolved.coordinator_host = LocalHostName();
  ASSIGN_OR_RETURN(auto split,
                   SplitMetricsUrl(resolved.coordinator_metrics_url, resolved.coordinator_host));
  ScrapeTarget coordinator;
  coordinator.address = split.address;
  coordinator.metrics_path = split.path;
  coordinator.scheme = split.scheme;
  coordinator.role = std::string(RoleName(Role::kCoordinator));
  coordinator.rank = 0;
  coordinator.job = resolved.job;
  std::unique_ptr<ServiceDiscovery> discovery(new ServiceDiscovery(resolved, coordinator));
  discovery->json_ = TargetGroupsJson({coordinator});
  return discovery;
}

Status ServiceDiscovery::Update(const FleetView& view) {
  std::vector<std::string> skipped;
  std::string json = TargetGroupsJson(ScrapeTargets(view, coordinator_, &skipped));
  std::string warning;
  for (const std::string& reason : skipped) warning += (warning.empty() ? "" : "; ") + reason;

  std::lock_guard<std::mutex> lock(mu_);
  json_ = json;
  if (warning != skipped_) {
    skipped_ = warning;
    if (!warning.empty()) {
      TLOG(WARNING) << "service discovery leaves out processes without a usable metrics URL: "
                    << warning;
    }
  }
  if (options_.file_sd_path.empty() || json == written_json_) return OkStatus();
  // Written under the lock, so two updates cannot leave the older list in the file.
  Status written = WriteFileAtomically(options_.file_sd_path, json.data(), json.size());
  if (!written.ok()) {
    return Status(written.code(), "file_sd targets file: " + std::string(written.message()));
  }
  written_json_ = json;
  return OkStatus();
}

std::string ServiceDiscovery::Json() const {
  std::lock_guard<std::mutex> lock(mu_);
  return json_;
}

HttpResponse ServiceDiscovery::Serve(const HttpRequest& request) const {
  HttpResponse response;
  if (request.method != "GET") {
    response.status = 405;
    response.body = "service discovery answers GET only\n";
    return response;
  }
  response.content_type = "application/json";
  response.body = Json();
  return response;
}

}  // namespace tessera::coordinator
