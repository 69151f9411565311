#include "common/process/metrics_http_settings.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <utility>

#include "common/base/host_port.h"
#include "common/base/logging.h"

namespace tessera {

MetricsHttpSettings MetricsHttpSettings::FromConfig(const ProcessConfig& config) {
  MetricsHttpSettings settings;
  settings.port = config.metrics_port;
  settings.bind_host = config.metrics_bind_host;
  settings.tls_cert_file = config.metrics_tls_cert;
  settings.tls_key_file = config.metrics_tls_key;
  settings.auth_file = config.metrics_auth_file;
  return settings;
}

MetricsHttpSettings MetricsHttpSettings::FromEnvironment(int port, const Environment& env) {
  MetricsHttpSettings settings;
  settings.from_environment = true;
  settings.port = port;
  auto value = [&env](const char* name, std::string* field) {
    if (auto it = env.find(name); it != env.end() && !it->second.empty()) *field = it->second;
  };
  value("TESSERA_METRICS_BIND_HOST", &settings.bind_host);
  value("TESSERA_METRICS_TLS_CERT", &settings.tls_cert_file);
  value("TESSERA_METRICS_TLS_KEY", &settings.tls_key_file);
  value("TESSERA_METRICS_AUTH_FILE", &settings.auth_file);
  return settings;
}

std::string MetricsHttpSettings::Name(std::string_view flag_suffix) const {
  if (!from_environment) return "--metrics-" + std::string(flag_suffix);
  std::string name = "TESSERA_METRICS_" + std::string(flag_suffix);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
    return c == '-' ? '_' : static_cast<char>(std::toupper(c));
  });
  return name;
}

StatusOr<MetricsHttpOptions> ResolveMetricsHttpOptions(const MetricsHttpSettings& settings,
                                                       const BindAddress& transport,
                                                       std::string_view coordinator_host) {
  const std::string bind_name = settings.Name("bind-host");
  MetricsHttpOptions options;
  options.port = settings.port;
  if (settings.bind_host == "loopback") {
    options.bind_host = "127.0.0.1";
    if (!IsLoopbackHost(transport.listen)) {
      // Said once, where a user looking for the scrape target will look.
      TLOG(INFO) << bind_name << " loopback: HTTP stays on 127.0.0.1 while the transport "
                 << "listens on " << transport.listen
                 << "; a Prometheus on another host cannot scrape it (set " << bind_name
                 << " to auto, and see docs/security-http.md)";
    }
  } else if (settings.bind_host == "auto") {
    options.bind_host = transport.listen;
    options.advertise_host = transport.advertise;
  } else {
    StatusOr<BindAddress> own = ResolveBindAddress(settings.bind_host, coordinator_host);
    if (!own.ok()) return own.status().WithContext(bind_name);
    options.bind_host = own->listen;
    options.advertise_host = own->advertise;
  }
  options.tls_cert_file = settings.tls_cert_file;
  options.tls_key_file = settings.tls_key_file;
  if (!settings.auth_file.empty()) {
    StatusOr<HttpBasicAuth> auth = HttpBasicAuth::ReadFile(settings.auth_file);
    if (!auth.ok()) return auth.status().WithContext(settings.Name("auth-file"));
    options.basic_auth = std::make_shared<const HttpBasicAuth>(std::move(auth).value());
  }
  if (!IsLoopbackHost(options.bind_host)) {
    TLOG(INFO) << bind_name << " " << settings.bind_host << ": HTTP listens on "
               << options.bind_host << ", from the network, "
               << (options.tls_cert_file.empty() ? "without TLS" : "over TLS") << ", "
               << (options.basic_auth ? "with basic auth" : "without authentication");
  }
  options.warn_when_exposed = false;  // said above; MetricsHttpServer still warns about basic
                                      // auth in the clear
  return options;
}

}  // namespace tessera
