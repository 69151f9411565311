#include "common/transport/rpc_endpoint.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/inproc/inproc_transport.h"
#include "common/wire/wire_codec.h"

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

std::unique_ptr<RpcEndpoint> Start(proto::Role role, std::unique_ptr<Transport> transport) {
  auto endpoint = RpcEndpoint::Start(std::move(transport), role, 0, nullptr);
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return std::move(endpoint).value();
}

std::unique_ptr<RpcEndpoint> Start(proto::Role role) { return Start(role, NewTransport()); }

Message Pull(uint64_t request_id) {
  MessageBuilder b(proto::Role::Worker, 0);
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
  return b.Finish(proto::CreatePullRequestDirect(b.fbb(), &metas), request_id);
}

TEST(RpcEndpointTest, CallGetsItsReplyAndErrorsBecomeStatuses) {
  auto server = Start(proto::Role::Server);
  auto client = Start(proto::Role::Worker);
  RpcEndpoint* s = server.get();
  server->SetHandler(proto::Body::PullRequest, [s](Envelope e) {
    uint64_t id = e.header->request_id();
    Message reply = id % 2 == 0 ? MakeErrorReply(proto::Role::Server, 0, id,
                                                 NotFoundError("key 9 is not on server 0"))
                                : [&] {
                                    MessageBuilder b(proto::Role::Server, 0);
                                    return b.Finish(proto::CreateAckDirect(b.fbb(), "ok"), id);
                                  }();
    EXPECT_TRUE(s->transport().Reply(e.origin, std::move(reply)).ok());
  });
  // Odd ids are answered with an Ack, even ones with an error.
  uint64_t odd = client->NextRequestId();
  uint64_t even = client->NextRequestId();
  if (odd % 2 == 0) std::swap(odd, even);
  auto ok = client->Call(server->address(), Pull(odd), odd, Deadline::AfterMillis(10000), "pull");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->header->body_type(), proto::Body::Ack);
  auto bad = client->Call(server->address(), Pull(even), even, Deadline::AfterMillis(10000), "pull");
  ASSERT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("server 0"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("key 9 is not on server 0"), std::string::npos);
}

TEST(RpcEndpointTest, UnhandledRequestIsAnsweredUnimplemented) {
  auto server = Start(proto::Role::Server);
  auto client = Start(proto::Role::Worker);
  uint64_t id = client->NextRequestId();
  auto reply = client->Call(server->address(), Pull(id), id, Deadline::AfterMillis(10000), "pull");
  EXPECT_EQ(reply.status().code(), StatusCode::kUnimplemented) << reply.status();
  EXPECT_NE(reply.status().message().find("PullRequest"), std::string::npos);
}

TEST(RpcEndpointTest, SilentPeerTimesOutNamingTheCallAndPeer) {
  auto server = Start(proto::Role::Server);
  server->SetHandler(proto::Body::PullRequest, [](Envelope) {});  // never answers
  auto client = Start(proto::Role::Worker);
  uint64_t id = client->NextRequestId();
  auto started = SteadyClock::now();
  auto reply = client->Call(server->address(), Pull(id), id, Deadline::AfterMillis(200),
                            "pull of layer0.w");
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - started);
  ASSERT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(reply.status().message().find("pull of layer0.w"), std::string::npos);
  EXPECT_NE(reply.status().message().find(server->address()), std::string::npos);
  EXPECT_LT(waited.count(), 5000);
}

TEST(RpcEndpointTest, FailAllFailsPendingAndLaterCallsWithTheRootCause) {
  auto server = Start(proto::Role::Server);
  server->SetHandler(proto::Body::PullRequest, [](Envelope) {});
  auto client = Start(proto::Role::Worker);
  uint64_t id = client->NextRequestId();
  auto pending = client->CallAsync(server->address(), Pull(id), id, Deadline::AfterMillis(60000), "pull");
  client->FailAll(AbortedError("worker 2 failed"));
  client->FailAll(AbortedError("a later, derived failure"));
  EXPECT_NE(pending.get().status().message().find("worker 2 failed"), std::string::npos);
  uint64_t id2 = client->NextRequestId();
  auto later = client->Call(server->address(), Pull(id2), id2, Deadline::AfterMillis(60000), "pull");
  EXPECT_EQ(later.status().code(), StatusCode::kAborted);
  EXPECT_NE(later.status().message().find("worker 2 failed"), std::string::npos);
}

