#include "common/transport/zmq/zmq_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "common/transport/envelope_queue.h"
#include "common/wire/wire_codec.h"

namespace tessera {
namespace {

Deadline Soon() { return Deadline::AfterMillis(10000); }

std::unique_ptr<ZmqTransport> StartTransport(EnvelopeQueue* queue, MetricsRegistry* metrics,
                                             uint64_t max_bytes = 1 << 20) {
  ZmqTransportOptions options;
  options.max_message_bytes = max_bytes;
  options.record_source_host = true;
  options.role = Role::kServer;
  options.rank = 0;
  auto transport = ZmqTransport::Start(options, queue->Handler(), metrics);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return std::move(transport).value();
}

OutgoingMessage Push(const std::vector<float>& values, uint64_t request_id) {
  PsPushPullRequest push;
  push.has_gradients = true;
  push.tensors.push_back(TensorData::Floats("w", 0, values));
  return OutgoingMessage{request_id, 1, std::move(push)};
}

// The frames a worker would send (for the raw client).
Message PushFrames(const std::vector<float>& values, uint64_t request_id) {
  MessageHeader header;
  header.sender_role = Role::kWorker;
  header.sender_rank = 1;
  header.request_id = request_id;
  return EncodeMessage(header, Push(values, request_id).body);
}

OutgoingMessage AckMessage(uint64_t request_id) {
  return OutgoingMessage{request_id, -1, Ack{"applied"}};
}

double CounterValue(const MetricsRegistry& metrics, const std::string& sample) {
  std::string text = metrics.RenderText();
  size_t at = text.find(sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + sample.size() + 1));
}

// The transport thread counts a message once ZeroMQ has taken it, which can be after the
// peer has already received it: a counter is read once it reaches `want` or Soon() passes.
double CounterValueOnceAtLeast(const MetricsRegistry& metrics, const std::string& sample,
                               double want) {
  Deadline deadline = Soon();
  double value = CounterValue(metrics, sample);
  while (value < want && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    value = CounterValue(metrics, sample);
  }
  return value;
}

TEST(ZmqTransportTest, BindsLoopbackOnAnOsChosenPort) {
  EnvelopeQueue queue;
  auto transport = StartTransport(&queue, nullptr);
  EXPECT_EQ(transport->address().rfind("tcp://127.0.0.1:", 0), 0u) << transport->address();
  EXPECT_TRUE(IsValidTcpAddress(transport->address()));
}

TEST(ZmqTransportTest, AdvertisesItsAdvertiseHostWhenBoundEverywhere) {
  EnvelopeQueue queue;
  ZmqTransportOptions options;
  options.bind_host = "0.0.0.0";
  options.advertise_host = "127.0.0.1";
  auto transport = ZmqTransport::Start(options, queue.Handler(), nullptr);
  ASSERT_TRUE(transport.ok()) << transport.status();
  EXPECT_EQ((*transport)->address().rfind("tcp://127.0.0.1:", 0), 0u) << (*transport)->address();
  // Reachable there: a request arrives.
  EnvelopeQueue client_queue;
  auto client = StartTransport(&client_queue, nullptr);
  ASSERT_TRUE(client->Send((*transport)->address(), Push({1.0f}, 3)).ok());
  EXPECT_TRUE(queue.Pop(Soon(), "push").ok());
}

TEST(ZmqTransportTest, RequestAndReplyCarryPayloadsIntact) {
  MetricsRegistry server_metrics;
  EnvelopeQueue server_queue, client_queue;
  auto server = StartTransport(&server_queue, &server_metrics);
  auto client = StartTransport(&client_queue, nullptr);

  std::vector<float> values(100000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(client->Send(server->address(), Push(values, 7)).ok());

  StatusOr<Envelope> request = server_queue.Pop(Soon(), "push");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->origin.IsRequest());
  EXPECT_EQ(request->header.request_id, 7u);
  EXPECT_EQ(request->header.DescribeSender(), "server 0");
  EXPECT_EQ(request->origin.source_host, "127.0.0.1");  // where the connection came from
  const PsPushPullRequest* push = request->As<PsPushPullRequest>();
  ASSERT_NE(push, nullptr);
  ASSERT_EQ(push->tensors.size(), 1u);
  ASSERT_EQ(push->tensors[0].bytes.size(), values.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(push->tensors[0].bytes.data(), values.data(),
                        values.size() * sizeof(float)),
            0);

  ASSERT_TRUE(server->Reply(request->origin, AckMessage(7)).ok());
  StatusOr<Envelope> reply = client_queue.Pop(Soon(), "ack");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->origin.IsRequest());
  EXPECT_EQ(reply->origin.peer_address, server->address());
  EXPECT_EQ(reply->type(), MessageType::kAck);
  EXPECT_EQ(reply->header.request_id, 7u);
  EXPECT_EQ(CounterValue(server_metrics,
                         "tessera_messages_received_total{type=\"PsPushPullRequest\"}"),
            1);
  EXPECT_EQ(
      CounterValueOnceAtLeast(server_metrics, "tessera_messages_sent_total{type=\"Ack\"}", 1), 1);
}

