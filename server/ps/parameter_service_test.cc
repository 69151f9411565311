#include "server/ps/parameter_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/transport/zmq/zmq_endpoint.h"
#include "common/wire/wire_codec.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTimeoutMs = 10000;

struct NamedTensor {
  std::string name;
  uint64_t key;
  std::vector<float> values;
  proto::DType dtype = proto::DType::Float32;
};

// One PushRequest with every tensor's bytes in ONE payload frame, at increasing offsets, as a
// fused push would send them.
Message PushMessage(const std::vector<NamedTensor>& tensors, uint64_t request_id) {
  MessageBuilder b(proto::Role::Worker, 3);
  auto frame_bytes = std::make_shared<std::vector<float>>();
  for (const NamedTensor& t : tensors) {
    frame_bytes->insert(frame_bytes->end(), t.values.begin(), t.values.end());
  }
  int32_t frame = b.AddPayload(
      Payload::Borrow(frame_bytes->data(), frame_bytes->size() * sizeof(float), frame_bytes));
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    std::vector<int64_t> shape = {static_cast<int64_t>(t.values.size())};
    uint64_t bytes = t.values.size() * sizeof(float);
    if (t.dtype == proto::DType::Float16) shape[0] *= 2;  // same bytes, twice the elements
    metas.push_back(proto::CreateTensorMetaDirect(b.fbb(), t.name.c_str(), t.key, t.dtype, &shape,
                                                  frame, offset, bytes));
    offset += bytes;
  }
  return b.Finish(proto::CreatePushRequestDirect(b.fbb(), &metas), request_id);
}

Message PullMessage(const std::vector<std::pair<std::string, uint64_t>>& tensors,
                    uint64_t request_id) {
  MessageBuilder b(proto::Role::Worker, 3);
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
  for (const auto& [name, key] : tensors) {
    metas.push_back(proto::CreateTensorMetaDirect(b.fbb(), name.c_str(), key,
                                                  proto::DType::Float32, nullptr, -1, 0, 0));
  }
  return b.Finish(proto::CreatePullRequestDirect(b.fbb(), &metas), request_id);
}

std::vector<float> FloatsOf(const Envelope& reply, const proto::TensorMeta& meta) {
  const Payload& frame = reply.message.payloads.at(static_cast<size_t>(meta.payload()));
  std::vector<float> values(meta.byte_length() / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), frame.data() + meta.offset(), meta.byte_length());
  return values;
}

// Server 1 of 2 over 10 keys: owns [5, 10).
class ParameterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZmqTransportOptions options;
    options.role = proto::Role::Server;
    options.rank = 1;
    auto server = StartZmqEndpoint(options, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    options.role = proto::Role::Worker;
    options.rank = 3;
    auto client = StartZmqEndpoint(options, nullptr);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(client).value();

    TensorStoreOptions store_options;
    store_options.server_rank = 1;
    store_options.num_servers = 2;
    store_options.key_space = 10;
    auto store = TensorStore::Create(store_options, &metrics_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::shared_ptr<TensorStore>(std::move(store).value());
    InstallParameterService(server_.get(), store_);
  }

  StatusOr<Envelope> Push(const std::vector<NamedTensor>& tensors) {
    uint64_t id = client_->NextRequestId();
    return client_->Call(server_->address(), PushMessage(tensors, id), id,
                         Deadline::AfterMillis(kTimeoutMs), "push");
  }
  StatusOr<Envelope> Pull(const std::vector<std::pair<std::string, uint64_t>>& tensors) {
    uint64_t id = client_->NextRequestId();
    return client_->Call(server_->address(), PullMessage(tensors, id), id,
                         Deadline::AfterMillis(kTimeoutMs), "pull");
  }

  MetricsRegistry metrics_;
  std::unique_ptr<RpcEndpoint> server_;
  std::unique_ptr<RpcEndpoint> client_;
  std::shared_ptr<TensorStore> store_;
};

