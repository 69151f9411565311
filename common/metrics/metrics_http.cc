#include "common/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/metrics/tls_relay.h"

namespace tessera {
namespace {

constexpr char kMetricsPath[] = "/metrics";
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// How long a worker thread waits for a connection's request to arrive whole. civetweb gives
// each connection a thread while it reads the request, so connections that never finish one
// (a slow or stuck client, a slowloris) hold threads: with 64 threads and 100 ms, 200 such
// connections delay a scrape by ~0.3 s (at the old 10 s and 2 threads, by 17 min). Scrapers
// and browsers send the request with the connection; sending the answer is not bounded by it.
constexpr char kRequestTimeoutMs[] = "100";
// The same behind the TLS relay (tls_relay.h), which connects only once it holds a request's
// header block and sends it at once: slow clients hold the relay's threads, not these. Its
// connection and its send are two steps of a thread that a loaded machine (training on every
// core) may not run for longer than 100 ms between them, which lost scrapes under load: on
// that port the timeout only bounds local processes that connect to it directly.
constexpr char kRelayedRequestTimeoutMs[] = "1000";

HttpResponse PlainResponse(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

// How often the stopping server's accept loop is woken until it has seen the stop flag.
constexpr auto kStopWakeInterval = std::chrono::milliseconds(5);

// Opens and at once closes a TCP connection to host:port (a numeric IPv4 or IPv6 address;
// the unspecified address means this host). Errors are ignored: the listener may be gone.
void TouchPort(const std::string& host, int port) {
  sockaddr_storage address = {};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  std::string bare = host.size() > 1 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  if (inet_pton(AF_INET, bare == "0.0.0.0" ? "127.0.0.1" : bare.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, bare == "::" ? "::1" : bare.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v6);
  } else {
    return;
  }
  int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<sockaddr*>(&address), length);
  close(fd);
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::string advertise_host,
                                     std::shared_ptr<const HttpBasicAuth> basic_auth)
    : advertise_host_(std::move(advertise_host)), basic_auth_(std::move(basic_auth)) {}

MetricsHttpServer::~MetricsHttpServer() {
  relay_.reset();  // no relayed request reaches civetweb after this
  if (context_ == nullptr) return;
  // mg_stop sets civetweb's stop flag and joins its threads, but the accept loop looks at the
  // flag only when poll() on the listening socket returns, which it does every 2 s (a constant
  // of the library as Debian builds it). A connection to our own port ends that poll: knock
  // until mg_stop has returned. A knock that lands before the flag is set is an ordinary
  // connection that closes without a request, which a worker thread drops at once.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      TouchPort(civetweb_host_, civetweb_port_);
      std::this_thread::sleep_for(kStopWakeInterval);
    }
  });
  mg_stop(context_);  // joins civetweb's threads
  stopped.store(true);
  waker.join();
}

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, const MetricsRegistry* registry) {
  if (registry == nullptr) return InvalidArgumentError("metrics http: registry is null");
  if (options.bind_host.empty()) return InvalidArgumentError("metrics http: bind_host is empty");
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("metrics http: port " + std::to_string(options.port) +
                                " is not in [0, 65535]");
  }
  if (options.num_threads < 1) {
    return InvalidArgumentError("metrics http: num_threads " + std::to_string(options.num_threads) +
                                " is not >= 1");
  }
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && (options.tls_cert_file.empty() || options.tls_key_file.empty())) {
    return InvalidArgumentError(
        "metrics http: TLS needs both a certificate file and a key file, got only the " +
        std::string(options.tls_cert_file.empty() ? "key" : "certificate"));
  }
  // civetweb takes numeric addresses only, IPv6 ones in brackets.
  std::string host = options.bind_host == "localhost" ? "127.0.0.1" : options.bind_host;
  auto bracketed = [](const std::string& h) {
    return h.find(':') == std::string::npos ? h : "[" + h + "]";
  };
  std::string address = bracketed(host);
  std::string listening = address + ":" + std::to_string(options.port);
  const bool exposed = !IsLoopbackHost(options.bind_host);
  if (options.warn_when_exposed && exposed) {
    TLOG(WARNING) << "metrics http: binding to " << listening
                  << ", which is reachable from the network ("
                  << (options.basic_auth ? "basic auth" : "no authentication") << ", "
                  << (tls ? "TLS" : "no TLS") << ")";
  }
  if (exposed && options.basic_auth && !tls) {
    TLOG(WARNING) << "metrics http: basic auth without TLS on " << listening
                  << ": passwords cross the network in the clear (base64 is no encryption); "
                     "give --metrics-tls-cert and --metrics-tls-key";
  }

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(
      bracketed(options.advertise_host.empty() ? host : options.advertise_host),
      options.basic_auth));
  if (tls) {
    // civetweb's own TLS crashes with OpenSSL 3 (see tls_relay.h): civetweb serves plain HTTP
    // on a loopback port of its own and the relay terminates TLS on the requested address.
    server->scheme_ = "https";
    server->civetweb_host_ = "127.0.0.1";
    server->civetweb_port_ = 0;
  } else {
    server->civetweb_host_ = host;
    server->civetweb_port_ = options.port;
  }
  std::string civetweb_listening =
      bracketed(server->civetweb_host_) + ":" + std::to_string(server->civetweb_port_);
  server->handlers_[kMetricsPath] =
      std::make_shared<const HttpHandler>([registry](const HttpRequest&) {
        HttpResponse response = PlainResponse(200, registry->RenderText());
        response.content_type = kMetricsContentType;
        return response;
      });

  // civetweb's library state is per process and its init is not thread-safe.
  static std::once_flag init_library;
  std::call_once(init_library, [] { mg_init_library(0); });

  std::string num_threads = std::to_string(options.num_threads);
  const char* config[] = {
      "listening_ports",    civetweb_listening.c_str(), "num_threads", num_threads.c_str(),
      "request_timeout_ms", tls ? kRelayedRequestTimeoutMs : kRequestTimeoutMs, nullptr};
  mg_callbacks callbacks = {};
  callbacks.begin_request = &MetricsHttpServer::HandleRequest;
  callbacks.log_message = &MetricsHttpServer::LogMessage;
  mg_init_data init = {&callbacks, server.get(), config};
  unsigned error_code = 0;
  char error_text[256] = "";
  mg_error_data error = {&error_code, error_text, sizeof(error_text)};
  server->context_ = mg_start2(&init, &error);

  std::string start_log;
  {
    std::lock_guard<std::mutex> lock(server->mu_);
    server->starting_ = false;
    start_log = std::move(server->start_log_);
  }
  // civetweb's error text is generic ("Failed to setup server ports"); the reason (e.g.
  // "cannot bind to 127.0.0.1:9100: 98 (Address already in use)") went to its log.
  std::string reason = start_log.empty() ? error_text : start_log;
  if (server->context_ == nullptr) {
    return UnavailableError("metrics http: cannot listen on " + civetweb_listening + ": " +
                            reason);
  }
  mg_server_port ports[4];
  if (mg_get_server_ports(server->context_, 4, ports) < 1) {
    return InternalError("metrics http: started on " + civetweb_listening +
                         " but has no listening port");
  }
  server->civetweb_port_ = ports[0].port;
  server->port_ = ports[0].port;
  if (tls) {
    TlsRelayOptions relay;
    relay.listen_host = host;
    relay.port = options.port;
    relay.cert_file = options.tls_cert_file;
    relay.key_file = options.tls_key_file;
    relay.backend_port = server->civetweb_port_;
    relay.max_connections = options.num_threads;
    StatusOr<std::unique_ptr<TlsRelay>> started = TlsRelay::Start(relay);
    if (!started.ok()) return started.status().WithContext("metrics http");
    server->relay_ = std::move(started).value();
    server->port_ = server->relay_->port();
  }
  if (!start_log.empty()) TLOG(WARNING) << "civetweb: " << start_log;
  // The URL reaches the user in TESSERA_READY (and the launcher's line about the process).
  TLOG(DEBUG) << "metrics http: serving " << server->url();
  return server;
}

