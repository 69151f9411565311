#include "common/transport/inproc/inproc_transport.h"

#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/wire/wire_codec.h"

namespace tessera {
namespace {

constexpr std::string_view kScheme = "inproc://";

// What a real transport does to a payload on the way out: one with an owner is shared (ZeroMQ
// takes the owner), one without is copied (ZeroMQ copies it into its frame).
Payload AsSent(const Payload& payload) {
  if (payload.empty() || payload.owner()) return payload;
  return Payload::Copy(payload.data(), payload.size());
}

Message AsSent(Message message) {
  message.header = AsSent(message.header);
  for (Payload& payload : message.payloads) payload = AsSent(payload);
  return message;
}

}  // namespace

Status InProcessNetwork::Register(const std::string& address, InProcessTransport* transport) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!transports_.emplace(address, transport).second) {
    return AlreadyExistsError("cannot listen at " + address + ": another transport does");
  }
  return OkStatus();
}

void InProcessNetwork::Unregister(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  transports_.erase(address);
}

bool InProcessNetwork::Deliver(const std::string& address, Delivery delivery) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transports_.find(address);
  if (it == transports_.end()) return false;
  it->second->Enqueue(std::move(delivery));
  return true;
}

InProcessTransport::InProcessTransport(std::shared_ptr<InProcessNetwork> network,
                                       std::string address, uint64_t max_message_bytes)
    : network_(std::move(network)),
      address_(std::move(address)),
      max_message_bytes_(max_message_bytes) {}

StatusOr<std::unique_ptr<InProcessTransport>> InProcessTransport::Create(
    std::shared_ptr<InProcessNetwork> network, const std::string& name,
    uint64_t max_message_bytes) {
  if (network == nullptr) return InvalidArgumentError("in-process transport: no network");
  if (name.empty()) return InvalidArgumentError("in-process transport: empty name");
  std::unique_ptr<InProcessTransport> transport(
      new InProcessTransport(network, std::string(kScheme) + name, max_message_bytes));
  RETURN_IF_ERROR(network->Register(transport->address_, transport.get()));
  return transport;
}

InProcessTransport::~InProcessTransport() { Shutdown(); }

Status InProcessTransport::Start(MessageHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return CancelledError("transport at " + address_ + " is shut down");
  if (started_) return FailedPreconditionError("transport at " + address_ + " is already started");
  started_ = true;
  handler_ = std::move(handler);
  thread_ = std::thread([this] { DeliveryLoop(); });
  return OkStatus();
}

Status InProcessTransport::Send(const std::string& address, OutgoingMessage message) {
  Origin origin;
  origin.reply_to = address_;
  return Deliver(address, std::move(origin),
                 EncodeMessage(identity_.Header(message.request_id, message.step),
                               std::move(message.body)),
                 /*is_reply=*/false);
}

Status InProcessTransport::SendFrames(const std::string& address, Message frames) {
  Origin origin;
  origin.reply_to = address_;
  return Deliver(address, std::move(origin), std::move(frames), /*is_reply=*/false);
}

Status InProcessTransport::Reply(const Origin& origin, OutgoingMessage message) {
  if (!origin.IsRequest()) {
    return InvalidArgumentError("cannot reply to a message that did not arrive as a request");
  }
  Origin from;
  from.peer_address = address_;
  return Deliver(origin.reply_to, std::move(from),
                 EncodeMessage(identity_.Header(message.request_id, message.step),
                               std::move(message.body)),
                 /*is_reply=*/true);
}

Status InProcessTransport::Deliver(const std::string& address, Origin origin, Message frames,
                                   bool is_reply) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return CancelledError("transport at " + address_ + " is shut down");
  }
  InProcessNetwork::Delivery delivery;
  delivery.origin = std::move(origin);
  delivery.message = AsSent(std::move(frames));
  if (!network_->Deliver(address, std::move(delivery))) {
    TLOG(WARNING) << "transport " << address_ << ": dropped a " << (is_reply ? "reply" : "message")
                  << " to " << address
                  << (is_reply ? ": the peer has disconnected" : ": nobody listens there");
  }
  return OkStatus();
}

void InProcessTransport::Shutdown() {
  network_->Unregister(address_);  // from here on nobody enqueues
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    inbox_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void InProcessTransport::SetIdentity(Role role, int32_t rank) { identity_.Set(role, rank); }

void InProcessTransport::Enqueue(InProcessNetwork::Delivery delivery) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    inbox_.push_back(std::move(delivery));
  }
  cv_.notify_one();
}

void InProcessTransport::DeliveryLoop() {
  while (true) {
    InProcessNetwork::Delivery delivery;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopped_ || !inbox_.empty(); });
      if (stopped_) return;
      delivery = std::move(inbox_.front());
      inbox_.pop_front();
    }
    Handle(std::move(delivery));
  }
}

void InProcessTransport::Handle(InProcessNetwork::Delivery delivery) {
  DecodeResult decoded = DecodeMessage(delivery.message, max_message_bytes_);
  if (!decoded.status.ok()) {
    const std::string from =
        delivery.origin.IsRequest() ? delivery.origin.reply_to : delivery.origin.peer_address;
    TLOG(WARNING) << "transport " << address_ << ": rejected a message from " << from << ": "
                  << decoded.status.message();
    if (delivery.origin.IsRequest()) {
      const MessageHeader header = identity_.Header(decoded.request_id, -1);
      Status rejected = decoded.status.WithContext("rejected by " + header.DescribeSender() +
                                                   " at " + address_);
      (void)Reply(delivery.origin, OutgoingMessage{decoded.request_id, -1, ErrorReplyOf(rejected)});
    }
    return;
  }
  Envelope envelope;
  envelope.origin = std::move(delivery.origin);
  envelope.header = decoded.message->header;
  envelope.body = std::move(decoded.message->body);
  handler_(std::move(envelope));
}

}  // namespace tessera
