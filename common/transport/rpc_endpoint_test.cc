#include "common/transport/rpc_endpoint.h"

#include <gtest/gtest.h>

#include "common/wire/wire_codec.h"

namespace tessera {
namespace {

std::unique_ptr<RpcEndpoint> Start(proto::Role role) {
  ZmqTransportOptions options;
  options.role = role;
  options.rank = 0;
  auto endpoint = RpcEndpoint::Start(options, nullptr);
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return std::move(endpoint).value();
}

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

}  // namespace
}  // namespace tessera
