#include "common/transport/zmq/zmq_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/base/deadline.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "common/transport/sender_identity.h"
#include "common/wire/wire_codec.h"

namespace tessera {
namespace {

// Frames beyond this many in one inbound message are a framing error (protects memory).
constexpr size_t kMaxFramesPerMessage = 1 + 65536;
// Inbound messages handled per socket per poll round, so one busy peer cannot starve others.
constexpr int kMaxReceivesPerRound = 256;
// Shutdown: how long queued messages may wait for a slow peer before they are dropped, and
// how long ZeroMQ may then go on delivering what it took (both only matter when a peer does not
// read; on a live connection both take microseconds).
constexpr int64_t kShutdownFlushMs = 200;
constexpr int kCloseLingerMs = 200;

void ReleasePayloadOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// An outbound frame that borrows the payload's bytes; ZeroMQ drops the owner once sent.
zmq::message_t ToZmqFrame(const Payload& payload) {
  if (payload.empty()) return zmq::message_t();
  if (!payload.owner()) return zmq::message_t(payload.data(), payload.size());
  auto* owner = new std::shared_ptr<const void>(payload.owner());
  return zmq::message_t(const_cast<uint8_t*>(payload.data()), payload.size(),
                        ReleasePayloadOwner, owner);
}

// An inbound frame becomes the owner of the Payload that views it: no copy.
Payload FromZmqFrame(zmq::message_t&& frame) {
  auto holder = std::make_shared<zmq::message_t>(std::move(frame));
  const void* data = holder->data();
  size_t size = holder->size();
  return Payload::Borrow(data, size, std::move(holder));
}

enum class SendOutcome { kSent, kWouldBlock, kFailed };

}  // namespace

bool IsValidTcpAddress(const std::string& address) {
  constexpr std::string_view kScheme = "tcp://";
  if (address.compare(0, kScheme.size(), kScheme) != 0) return false;
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon <= kScheme.size()) return false;
  std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
  }
  int value = std::stoi(port);
  return value >= 1 && value <= 65535;
}

struct ZmqTransport::Impl {
  // A message's frames, and its type for the metrics and logs.
  struct Frames {
    Message message;
    MessageType type = MessageType::kAck;
  };
  // A Send or Reply waiting for the I/O thread.
  struct Command {
    bool is_reply = false;
    std::string target;  // peer address (Send) or routing id (Reply)
    Frames frames;
  };
  // One outgoing connection and the messages that ZeroMQ could not take yet.
  struct Outbound {
    std::string address;
    std::unique_ptr<zmq::socket_t> socket;
    std::deque<Frames> pending;
  };
  struct RoutedMessage {
    std::string routing_id;
    Frames frames;
  };

