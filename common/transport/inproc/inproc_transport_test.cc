#include "common/transport/inproc/inproc_transport.h"

#include <gtest/gtest.h>

#include "common/transport/envelope_queue.h"

namespace tessera {
namespace {

Deadline Soon() { return Deadline::AfterMillis(10000); }

OutgoingMessage AckMessage(uint64_t request_id, const std::string& text = "applied") {
  return OutgoingMessage{request_id, -1, Ack{text}};
}

struct Peer {
  EnvelopeQueue queue;
  std::unique_ptr<InProcessTransport> transport;

  Peer(const std::shared_ptr<InProcessNetwork>& network, const std::string& name) {
    auto created = InProcessTransport::Create(network, name);
    EXPECT_TRUE(created.ok()) << created.status();
    transport = std::move(created).value();
    EXPECT_TRUE(transport->Start(queue.Handler()).ok());
  }
};

TEST(InProcessTransportTest, RequestsAndRepliesArriveInOrderWithTheirOrigin) {
  auto network = std::make_shared<InProcessNetwork>();
  Peer server(network, "server"), client(network, "client");
  EXPECT_EQ(server.transport->address(), "inproc://server");
  for (uint64_t id = 1; id <= 100; ++id) {
    ASSERT_TRUE(client.transport->Send(server.transport->address(), AckMessage(id)).ok());
  }
  for (uint64_t id = 1; id <= 100; ++id) {
    StatusOr<Envelope> request = server.queue.Pop(Soon(), "request " + std::to_string(id));
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_EQ(request->header.request_id, id);
    ASSERT_TRUE(request->origin.IsRequest());
    ASSERT_TRUE(server.transport->Reply(request->origin, AckMessage(id, "done")).ok());
  }
  for (uint64_t id = 1; id <= 100; ++id) {
    StatusOr<Envelope> reply = client.queue.Pop(Soon(), "reply " + std::to_string(id));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->header.request_id, id);
    EXPECT_FALSE(reply->origin.IsRequest());
    EXPECT_EQ(reply->origin.peer_address, "inproc://server");
  }
}

// A payload without an owner is copied when sent, as ZeroMQ would: the sender may reuse its
// buffer at once. One with an owner is shared.
TEST(InProcessTransportTest, PayloadsTravelAsOverZeroMq) {
  auto network = std::make_shared<InProcessNetwork>();
  Peer server(network, "server"), client(network, "client");
  std::vector<float> scratch = {1, 2, 3};
  auto shared = std::make_shared<std::vector<float>>(scratch);
  PsPushPullRequest push;
  push.has_gradients = true;
  push.tensors.push_back(TensorData::Floats("w", 0, scratch.data(), 3, nullptr));
  push.tensors.push_back(TensorData::Floats("v", 1, shared->data(), 3, shared));
  ASSERT_TRUE(client.transport->Send("inproc://server", OutgoingMessage{7, 1, push}).ok());
  scratch.assign(3, -1.0f);  // the sender's buffer changes after the send
  StatusOr<Envelope> request = server.queue.Pop(Soon(), "push");
  ASSERT_TRUE(request.ok()) << request.status();
  const PsPushPullRequest* got = request->As<PsPushPullRequest>();
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->tensors.size(), 2u);
  EXPECT_EQ(got->tensors[0].Read<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(got->tensors[1].bytes.data(),
            reinterpret_cast<const uint8_t*>(shared->data()));  // shared, not copied
}

TEST(InProcessTransportTest, MalformedRequestGetsAnErrorReplyAndServingContinues) {
  auto network = std::make_shared<InProcessNetwork>();
  Peer server(network, "server"), client(network, "client");
  server.transport->SetIdentity(Role::kServer, 3);
  Message garbage;
  garbage.header = Payload::FromString("hello, is this the parameter server?");
  ASSERT_TRUE(client.transport->SendFrames("inproc://server", std::move(garbage)).ok());
  StatusOr<Envelope> reply = client.queue.Pop(Soon(), "the error reply");
  ASSERT_TRUE(reply.ok()) << reply.status();
  const ErrorReply* error = reply->As<ErrorReply>();
  ASSERT_NE(error, nullptr);
  Status status = StatusOf(*error);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not a valid tessera.proto.Header"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("rejected by server 3 at inproc://server"), std::string::npos)
      << status;
  EXPECT_EQ(reply->header.DescribeSender(), "server 3");
  ASSERT_TRUE(client.transport->Send("inproc://server", AckMessage(9)).ok());
  StatusOr<Envelope> next = server.queue.Pop(Soon(), "a good request");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->header.request_id, 9u);
}

TEST(InProcessTransportTest, AddressesAreUniqueAndShutdownEndsDelivery) {
  auto network = std::make_shared<InProcessNetwork>();
  Peer server(network, "server"), client(network, "client");
  auto again = InProcessTransport::Create(network, "server");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(client.transport->Start(client.queue.Handler()).code(),
            StatusCode::kFailedPrecondition);
  server.transport->Shutdown();
  server.transport->Shutdown();  // idempotent
  // Nobody listens there now: the message is dropped, as ZeroMQ would hold it unanswered.
  EXPECT_TRUE(client.transport->Send("inproc://server", AckMessage(1)).ok());
  EXPECT_EQ(server.queue.Pop(Deadline::AfterMillis(50), "nothing").status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(server.transport->Send("inproc://client", AckMessage(2)).code(),
            StatusCode::kCancelled);
  // The address is free again.
  EXPECT_TRUE(InProcessTransport::Create(network, "server").ok());
}

}  // namespace
}  // namespace tessera