TEST(ZmqTransportTest, ManyMessagesArriveInOrder) {
  EnvelopeQueue server_queue, client_queue;
  auto server = StartTransport(&server_queue, nullptr);
  auto client = StartTransport(&client_queue, nullptr);
  constexpr int kCount = 2000;
  for (int i = 0; i < kCount; ++i) ASSERT_TRUE(client->Send(server->address(), Push({1.0f}, i)).ok());
  for (int i = 0; i < kCount; ++i) {
    StatusOr<Envelope> e = server_queue.Pop(Soon(), "push");
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_EQ(e->header.request_id, static_cast<uint64_t>(i));
  }
}

TEST(ZmqTransportTest, RejectsBadAddresses) {
  EnvelopeQueue queue;
  auto transport = StartTransport(&queue, nullptr);
  for (std::string bad : {"127.0.0.1:5000", "tcp://127.0.0.1", "tcp://:5000", "tcp://host:0",
                          "tcp://host:70000", "tcp://host:12a"}) {
    Status s = transport->Send(bad, AckMessage(1));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(bad), std::string::npos) << s;
  }
}

TEST(ZmqTransportTest, ListenFailureNamesTheAddress) {
  EnvelopeQueue queue;
  auto first = StartTransport(&queue, nullptr);
  std::string address = first->address();
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  ZmqTransportOptions options;
  options.port = port;
  auto second = ZmqTransport::Start(options, queue.Handler(), nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(std::to_string(port)), std::string::npos)
      << second.status();
}

// A raw ZeroMQ client that can send anything, as a confused or hostile peer would.
class RawClient {
 public:
  explicit RawClient(const std::string& address) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 10000);
    socket_.connect(address);
  }
  void Send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m(frames[i].data(), frames[i].size());
      socket_.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  void Send(const Message& message) {
    std::vector<std::string> frames = {
        std::string(reinterpret_cast<const char*>(message.header.data()), message.header.size())};
    for (const Payload& p : message.payloads) {
      frames.emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
    }
    Send(frames);
  }
  // The next reply, verified; its body must be an ErrorReply or the given type.
  StatusOr<std::pair<std::string, Message>> Receive() {
    std::vector<zmq::message_t> frames;
    bool more = true;
    while (more) {
      zmq::message_t m;
      if (!socket_.recv(m)) return DeadlineExceededError("no reply within 10 s");
      more = m.more();
      frames.push_back(std::move(m));
    }
    Message message;
    message.header = Payload::Copy(frames[0].data(), frames[0].size());
    for (size_t i = 1; i < frames.size(); ++i) {
      message.payloads.push_back(Payload::Copy(frames[i].data(), frames[i].size()));
    }
    // The frames are copies, so the header is aligned as DecodeMessage needs.
    DecodeResult decoded = DecodeMessage(message, 1 << 30);
    if (!decoded.status.ok()) return decoded.status;
    std::string text;
    if (const auto* error = std::get_if<ErrorReply>(&decoded.message->body)) {
      text = StatusOf(*error).ToString();
    } else {
      text = std::string(MessageTypeName(TypeOf(decoded.message->body)));
    }
    return std::make_pair(text, message);
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

TEST(ZmqTransportTest, GarbageGetsErrorRepliesAndServingContinues) {
  MetricsRegistry metrics;
  EnvelopeQueue queue;
  auto server = StartTransport(&queue, &metrics, /*max_bytes=*/64 * 1024);
  RawClient client(server->address());

  struct Case {
    std::vector<std::string> frames;
    std::string expected;
  };
  Message valid = PushFrames({1, 2, 3}, 5);
  std::string valid_header(reinterpret_cast<const char*>(valid.header.data()), valid.header.size());
  std::string valid_payload(reinterpret_cast<const char*>(valid.payloads[0].data()),
                            valid.payloads[0].size());
  std::vector<Case> cases = {
      {{"hello, is this the parameter server?"}, "not a valid tessera.proto.Header"},
      {{""}, "empty header frame"},
      {{valid_header.substr(0, valid_header.size() / 2)}, "not a valid tessera.proto.Header"},
      {{valid_header}, "declares 1 payload frames but 0 arrived"},
      {{valid_header, valid_payload.substr(0, 5)}, "declares 12 bytes but 5 arrived"},
      {{valid_header, std::string(100 * 1024, 'x')}, "exceeds the maximum of 65536 bytes"},
  };
  for (const Case& c : cases) {
    client.Send(c.frames);
    auto reply = client.Receive();
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_NE(reply->first.find("INVALID_ARGUMENT"), std::string::npos) << reply->first;
    EXPECT_NE(reply->first.find(c.expected), std::string::npos) << reply->first;
  }
  EXPECT_EQ(CounterValue(metrics, "tessera_bad_messages_total{reason=\"malformed_header\"}"), 2);
  EXPECT_EQ(CounterValue(metrics, "tessera_bad_messages_total{reason=\"too_large\"}"), 1);

  // The same connection still gets a correct request served.
  client.Send(valid);
  StatusOr<Envelope> request = queue.Pop(Soon(), "push");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->header.request_id, 5u);
  ASSERT_TRUE(server->Reply(request->origin, AckMessage(5)).ok());
  auto reply = client.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->first, "Ack");
}