  ZmqTransportOptions options;
  MessageHandler handler;
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};  // I/O thread only (after Start)
  std::map<std::string, Outbound> dealers;                  // I/O thread only
  std::deque<RoutedMessage> router_pending;                 // I/O thread only
  int wake_fd = -1;
  std::thread io_thread;

  std::mutex mu;
  std::deque<Command> commands;  // guarded by mu
  bool stopped = false;          // guarded by mu
  std::atomic<size_t> queued{0};  // messages accepted by Send/Reply, not yet given to ZeroMQ
  SenderIdentity identity;

  // Metrics (null when no registry was given). The per-type counters are looked up once, at
  // registration, so counting a message costs one atomic add and no lock.
  std::array<Counter*, kMessageTypeCount> sent_by_type{};
  std::array<Counter*, kMessageTypeCount> received_by_type{};
  CounterFamily* bad_by_reason = nullptr;
  Counter* bytes_sent = nullptr;
  Counter* bytes_received = nullptr;
  Counter* send_failures = nullptr;
  uint64_t bad_messages_logged = 0;  // I/O thread only

  ~Impl() {
    if (wake_fd >= 0) close(wake_fd);
  }

  Status RegisterMetrics(MetricsRegistry* metrics) {
    namespace names = metric_names;
    ASSIGN_OR_RETURN(CounterFamily * sent, metrics->RegisterCounter(names::kMessagesSentTotal.name,
                                                                    names::kMessagesSentTotal.help,
                                                                    {"type"}));
    ASSIGN_OR_RETURN(CounterFamily * received,
                     metrics->RegisterCounter(names::kMessagesReceivedTotal.name,
                                              names::kMessagesReceivedTotal.help, {"type"}));
    for (size_t type = 0; type < kMessageTypeCount; ++type) {
      std::string label(MessageTypeName(static_cast<MessageType>(type)));
      ASSIGN_OR_RETURN(sent_by_type[type], sent->WithLabels({label}));
      ASSIGN_OR_RETURN(received_by_type[type], received->WithLabels({label}));
    }
    ASSIGN_OR_RETURN(bad_by_reason, metrics->RegisterCounter(names::kBadMessagesTotal.name,
                                                             names::kBadMessagesTotal.help,
                                                             {"reason"}));
    ASSIGN_OR_RETURN(CounterFamily * family,
                     metrics->RegisterCounter(names::kBytesSentTotal.name,
                                              names::kBytesSentTotal.help));
    ASSIGN_OR_RETURN(bytes_sent, family->WithLabels({}));
    ASSIGN_OR_RETURN(family, metrics->RegisterCounter(names::kBytesReceivedTotal.name,
                                                      names::kBytesReceivedTotal.help));
    ASSIGN_OR_RETURN(bytes_received, family->WithLabels({}));
    ASSIGN_OR_RETURN(family, metrics->RegisterCounter(names::kSendFailuresTotal.name,
                                                      names::kSendFailuresTotal.help));
    ASSIGN_OR_RETURN(send_failures, family->WithLabels({}));
    // Pre-create the reason children so the metric is visible (at 0) before the first one.
    for (std::string_view reason :
         {bad_message_reason::kTooLarge, bad_message_reason::kMalformedHeader,
          bad_message_reason::kVersion, bad_message_reason::kPayloadLength,
          bad_message_reason::kField, bad_message_reason::kFraming}) {
      RETURN_IF_ERROR(bad_by_reason->WithLabels({std::string(reason)}).status());
    }
    return OkStatus();
  }

  static void Count(const std::array<Counter*, kMessageTypeCount>& by_type, MessageType type) {
    Counter* counter = by_type[static_cast<size_t>(type)];
    if (counter != nullptr) counter->Increment();
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;  // EAGAIN means the counter is already non-zero: the thread will wake anyway
  }

  Status Enqueue(Command command) {
    // Count the message before publishing it: the I/O thread may send it (and decrement)
    // as soon as the lock is released.
    if (queued.fetch_add(1) >= options.max_queued_messages) {
      --queued;
      return UnavailableError("send queue full (" + std::to_string(options.max_queued_messages) +
                              " messages waiting) for " +
                              (command.is_reply ? std::string("a reply") : command.target) +
                              ": the peer is not reading fast enough");
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopped) {
        --queued;
        return CancelledError("transport at " + router_address + " is shut down");
      }
      commands.push_back(std::move(command));
    }
    Wake();
    return OkStatus();
  }

  std::string router_address;

  // ---- I/O thread ----

  void Run() {
    std::vector<zmq::pollitem_t> items;
    std::vector<Outbound*> outbound_of_item;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopped) break;
      }
      items.clear();
      outbound_of_item.clear();
      items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
      items.push_back({router.handle(), 0, ZMQ_POLLIN, 0});
      outbound_of_item.push_back(nullptr);
      outbound_of_item.push_back(nullptr);
      bool any_pending = !router_pending.empty();
      for (auto& [address, out] : dealers) {
        short events = ZMQ_POLLIN;
        if (!out.pending.empty()) {
          events |= ZMQ_POLLOUT;
          any_pending = true;
        }
        items.push_back({out.socket->handle(), 0, events, 0});
        outbound_of_item.push_back(&out);
      }
      // A ROUTER reports POLLOUT whatever one peer's queue holds, so blocked replies are retried
      // on a short timer instead of by readiness.
      auto timeout = std::chrono::milliseconds(any_pending ? 1 : 200);
      try {
        zmq::poll(items.data(), items.size(), timeout);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        TLOG(ERROR) << "transport " << router_address << ": poll failed: " << e.what();
        continue;
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count;
        ssize_t n = read(wake_fd, &count, sizeof(count));
        (void)n;
      }
      TakeCommands();
      FlushRouter();
      for (size_t i = 2; i < items.size(); ++i) {
        Outbound* out = outbound_of_item[i];
        FlushDealer(*out);
        if (items[i].revents & ZMQ_POLLIN) Drain(*out->socket, out->address);
      }
      if (items[1].revents & ZMQ_POLLIN) Drain(router, "");
    }
    FlushBeforeClose();
    // Close every socket on the thread that used them. What ZeroMQ still holds may leave for
    // kCloseLingerMs more (the context's destructor waits for it); what it never took is dropped.
    for (auto& [address, out] : dealers) {
      queued -= out.pending.size();
      out.socket->set(zmq::sockopt::linger, kCloseLingerMs);
      out.socket->close();
    }
    queued -= router_pending.size();
    router.set(zmq::sockopt::linger, kCloseLingerMs);
    router.close();
  }

  // Hands ZeroMQ every message queued before Shutdown (a goodbye, the replies to the last
  // requests), waiting for slow peers' queues for at most kShutdownFlushMs in all, so that a
  // process can answer and leave at once instead of sleeping "long enough" first.
  void FlushBeforeClose() {
    TakeCommands();
    Deadline deadline = Deadline::AfterMillis(kShutdownFlushMs);
    while (true) {
      FlushRouter();
      bool pending = !router_pending.empty();
      for (auto& [address, out] : dealers) {
        FlushDealer(out);
        pending |= !out.pending.empty();
      }
      if (!pending || deadline.Expired()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void TakeCommands() {
    std::deque<Command> taken;
    {
      std::lock_guard<std::mutex> lock(mu);
      taken.swap(commands);
    }
    for (Command& command : taken) {
      if (command.is_reply) {
        router_pending.push_back({std::move(command.target), std::move(command.frames)});
        continue;
      }
      StatusOr<Outbound*> out = DealerFor(command.target);
      if (!out.ok()) {
        --queued;
        if (send_failures) send_failures->Increment();
        TLOG(ERROR) << "transport " << router_address << ": " << out.status();
        continue;
      }
      (*out)->pending.push_back(std::move(command.frames));
    }
  }

  StatusOr<Outbound*> DealerFor(const std::string& address) {
    auto it = dealers.find(address);
    if (it != dealers.end()) return &it->second;
    try {
      Outbound out;
      out.address = address;
      out.socket = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
      ConfigureSocket(*out.socket);
      out.socket->connect(address);
      return &dealers.emplace(address, std::move(out)).first->second;
    } catch (const zmq::error_t& e) {
      return UnavailableError("cannot connect to " + address + ": " + e.what());
    }
  }

  void ConfigureSocket(zmq::socket_t& socket) {
    socket.set(zmq::sockopt::linger, 0);
    // A peer not listening yet (processes of several hosts start together; the coordinator
    // may come up after its workers) is retried after 10 ms, doubling up to 1 s, instead of
    // ZeroMQ's fixed 100 ms, which put 100 ms into a multi-host job's start.
    socket.set(zmq::sockopt::reconnect_ivl, 10);
    socket.set(zmq::sockopt::reconnect_ivl_max, 1000);
    socket.set(zmq::sockopt::sndhwm, 10000);
    socket.set(zmq::sockopt::rcvhwm, 10000);
    // Frames beyond this are dropped by ZeroMQ with the connection; smaller oversized messages
    // reach DecodeMessage and get an ErrorReply.
    socket.set(zmq::sockopt::maxmsgsize,
               static_cast<int64_t>(options.max_message_bytes + (1u << 20)));
  }

  void FlushDealer(Outbound& out) {
    while (!out.pending.empty()) {
      SendOutcome outcome = SendFrames(*out.socket, nullptr, out.pending.front());
      if (outcome == SendOutcome::kWouldBlock) return;
      out.pending.pop_front();
      --queued;
    }
  }

  void FlushRouter() {
    size_t attempts = router_pending.size();
    for (size_t i = 0; i < attempts && !router_pending.empty(); ++i) {
      RoutedMessage& front = router_pending.front();
      SendOutcome outcome = SendFrames(router, &front.routing_id, front.frames);
      if (outcome == SendOutcome::kWouldBlock) {
        // That peer is slow; let the others' replies pass.
        router_pending.push_back(std::move(front));
      } else {
        --queued;
      }
      router_pending.pop_front();
    }
  }

  SendOutcome SendFrames(zmq::socket_t& socket, const std::string* routing_id,
                         const Frames& frames) {
    const Message& message = frames.message;
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    try {
      if (routing_id != nullptr) {
        zmq::message_t id(routing_id->data(), routing_id->size());
        if (!socket.send(id, more)) return SendOutcome::kWouldBlock;
      }
      zmq::message_t header = ToZmqFrame(message.header);
      auto flags = message.payloads.empty() ? zmq::send_flags::dontwait : more;
      if (!socket.send(header, flags)) {
        // With a routing id sent, ZeroMQ has taken the message; this cannot block.
        if (routing_id == nullptr) return SendOutcome::kWouldBlock;
        throw zmq::error_t();
      }
      for (size_t i = 0; i < message.payloads.size(); ++i) {
        zmq::message_t frame = ToZmqFrame(message.payloads[i]);
        bool last = i + 1 == message.payloads.size();
        if (!socket.send(frame, last ? zmq::send_flags::none : zmq::send_flags::sndmore)) {
          throw zmq::error_t();
        }
      }
    } catch (const zmq::error_t& e) {
      if (send_failures) send_failures->Increment();
      const char* reason = e.num() == EHOSTUNREACH ? "the peer has disconnected" : e.what();
      TLOG(WARNING) << "transport " << router_address << ": dropped "
                    << MessageTypeName(frames.type)
                    << (routing_id ? " reply" : " message") << ": " << reason;
      return SendOutcome::kFailed;
    }
    Count(sent_by_type, frames.type);
    if (bytes_sent) bytes_sent->Increment(static_cast<double>(message.TotalBytes()));
    return SendOutcome::kSent;
  }

  // Receives up to kMaxReceivesPerRound whole messages from `socket`: the ROUTER when
  // `peer_address` is empty, else the DEALER connected to it.
  void Drain(zmq::socket_t& socket, const std::string& peer_address) {
    bool is_router = peer_address.empty();
    for (int round = 0; round < kMaxReceivesPerRound; ++round) {
      std::vector<zmq::message_t> frames;
      uint64_t total = 0;
      bool overflow = false;
      try {
        zmq::message_t first;
        if (!socket.recv(first, zmq::recv_flags::dontwait)) return;
        bool more = first.more();
        total += first.size();
        frames.push_back(std::move(first));
        while (more) {
          zmq::message_t next;
          (void)socket.recv(next, zmq::recv_flags::none);  // the rest of a message is here
          more = next.more();
          total += next.size();
          // Keep reading to the end of the message, but stop holding frames once it is
          // clearly unacceptable.
          if (frames.size() >= kMaxFramesPerMessage || total > options.max_message_bytes) {
            overflow = true;
            if (frames.size() > 2) frames.resize(2);
            continue;
          }
          frames.push_back(std::move(next));
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == EAGAIN || e.num() == EINTR) return;
        TLOG(ERROR) << "transport " << router_address << ": receive failed: " << e.what();
        return;
      }
      if (bytes_received) bytes_received->Increment(static_cast<double>(total));
      Handle(is_router, peer_address, std::move(frames), overflow, total);
    }
  }

  void Handle(bool is_router, std::string peer_address, std::vector<zmq::message_t> frames,
              bool overflow, uint64_t total) {
    Origin origin;
    size_t first_frame = 0;
    if (is_router) {
      origin.reply_to = frames[0].to_string();
      first_frame = 1;
      // The routing-id frame is the ROUTER's own; the peer's frames carry its address.
      if (options.record_source_host) {
        try {
          origin.source_host = frames.back().gets("Peer-Address");
        } catch (const zmq::error_t&) {
          // Not every transport (ipc, inproc) knows it.
        }
      }
    } else {
      origin.peer_address = std::move(peer_address);
    }
    std::string from = is_router ? "a client" : origin.peer_address;
    DecodeResult verified;
    Message message;
    if (overflow) {
      verified.status = InvalidArgumentError(
          "message of " + std::to_string(total) + " bytes in " +
          (frames.size() > kMaxFramesPerMessage ? "too many frames" : "its frames") +
          " exceeds the maximum of " + std::to_string(options.max_message_bytes) + " bytes");
      verified.reason = bad_message_reason::kTooLarge;
    } else if (frames.size() <= first_frame) {
      verified.status = InvalidArgumentError("message has no header frame");
      verified.reason = bad_message_reason::kFraming;
    } else {
      // FlatBuffers reads the header in place and needs it 8-byte aligned; ZeroMQ keeps small
      // frames inside the zmq_msg_t, where they may not be. Headers are small: copy those.
      zmq::message_t& header = frames[first_frame];
      if (reinterpret_cast<uintptr_t>(header.data()) % alignof(uint64_t) != 0) {
        message.header = Payload::Copy(header.data(), header.size());
      } else {
        message.header = FromZmqFrame(std::move(header));
      }
      for (size_t i = first_frame + 1; i < frames.size(); ++i) {
        message.payloads.push_back(FromZmqFrame(std::move(frames[i])));
      }
      verified = DecodeMessage(message, options.max_message_bytes);
    }
    if (!verified.status.ok()) {
      if (bad_by_reason != nullptr) {  // rare: a lookup here is fine
        StatusOr<Counter*> bad = bad_by_reason->WithLabels({std::string(verified.reason)});
        if (bad.ok()) (*bad)->Increment();
      }
      if (bad_messages_logged++ < 20 || bad_messages_logged % 1000 == 0) {
        TLOG(WARNING) << "transport " << router_address << ": rejected a message from " << from
                      << ": " << verified.status.message();
      }
      if (is_router) {
        const MessageHeader header = identity.Header(verified.request_id, -1);
        Status rejected = verified.status.WithContext("rejected by " + header.DescribeSender() +
                                                      " at " + router_address);
        Frames reply{EncodeMessage(header, ErrorReplyOf(rejected)), MessageType::kErrorReply};
        router_pending.push_back({origin.reply_to, std::move(reply)});
        ++queued;
      }
      return;
    }
    DecodedMessage& decoded = *verified.message;
    Count(received_by_type, TypeOf(decoded.body));
    Envelope envelope;
    envelope.origin = std::move(origin);
    envelope.header = decoded.header;
    envelope.body = std::move(decoded.body);
    handler(std::move(envelope));
  }
};

ZmqTransport::ZmqTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  address_ = impl_->router_address;
}

StatusOr<std::unique_ptr<ZmqTransport>> ZmqTransport::Create(const ZmqTransportOptions& options,
                                                              MetricsRegistry* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->identity.Set(options.role, options.rank);
  if (metrics != nullptr) RETURN_IF_ERROR(impl->RegisterMetrics(metrics));

  bool ipv6 = options.bind_host.find(':') != std::string::npos;
  std::string host = ipv6 ? "[" + options.bind_host + "]" : options.bind_host;
  std::string endpoint =
      "tcp://" + host + ":" + (options.port == 0 ? "*" : std::to_string(options.port));
  try {
    impl->ConfigureSocket(impl->router);
    impl->router.set(zmq::sockopt::router_mandatory, 1);
    if (ipv6) impl->router.set(zmq::sockopt::ipv6, 1);
    impl->router.bind(endpoint);
    impl->router_address = impl->router.get(zmq::sockopt::last_endpoint);
    if (!options.advertise_host.empty()) {
      const std::string& bound = impl->router_address;
      const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
      impl->router_address = "tcp://" + JoinHostPort(options.advertise_host, port);
    }
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot listen on " + endpoint + ": " + e.what());
  }
  if (options.warn_when_exposed && !IsLoopbackHost(options.bind_host)) {
    TLOG(WARNING) << "transport listens on " << impl->router_address
                  << ", which is reachable from the network; Tessera does not authenticate "
                     "peers yet, so expose it only on a trusted network";
  }
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return InternalError(std::string("eventfd: ") + std::strerror(errno));
  return std::unique_ptr<ZmqTransport>(new ZmqTransport(std::move(impl)));
}

StatusOr<std::unique_ptr<ZmqTransport>> ZmqTransport::Start(const ZmqTransportOptions& options,
                                                             MessageHandler handler,
                                                             MetricsRegistry* metrics) {
  ASSIGN_OR_RETURN(std::unique_ptr<ZmqTransport> transport, Create(options, metrics));
  RETURN_IF_ERROR(transport->Start(std::move(handler)));
  return transport;
}

Status ZmqTransport::Start(MessageHandler handler) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return CancelledError("transport at " + address_ + " is shut down");
  if (impl_->io_thread.joinable()) {
    return FailedPreconditionError("transport at " + address_ + " is already started");
  }
  impl_->handler = std::move(handler);
  Impl* raw = impl_.get();
  impl_->io_thread = std::thread([raw] { raw->Run(); });
  return OkStatus();
}

