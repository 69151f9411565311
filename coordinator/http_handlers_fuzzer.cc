// Fuzz target (issue 15): the coordinator's HTTP handlers as civetweb hands them a request
// (HttpRequest: method, path, query), which anyone who reaches the port can send: /sd
// (ServiceDiscovery::Serve) and /dashboard, /dashboard/data (Dashboard::ServePage, ServeData,
// whose since= is read from the query). Input: the method, a newline, the path, a newline,
// the query. Seeds: http_handlers_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "coordinator/dashboard.h"
#include "coordinator/service_discovery.h"

namespace {

tessera::FleetView View() {
  tessera::FleetView view;
  view.job = "fuzz";
  view.num_workers = 1;
  tessera::MemberInfo worker;
  worker.role = tessera::Role::kWorker;
  worker.rank = 0;
  worker.address = "tcp://127.0.0.1:5555";
  worker.metrics_address = "http://127.0.0.1:5556/metrics";
  view.members.push_back(worker);
  return view;
}

struct Handlers {
  std::unique_ptr<tessera::coordinator::Dashboard> dashboard;
  std::unique_ptr<tessera::coordinator::ServiceDiscovery> discovery;
  Handlers() {
    tessera::coordinator::DashboardOptions dashboard_options;
    dashboard_options.coordinator_address = "tcp://127.0.0.1:5550";
    dashboard_options.coordinator_metrics_url = "http://127.0.0.1:5551/metrics";
    dashboard = std::move(tessera::coordinator::Dashboard::Create(dashboard_options)).value();
    dashboard->UpdateFleet(View());  // not started: nothing is scraped
    tessera::coordinator::ServiceDiscoveryOptions discovery_options;
    discovery_options.coordinator_metrics_url = "http://127.0.0.1:5551/metrics";
    discovery =
        std::move(tessera::coordinator::ServiceDiscovery::Create(discovery_options)).value();
    if (!discovery->Update(View()).ok()) __builtin_trap();
  }
};

void Check(const tessera::HttpResponse& response) {
  if (response.status < 200 || response.status > 599 || response.content_type.empty()) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Handlers* handlers = new Handlers();
  const std::string text(reinterpret_cast<const char*>(data), size);
  tessera::HttpRequest request;
  const size_t first = text.find('\n');
  request.method = text.substr(0, first);
  if (first != std::string::npos) {
    const size_t second = text.find('\n', first + 1);
    request.path = text.substr(first + 1, second == std::string::npos ? std::string::npos
                                                                       : second - first - 1);
    if (second != std::string::npos) request.query = text.substr(second + 1);
  }
  Check(handlers->discovery->Serve(request));
  Check(handlers->dashboard->ServePage(request));
  Check(handlers->dashboard->ServeData(request));
  return 0;
}