TEST(ZmqTransportTest, SendAfterShutdownFails) {
  EnvelopeQueue queue;
  auto transport = StartTransport(&queue, nullptr);
  transport->Shutdown();
  transport->Shutdown();  // idempotent
  EXPECT_EQ(transport->Send("tcp://127.0.0.1:9", AckMessage(1)).code(), StatusCode::kCancelled);
}

// A flag set by a watch's on_gone, waited for by the test thread.
class GoneFlag {
 public:
  std::function<void()> Setter() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      changed_.notify_all();
    };
  }
  // The calls made once one was or `deadline` passed.
  int WaitForCall(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_until(lock, deadline.when(), [&] { return calls_ > 0; });
    return calls_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int calls_ = 0;
};

TEST(ZmqTransportTest, AWatchedPeerThatGoesIsReportedOnceAndOneThatStaysIsNot) {
  EnvelopeQueue watcher_queue, going_queue, staying_queue;
  auto watcher = StartTransport(&watcher_queue, nullptr);
  auto going = StartTransport(&going_queue, nullptr);
  auto staying = StartTransport(&staying_queue, nullptr);
  GoneFlag going_gone, staying_gone, never_gone;
  ASSERT_TRUE(watcher->Watch(going->address(), going_gone.Setter()).ok());
  ASSERT_TRUE(watcher->Watch(staying->address(), staying_gone.Setter()).ok());
  // Nothing listens at a port just freed: a peer never reached is not reported as gone.
  std::string nobody;
  {
    EnvelopeQueue queue;
    auto freed = StartTransport(&queue, nullptr);
    nobody = freed->address();
  }
  ASSERT_TRUE(watcher->Watch(nobody, never_gone.Setter()).ok());
  // Let the watches connect (a message over each proves the connection is up).
  ASSERT_TRUE(watcher->Send(going->address(), AckMessage(1)).ok());
  ASSERT_TRUE(watcher->Send(staying->address(), AckMessage(2)).ok());
  ASSERT_TRUE(going_queue.Pop(Soon(), "ack").ok());
  ASSERT_TRUE(staying_queue.Pop(Soon(), "ack").ok());

  const auto shut = std::chrono::steady_clock::now();
  going->Shutdown();
  EXPECT_EQ(going_gone.WaitForCall(Soon()), 1);
  const auto seen = std::chrono::steady_clock::now();
  // A refused reconnection comes back at once; the deadline is for slow (sanitized) builds.
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(seen - shut).count(), 5000);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(going_gone.calls(), 1);
  EXPECT_EQ(staying_gone.calls(), 0);
  EXPECT_EQ(never_gone.calls(), 0);
  // The watched connection still carries messages.
  ASSERT_TRUE(watcher->Send(staying->address(), AckMessage(3)).ok());
  EXPECT_TRUE(staying_queue.Pop(Soon(), "ack").ok());
}

TEST(ZmqTransportTest, WatchRejectsBadAddressesAndFailsAfterShutdown) {
  EnvelopeQueue queue;
  auto transport = StartTransport(&queue, nullptr);
  EXPECT_EQ(transport->Watch("127.0.0.1:5", [] {}).code(), StatusCode::kInvalidArgument);
  transport->Shutdown();
  EXPECT_EQ(transport->Watch("tcp://127.0.0.1:9", [] {}).code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace tessera