ZmqTransport::~ZmqTransport() { Shutdown(); }

Status ZmqTransport::Send(const std::string& address, OutgoingMessage message) {
  if (!IsValidTcpAddress(address)) {
    return InvalidArgumentError("cannot send to '" + address +
                                "': expected tcp://HOST:PORT with a port in 1..65535");
  }
  Impl::Command command;
  command.target = address;
  command.frames.type = TypeOf(message.body);
  command.frames.message = EncodeMessage(
      impl_->identity.Header(message.request_id, message.step), std::move(message.body));
  return impl_->Enqueue(std::move(command));
}

Status ZmqTransport::Reply(const Origin& origin, OutgoingMessage message) {
  if (!origin.IsRequest()) {
    return InvalidArgumentError("cannot reply to a message that did not arrive as a request");
  }
  Impl::Command command;
  command.is_reply = true;
  command.target = origin.reply_to;
  command.frames.type = TypeOf(message.body);
  command.frames.message = EncodeMessage(
      impl_->identity.Header(message.request_id, message.step), std::move(message.body));
  return impl_->Enqueue(std::move(command));
}

void ZmqTransport::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->Wake();
  // Start and Shutdown both hold mu to touch io_thread, so a thread started is joined here.
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
}

void ZmqTransport::SetIdentity(Role role, int32_t rank) { impl_->identity.Set(role, rank); }

}  // namespace tessera
