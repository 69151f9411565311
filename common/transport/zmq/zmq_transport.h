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
