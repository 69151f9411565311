#include "common/metrics/tls_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/base/deadline.h"
#include "common/base/logging.h"

namespace tessera {

struct TlsRelay::Connection {
  int client_fd = -1;
  int backend_fd = -1;  // -1 until connected; guarded by TlsRelay::mu_ for shutdown()
  std::atomic<bool> done{false};
  std::thread thread;
};

namespace {

// OpenSSL's queued errors as one line, e.g. "error:0A000086:SSL routines::certificate verify
// failed"; empties the queue.
std::string OpenSslErrors() {
  std::string text;
  for (unsigned long code; (code = ERR_get_error()) != 0;) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    text += (text.empty() ? "" : "; ") + std::string(buffer);
  }
  return text.empty() ? "no reason given" : text;
}

void SetTimeouts(int fd, int timeout_ms) {
  timeval timeout = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
}

bool SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

int ConnectBackend(int port, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  SetTimeouts(fd, timeout_ms);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TlsRelay::TlsRelay(const TlsRelayOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<TlsRelay>> TlsRelay::Start(const TlsRelayOptions& options) {
  if (options.backend_port <= 0 || options.backend_port > 65535) {
    return InvalidArgumentError("tls relay: backend port " + std::to_string(options.backend_port) +
                                " is not in [1, 65535]");
  }
  if (options.max_connections < 1 || options.idle_timeout_ms < 1) {
    return InvalidArgumentError("tls relay: max_connections and idle_timeout_ms must be >= 1");
  }
  std::unique_ptr<TlsRelay> relay(new TlsRelay(options));

  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return InternalError("tls relay: SSL_CTX_new: " + OpenSslErrors());
  relay->ssl_ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
    return InvalidArgumentError("TLS certificate " + options.cert_file +
                                " does not load: " + OpenSslErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return InvalidArgumentError("TLS key " + options.key_file + " does not load: " +
                                OpenSslErrors());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgumentError("TLS key " + options.key_file + " is not the key of certificate " +
                                options.cert_file + ": " + OpenSslErrors());
  }

  // The listener.
  sockaddr_storage address = {};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  const std::string listening = (options.listen_host.find(':') == std::string::npos
                                     ? options.listen_host
                                     : "[" + options.listen_host + "]") +
                                ":" + std::to_string(options.port);
  if (inet_pton(AF_INET, options.listen_host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(options.port));
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, options.listen_host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(options.port));
    length = sizeof(*v6);
  } else {
    return InvalidArgumentError("tls relay: cannot listen on " + listening +
                                ": not a numeric IP address");
  }
  relay->listen_fd_ = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (relay->listen_fd_ < 0) {
    return UnavailableError("tls relay: socket: " + std::string(std::strerror(errno)));
  }
  int one = 1;
  setsockopt(relay->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(relay->listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(relay->listen_fd_, 128) != 0) {
    return UnavailableError("tls relay: cannot listen on " + listening + ": " +
                            std::strerror(errno));
  }
  sockaddr_storage bound = {};
  socklen_t bound_length = sizeof(bound);
  getsockname(relay->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  relay->port_ = ntohs(bound.ss_family == AF_INET6
                           ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(relay->wake_pipe_, O_CLOEXEC) != 0) {
    return InternalError("tls relay: pipe: " + std::string(std::strerror(errno)));
  }
  TlsRelay* raw = relay.get();
  relay->accept_thread_ = std::thread([raw] { raw->AcceptLoop(); });
  return relay;
}

TlsRelay::~TlsRelay() {
  stopping_.store(true);
  if (wake_pipe_[1] >= 0) {
    char byte = 0;
    (void)!write(wake_pipe_[1], &byte, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    // Wake every connection out of its poll, read or write.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& connection : connections_) {
      shutdown(connection->client_fd, SHUT_RDWR);
      if (connection->backend_fd >= 0) shutdown(connection->backend_fd, SHUT_RDWR);
    }
  }
  for (const auto& connection : connections_) connection->thread.join();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
  if (ssl_ctx_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(ssl_ctx_));
}

void TlsRelay::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      TLOG(WARNING) << "tls relay: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the peer went away, or out of descriptors: try the next one

    std::lock_guard<std::mutex> lock(mu_);
    // Reap the connections that have ended.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      close(fd);  // a scraper retries; holding it open would only queue it behind the others
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->client_fd = fd;
    Connection* raw = connection.get();
    connections_.push_back(std::move(connection));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void TlsRelay::Serve(Connection* connection) {
  // OpenSSL writes with write(2), which raises SIGPIPE on a connection the client closed:
  // blocked in this thread, the write fails with EPIPE instead of ending the process.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  const int client = connection->client_fd;
  SetTimeouts(client, options_.idle_timeout_ms);  // bounds the handshake and every read/write
  int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(ssl_ctx_));
  int backend = -1;
  char buffer[16384];
  std::string head;  // the request's header block, or its first sizeof(buffer) bytes
  if (ssl != nullptr && SSL_set_fd(ssl, client) == 1 && SSL_accept(ssl) == 1) {
    // The backend is connected once the whole header block is here, and given it at once:
    // a slow client holds this thread, not one of the backend's (which times out a request
    // slower than its request timeout; under load, connecting at the handshake lost answers).
    const Deadline whole = Deadline::AfterMillis(options_.idle_timeout_ms);
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < sizeof(buffer) &&
           !whole.Expired()) {
      const int n = SSL_read(ssl, buffer, sizeof(buffer));
      if (n <= 0) break;
      head.append(buffer, static_cast<size_t>(n));
    }
    if (!head.empty() && !stopping_.load()) {
      backend = ConnectBackend(options_.backend_port, options_.idle_timeout_ms);
    }
  }
  if (backend >= 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      connection->backend_fd = backend;
    }
    if (stopping_.load()) shutdown(backend, SHUT_RDWR);
    bool open = SendAll(backend, head.data(), head.size());
    while (open) {
      // Bytes OpenSSL already decrypted do not show in poll.
      if (SSL_pending(ssl) == 0) {
        pollfd fds[2] = {{client, POLLIN, 0}, {backend, POLLIN, 0}};
        int ready = poll(fds, 2, options_.idle_timeout_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) break;  // idle for too long, or an error
        if (fds[1].revents != 0) {
          ssize_t n = recv(backend, buffer, sizeof(buffer), 0);
          if (n <= 0) break;  // the backend answered and closed (Connection: close)
          if (SSL_write(ssl, buffer, static_cast<int>(n)) <= 0) break;
          continue;
        }
        if (fds[0].revents == 0) continue;
      }
      int n = SSL_read(ssl, buffer, sizeof(buffer));
      if (n <= 0) {
        // The client closed its side: let the backend finish the answer it may be writing.
        shutdown(backend, SHUT_WR);
        while (true) {
          ssize_t m = recv(backend, buffer, sizeof(buffer), 0);
          if (m <= 0 || SSL_write(ssl, buffer, static_cast<int>(m)) <= 0) break;
        }
        open = false;
        break;
      }
      if (!SendAll(backend, buffer, static_cast<size_t>(n))) break;
    }
    SSL_shutdown(ssl);
  }
  ERR_clear_error();  // a failed handshake (a scanner, plain HTTP) is the client's business
  if (ssl != nullptr) SSL_free(ssl);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (backend >= 0) close(backend);
    connection->backend_fd = -1;
    close(client);
    connection->client_fd = -1;
  }
  connection->done.store(true);
}

}  // namespace tessera
