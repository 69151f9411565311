#include "common/transport/rpc_endpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/inproc/inproc_transport.h"

namespace tessera {
namespace {

// Endpoints over in-process transports: the endpoint's logic without sockets. The transports
// themselves are tested beside them (zmq/, inproc/, faulty/).
std::shared_ptr<InProcessNetwork> Network() {
  static const auto network = std::make_shared<InProcessNetwork>();
  return network;
}

std::unique_ptr<Transport> NewTransport() {
  static std::atomic<int> next{0};
  auto transport = InProcessTransport::Create(Network(), "endpoint" + std::to_string(next++));
  EXPECT_TRUE(transport.ok()) << transport.status();
  return std::move(transport).value();
}

std::unique_ptr<RpcEndpoint> Start(Role role, std::unique_ptr<Transport> transport) {
  auto endpoint = RpcEndpoint::Start(std::move(transport), role, 0, nullptr);
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return std::move(endpoint).value();
}

std::unique_ptr<RpcEndpoint> Start(Role role) { return Start(role, NewTransport()); }

// The request of these tests; servers answer with the sequence number as the Ack's detail.
MessageBody Request(uint64_t sequence) { return Heartbeat{sequence}; }
uint64_t SequenceOf(const Envelope& request) { return request.As<Heartbeat>()->sequence; }

TEST(RpcEndpointTest, CallGetsItsReplyAndErrorsBecomeStatuses) {
  auto server = Start(Role::kServer);
  auto client = Start(Role::kWorker);
  RpcEndpoint* s = server.get();
  server->SetHandler(MessageType::kHeartbeat, [s](Envelope e) {
    // Odd sequence numbers are answered with an Ack, even ones with an error.
    if (SequenceOf(e) % 2 == 0) {
      s->ReplyError(e, NotFoundError("key 9 is not on server 0"));
    } else {
      s->Reply(e, Ack{std::to_string(SequenceOf(e))});
    }
  });
  auto ok = client->Call(server->address(), Request(1), -1, Deadline::AfterMillis(10000), "pull");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->type(), MessageType::kAck);
  EXPECT_EQ(ok->As<Ack>()->detail, "1");
  EXPECT_EQ(ok->header.DescribeSender(), "server 0");
  auto bad = client->Call(server->address(), Request(2), -1, Deadline::AfterMillis(10000), "pull");
  ASSERT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("server 0"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("key 9 is not on server 0"), std::string::npos);
}

// CallAsync's `settled` runs once per call, after its future is ready, however the call ends:
// a reply, an error reply, its deadline, a peer failed, or before it was sent.
TEST(RpcEndpointTest, SettledRunsOnceAfterTheFutureIsReadyHoweverTheCallEnds) {
  auto server = Start(Role::kServer);
  auto client = Start(Role::kWorker);
  RpcEndpoint* s = server.get();
  server->SetHandler(MessageType::kHeartbeat, [s](Envelope e) {
    if (SequenceOf(e) == 1) s->Reply(e, Ack{"1"});
    if (SequenceOf(e) == 2) s->ReplyError(e, NotFoundError("no"));
    // 3 and 4 are left unanswered.
  });
  std::mutex mu;
  std::vector<uint64_t> settled;  // by sequence, as they ran
  std::vector<std::shared_future<StatusOr<Envelope>>> calls;
  auto call = [&](uint64_t sequence, int64_t timeout_ms) {
    calls.push_back(client->CallAsync(server->address(), Request(sequence), -1,
                                      Deadline::AfterMillis(timeout_ms), "call", 0, [&, sequence] {
                                        std::lock_guard<std::mutex> lock(mu);
                                        settled.push_back(sequence);
                                      }));
  };
  call(1, 10000);
  call(2, 10000);
  call(3, 200);
  call(4, 10000);
  for (size_t i = 0; i < 3; ++i) calls[i].wait();
  client->FailCallsTo(server->address(), UnavailableError("server 0 failed"));
  calls[3].wait();
  client->FailAll(CancelledError("stopping"));
  call(5, 10000);  // refused before it is sent
  EXPECT_EQ(calls[4].get().status().code(), StatusCode::kCancelled);
  // Each runs just after its future is completed, on the completing thread.
  const Deadline deadline = Deadline::AfterMillis(10000);
  while (!deadline.Expired()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (settled.size() >= 5) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(mu);
  std::vector<uint64_t> sorted = settled;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(calls[2].get().status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(calls[3].get().status().code(), StatusCode::kUnavailable);
}

TEST(RpcEndpointTest, TakeBodyNamesWhatCameInstead) {
  auto server = Start(Role::kServer);
  auto client = Start(Role::kWorker);
  RpcEndpoint* s = server.get();
  server->SetHandler(MessageType::kHeartbeat, [s](Envelope e) { s->Reply(e, Ack{"ok"}); });
  auto reply = client->Call(server->address(), Request(1), -1, Deadline::AfterMillis(10000), "hb");
  ASSERT_TRUE(reply.ok()) << reply.status();
  StatusOr<HeartbeatAck> ack = TakeBody<HeartbeatAck>(std::move(reply).value(), "heartbeat");
  ASSERT_EQ(ack.status().code(), StatusCode::kInternal);
  EXPECT_EQ(ack.status().message(), "heartbeat: server 0 answered with Ack instead of HeartbeatAck");
}

TEST(RpcEndpointTest, UnhandledRequestIsAnsweredUnimplemented) {
  auto server = Start(Role::kServer);
  auto client = Start(Role::kWorker);
  auto reply = client->Call(server->address(), Request(1), -1, Deadline::AfterMillis(10000), "hb");
  EXPECT_EQ(reply.status().code(), StatusCode::kUnimplemented) << reply.status();
  EXPECT_NE(reply.status().message().find("server 0 does not serve Heartbeat requests"),
            std::string::npos)
      << reply.status();
}

TEST(RpcEndpointTest, SilentPeerTimesOutNamingTheCallAndPeer) {
  auto server = Start(Role::kServer);
  server->SetHandler(MessageType::kHeartbeat, [](Envelope) {});  // never answers
  auto client = Start(Role::kWorker);
  auto started = SteadyClock::now();
  auto reply = client->Call(server->address(), Request(1), -1, Deadline::AfterMillis(200),
                            "pull of layer0.w");
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - started);
  ASSERT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(reply.status().message().find("pull of layer0.w"), std::string::npos);
  EXPECT_NE(reply.status().message().find(server->address()), std::string::npos);
  EXPECT_LT(waited.count(), 5000);
}

TEST(RpcEndpointTest, FailAllFailsPendingAndLaterCallsWithTheRootCause) {
  auto server = Start(Role::kServer);
  server->SetHandler(MessageType::kHeartbeat, [](Envelope) {});
  auto client = Start(Role::kWorker);
  auto pending = client->CallAsync(server->address(), Request(1), -1,
                                   Deadline::AfterMillis(60000), "pull");
  client->FailAll(AbortedError("worker 2 failed"));
  client->FailAll(AbortedError("a later, derived failure"));
  EXPECT_NE(pending.get().status().message().find("worker 2 failed"), std::string::npos);
  auto later = client->Call(server->address(), Request(2), -1, Deadline::AfterMillis(60000),
                            "pull");
  EXPECT_EQ(later.status().code(), StatusCode::kAborted);
  EXPECT_NE(later.status().message().find("worker 2 failed"), std::string::npos);
}

TEST(RpcEndpointTest, FailCallsToFailsOnlyThatPeersCallsAndLaterCallsGoOut) {
  auto silent = Start(Role::kServer);
  silent->SetHandler(MessageType::kHeartbeat, [](Envelope) {});
  auto answering = Start(Role::kServer);
  RpcEndpoint* a = answering.get();
  answering->SetHandler(MessageType::kHeartbeat, [a](Envelope e) { a->Reply(e, Ack{"ok"}); });
  auto client = Start(Role::kWorker);
  auto to_silent = client->CallAsync(silent->address(), Request(1), -1,
                                     Deadline::AfterMillis(60000), "push to server 0");
  client->FailCallsTo(silent->address(), UnavailableError("server 0 failed"));
  StatusOr<Envelope> failed = to_silent.get();
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("push to server 0"), std::string::npos);
  auto other = client->Call(answering->address(), Request(2), -1, Deadline::AfterMillis(10000),
                            "push to server 1");
  EXPECT_TRUE(other.ok()) << other.status();
}

// Whether `reply` is the Ack of request `sequence`.
bool AnswersRequest(const Envelope& reply, uint64_t sequence) {
  const Ack* ack = reply.As<Ack>();
  return ack != nullptr && ack->detail == std::to_string(sequence);
}

// A server that answers every request with an Ack of its sequence and counts the requests.
struct AckingServer {
  std::atomic<int> requests{0};  // before endpoint: the handler counts until it is gone
  std::unique_ptr<RpcEndpoint> endpoint;

