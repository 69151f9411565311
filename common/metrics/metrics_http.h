// A small HTTP server (civetweb) that serves the registry at GET /metrics, plus whatever other
// pages are added with AddHandler (service discovery JSON, the dashboard).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsHttpServer> http,
//                    MetricsHttpServer::Start(MetricsHttpOptions{}, &registry));
//   TLOG(INFO) << "metrics at " << http->url();
//
// /metrics answers GET with the text exposition format 0.0.4. Every page answers GET and HEAD
// only: any other method gets 405 (Allow: GET, HEAD) before a handler runs, so no page can
// change state. Unknown paths get 404. With `basic_auth`, every request without one of its
// users' credentials gets 401 (WWW-Authenticate: Basic realm="tessera") before anything else.
// Binding to anything but loopback logs a warning, since the port is then reachable from the
// network; so does basic auth without TLS off the loopback (the password crosses in the clear).
//
// Lifetime: the registry, and anything the handlers capture, must outlive the server; the
// destructor stops the server and waits for requests in flight (milliseconds: it wakes
// civetweb's accept loop instead of waiting out its 2 s poll).
// Thread-safety: requests run on civetweb's worker threads, so handlers must be thread-safe;
// AddHandler may be called from any thread, also while serving.
#ifndef TESSERA_COMMON_METRICS_METRICS_HTTP_H_
#define TESSERA_COMMON_METRICS_METRICS_HTTP_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/base/status.h"
#include "common/metrics/http_basic_auth.h"
#include "common/metrics/metrics.h"

struct mg_connection;
struct mg_context;

namespace tessera {

class TlsRelay;

struct MetricsHttpOptions {
  std::string bind_host = "127.0.0.1";  // an IPv4 address or "localhost"
  // The host url() names; empty: bind_host. Set it when bind_host is 0.0.0.0.
  std::string advertise_host;
  // Log a warning when bind_host is reachable from the network.
  bool warn_when_exposed = true;
  int port = 0;                         // 0: the OS picks a free port; see port()
  // civetweb worker threads, >= 1. Idle ones cost a stack; each connection reading a request
  // holds one (see kRequestTimeoutMs in metrics_http.cc).
  int num_threads = 64;
  // HTTP basic auth (--metrics-auth-file): null serves everyone who reaches the port.
  std::shared_ptr<const HttpBasicAuth> basic_auth;
  // HTTPS (--metrics-tls-cert, --metrics-tls-key): PEM files of the certificate (chain) and its
  // private key; both or neither. url() then starts with https://.
  std::string tls_cert_file;
  std::string tls_key_file;
};

struct HttpRequest {
  std::string method;  // "GET" (a HEAD is served as a GET whose body is not sent)
  std::string path;    // "/sd", URL-decoded, without the query string
  std::string query;   // after '?', not decoded; empty if none
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Sees GET only (the server answers every other method itself, see above).
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class MetricsHttpServer {
 public:
  // Listens on options.bind_host:options.port and serves `registry` at /metrics.
  // InvalidArgument for bad options; Unavailable naming host:port and civetweb's reason when
  // it cannot listen (port in use, address not local).
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const MetricsHttpOptions& options,
                                                            const MetricsRegistry* registry);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Serves `path` (exact match, starting with '/') with `handler`. AlreadyExists if the path
  // is taken (including /metrics).
  Status AddHandler(const std::string& path, HttpHandler handler);

  int port() const { return port_; }
  // "http://127.0.0.1:PORT/metrics" ("https://..." with TLS).
  std::string url() const;

 private:
  MetricsHttpServer(std::string advertise_host, std::shared_ptr<const HttpBasicAuth> basic_auth);
  static int HandleRequest(mg_connection* conn);
  static int LogMessage(const mg_connection* conn, const char* message);

  const std::string advertise_host_;  // bracketed when IPv6
  const std::shared_ptr<const HttpBasicAuth> basic_auth_;  // null: none
  std::string scheme_ = "http";
  // Where civetweb listens: the options' host and port, or with TLS the loopback behind relay_.
  std::string civetweb_host_;
  int civetweb_port_ = 0;
  mg_context* context_ = nullptr;
  std::unique_ptr<TlsRelay> relay_;  // TLS only; destroyed before civetweb stops
  int port_ = 0;                     // the port clients connect to

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const HttpHandler>> handlers_;  // guarded by mu_
  bool starting_ = true;   // guarded by mu_; civetweb's messages go to start_log_ until false
  std::string start_log_;  // guarded by mu_
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_METRICS_HTTP_H_
