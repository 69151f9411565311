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

Status InProcessTransport::Send(const std::string& address, Message message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return CancelledError("transport at " + address_ + " is shut down");
  }
  InProcessNetwork::Delivery delivery;
  delivery.origin.reply_to = address_;
  delivery.message = AsSent(std::move(message));
  if (!network_->Deliver(address, std::move(delivery))) {
    TLOG(WARNING) << "transport " << address_ << ": dropped a message to " << address
                  << ": nobody listens there";
  }
  return OkStatus();
}

Status InProcessTransport::Reply(const Origin& origin, Message message) {
  if (!origin.IsRequest()) {
    return InvalidArgumentError("cannot reply to a message that did not arrive as a request");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return CancelledError("transport at " + address_ + " is shut down");
  }
  InProcessNetwork::Delivery delivery;
  delivery.origin.peer_address = address_;
  delivery.message = AsSent(std::move(message));
  if (!network_->Deliver(origin.reply_to, std::move(delivery))) {
    TLOG(WARNING) << "transport " << address_ << ": dropped a reply to " << origin.reply_to
                  << ": the peer has disconnected";
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

void InProcessTransport::SetIdentity(proto::Role role, int32_t rank) {
  role_ = role;
  rank_ = rank;
}

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
  VerifyResult verified = VerifyMessage(delivery.message, max_message_bytes_);
  if (!verified.status.ok()) {
    const std::string from =
        delivery.origin.IsRequest() ? delivery.origin.reply_to : delivery.origin.peer_address;
    TLOG(WARNING) << "transport " << address_ << ": rejected a message from " << from << ": "
                  << verified.status.message();
    if (delivery.origin.IsRequest()) {
      Message reply = MakeErrorReply(
          role_.load(), rank_.load(), verified.request_id,
          verified.status.WithContext("rejected by " + std::string(RoleLabel(role_.load())) +
                                      " at " + address_));
      (void)Reply(delivery.origin, std::move(reply));
    }
    return;
  }
  Envelope envelope;
  envelope.origin = std::move(delivery.origin);
  envelope.header = verified.header;
  envelope.message = std::move(delivery.message);
  handler_(std::move(envelope));
}

}  // namespace tessera