  explicit AckingServer(std::unique_ptr<Transport> transport)
      : endpoint(Start(Role::kServer, std::move(transport))) {
    RpcEndpoint* e = endpoint.get();
    endpoint->SetHandler(MessageType::kHeartbeat, [this, e](Envelope envelope) {
      ++requests;
      e->Reply(envelope, Ack{std::to_string(SequenceOf(envelope))});
    });
  }
};

// A lost request is a call that fails at its deadline, naming the call and the peer; the
// calls around it are answered.
TEST(RpcEndpointFaultTest, LostRequestFailsAtItsDeadlineNamingTheCall) {
  AckingServer server(NewTransport());
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), FaultOptions());
  FaultyTransport* faults = faulty.get();
  auto client = Start(Role::kWorker, std::move(faulty));
  ASSERT_TRUE(client->Call(server.endpoint->address(), Request(1), -1,
                           Deadline::AfterMillis(10000), "pull 1").ok());
  faults->Disconnect(server.endpoint->address());
  auto reply = client->Call(server.endpoint->address(), Request(2), -1,
                            Deadline::AfterMillis(200), "pull of layer1.w");
  ASSERT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_NE(reply.status().message().find("pull of layer1.w"), std::string::npos);
  EXPECT_NE(reply.status().message().find(server.endpoint->address()), std::string::npos);
  EXPECT_EQ(faults->dropped(), 1u);
  faults->Reconnect(server.endpoint->address());
  auto third = client->Call(server.endpoint->address(), Request(3), -1,
                            Deadline::AfterMillis(10000), "pull 3");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(AnswersRequest(*third, 3));
  EXPECT_EQ(server.requests.load(), 2);
}

