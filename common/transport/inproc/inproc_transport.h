// InProcessTransport: a Transport whose peers live in the same process, for fast,
// deterministic unit tests of what sits above the transport (RpcEndpoint, and through it the
// rendezvous client, the ring's ZeroMQ channel, the parameter server).
//
//   auto network = std::make_shared<InProcessNetwork>();
//   ASSIGN_OR_RETURN(auto a, InProcessTransport::Create(network, "a"));   // "inproc://a"
//   ASSIGN_OR_RETURN(auto b, InProcessTransport::Create(network, "b"));
//   ASSIGN_OR_RETURN(auto endpoint, RpcEndpoint::Start(std::move(a), role, rank, nullptr));
//
// It keeps the promises of transport.h as ZmqTransport does: every message is encoded to the
// same frames and decoded (so verified) by the same wire layer, and a malformed request is
// answered with an ErrorReply; delivery
// is in order per sender and receiver, on the receiver's own delivery thread; a message to an
// address nobody listens at is dropped with a warning (ZeroMQ holds it until the peer comes,
// which a test would only see as silence). Payloads travel as they would over ZeroMQ: one
// with an owner is shared, one without is copied when sent.
//
// Thread-safety: thread-safe. Handlers run on the receiving transport's delivery thread.
#ifndef TESSERA_COMMON_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
#define TESSERA_COMMON_TRANSPORT_INPROC_INPROC_TRANSPORT_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "common/transport/sender_identity.h"
#include "common/transport/transport.h"

namespace tessera {

class InProcessTransport;

// The address book of the in-process transports that can reach each other.
class InProcessNetwork {
 public:
  InProcessNetwork() = default;
  InProcessNetwork(const InProcessNetwork&) = delete;
  InProcessNetwork& operator=(const InProcessNetwork&) = delete;

 private:
  friend class InProcessTransport;
  struct Delivery {
    Origin origin;
    Message message;
  };
  Status Register(const std::string& address, InProcessTransport* transport);
  void Unregister(const std::string& address);
  // Hands `delivery` to the transport at `address`; false if nobody listens there.
  bool Deliver(const std::string& address, Delivery delivery);

  std::mutex mu_;
  std::map<std::string, InProcessTransport*> transports_;  // guarded by mu_
};

class InProcessTransport final : public Transport {
 public:
  // Listens at "inproc://<name>" on `network`. Fails if that address is taken.
  static StatusOr<std::unique_ptr<InProcessTransport>> Create(
      std::shared_ptr<InProcessNetwork> network, const std::string& name,
      uint64_t max_message_bytes = uint64_t{1} << 30);
  ~InProcessTransport() override;

  const std::string& address() const override { return address_; }
  Status Start(MessageHandler handler) override;
  Status Send(const std::string& address, OutgoingMessage message) override;
  Status Reply(const Origin& origin, OutgoingMessage message) override;
  // Stops taking messages, delivers none after it returns (what is queued is dropped), and
  // waits for a handler that is running. Idempotent.
  void Shutdown() override;
  void SetIdentity(Role role, int32_t rank) override;

  // Sends raw frames to `address` as a request, as a foreign or broken peer might (tests of
  // what receivers do with malformed bytes).
  Status SendFrames(const std::string& address, Message frames);

 private:
  friend class InProcessNetwork;  // Enqueue
  InProcessTransport(std::shared_ptr<InProcessNetwork> network, std::string address,
                     uint64_t max_message_bytes);
  // Called by the network with its lock held; never blocks on a handler.
  void Enqueue(InProcessNetwork::Delivery delivery);
  Status Deliver(const std::string& address, Origin origin, Message frames, bool is_reply);
  void DeliveryLoop();
  void Handle(InProcessNetwork::Delivery delivery);

  const std::shared_ptr<InProcessNetwork> network_;
  const std::string address_;
  const uint64_t max_message_bytes_;
  SenderIdentity identity_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InProcessNetwork::Delivery> inbox_;  // guarded by mu_
  MessageHandler handler_;                        // set once, under mu_, before the thread
  bool started_ = false;                          // guarded by mu_
  bool stopped_ = false;                          // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
