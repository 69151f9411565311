// MetricsHttpSettings: how a process asked for its HTTP pages (/metrics, /sd, /dashboard) to be
// served, whether by flags (tessera-coordinator, -server, -worker: --metrics-port,
// --metrics-bind-host, --metrics-tls-cert/-key, --metrics-auth-file) or by the environment (the
// torch backend: TESSERA_METRICS_PORT, _BIND_HOST, _TLS_CERT, _TLS_KEY, _AUTH_FILE), and what
// they resolve to:
//
//   MetricsHttpSettings settings = MetricsHttpSettings::FromEnvironment(port, env);
//   ASSIGN_OR_RETURN(MetricsHttpOptions options,
//                    ResolveMetricsHttpOptions(settings, transport_address, coordinator_host));
//
// Thread-safety: plain values and a function of them (which reads the auth file and logs).
#ifndef TESSERA_COMMON_PROCESS_METRICS_HTTP_SETTINGS_H_
#define TESSERA_COMMON_PROCESS_METRICS_HTTP_SETTINGS_H_

#include <string>
#include <string_view>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/metrics/metrics_http.h"
#include "common/transport/bind_address.h"

namespace tessera {

struct MetricsHttpSettings {
  int port = 0;                          // 0: the OS picks one
  std::string bind_host = "loopback";    // loopback, auto (the transport's), or as --bind-host
  std::string tls_cert_file;             // empty: plain HTTP
  std::string tls_key_file;
  std::string auth_file;                 // empty: no basic auth
  // Messages name the setting as the user gave it: a flag ("--metrics-auth-file") or an
  // environment variable ("TESSERA_METRICS_AUTH_FILE").
  bool from_environment = false;

  static MetricsHttpSettings FromConfig(const ProcessConfig& config);
  // TESSERA_METRICS_BIND_HOST, _TLS_CERT, _TLS_KEY and _AUTH_FILE of `env` (unset: defaults).
  static MetricsHttpSettings FromEnvironment(int port, const Environment& env);

  // "--metrics-" + `flag_suffix`, or "TESSERA_METRICS_" + the suffix upper-cased, '-' as '_'.
  std::string Name(std::string_view flag_suffix) const;
};

// Where and how HTTP is served: bind host "loopback" is 127.0.0.1; "auto" is `transport` (what
// the transport's --bind-host resolved to); anything else resolves like --bind-host. Reads the
// auth file (errors name the setting and the file). Logs how HTTP is exposed when it is off the
// loopback, and that it stays on the loopback while the transport is not.
StatusOr<MetricsHttpOptions> ResolveMetricsHttpOptions(const MetricsHttpSettings& settings,
                                                       const BindAddress& transport,
                                                       std::string_view coordinator_host);

}  // namespace tessera

#endif  // TESSERA_COMMON_PROCESS_METRICS_HTTP_SETTINGS_H_