// Every reply sent twice: each call completes once, with its own reply, and the second copy
// (for a call already answered) is dropped without touching the calls that follow.
TEST(RpcEndpointFaultTest, DuplicatedRepliesCompleteEachCallOnce) {
  FaultOptions twice;
  twice.duplicate_probability = 1;
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), twice);
  FaultyTransport* faults = faulty.get();
  AckingServer server(std::move(faulty));
  auto client = Start(Role::kWorker);
  for (uint64_t i = 0; i < 20; ++i) {
    auto reply = client->Call(server.endpoint->address(), Request(i), -1,
                              Deadline::AfterMillis(10000), "pull");
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(AnswersRequest(*reply, i));
  }
  EXPECT_EQ(server.requests.load(), 20);
  EXPECT_EQ(faults->duplicated(), 20u);
}

// Requests delayed at random (seeded) still arrive in the order they were sent, and every
// call in flight gets its own reply.
TEST(RpcEndpointFaultTest, DelayedRequestsKeepTheirOrderAndAllAreAnswered) {
  std::vector<uint64_t> seen;
  std::mutex seen_mu;
  auto server = Start(Role::kServer);
  RpcEndpoint* s = server.get();
  server->SetHandler(MessageType::kHeartbeat, [&, s](Envelope envelope) {
    {
      std::lock_guard<std::mutex> lock(seen_mu);
      seen.push_back(SequenceOf(envelope));
    }
    s->Reply(envelope, Ack{std::to_string(SequenceOf(envelope))});
  });
  FaultOptions late;
  late.seed = 42;
  late.delay_probability = 0.3;
  late.delay_ms = 20;
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), late);
  FaultyTransport* faults = faulty.get();
  auto client = Start(Role::kWorker, std::move(faulty));
  std::vector<uint64_t> sent;
  std::vector<std::shared_future<StatusOr<Envelope>>> replies;
  for (uint64_t i = 0; i < 50; ++i) {
    sent.push_back(i);
    replies.push_back(client->CallAsync(server->address(), Request(i), -1,
                                        Deadline::AfterMillis(10000), "pull"));
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    auto reply = replies[i].get();
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(AnswersRequest(*reply, sent[i]));
  }
  std::lock_guard<std::mutex> lock(seen_mu);
  EXPECT_EQ(seen, sent);
  EXPECT_GT(faults->delayed(), 0u);
}