Status MetricsHttpServer::AddHandler(const std::string& path, HttpHandler handler) {
  if (path.empty() || path[0] != '/') {
    return InvalidArgumentError("metrics http: handler path '" + path + "' must start with /");
  }
  std::lock_guard<std::mutex> lock(mu_);
  bool added =
      handlers_.emplace(path, std::make_shared<const HttpHandler>(std::move(handler))).second;
  if (!added) return AlreadyExistsError("metrics http: a handler for " + path + " exists");
  return OkStatus();
}

std::string MetricsHttpServer::url() const {
  return scheme_ + "://" + advertise_host_ + ":" + std::to_string(port_) + kMetricsPath;
}

int MetricsHttpServer::HandleRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  auto* server = static_cast<MetricsHttpServer*>(info->user_data);
  HttpRequest request;
  request.method = info->request_method != nullptr ? info->request_method : "";
  request.path = info->local_uri != nullptr ? info->local_uri : "";
  request.query = info->query_string != nullptr ? info->query_string : "";

  HttpResponse response;
  bool head_only = request.method == "HEAD";
  if (server->basic_auth_ != nullptr) {
    const char* authorization = mg_get_header(conn, "Authorization");
    if (!server->basic_auth_->Matches(authorization != nullptr ? authorization : "")) {
      response = PlainResponse(401, "authentication required\n");
    }
  }
  if (response.status == 200 && request.method != "GET" && !head_only) {
    // No page changes state: only GET and HEAD reach a handler.
    response = PlainResponse(405, request.method + " is not allowed: use GET\n");
  }
  if (response.status == 200) {
    request.method = "GET";  // a HEAD is a GET without the body
    std::shared_ptr<const HttpHandler> handler;
    {
      std::lock_guard<std::mutex> lock(server->mu_);
      auto it = server->handlers_.find(request.path);
      if (it != server->handlers_.end()) handler = it->second;
    }
    response = handler != nullptr ? (*handler)(request)
                                  : PlainResponse(404, "not found: " + request.path + "\n");
  }

  // Formatted here rather than with mg_printf, whose 8 KiB stack buffer overflows civetweb's
  // fixed 100 KiB thread stacks in processes that link libraries with large static TLS
  // (OpenBLAS reserves 60 KiB of every thread's stack for it).
  std::string head = "HTTP/1.1 " + std::to_string(response.status) + " " +
                     mg_get_response_code_text(conn, response.status) +
                     "\r\nContent-Type: " + response.content_type +
                     "\r\nContent-Length: " + std::to_string(response.body.size()) + "\r\n" +
                     (response.status == 405 ? "Allow: GET, HEAD\r\n" : "") +
                     (response.status == 401 ? "WWW-Authenticate: Basic realm=\"tessera\"\r\n"
                                             : "") +
                     "Cache-Control: no-store\r\nConnection: close\r\n\r\n";
  mg_write(conn, head.data(), head.size());
  if (!head_only) mg_write(conn, response.body.data(), response.body.size());
  return response.status;  // 1..999: civetweb sends nothing more
}

int MetricsHttpServer::LogMessage(const mg_connection* conn, const char* message) {
  auto* server = conn != nullptr
                     ? static_cast<MetricsHttpServer*>(mg_get_user_data(mg_get_context(conn)))
                     : nullptr;
  if (server != nullptr) {
    std::lock_guard<std::mutex> lock(server->mu_);
    if (server->starting_) {  // Start() puts these into its error
      server->start_log_ += (server->start_log_.empty() ? "" : "; ") + std::string(message);
      return 1;
    }
  }
  TLOG(WARNING) << "civetweb: " << message;
  return 1;  // civetweb prints nothing itself
}

}  // namespace tessera