TEST_F(ParameterServiceTest, PushThenPullRoundTripsValues) {
  auto ack = Push({{"layer0.w", 5, {1, 2, 3}}, {"layer0.b", 9, {-4.5f}}});
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->header->body_type(), proto::Body::Ack);

  auto reply = Pull({{"layer0.b", 9}, {"layer0.w", 5}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->header->body_type(), proto::Body::PullReply);
  auto* tensors = reply->header->body_as_PullReply()->tensors();
  ASSERT_NE(tensors, nullptr);
  ASSERT_EQ(tensors->size(), 2u);
  EXPECT_EQ(tensors->Get(0)->name()->str(), "layer0.b");
  EXPECT_EQ(FloatsOf(*reply, *tensors->Get(0)), std::vector<float>{-4.5f});
  EXPECT_EQ(tensors->Get(1)->name()->str(), "layer0.w");
  EXPECT_EQ(tensors->Get(1)->key(), 5u);
  EXPECT_EQ(tensors->Get(1)->shape()->Get(0), 3);
  EXPECT_EQ(FloatsOf(*reply, *tensors->Get(1)), (std::vector<float>{1, 2, 3}));
  EXPECT_THAT(metrics_.RenderText(), HasSubstr("tessera_server_pulls_total 2\n"));
}

TEST_F(ParameterServiceTest, OneBadTensorRejectsTheWholePush) {
  auto reply = Push({{"good", 6, {1}}, {"misplaced", 2, {2}}});
  ASSERT_EQ(reply.status().code(), StatusCode::kInvalidArgument) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'misplaced' key 2"));
  EXPECT_THAT(reply.status().message(), HasSubstr("belongs to server 0"));
  EXPECT_THAT(reply.status().message(), HasSubstr("push from worker 3 to server 1"));
  EXPECT_EQ(store_->size(), 0u);
  auto pull = Pull({{"good", 6}});
  EXPECT_EQ(pull.status().code(), StatusCode::kNotFound) << pull.status();
}

TEST_F(ParameterServiceTest, NonFloatTensorsAreRejectedByName) {
  NamedTensor half{"half.w", 7, {1, 2}, proto::DType::Float16};
  auto reply = Push({half});
  ASSERT_EQ(reply.status().code(), StatusCode::kInvalidArgument) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'half.w' has dtype Float16"));
}

TEST_F(ParameterServiceTest, ShapeChangeIsRejectedNamingBothShapes) {
  ASSERT_TRUE(Push({{"w", 5, {1, 2}}}).ok());
  auto reply = Push({{"w", 5, {1, 2, 3}}});
  EXPECT_THAT(reply.status().message(), HasSubstr("shape [2]; a push of shape [3]"));
}

TEST_F(ParameterServiceTest, PullOfMissingTensorNamesTensorAndServer) {
  auto reply = Pull({{"never.pushed", 8}});
  ASSERT_EQ(reply.status().code(), StatusCode::kNotFound) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("'never.pushed'"));
  EXPECT_THAT(reply.status().message(), HasSubstr("server 1"));
}

TEST_F(ParameterServiceTest, PullReplyBorrowsTheStoredBytes) {
  ASSERT_TRUE(Push({{"w", 5, {1, 2, 3, 4}}}).ok());
  Message request = PullMessage({{"w", 5}}, 42);
  VerifyResult verified = VerifyMessage(request, 1 << 20);
  ASSERT_TRUE(verified.status.ok()) << verified.status;
  Envelope envelope{Origin{}, request, verified.header};
  Message reply = ServePull(*store_, envelope);
  ASSERT_EQ(reply.payloads.size(), 1u);
  auto stored = store_->Get(5, "w");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(reply.payloads[0].data(), stored->bytes->data()) << "the reply copied the tensor";
  // A later push replaces the store's buffer; the reply's frame keeps the old one alive.
  ASSERT_TRUE(Push({{"w", 5, {5, 6, 7, 8}}}).ok());
  float first = 0;
  std::memcpy(&first, reply.payloads[0].data(), sizeof(float));
  EXPECT_EQ(first, 1.0f);
}

}  // namespace
}  // namespace tessera::server