Message Ack(uint64_t request_id, const std::string& text) {
  MessageBuilder b(proto::Role::Server, 0);
  return b.Finish(proto::CreateAckDirect(b.fbb(), text.c_str()), request_id);
}

// A server that answers every PullRequest with an Ack and counts the requests it saw.
struct AckingServer {
  std::atomic<int> requests{0};  // before endpoint: the handler counts until it is gone
  std::unique_ptr<RpcEndpoint> endpoint;

  explicit AckingServer(std::unique_ptr<Transport> transport)
      : endpoint(Start(proto::Role::Server, std::move(transport))) {
    RpcEndpoint* e = endpoint.get();
    endpoint->SetHandler(proto::Body::PullRequest, [this, e](Envelope envelope) {
      ++requests;
      EXPECT_TRUE(
          e->transport().Reply(envelope.origin, Ack(envelope.header->request_id(), "ok")).ok());
    });
  }
};

// A lost request is a call that fails at its deadline, naming the call and the peer; the
// calls around it are answered.
TEST(RpcEndpointFaultTest, LostRequestFailsAtItsDeadlineNamingTheCall) {
  AckingServer server(NewTransport());
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), FaultOptions());
  FaultyTransport* faults = faulty.get();
  auto client = Start(proto::Role::Worker, std::move(faulty));
  uint64_t first = client->NextRequestId();
  ASSERT_TRUE(client->Call(server.endpoint->address(), Pull(first), first,
                           Deadline::AfterMillis(10000), "pull 1").ok());
  faults->Disconnect(server.endpoint->address());
  uint64_t lost = client->NextRequestId();
  auto reply = client->Call(server.endpoint->address(), Pull(lost), lost,
                            Deadline::AfterMillis(200), "pull of layer1.w");
  ASSERT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_NE(reply.status().message().find("pull of layer1.w"), std::string::npos);
  EXPECT_NE(reply.status().message().find(server.endpoint->address()), std::string::npos);
  EXPECT_EQ(faults->dropped(), 1u);
  faults->Reconnect(server.endpoint->address());
  uint64_t third = client->NextRequestId();
  EXPECT_TRUE(client->Call(server.endpoint->address(), Pull(third), third,
                           Deadline::AfterMillis(10000), "pull 3").ok());
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
  auto client = Start(proto::Role::Worker);
  for (int i = 0; i < 20; ++i) {
    uint64_t id = client->NextRequestId();
    auto reply = client->Call(server.endpoint->address(), Pull(id), id,
                              Deadline::AfterMillis(10000), "pull");
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header->request_id(), id);
  }
  EXPECT_EQ(server.requests.load(), 20);
  EXPECT_EQ(faults->duplicated(), 20u);
}

// Requests delayed at random (seeded) still arrive in the order they were sent, and every
// call in flight gets its own reply.
TEST(RpcEndpointFaultTest, DelayedRequestsKeepTheirOrderAndAllAreAnswered) {
  std::vector<uint64_t> seen;
  std::mutex seen_mu;
  auto server = Start(proto::Role::Server);
  RpcEndpoint* s = server.get();
  server->SetHandler(proto::Body::PullRequest, [&, s](Envelope envelope) {
    {
      std::lock_guard<std::mutex> lock(seen_mu);
      seen.push_back(envelope.header->request_id());
    }
    EXPECT_TRUE(s->transport().Reply(envelope.origin, Ack(envelope.header->request_id(), "ok")).ok());
  });
  FaultOptions late;
  late.seed = 42;
  late.delay_probability = 0.3;
  late.delay_ms = 20;
  auto faulty = std::make_unique<FaultyTransport>(NewTransport(), late);
  FaultyTransport* faults = faulty.get();
  auto client = Start(proto::Role::Worker, std::move(faulty));
  std::vector<uint64_t> sent;
  std::vector<std::shared_future<StatusOr<Envelope>>> replies;
  for (int i = 0; i < 50; ++i) {
    uint64_t id = client->NextRequestId();
    sent.push_back(id);
    replies.push_back(client->CallAsync(server->address(), Pull(id), id,
                                        Deadline::AfterMillis(10000), "pull"));
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    auto reply = replies[i].get();
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header->request_id(), sent[i]);
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
  auto client = Start(proto::Role::Worker);
  std::atomic<int> answered{0}, expired{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        uint64_t id = client->NextRequestId();
        auto reply = client->Call(server.endpoint->address(), Pull(id), id,
                                  Deadline::AfterMillis(100), "pull");
        if (reply.ok()) {
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

}  // namespace
}  // namespace tessera
