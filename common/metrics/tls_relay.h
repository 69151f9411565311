// TlsRelay: HTTPS in front of a plain HTTP server on the loopback. It accepts TLS connections
// on listen_host:port, completes the handshake with OpenSSL, and relays each connection's
// plaintext to and from 127.0.0.1:backend_port.
//
// Why not civetweb's own TLS: Debian 12's libcivetweb (1.15) is built for the OpenSSL 1.1 API
// and dlopens libssl.so at run time. On every TLS connection it calls SSL_get_peer_certificate,
// which OpenSSL 3 (Debian 12's only libssl) no longer exports (it became a macro for
// SSL_get1_peer_certificate), so civetweb calls a null pointer and the process crashes
// (civetweb issue #1334). This adapter is the only code that names OpenSSL.
//
// The backend keeps listening on the loopback without TLS; anything it enforces (basic auth)
// applies to relayed and local requests alike.
//
// Limits: at most `max_connections` connections at once (more are closed at accept); a
// handshake, a silence, or a request header block slower than `idle_timeout_ms` ends a
// connection. The backend is connected only once a request's header block is here, and given
// it at once (behind the relay its request timeout is 1 s: metrics_http.cc).
//
// Lifetime: the destructor closes the listener and every connection and joins their threads.
// Thread-safety: port() is constant after Start.
#ifndef TESSERA_COMMON_METRICS_TLS_RELAY_H_
#define TESSERA_COMMON_METRICS_TLS_RELAY_H_

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/status.h"

namespace tessera {

struct TlsRelayOptions {
  std::string listen_host = "127.0.0.1";  // a numeric IPv4 or IPv6 address, unbracketed
  int port = 0;                           // 0: the OS picks
  std::string cert_file;                  // PEM: the certificate, then any intermediates
  std::string key_file;                   // PEM: its private key, unencrypted
  int backend_port = 0;                   // the plain HTTP server on 127.0.0.1
  int max_connections = 64;
  int idle_timeout_ms = 10000;
};

class TlsRelay {
 public:
  // InvalidArgument naming the file and OpenSSL's reason for a certificate or key that does
  // not load or match; Unavailable naming host:port when it cannot listen.
  static StatusOr<std::unique_ptr<TlsRelay>> Start(const TlsRelayOptions& options);
  ~TlsRelay();
  TlsRelay(const TlsRelay&) = delete;
  TlsRelay& operator=(const TlsRelay&) = delete;

  int port() const { return port_; }

 private:
  struct Connection;
  explicit TlsRelay(const TlsRelayOptions& options);
  void AcceptLoop();
  void Serve(Connection* connection);

  const TlsRelayOptions options_;
  void* ssl_ctx_ = nullptr;  // SSL_CTX*, kept out of this header
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // written once by the destructor to end AcceptLoop
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;

  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_TLS_RELAY_H_
