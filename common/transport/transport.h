// Transport: how a Tessera process sends and receives Messages.
//
// Every process has one Transport. It listens at `address()` and connects to other processes'
// addresses on first use. It speaks messages (common/messages/message.h): a backend encodes
// what it sends and decodes what it receives with the wire layer (common/wire), so inbound
// messages are verified before the handler sees them; a malformed one is answered with an
// ErrorReply naming what was wrong, counted in tessera_bad_messages_total, and dropped, and
// the transport keeps serving.
//
// Two kinds of inbound messages reach the handler:
//   - requests, which arrived on our listening socket: `origin.reply_to` is set and Reply()
//     answers on the connection they came in on (the sender need not listen anywhere);
//   - replies and unsolicited messages that arrived on one of our outgoing connections:
//     `origin.peer_address` names the process we connected to.
//
// Lifecycle: a backend's factory binds (so `address()` is known), Start(handler) begins
// delivery, Shutdown ends it. RpcEndpoint takes any Transport; main wires the ZeroMQ one.
//
// Backends mirror each other's file names: zmq/zmq_transport.{h,cc} for production,
// inproc/inproc_transport.{h,cc} (peers in one process, for fast deterministic tests) and
// faulty/faulty_transport.{h,cc} (a seeded decorator that drops, delays, duplicates and
// disconnects, for tests that must catch such faults).
#ifndef TESSERA_COMMON_TRANSPORT_TRANSPORT_H_
#define TESSERA_COMMON_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>

#include "common/base/role.h"
#include "common/base/status.h"
#include "common/messages/message.h"

namespace tessera {

// Where an inbound message came from.
struct Origin {
  // Non-empty for messages received on our listening socket: the opaque route to answer on.
  std::string reply_to;
  // For those: the IP address the connection came from, when the transport records it
  // (ZmqTransportOptions::record_source_host).
  std::string source_host;
  // For messages received on an outgoing connection: the address we connected to.
  std::string peer_address;

  bool IsRequest() const { return !reply_to.empty(); }
};

// A verified inbound message. Tensor bytes in its body view the frames they arrived in, which
// they keep alive.
struct Envelope {
  Origin origin;
  MessageHeader header;
  MessageBody body;

  MessageType type() const { return TypeOf(body); }
  // The body as T, or null when it is another type.
  template <typename T>
  const T* As() const {
    return std::get_if<T>(&body);
  }
  template <typename T>
  T* As() {
    return std::get_if<T>(&body);
  }
};

// The body of `reply` as T; Internal naming `what`, the sender and the type that came instead.
template <typename T>
StatusOr<T> TakeBody(Envelope reply, std::string_view what) {
  if (T* body = reply.As<T>()) return std::move(*body);
  return InternalError(std::string(what) + ": " + reply.header.DescribeSender() +
                       " answered with " + std::string(MessageTypeName(reply.type())) +
                       " instead of " + std::string(MessageTypeName(TypeOfBody<T>())));
}

// Called on the transport's I/O thread for every verified inbound message. It must not block
// for long: hand work to another thread (a queue) if it is more than bookkeeping.
using MessageHandler = std::function<void(Envelope envelope)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // "tcp://127.0.0.1:PORT": where other processes reach this one.
  virtual const std::string& address() const = 0;

  // Starts handing verified inbound messages to `handler`, on the transport's own thread;
  // what arrived before waits. Fails if called twice or after Shutdown.
  virtual Status Start(MessageHandler handler) = 0;

  // Who this process is: the sender fields of every message it sends. Thread-safe.
  virtual void SetIdentity(Role role, int32_t rank) = 0;

  // Queues `message` for the process listening at `address` ("tcp://HOST:PORT"), connecting
  // on first use; its header names this transport's identity as the sender. Returns once
  // queued; delivery failures after that are logged and counted (the receiver's silence is
  // detected by the waiting side's deadline). Thread-safe.
  virtual Status Send(const std::string& address, OutgoingMessage message) = 0;

  // Answers a request on the connection it arrived on. Thread-safe.
  virtual Status Reply(const Origin& origin, OutgoingMessage message) = 0;

  // Watches the process listening at `address` without sending it anything: connects (as a
  // Send would) and, once that connection has been made, closed, and a reconnection is
  // refused (nothing listens there any more: the process is gone, even on another host, whose
  // kernel closes a dead process's connections), calls `on_gone` once, on the transport's
  // thread (it must be quick), and closes the connection. A host that vanishes whole (no
  // refusal comes back) is not reported: heartbeats find that. Watching an address again
  // replaces its `on_gone`. Thread-safe. Backends that cannot tell return Unimplemented.
  virtual Status Watch(const std::string& address, std::function<void()> on_gone) {
    (void)on_gone;
    return UnimplementedError("this transport cannot watch " + address);
  }

  // Hands on what Send/Reply queued before (waiting briefly for a peer that does not read, so
  // replies and goodbyes sent just before are not lost), stops the I/O thread and closes every
  // socket; later Send/Reply fail. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_TRANSPORT_H_
