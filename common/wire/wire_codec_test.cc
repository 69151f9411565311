#include "common/wire/wire_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace tessera {
namespace {

constexpr uint64_t kMax = 1 << 20;

Message PushOf(std::vector<float> values, std::vector<int64_t> shape) {
  MessageBuilder builder(proto::Role::Worker, 3);
  int32_t frame = builder.AddPayload(Payload::Copy(values.data(), values.size() * sizeof(float)));
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
      builder.fbb(), "layer0.w", 7, proto::DType::Float32, &shape, frame, 0,
      values.size() * sizeof(float))};
  return builder.Finish(proto::CreatePushRequestDirect(builder.fbb(), &metas), 42, 5);
}

TEST(WireCodecTest, RoundTripPush) {
  Message m = PushOf({1, 2, 3, 4, 5, 6}, {2, 3});
  VerifyResult r = VerifyMessage(m, kMax);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.header->version(), kWireVersion);
  EXPECT_EQ(r.header->sender_role(), proto::Role::Worker);
  EXPECT_EQ(r.header->sender_rank(), 3);
  EXPECT_EQ(r.header->request_id(), 42u);
  EXPECT_EQ(r.header->step(), 5);
  ASSERT_EQ(r.header->body_type(), proto::Body::PushRequest);
  auto* tensor = r.header->body_as_PushRequest()->tensors()->Get(0);
  EXPECT_EQ(tensor->name()->str(), "layer0.w");
  EXPECT_EQ(tensor->key(), 7u);
  const float* data = reinterpret_cast<const float*>(m.payloads[tensor->payload()].data());
  EXPECT_EQ(data[5], 6.0f);
  EXPECT_EQ(DescribeSender(*r.header), "worker 3");
}

TEST(WireCodecTest, RejectsOversizedBeforeParsing) {
  Message m = PushOf(std::vector<float>(1000, 1.0f), {1000});
  VerifyResult r = VerifyMessage(m, 1000);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.reason, bad_message_reason::kTooLarge);
  EXPECT_NE(r.status.message().find("exceeds the maximum of 1000 bytes"), std::string::npos)
      << r.status;
}

TEST(WireCodecTest, RejectsEmptyAndTruncatedHeaders) {
  Message empty;
  EXPECT_EQ(VerifyMessage(empty, kMax).reason, bad_message_reason::kEmptyHeader);

  Message good = PushOf({1, 2}, {2});
  // The last few bytes of a FlatBuffer can be alignment padding (at most 7), whose loss does not
  // damage it; every cut that removes real data must be rejected.
  ASSERT_GT(good.header.size(), 8u);
  for (size_t cut = 1; cut + 8 <= good.header.size(); ++cut) {
    Message truncated = good;
    truncated.header = Payload::Copy(good.header.data(), cut);
    VerifyResult r = VerifyMessage(truncated, kMax);
    EXPECT_FALSE(r.status.ok()) << "header truncated to " << cut << " bytes was accepted";
  }
}

TEST(WireCodecTest, RandomBytesNeverVerify) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes(1 + rng() % 256);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    Message m;
    m.header = Payload::FromVector(bytes);
    VerifyResult r = VerifyMessage(m, kMax);
    // Random bytes may by chance form a valid table; what matters is no crash, and that
    // anything accepted is structurally consistent.
    if (r.status.ok()) {
      EXPECT_EQ(r.header->version(), kWireVersion);
    } else {
      EXPECT_FALSE(r.reason.empty());
    }
  }
}

TEST(WireCodecTest, RejectsWrongVersion) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = proto::CreateHeartbeat(fbb, 1);
  proto::HeaderBuilder h(fbb);
  h.add_version(kWireVersion + 1);
  h.add_sender_role(proto::Role::Server);
  h.add_sender_rank(1);
  h.add_body_type(proto::Body::Heartbeat);
  h.add_body(body.Union());
  fbb.Finish(h.Finish());
  Message m;
  m.header = Payload::Copy(fbb.GetBufferPointer(), fbb.GetSize());
  VerifyResult r = VerifyMessage(m, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kVersion);
  EXPECT_NE(r.status.message().find("server 1"), std::string::npos) << r.status;
}

TEST(WireCodecTest, RejectsPayloadCountAndLengthMismatch) {
  Message extra = PushOf({1, 2}, {2});
  extra.payloads.push_back(Payload::FromString("surplus"));
  EXPECT_EQ(VerifyMessage(extra, kMax).reason, bad_message_reason::kPayloadCount);

  Message missing = PushOf({1, 2}, {2});
  missing.payloads.clear();
  EXPECT_EQ(VerifyMessage(missing, kMax).reason, bad_message_reason::kPayloadCount);

  Message shorter = PushOf({1, 2}, {2});
  shorter.payloads[0] = Payload::Copy(shorter.payloads[0].data(), 4);
  VerifyResult r = VerifyMessage(shorter, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kPayloadLength);
  EXPECT_NE(r.status.message().find("declares 8 bytes but 4 arrived"), std::string::npos)
      << r.status;
}

TEST(WireCodecTest, RejectsTensorOutsideItsFrame) {
  MessageBuilder builder(proto::Role::Worker, 0);
  std::vector<float> values(4, 1.0f);
  int32_t frame = builder.AddPayload(Payload::Copy(values.data(), 16));
  std::vector<int64_t> shape = {8};
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
      builder.fbb(), "emb", 0, proto::DType::Float32, &shape, frame, 0, 32)};
  Message m = builder.Finish(proto::CreatePushRequestDirect(builder.fbb(), &metas), 1);
  VerifyResult r = VerifyMessage(m, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kTensor);
  EXPECT_NE(r.status.message().find("'emb'"), std::string::npos) << r.status;
}

TEST(WireCodecTest, RejectsShapeThatDisagreesWithLength) {
  Message m = PushOf({1, 2, 3, 4}, {3});  // 3 elements declared, 16 bytes sent
  VerifyResult r = VerifyMessage(m, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kTensor);
  EXPECT_NE(r.status.message().find("shape holds 3 elements"), std::string::npos) << r.status;
}

TEST(WireCodecTest, ErrorReplyCarriesStatus) {
  Message m = MakeErrorReply(proto::Role::Server, 2, 99,
                             NotFoundError("key 17 is owned by server 1, not server 2"));
  VerifyResult r = VerifyMessage(m, kMax);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.header->request_id(), 99u);
  Status s = StatusFromErrorReply(*r.header->body_as_ErrorReply());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "key 17 is owned by server 1, not server 2");
}

}  // namespace
}  // namespace tessera
