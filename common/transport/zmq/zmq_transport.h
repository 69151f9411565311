// ZmqTransport: the production Transport, over ZeroMQ (cppzmq) on TCP.
//
// One I/O thread owns every socket (ZeroMQ sockets are single-threaded): a ROUTER bound to
// `tcp://bind_host:port` for inbound requests (with ZMQ_ROUTER_MANDATORY, so a reply to a
// vanished peer is an error rather than a silent drop), and one DEALER per remote address for
// outbound traffic and its replies. Send()/Reply() from any thread append to a bounded command
// queue and wake the I/O thread through an eventfd it polls beside the sockets.
//
// Payload frames travel without copies: an outbound frame hands its Payload's owner to ZeroMQ,
// which releases it once sent; an inbound frame stays in its zmq message, which becomes the
// Payload's owner. A payload without an owner (Payload::Borrow with a null owner) is copied
// into its frame when the I/O thread sends it, because nothing else would keep its bytes
// alive until ZeroMQ is done with them.
//
// Oversized traffic: messages whose total exceeds max_message_bytes are answered with an
// ErrorReply; a single frame larger than max_message_bytes + 1 MiB makes ZeroMQ drop the
// connection before reading it (ZMQ_MAXMSGSIZE), which protects memory.
//
// Authentication (options.credentials, common/security/credentials.h): with a job key, a peer
// must prove it holds the key before its connection carries a single message. The I/O thread
// also serves the ZAP handler (inproc://zeromq.zap.01 of the transport's own context, bound
// before the ROUTER so no connection is ever admitted unchecked) and watches the sockets'
// handshake events:
//   - not encrypted: the PLAIN mechanism, whose password is a one-time token
//     (common/security/connect_token.h); each outgoing socket presents a fresh one, and a
//     socket whose token is refused (a reconnection re-presents its first token, which the
//     listener has seen) is replaced by a new socket with a new token, after a backoff;
//   - encrypted: CURVE, every process holding the one key pair derived from the job key, so
//     each side proves the key to the other (the listener by decrypting the HELLO, the client
//     by its vouch) and ZAP admits only that public key.
// A refused connection is counted in tessera_auth_failures_total{reason} and logged with the
// peer's address (the first 20, then every 1000th). A listener that refuses this process's own
// credentials, or speaks another mechanism (--insecure or --encrypt differ), is logged once
// per peer as an error naming the likely cause.
//
// Thread-safety: Send, Reply, Shutdown and the accessors are thread-safe; the handler runs on
// the I/O thread.
#ifndef TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_TRANSPORT_H_
#define TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "common/transport/transport.h"

namespace tessera {

struct ZmqTransportOptions {
  std::string bind_host = "127.0.0.1";
  // The host address() names, for peers to connect to; empty: the bound one. Must be set when
  // bind_host is unspecified (0.0.0.0), which nobody can connect to.
  std::string advertise_host;
  int port = 0;  // 0: the OS picks a free port; address() reports it
  // Log a warning when bind_host is reachable from the network (ProcessRuntime says it once
  // for all of a process's sockets instead).
  bool warn_when_exposed = true;
  // Fill Origin::source_host of requests (a metadata lookup per message: for the coordinator,
  // which checks where members connect from, not for the data paths).
  bool record_source_host = false;
  uint64_t max_message_bytes = 1ull << 30;
  // Who we are: the sender fields of what we send (SetIdentity changes them).
  std::optional<Role> role;
  int32_t rank = -1;
  // Outbound messages queued (not yet handed to ZeroMQ) before Send() reports back-pressure.
  size_t max_queued_messages = 100000;
  // Who may connect, and whether traffic is encrypted; every process of a job must use the
  // same protection and key. The default admits anyone (for tests of other layers).
  Credentials credentials;
};

class ZmqTransport final : public Transport {
 public:
  // Binds; Start(handler) starts the I/O thread. `metrics` may be null (no counters);
  // otherwise it must outlive the transport. Fails with the address and ZeroMQ's reason if the
  // bind fails.
  static StatusOr<std::unique_ptr<ZmqTransport>> Create(const ZmqTransportOptions& options,
                                                        MetricsRegistry* metrics);
  // Create, then Start(handler).
  static StatusOr<std::unique_ptr<ZmqTransport>> Start(const ZmqTransportOptions& options,
                                                       MessageHandler handler,
                                                       MetricsRegistry* metrics);
  ~ZmqTransport() override;

  const std::string& address() const override { return address_; }
  Status Start(MessageHandler handler) override;
  Status Send(const std::string& address, OutgoingMessage message) override;
  Status Reply(const Origin& origin, OutgoingMessage message) override;
  // The connection's events tell: ZMQ_EVENT_DISCONNECTED, then a reconnection attempt closed
  // (ZMQ_EVENT_CLOSED) within a second, before any ZMQ_EVENT_CONNECTED.
  Status Watch(const std::string& address, std::function<void()> on_gone) override;
  void Shutdown() override;
  void SetIdentity(Role role, int32_t rank) override;

 private:
  struct Impl;
  explicit ZmqTransport(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// True for "tcp://HOST:PORT" with a non-empty host and a port in 1..65535.
bool IsValidTcpAddress(const std::string& address);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_TRANSPORT_H_