// Calls from several threads while the peer's replies are lost at random: every call ends,
// answered or at its deadline, and the endpoint shuts down cleanly (TSan drives the pending
// map from the callers, the delivery thread and the expiry thread at once).
TEST(RpcEndpointFaultTest, ConcurrentCallsWithLostRepliesAllEnd) {
  FaultOptions lossy;
  lossy.seed = 3;
  lossy.drop_probability = 0.3;
  AckingServer server(std::make_unique<FaultyTransport>(NewTransport(), lossy));
  auto client = Start(Role::kWorker);
  std::atomic<int> answered{0}, expired{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const uint64_t sequence = static_cast<uint64_t>(t * 100 + i);
        auto reply = client->Call(server.endpoint->address(), Request(sequence), -1,
                                  Deadline::AfterMillis(100), "pull");
        if (reply.ok()) {
          EXPECT_TRUE(AnswersRequest(*reply, sequence));
          ++answered;
        } else {
          EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status();
          ++expired;
        }
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(answered + expired, 100);
  EXPECT_GT(answered.load(), 0);
  EXPECT_GT(expired.load(), 0);
}

// A call that resends: a lost request is sent again with the same id until one arrives, and
// the call completes with its reply; the resends are counted by type.
TEST(RpcEndpointFaultTest, AResendingCallOutlivesALostRequest) {
  MetricsRegistry metrics;
  AckingServer server(NewTransport());
  std::vector<uint64_t> ids;
  std::mutex ids_mu;
  RpcEndpoint* s = server.endpoint.get();
  s->SetHandler(MessageType::kHeartbeat, [&, s](Envelope envelope) {
    {
      std::lock_guard<std::mutex> lock(ids_mu);
      ids.push_back(envelope.header.request_id);
    }
    s->Reply(envelope, Ack{std::to_string(SequenceOf(envelope))});
  });
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), FaultOptions());
  FaultyTransport* faults = faulty.get();
  auto started = RpcEndpoint::Start(std::move(faulty), Role::kWorker, 0, &metrics);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<RpcEndpoint> client = std::move(started).value();
  faults->Disconnect(server.endpoint->address());
  auto reply = client->CallAsync(server.endpoint->address(), Request(5), 3,
                                 Deadline::AfterMillis(20000), "push of step 3",
                                 /*resend_after_ms=*/10);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // 10, 30, 70 ms: 3 lost
  faults->Reconnect(server.endpoint->address());
  ASSERT_TRUE(reply.get().ok()) << reply.get().status();
  EXPECT_TRUE(AnswersRequest(*reply.get(), 5));
  EXPECT_GE(faults->dropped(), 2u);
  {
    std::lock_guard<std::mutex> lock(ids_mu);
    ASSERT_GE(ids.size(), 1u);
    EXPECT_EQ(ids.front(), ids.back());  // one request, however often it arrived
  }
  EXPECT_NE(metrics.RenderText().find("tessera_rpc_resent_total{type=\"Heartbeat\"}"),
            std::string::npos)
      << metrics.RenderText();
  // Answered: no more resends.
  const uint64_t dropped = faults->dropped();
  size_t arrived = 0;
  {
    std::lock_guard<std::mutex> lock(ids_mu);
    arrived = ids.size();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::lock_guard<std::mutex> lock(ids_mu);
  EXPECT_EQ(ids.size(), arrived);
  EXPECT_EQ(faults->dropped(), dropped);
}

// A resending call with no answer at all still ends at its deadline, naming what it waited for.
TEST(RpcEndpointFaultTest, AResendingCallStillEndsAtItsDeadline) {
  auto silent = Start(Role::kServer);  // handles nothing: but its Unimplemented is lost too
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), FaultOptions());
  faulty->Disconnect(silent->address());
  auto client = Start(Role::kWorker, std::move(faulty));
  const auto started = SteadyClock::now();
  auto reply = client->Call(silent->address(), Request(1), -1, Deadline::AfterMillis(300),
                            "pull of emb", /*resend_after_ms=*/20);
  ASSERT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_NE(reply.status().message().find("pull of emb"), std::string::npos);
  EXPECT_LT(SteadyClock::now() - started, std::chrono::seconds(5));
}

}  // namespace
}  // namespace tessera
