#include "common/transport/zmq/zmq_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/base/deadline.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "common/security/connect_token.h"
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

// ZAP (ZeroMQ RFC 27): libzmq asks the handler bound here, in the socket's own context.
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapDomain[] = "tessera";
constexpr char kPlainUser[] = "tessera";
// A socket whose credentials were refused is replaced after this backoff, doubling to the max.
constexpr int64_t kFirstRebuildBackoffMs = 10;
constexpr int64_t kMaxRebuildBackoffMs = 1000;
// A watched peer's reconnection that fails within this long was refused (nothing listens
// there); one that takes longer timed out or found no route, which says nothing of the process.
constexpr int64_t kRefusedWithinMs = 1000;
// Refused connections logged: the first kAuthLogFirst, then every kAuthLogEvery-th.
constexpr uint64_t kAuthLogFirst = 20;
constexpr uint64_t kAuthLogEvery = 1000;

std::string_view KeyView(const KeyBytes& key) {
  return std::string_view(reinterpret_cast<const char*>(key.data()), key.size());
}

std::string ProtocolErrorText(uint32_t code) {
  char hex[16];
  std::snprintf(hex, sizeof(hex), "0x%08x", code);
  std::string text = std::string("ZeroMQ protocol error ") + hex;
  if (code == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
    text += " (a CURVE handshake that did not decrypt: the peer holds another job's key)";
  } else if (code == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
    text += " (the peers use different security mechanisms: give every process of the job the "
            "same --insecure and --encrypt)";
  }
  return text;
}

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
    // With credentials: the socket's handshake events, and its replacement after a refusal.
    std::unique_ptr<zmq::socket_t> monitor;
    bool handshake_succeeded = false;  // since the socket was made
    bool rebuild_due = false;
    SteadyClock::time_point rebuild_at;
    int64_t backoff_ms = kFirstRebuildBackoffMs;
    bool refusal_reported = false;  // the error below is logged once per run of refusals
    // Watch(): `on_gone` is called once the connection, made once, closed and a reconnection
    // was refused; then the dealer is closed and forgotten (`forget`, at the end of the round).
    std::function<void()> on_gone;
    bool connected_once = false;  // survives rebuilds
    bool lost = false;            // the connection closed; no new one made since
    SteadyClock::time_point attempt_started;
    bool forget = false;
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
  // With credentials (I/O thread only): the ZAP handler, the ROUTER's handshake events, and
  // what the handler checks.
  std::unique_ptr<zmq::socket_t> zap;
  std::unique_ptr<zmq::socket_t> router_monitor;
  std::optional<ConnectTokenVerifier> token_verifier;  // PLAIN
  CurveKeys curve_keys{};                               // CURVE
  int monitors_made = 0;
  // The security sockets are drained on the next round whatever their file descriptors say:
  // a new socket signals nothing for the messages that reach it before its first receive, and
  // a drain cut short by kMaxReceivesPerRound goes on. I/O thread (and Start, before it).
  bool security_backlog = true;
  uint64_t auth_failures_logged = 0;
  std::deque<RoutedMessage> router_pending;                 // I/O thread only
  int wake_fd = -1;
  std::thread io_thread;

  std::mutex mu;
  std::deque<Command> commands;  // guarded by mu
  std::deque<std::pair<std::string, std::function<void()>>> watches;  // guarded by mu
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
  CounterFamily* auth_failures = nullptr;
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
    if (options.credentials.authenticated()) {
      ASSIGN_OR_RETURN(auth_failures, metrics->RegisterCounter(names::kAuthFailuresTotal.name,
                                                               names::kAuthFailuresTotal.help,
                                                               {"reason"}));
      for (std::string_view reason :
           {"malformed", "wrong_key", "expired", "replayed", "mechanism", "protocol"}) {
        RETURN_IF_ERROR(auth_failures->WithLabels({std::string(reason)}).status());
      }
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
    // The security sockets (ZAP, monitors) carry a message per connection, not per request.
    // zmq_poll asks every socket item for its state before and after polling (ZMQ_EVENTS, a
    // system call each), which on the data path would make an authenticated process pay for
    // them every round; so they are polled by their file descriptors (ZMQ_FD, which signals
    // when something may have arrived for the socket) and drained, to EAGAIN, when it does.
    // A drain cut short, or a new security socket, is drained the next round anyway
    // (`security_backlog`), and all of them once kSecurityDrainEvery has passed, as a
    // safeguard against a missed signal (at the next wake-up: within 200 ms when idle).
    constexpr auto kSecurityDrainEvery = std::chrono::milliseconds(10);
    SteadyClock::time_point drained_all = SteadyClock::now();
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopped) break;
      }
      RebuildRefusedDealers();
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
        if (out.rebuild_due) any_pending = true;
        items.push_back({out.socket->handle(), 0, events, 0});
        outbound_of_item.push_back(&out);
      }
      const size_t dealers_end = items.size();
      // The ZAP handler, then the monitors (outbound_of_item names the dealer a monitor
      // watches; null for the ROUTER's), by their file descriptors.
      const size_t zap_item = zap ? items.size() : SIZE_MAX;  // MAX: none
      const size_t monitors_begin = items.size() + (zap ? 1 : 0);
      if (zap) items.push_back({nullptr, zap->get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
      outbound_of_item.resize(items.size(), nullptr);
      if (router_monitor) {
        items.push_back({nullptr, router_monitor->get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
        outbound_of_item.resize(items.size(), nullptr);
      }
      for (auto& [address, out] : dealers) {
        if (!out.monitor) continue;
        items.push_back({nullptr, out.monitor->get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
        outbound_of_item.resize(items.size(), nullptr);
        outbound_of_item.back() = &out;
      }
      // A ROUTER reports POLLOUT whatever one peer's queue holds, so blocked replies are retried
      // on a short timer instead of by readiness.
      auto timeout = std::chrono::milliseconds(any_pending || security_backlog ? 1 : 200);
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
      for (size_t i = 2; i < dealers_end; ++i) {
        Outbound* out = outbound_of_item[i];
        FlushDealer(*out);
        if (items[i].revents & ZMQ_POLLIN) Drain(*out->socket, out->address);
      }
      if (items[1].revents & ZMQ_POLLIN) Drain(router, "");
      const SteadyClock::time_point now = SteadyClock::now();
      const bool drain_all = security_backlog || now - drained_all >= kSecurityDrainEvery;
      if (drain_all) drained_all = now;
      security_backlog = false;
      if (zap_item != SIZE_MAX && (drain_all || (items[zap_item].revents & ZMQ_POLLIN))) {
        security_backlog |= ServeZap();
      }
      for (size_t i = monitors_begin; i < items.size(); ++i) {
        if (drain_all || (items[i].revents & ZMQ_POLLIN)) {
          security_backlog |= ReadMonitorEvents(outbound_of_item[i]);
        }
      }
      ForgetGoneDealers();
    }
    FlushBeforeClose();
    // Close every socket on the thread that used them. What ZeroMQ still holds may leave for
    // kCloseLingerMs more (the context's destructor waits for it); what it never took is dropped.
    for (auto& [address, out] : dealers) {
      queued -= out.pending.size();
      out.socket->set(zmq::sockopt::linger, kCloseLingerMs);
      CloseMonitor(*out.socket, out.monitor);
      out.socket->close();
    }
    queued -= router_pending.size();
    router.set(zmq::sockopt::linger, kCloseLingerMs);
    CloseMonitor(router, router_monitor);
    router.close();
    if (zap) zap->close();
  }

  // Closes the watched dealers whose peer is gone (ZeroMQ would retry them for ever); what
  // they still held for the peer is dropped, and counted as failed sends.
  void ForgetGoneDealers() {
    for (auto it = dealers.begin(); it != dealers.end();) {
      Outbound& out = it->second;
      if (!out.forget) {
        ++it;
        continue;
      }
      queued -= out.pending.size();
      if (send_failures) send_failures->Increment(static_cast<double>(out.pending.size()));
      CloseMonitor(*out.socket, out.monitor);
      out.socket->close();
      it = dealers.erase(it);
    }
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
    std::deque<std::pair<std::string, std::function<void()>>> new_watches;
    {
      std::lock_guard<std::mutex> lock(mu);
      taken.swap(commands);
      new_watches.swap(watches);
    }
    for (auto& [address, on_gone] : new_watches) {
      StatusOr<Outbound*> out = DealerFor(address);
      if (!out.ok()) {
        TLOG(ERROR) << "transport " << router_address << ": cannot watch: " << out.status();
        continue;
      }
      (*out)->on_gone = std::move(on_gone);
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
      ConfigureSecurity(*out.socket, /*listener=*/false);
      out.monitor = MonitorEvents(*out.socket, /*listener=*/false);
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

  // ---- authentication (see the header) ----

  // The mechanism and keys of a socket; a client's PLAIN password is a fresh token.
  void ConfigureSecurity(zmq::socket_t& socket, bool listener) {
    const Credentials& credentials = options.credentials;
    if (!credentials.authenticated()) return;
    if (listener) socket.set(zmq::sockopt::zap_domain, kZapDomain);
    if (credentials.encrypted()) {
      if (listener) {
        socket.set(zmq::sockopt::curve_server, 1);
        socket.set(zmq::sockopt::curve_secretkey, KeyView(curve_keys.secret_key));
      } else {
        socket.set(zmq::sockopt::curve_serverkey, KeyView(curve_keys.public_key));
        socket.set(zmq::sockopt::curve_publickey, KeyView(curve_keys.public_key));
        socket.set(zmq::sockopt::curve_secretkey, KeyView(curve_keys.secret_key));
      }
    } else if (listener) {
      socket.set(zmq::sockopt::plain_server, 1);
    } else {
      socket.set(zmq::sockopt::plain_username, kPlainUser);
      socket.set(zmq::sockopt::plain_password,
                 MakeConnectToken(*credentials.key, WallClockMs()));
    }
  }

  // A PAIR socket receiving `socket`'s handshake events (with credentials) and, for a dealer,
  // its connection events (for Watch: a dealer may be watched after it connected); null for
  // a listener without credentials.
  std::unique_ptr<zmq::socket_t> MonitorEvents(zmq::socket_t& socket, bool listener) {
    security_backlog = true;
    int events = 0;
    if (options.credentials.authenticated()) {
      // The listener's refusals by ZAP are counted by ServeZap; the rest fail before ZAP.
      events = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
               (listener ? 0 : ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    }
    if (!listener) {
      events |= ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_DELAYED |
                ZMQ_EVENT_CLOSED;
    }
    if (events == 0) return nullptr;
    const std::string endpoint = "inproc://tessera-events-" + std::to_string(++monitors_made);
    if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
    auto monitor = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
    monitor->set(zmq::sockopt::linger, 0);
    monitor->connect(endpoint);
    return monitor;
  }

  static void CloseMonitor(zmq::socket_t& socket, std::unique_ptr<zmq::socket_t>& monitor) {
    if (!monitor) return;
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    monitor->close();
    monitor.reset();
  }

  void CountAuthFailure(std::string_view reason, const std::string& detail) {
    if (auth_failures != nullptr) {  // rare: a lookup here is fine
      StatusOr<Counter*> counter = auth_failures->WithLabels({std::string(reason)});
      if (counter.ok()) (*counter)->Increment();
    }
    if (auth_failures_logged++ < kAuthLogFirst || auth_failures_logged % kAuthLogEvery == 0) {
      TLOG(WARNING) << "transport " << router_address << ": refused a connection (" << reason
                    << ", " << auth_failures_logged << " so far): " << detail;
    }
  }

  // Answers the ZAP requests libzmq made for connections to the ROUTER (RFC 27): PLAIN with a
  // valid token, or CURVE with the job's public key, is admitted; anything else is not.
  // Returns true when it stopped at kMaxReceivesPerRound before the socket was empty.
  bool ServeZap() {
    for (int round = 0; round < kMaxReceivesPerRound; ++round) {
      std::vector<zmq::message_t> request;
      try {
        zmq::message_t frame;
        if (!zap->recv(frame, zmq::recv_flags::dontwait)) return false;
        bool more = frame.more();
        request.push_back(std::move(frame));
        while (more && request.size() < 16) {
          zmq::message_t next;
          (void)zap->recv(next, zmq::recv_flags::none);
          more = next.more();
          request.push_back(std::move(next));
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == EAGAIN || e.num() == EINTR) return false;
        TLOG(ERROR) << "transport " << router_address << ": ZAP receive failed: " << e.what();
        return false;
      }
      // version, request id, domain, address, routing id, mechanism, credentials...
      const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
      const std::string address = request.size() > 3 ? request[3].to_string() : "?";
      const std::string mechanism = request.size() > 5 ? request[5].to_string() : "";
      TokenVerdict verdict;
      if (options.credentials.encrypted()) {
        if (mechanism == "CURVE" && request.size() > 6 &&
            request[6].size() == curve_keys.public_key.size() &&
            std::memcmp(request[6].data(), curve_keys.public_key.data(),
                        curve_keys.public_key.size()) == 0) {
          verdict.ok = true;
        } else {
          verdict.reason = mechanism == "CURVE" ? "wrong_key" : "mechanism";
          verdict.detail = "its CURVE key is not this job's";
        }
      } else if (mechanism == "PLAIN" && request.size() > 7 &&
                 request[6].to_string_view() == kPlainUser) {
        verdict = token_verifier->Verify(request[7].to_string_view(), WallClockMs());
      } else {
        verdict.reason = mechanism == "PLAIN" ? "malformed" : "mechanism";
        verdict.detail = "it offered the " + mechanism + " mechanism without a Tessera token";
      }
      if (!verdict.ok) CountAuthFailure(verdict.reason, "from " + address + ": " + verdict.detail);
      const std::array<std::string, 6> reply = {
          "1.0", request_id, verdict.ok ? "200" : "400",
          verdict.ok ? "OK" : std::string(verdict.reason), "", ""};
      try {
        for (size_t i = 0; i < reply.size(); ++i) {
          zap->send(zmq::buffer(reply[i]),
                    i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      } catch (const zmq::error_t& e) {
        TLOG(ERROR) << "transport " << router_address << ": ZAP reply failed: " << e.what();
      }
    }
    return true;
  }

  // Monitor events of the ROUTER (`out` null) or of the dealer `out`. Returns true when it
  // stopped at kMaxReceivesPerRound before the monitor was empty.
  bool ReadMonitorEvents(Outbound* out) {
    zmq::socket_t& monitor = out != nullptr ? *out->monitor : *router_monitor;
    for (int round = 0; round < kMaxReceivesPerRound; ++round) {
      zmq::message_t event_frame;
      zmq::message_t endpoint_frame;
      try {
        if (!monitor.recv(event_frame, zmq::recv_flags::dontwait)) return false;
        if (event_frame.more()) (void)monitor.recv(endpoint_frame, zmq::recv_flags::none);
      } catch (const zmq::error_t&) {
        return false;
      }
      if (event_frame.size() < 6) continue;
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, event_frame.data(), sizeof(event));
      std::memcpy(&value, static_cast<const uint8_t*>(event_frame.data()) + 2, sizeof(value));
      if (out == nullptr) {
        CountAuthFailure("protocol", "a peer failed the ZeroMQ handshake on " +
                                         endpoint_frame.to_string() + ": " +
                                         (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                                              ? ProtocolErrorText(value)
                                              : std::string("it closed or spoke no ZMTP")));
        continue;
      }
      OnDealerEvent(*out, event, value);
    }
    return true;
  }

  void OnDealerEvent(Outbound& out, uint16_t event, uint32_t value) {
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        out.connected_once = true;
        out.lost = false;
        return;
      case ZMQ_EVENT_DISCONNECTED:
        if (out.connected_once) {
          out.lost = true;
          out.attempt_started = SteadyClock::now();
        }
        return;
      case ZMQ_EVENT_CONNECT_DELAYED:
        out.attempt_started = SteadyClock::now();
        return;
      case ZMQ_EVENT_CLOSED:
        // A connection attempt failed (a dropped connection is DISCONNECTED instead).
        if (out.lost && out.on_gone && !out.forget &&
            SteadyClock::now() - out.attempt_started <
                std::chrono::milliseconds(kRefusedWithinMs)) {
          out.forget = true;
          std::function<void()> on_gone = std::move(out.on_gone);
          on_gone();
        }
        return;
      default:
        break;
    }
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      out.handshake_succeeded = true;
      out.backoff_ms = kFirstRebuildBackoffMs;
      out.refusal_reported = false;
      return;
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      // After a dropped connection ZeroMQ reconnects with the token the peer has seen, which
      // it refuses as replayed: a new socket gets a new token. A fresh socket refused means
      // the peer does not take our key.
      if (!out.handshake_succeeded && !out.refusal_reported) {
        out.refusal_reported = true;
        TLOG(ERROR) << "transport " << router_address << ": " << out.address
                    << " refused this process's credentials (key "
                    << options.credentials.key->Fingerprint()
                    << "): does it use this job's key (--auth-key-file, TESSERA_AUTH_KEY_FILE) "
                       "and its clock within "
                    << kTokenWindowMs / 60000 << " minutes of this host's? Retrying.";
      }
      out.rebuild_due = true;
      out.rebuild_at = SteadyClock::now() + std::chrono::milliseconds(out.backoff_ms);
      out.backoff_ms = std::min(2 * out.backoff_ms, kMaxRebuildBackoffMs);
      return;
    }
    if (!out.refusal_reported) {
      out.refusal_reported = true;
      TLOG(ERROR) << "transport " << router_address << ": the handshake with " << out.address
                  << " failed: "
                  << (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                          ? ProtocolErrorText(value)
                          : std::string("the connection closed during it"))
                  << "; ZeroMQ retries";
    }
  }

  // Replaces dealers whose credentials were refused, once their backoff has passed. Messages
  // ZeroMQ held in the old socket are lost with it (the waiting side's deadline notices);
  // those still queued here go out on the new one.
  void RebuildRefusedDealers() {
    const SteadyClock::time_point now = SteadyClock::now();
    for (auto& [address, out] : dealers) {
      if (!out.rebuild_due || now < out.rebuild_at) continue;
      out.rebuild_due = false;
      try {
        CloseMonitor(*out.socket, out.monitor);
        out.socket->close();
        out.socket = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
        ConfigureSocket(*out.socket);
        ConfigureSecurity(*out.socket, /*listener=*/false);
        out.monitor = MonitorEvents(*out.socket, /*listener=*/false);
        out.handshake_succeeded = false;
        // The new socket's first connection is a reconnection: refused, the peer is gone.
        if (out.connected_once) {
          out.lost = true;
          out.attempt_started = SteadyClock::now();
        }
        out.socket->connect(address);
      } catch (const zmq::error_t& e) {
        TLOG(ERROR) << "transport " << router_address << ": cannot reconnect to " << address
                    << ": " << e.what();
      }
    }
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
    const Credentials& credentials = options.credentials;
    if (credentials.authenticated()) {
      // The handler must be bound before the ROUTER: without one, libzmq admits any CURVE
      // client and stalls PLAIN handshakes (notes/learned.md).
      impl->zap = std::make_unique<zmq::socket_t>(impl->context, zmq::socket_type::rep);
      impl->zap->set(zmq::sockopt::linger, 0);
      impl->zap->bind(kZapEndpoint);
      if (credentials.encrypted()) {
        impl->curve_keys = JobCurveKeys(*credentials.key);
      } else {
        impl->token_verifier.emplace(*credentials.key);
      }
    }
    impl->ConfigureSocket(impl->router);
    impl->ConfigureSecurity(impl->router, /*listener=*/true);
    impl->router_monitor = impl->MonitorEvents(impl->router, /*listener=*/true);
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
  if (options.warn_when_exposed && !IsLoopbackHost(options.bind_host) &&
      !options.credentials.encrypted()) {
    TLOG(WARNING) << "transport listens on " << impl->router_address
                  << ", which is reachable from the network, without encryption ("
                  << options.credentials.Describe() << ")";
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

Status ZmqTransport::Watch(const std::string& address, std::function<void()> on_gone) {
  if (!IsValidTcpAddress(address)) {
    return InvalidArgumentError("cannot watch '" + address +
                                "': expected tcp://HOST:PORT with a port in 1..65535");
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) {
      return CancelledError("transport at " + impl_->router_address + " is shut down");
    }
    impl_->watches.emplace_back(address, std::move(on_gone));
  }
  impl_->Wake();
  return OkStatus();
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
