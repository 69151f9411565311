#include "common/wire/wire_codec.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "proto/wire_generated.h"

namespace tessera {
namespace {

constexpr uint64_t kMax = 1 << 20;

MessageHeader WorkerHeader(int rank, uint64_t request_id = 42, int64_t step = 5) {
  MessageHeader header;
  header.sender_role = Role::kWorker;
  header.sender_rank = rank;
  header.request_id = request_id;
  header.step = step;
  return header;
}

Message PushOf(std::vector<float> values, std::vector<int64_t> shape) {
  TensorData tensor = TensorData::Floats("layer0.w", 7, std::move(values));
  tensor.shape = std::move(shape);
  PsPushPullRequest push;
  push.tensors.push_back(std::move(tensor));
  push.has_gradients = true;
  push.job_token = 11;
  push.model = "{}";
  push.region_pid = 1234;
  push.region_fd = 9;
  push.region_token_high = 5;
  push.region_token_low = 6;
  push.in_region = true;
  push.skip = true;
  push.stop = true;
  push.range = 2;
  push.ack_only = true;
  push.join = 1;
  push.forward_to = "tcp://10.0.0.2:5000";
  push.forwarded = true;
  push.dropped_by = 2;
  push.stopped_by = 0;
  push.joining = 3;
  push.pushed_by = 1;
  push.updates = {7, 9};
  push.region_writers = 3;
  push.region_writer = 2;
  return EncodeMessage(WorkerHeader(3), std::move(push));
}

DecodedMessage Decoded(const Message& message) {
  DecodeResult result = DecodeMessage(message, kMax);
  EXPECT_TRUE(result.status.ok()) << result.status;
  return result.message.value_or(DecodedMessage{});
}

// The frames of a FlatBuffers header built by hand (for what EncodeMessage never writes).
Message RawMessage(flatbuffers::FlatBufferBuilder& fbb, std::vector<Payload> payloads = {}) {
  Message message;
  message.header = Payload::Copy(fbb.GetBufferPointer(), fbb.GetSize());
  message.payloads = std::move(payloads);
  return message;
}

template <typename Table>
Message RawWith(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<Table> body,
                proto::Role role = proto::Role::Worker, std::vector<uint64_t> lengths = {},
                std::vector<Payload> payloads = {}) {
  auto lengths_offset = fbb.CreateVector(lengths);
  proto::HeaderBuilder h(fbb);
  h.add_version(kWireVersion);
  h.add_sender_role(role);
  h.add_sender_rank(1);
  h.add_body_type(proto::BodyTraits<Table>::enum_value);
  h.add_body(body.Union());
  h.add_payload_lengths(lengths_offset);
  fbb.Finish(h.Finish());
  return RawMessage(fbb, std::move(payloads));
}

TEST(WireCodecTest, RoundTripPushPull) {
  Message m = PushOf({1, 2, 3, 4, 5, 6}, {2, 3});
  ASSERT_EQ(m.payloads.size(), 1u);
  DecodedMessage d = Decoded(m);
  EXPECT_EQ(d.header.sender_role, Role::kWorker);
  EXPECT_EQ(d.header.sender_rank, 3);
  EXPECT_EQ(d.header.request_id, 42u);
  EXPECT_EQ(d.header.step, 5);
  EXPECT_EQ(d.header.DescribeSender(), "worker 3");
  ASSERT_EQ(TypeOf(d.body), MessageType::kPsPushPullRequest);
  const auto& push = std::get<PsPushPullRequest>(d.body);
  EXPECT_TRUE(push.has_gradients);
  EXPECT_EQ(push.job_token, 11u);
  EXPECT_EQ(push.model, "{}");
  EXPECT_EQ(push.region_pid, 1234);
  EXPECT_EQ(push.region_fd, 9);
  EXPECT_EQ(push.region_token_high, 5u);
  EXPECT_EQ(push.region_token_low, 6u);
  EXPECT_TRUE(push.in_region);
  EXPECT_TRUE(push.skip);
  EXPECT_TRUE(push.stop);
  EXPECT_EQ(push.range, 2);
  EXPECT_TRUE(push.ack_only);
  EXPECT_EQ(push.join, 1);
  EXPECT_EQ(push.forward_to, "tcp://10.0.0.2:5000");
  EXPECT_TRUE(push.forwarded);
  EXPECT_EQ(push.dropped_by, 2);
  EXPECT_EQ(push.stopped_by, 0);
  EXPECT_EQ(push.joining, 3);
  EXPECT_EQ(push.pushed_by, 1);
  EXPECT_EQ(push.updates, (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(push.region_writers, 3);
  EXPECT_EQ(push.region_writer, 2);
  ASSERT_EQ(push.tensors.size(), 1u);
  EXPECT_EQ(push.tensors[0].name, "layer0.w");
  EXPECT_EQ(push.tensors[0].key, 7u);
  EXPECT_EQ(push.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(push.tensors[0].Read<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // The bytes are a view of the received frame, not a copy.
  EXPECT_EQ(push.tensors[0].bytes.data(), m.payloads[0].data());
}

TEST(WireCodecTest, RoundTripEveryBody) {
  FleetView view;
  view.job = "job-1";
  view.epoch = 3;
  view.num_servers = 2;
  view.num_workers = 2;
  view.key_space = 1000;
  view.replicas = 2;
  view.members.push_back({Role::kServer, 0, "tcp://127.0.0.1:5000",
                          "http://127.0.0.1:6000/metrics", "h", 11, MemberState::kAlive, 0, 1000});
  view.members.push_back({Role::kWorker, 1, "tcp://127.0.0.1:5002", "", "h", 13,
                          MemberState::kFailed, 0, 0});
  std::vector<MessageBody> bodies = {
      RegisterRequest{Role::kServer, 2, "tcp://a:1", "http://a:2/metrics", "a", 77, 4},
      view,
      Heartbeat{9},
      HeartbeatAck{10},
      FailureNotice{Role::kWorker, 1, "tcp://b:1", "no heartbeat"},
      BarrierRequest{"start", 2, 500, Role::kWorker},
      BarrierRequest{"all", 3, 600, std::nullopt},
      BarrierRelease{"start", 2},
      Goodbye{"done"},
      PsInitRequest{"{}", {TensorData::Floats("chunk0", 5, {1.5f})}, 99},
      PsPushPullReply{{TensorData::Floats("chunk0", 5, {2.5f, 3.5f})}, true, "refused"},
      SparsePushRequest{"emb", TensorData::Int64s("row_ids", {3, 4}),
                        TensorData::Floats("values", 0, {1, 2, 3, 4})},
      SparsePullRequest{"emb", TensorData::Int64s("row_ids", {8})},
      SparsePullReply{"emb", TensorData::Int64s("row_ids", {8}),
                      TensorData::Floats("values", 0, {5, 6})},
      CheckpointRequest{"/ckpt", 12, true},
      CheckpointReply{"/ckpt", 12, {"server-0.ckpt"}, {100}, {0xabc}},
      Ack{"ok"},
      ErrorReply{StatusCode::kNotFound, "no such key"},
  };
  for (const MessageBody& body : bodies) {
    const MessageType type = TypeOf(body);
    DecodedMessage d = Decoded(EncodeMessage(WorkerHeader(0), body));
    ASSERT_EQ(TypeOf(d.body), type) << MessageTypeName(type);
  }
  DecodedMessage fleet = Decoded(EncodeMessage(WorkerHeader(0), view));
  const FleetView& back = std::get<FleetView>(fleet.body);
  EXPECT_EQ(back.job, "job-1");
  EXPECT_EQ(back.key_space, 1000u);
  EXPECT_EQ(back.replicas, 2);
  ASSERT_EQ(back.members.size(), 2u);
  EXPECT_EQ(back.members[0].metrics_address, "http://127.0.0.1:6000/metrics");
  EXPECT_EQ(back.members[1].state, MemberState::kFailed);

  // An elastic job's membership epoch travels with the notice (issue 47); 0 by default.
  FailureNotice left{Role::kWorker, 2, "tcp://c:1", "process gone"};
  left.membership_epoch = 3;
  left.membership_step = 40;
  left.world_size = 3;
  const auto notice =
      std::get<FailureNotice>(Decoded(EncodeMessage(WorkerHeader(0), left)).body);
  EXPECT_EQ(notice.membership_epoch, 3u);
  EXPECT_EQ(notice.membership_step, 40);
  EXPECT_EQ(notice.world_size, 3);
  EXPECT_FALSE(notice.joined);
  const auto plain = std::get<FailureNotice>(
      Decoded(EncodeMessage(WorkerHeader(0), FailureNotice{Role::kWorker, 1, "a", "b"})).body);
  EXPECT_EQ(plain.membership_epoch, 0u);
  EXPECT_EQ(plain.membership_step, -1);

  const auto barrier = std::get<BarrierRequest>(
      Decoded(EncodeMessage(WorkerHeader(0), BarrierRequest{"all", 3, 600, std::nullopt})).body);
  EXPECT_FALSE(barrier.scope.has_value());
  const auto sparse = std::get<SparsePushRequest>(Decoded(EncodeMessage(
      WorkerHeader(0), SparsePushRequest{"emb", TensorData::Int64s("row_ids", {3, 4}),
                                         TensorData::Floats("values", 0, {1, 2, 3, 4})})).body);
  EXPECT_EQ(sparse.row_ids.Read<int64_t>(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(sparse.row_ids.dtype, DataType::kInt64);
  EXPECT_FALSE(sparse.forwarded);
  EXPECT_EQ(sparse.pushed_by, -1);
  // A region offer of --replicas 1 (or an older worker's) names one values half, the server's.
  const auto offer = std::get<PsPushPullRequest>(
      Decoded(EncodeMessage(WorkerHeader(0), PsPushPullRequest{})).body);
  EXPECT_EQ(offer.region_writers, 1);
  EXPECT_EQ(offer.region_writer, 0);
  SparsePushRequest forward{"emb",
                            TensorData::Int64s("row_ids", {3}),
                            TensorData::Floats("values", 0, {1, 2}),
                            1,
                            "tcp://b:2",
                            true,
                            2,
                            9};
  const auto forwarded =
      std::get<SparsePushRequest>(Decoded(EncodeMessage(WorkerHeader(0), forward)).body);
  EXPECT_EQ(forwarded.forward_to, "tcp://b:2");
  EXPECT_TRUE(forwarded.forwarded);
  EXPECT_EQ(forwarded.pushed_by, 2);
  EXPECT_EQ(forwarded.update, 9);
  EXPECT_EQ(forwarded.range, 1);
  const auto reply = std::get<CheckpointReply>(Decoded(EncodeMessage(
      WorkerHeader(0), CheckpointReply{"/ckpt", 12, {"a", "b"}, {1, 2}, {3, 4}})).body);
  EXPECT_EQ(reply.files, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(reply.checksums, (std::vector<uint64_t>{3, 4}));
  const auto pulled = std::get<PsPushPullReply>(
      Decoded(EncodeMessage(WorkerHeader(0),
                            PsPushPullReply{{}, true, "not here", 1, 2, 0, "tcp://c:3"}))
          .body);
  EXPECT_TRUE(pulled.region_mapped);
  EXPECT_EQ(pulled.copied_to, "tcp://c:3");
  EXPECT_EQ(pulled.joining, 0);
  EXPECT_EQ(pulled.skipped_by, 1);
  EXPECT_EQ(pulled.stopped_by, 2);
  EXPECT_EQ(pulled.region_refusal, "not here");
  const auto rows = std::get<SparsePullReply>(
      Decoded(EncodeMessage(WorkerHeader(0),
                            SparsePullReply{"emb", TensorData::Int64s("row_ids", {8}),
                                            TensorData::Floats("values", 0, {5, 6}), "tcp://d:4"}))
          .body);
  EXPECT_EQ(rows.copied_to, "tcp://d:4");
  EXPECT_EQ(rows.values.Read<float>(), (std::vector<float>{5, 6}));
  // A server joining in a failed one's place, and a range copied to it.
  RegisterRequest join{Role::kServer, 1, "tcp://a:1", "", "a", 77, 0};
  join.join = true;
  EXPECT_TRUE(std::get<RegisterRequest>(Decoded(EncodeMessage(WorkerHeader(0), join)).body).join);
  CheckpointRequest export_request{"", 12, false, 1};
  export_request.copy = true;
  const auto exported = std::get<CheckpointRequest>(
      Decoded(EncodeMessage(WorkerHeader(0), export_request)).body);
  EXPECT_TRUE(exported.copy);
  EXPECT_EQ(exported.range, 1);
  EXPECT_TRUE(exported.forward_to.empty());
  EXPECT_EQ(exported.forward_rank, -1);
  export_request.forward_to = "tcp://b:2";
  export_request.forward_rank = 1;
  const auto forwarding =
      std::get<CheckpointRequest>(Decoded(EncodeMessage(WorkerHeader(0), export_request)).body);
  EXPECT_EQ(forwarding.forward_to, "tcp://b:2");
  EXPECT_EQ(forwarding.forward_rank, 1);
  CheckpointReply copy_reply{"", 12, {}, {}, {}};
  copy_reply.tensors.push_back(TensorData::Floats("chunk0.state", 0, {}));
  copy_reply.tensors.push_back(TensorData::Floats("chunk0.state", 0, {1, 2}));
  copy_reply.tensors.push_back(TensorData::Int64s("emb.ids", {7}));
  const auto copied = std::get<CheckpointReply>(
      Decoded(EncodeMessage(WorkerHeader(0), copy_reply)).body);
  ASSERT_EQ(copied.tensors.size(), 3u);
  EXPECT_EQ(copied.tensors[0].name, "chunk0.state");  // no elements (SGD keeps no state)
  EXPECT_TRUE(copied.tensors[0].bytes.empty());
  EXPECT_EQ(copied.tensors[1].Read<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(copied.tensors[2].name, "emb.ids");
  EXPECT_EQ(copied.tensors[2].Read<int64_t>(), (std::vector<int64_t>{7}));
  PsInitRequest init{"{}", {TensorData::Floats("chunk0", 5, {1.5f})}, 99, 1};
  init.copy.push_back(TensorData::Floats("chunk0.values", 0, {4, 5}));
  init.copy_step = 12;
  const auto inited = std::get<PsInitRequest>(Decoded(EncodeMessage(WorkerHeader(0), init)).body);
  EXPECT_EQ(inited.copy_step, 12);
  ASSERT_EQ(inited.copy.size(), 1u);
  EXPECT_EQ(inited.copy[0].name, "chunk0.values");
  EXPECT_EQ(inited.copy[0].Read<float>(), (std::vector<float>{4, 5}));
  ASSERT_EQ(inited.tensors.size(), 1u);
  EXPECT_EQ(inited.tensors[0].Read<float>(), (std::vector<float>{1.5f}));
  const auto clean = std::get<Goodbye>(Decoded(EncodeMessage(WorkerHeader(0), Goodbye{"done"})).body);
  EXPECT_EQ(clean.code, StatusCode::kOk);
  const auto failed = std::get<Goodbye>(Decoded(EncodeMessage(
      WorkerHeader(0), Goodbye{"out of data", StatusCode::kOutOfRange})).body);
  EXPECT_EQ(failed.reason, "out of data");
  EXPECT_EQ(failed.code, StatusCode::kOutOfRange);
}

TEST(WireCodecTest, RoundTripRingFrames) {
  RingFrame data;
  data.kind = RingFrameKind::kData;
  data.tag = 5;
  data.op = CollectiveOp::kReduceScatter;
  data.reduce_op = ReduceOp::kMax;
  data.dtype = DataType::kBFloat16;
  data.buffer_elements = 10;
  data.slot = 3;
  data.block = 2;
  data.element_offset = 6;
  data.element_count = 2;
  data.sequence = 0x1234567800000009;
  data.data = Payload::FromString("abcd");
  RingFrame got = std::get<RingFrame>(Decoded(EncodeMessage(WorkerHeader(1), data)).body);
  EXPECT_EQ(got.kind, RingFrameKind::kData);
  EXPECT_EQ(got.tag, 5u);
  EXPECT_EQ(got.op, CollectiveOp::kReduceScatter);
  EXPECT_EQ(got.reduce_op, ReduceOp::kMax);
  EXPECT_EQ(got.dtype, DataType::kBFloat16);
  EXPECT_EQ(got.buffer_elements, 10u);
  EXPECT_EQ(got.slot, 3u);
  EXPECT_EQ(got.block, 2u);
  EXPECT_EQ(got.element_offset, 6u);
  EXPECT_EQ(got.element_count, 2u);
  EXPECT_EQ(got.sequence, 0x1234567800000009u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data.data()), got.data.size()), "abcd");

  RingFrame abort;
  abort.kind = RingFrameKind::kAbort;
  abort.tag = 5;
  abort.notice = AbortNotice{2, StatusCode::kDeadlineExceeded, "rank 2 timed out"};
  got = std::get<RingFrame>(Decoded(EncodeMessage(WorkerHeader(1), abort)).body);
  EXPECT_EQ(got.kind, RingFrameKind::kAbort);
  EXPECT_EQ(got.notice.origin, 2);
  EXPECT_EQ(got.notice.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.notice.message, "rank 2 timed out");
  EXPECT_TRUE(got.data.empty());

  RingFrame handshake;
  handshake.kind = RingFrameKind::kHandshake;
  got = std::get<RingFrame>(Decoded(EncodeMessage(WorkerHeader(1), handshake)).body);
  EXPECT_EQ(got.kind, RingFrameKind::kHandshake);
}

// Every dtype and every reduce op survives the wire, the data frame's bytes with it (their
// TensorMeta carries the dtype too, checked against the byte count).
TEST(WireCodecTest, RoundTripRingFramesOfEveryDTypeAndReduceOp) {
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kInt64, DataType::kInt32, DataType::kUInt8,
                         DataType::kFloat64, DataType::kInt8, DataType::kBool}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin,
                        ReduceOp::kProduct}) {
      SCOPED_TRACE(std::string(DataTypeName(dtype)) + " " + std::string(ReduceOpName(op)));
      RingFrame data;
      data.kind = RingFrameKind::kData;
      data.op = CollectiveOp::kAllReduce;
      data.reduce_op = op;
      data.dtype = dtype;
      data.buffer_elements = 9;
      data.element_offset = 6;
      data.element_count = 3;
      std::string bytes(3 * DataTypeSize(dtype), '\0');
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i % 2);
      data.data = Payload::FromString(bytes);
      DecodeResult r = DecodeMessage(EncodeMessage(WorkerHeader(1), data), kMax);
      ASSERT_TRUE(r.status.ok()) << r.status;
      const RingFrame& got = std::get<RingFrame>(r.message->body);
      EXPECT_EQ(got.dtype, dtype);
      EXPECT_EQ(got.reduce_op, op);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data.data()), got.data.size()),
                bytes);
    }
  }
}

// The point-to-point frames of torch process groups are marked with ops of their own.
TEST(WireCodecTest, RoundTripRingFramesOfEveryCollectiveOp) {
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kReduceScatter,
                          CollectiveOp::kAllGather, CollectiveOp::kBroadcast,
                          CollectiveOp::kBarrier, CollectiveOp::kSendRecv,
                          CollectiveOp::kAllToAll}) {
    SCOPED_TRACE(std::string(CollectiveOpName(op)));
    RingFrame frame;
    frame.kind = RingFrameKind::kHandshake;
    frame.op = op;
    DecodeResult r = DecodeMessage(EncodeMessage(WorkerHeader(1), frame), kMax);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(std::get<RingFrame>(r.message->body).op, op);
  }
}

// A data frame's bytes must be exactly its element count of its dtype.
TEST(WireCodecTest, RejectsRingFrameWhoseBytesDisagreeWithItsCount) {
  RingFrame data;
  data.element_count = 3;  // float32: 12 bytes expected
  data.data = Payload::FromString("abcd");
  DecodeResult r = DecodeMessage(EncodeMessage(WorkerHeader(1), data), kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kTensor);
}

// The chunk's own count and dtype are what the ring reads: bytes that agree with the data's
// TensorMeta but not with them are refused too (wire_decode_fuzzer found a count of 5 over 2
// elements' bytes, which decoded and then could not be encoded again).
TEST(WireCodecTest, RejectsRingFrameWhoseCountDisagreesWithItsTensor) {
  for (const auto& [count, dtype, kind, expected] :
       std::vector<std::tuple<uint64_t, proto::DType, proto::FrameKind, std::string>>{
           {5, proto::DType::Float32, proto::FrameKind::Data,
            "frame: 5 float32 elements in 8 bytes of data"},
           {2, proto::DType::Float64, proto::FrameKind::Data,
            "frame: 2 float64 elements in 8 bytes of data"},
           {uint64_t{1} << 62, proto::DType::Float32, proto::FrameKind::Data,
            "frame: 4611686018427387904 float32 elements in 8 bytes of data"},
           {2, proto::DType::Float32, proto::FrameKind::Handshake,
            "frame: a handshake frame carries 8 bytes of data"}}) {
    SCOPED_TRACE(expected);
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<float> values = {1.0f, 2.0f};
    std::vector<int64_t> shape = {2};
    auto data = proto::CreateTensorMetaDirect(fbb, "", 0, proto::DType::Float32, &shape, 0, 0, 8);
    proto::CollectiveChunkBuilder chunk(fbb);
    chunk.add_kind(kind);
    chunk.add_dtype(dtype);
    chunk.add_element_count(count);
    chunk.add_data(data);
    auto body = chunk.Finish();
    Message m = RawWith(fbb, body, proto::Role::Worker, {8}, {Payload::Copy(values.data(), 8)});
    DecodeResult r = DecodeMessage(m, kMax);
    EXPECT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find(expected), std::string::npos) << r.status;
  }
}

TEST(WireCodecTest, RejectsOversizedBeforeParsing) {
  Message m = PushOf(std::vector<float>(1000, 1.0f), {1000});
  DecodeResult r = DecodeMessage(m, 1000);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.reason, bad_message_reason::kTooLarge);
  EXPECT_NE(r.status.message().find("exceeds the maximum of 1000 bytes"), std::string::npos)
      << r.status;
}

TEST(WireCodecTest, RejectsEmptyAndTruncatedHeaders) {
  Message empty;
  EXPECT_EQ(DecodeMessage(empty, kMax).reason, bad_message_reason::kEmptyHeader);

  Message good = PushOf({1, 2}, {2});
  // The last few bytes of a FlatBuffer can be alignment padding (at most 7), whose loss does not
  // damage it; every cut that removes real data must be rejected.
  ASSERT_GT(good.header.size(), 8u);
  for (size_t cut = 1; cut + 8 <= good.header.size(); ++cut) {
    Message truncated = good;
    truncated.header = Payload::Copy(good.header.data(), cut);
    DecodeResult r = DecodeMessage(truncated, kMax);
    EXPECT_FALSE(r.status.ok()) << "header truncated to " << cut << " bytes was accepted";
  }
}

TEST(WireCodecTest, RandomBytesNeverCrash) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes(1 + rng() % 256);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    Message m;
    m.header = Payload::FromVector(bytes);
    DecodeResult r = DecodeMessage(m, kMax);
    // Random bytes may by chance form a valid table; what matters is no crash, and a reason
    // for every rejection.
    if (r.status.ok()) {
      EXPECT_TRUE(r.message.has_value());
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
  DecodeResult r = DecodeMessage(RawMessage(fbb), kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kVersion);
  EXPECT_NE(r.status.message().find("server 1"), std::string::npos) << r.status;
}

TEST(WireCodecTest, RejectsEnumsOutsideTheirRange) {
  {
    flatbuffers::FlatBufferBuilder fbb;
    Message m = RawWith(fbb, proto::CreateHeartbeat(fbb, 1), static_cast<proto::Role>(9));
    DecodeResult r = DecodeMessage(m, kMax);
    EXPECT_EQ(r.reason, bad_message_reason::kField);
    EXPECT_NE(r.status.message().find("role 9"), std::string::npos) << r.status;
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto chunk = proto::CreateCollectiveChunk(fbb, proto::FrameKind::Data, 1,
                                              static_cast<proto::CollectiveOp>(7));
    DecodeResult r = DecodeMessage(RawWith(fbb, chunk), kMax);
    EXPECT_EQ(r.reason, bad_message_reason::kField);
    EXPECT_NE(r.status.message().find("collective op 7"), std::string::npos) << r.status;
  }
  {
    // The values after the last ones wire version 3 added.
    flatbuffers::FlatBufferBuilder fbb;
    auto chunk = proto::CreateCollectiveChunk(fbb, proto::FrameKind::Handshake, 1,
                                              proto::CollectiveOp::AllReduce,
                                              static_cast<proto::ReduceOp>(5));
    DecodeResult r = DecodeMessage(RawWith(fbb, chunk), kMax);
    EXPECT_EQ(r.reason, bad_message_reason::kField);
    EXPECT_NE(r.status.message().find("reduce op 5"), std::string::npos) << r.status;
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto chunk = proto::CreateCollectiveChunk(fbb, proto::FrameKind::Handshake, 1,
                                              proto::CollectiveOp::AllReduce,
                                              proto::ReduceOp::Product,
                                              static_cast<proto::DType>(9));
    DecodeResult r = DecodeMessage(RawWith(fbb, chunk), kMax);
    EXPECT_EQ(r.reason, bad_message_reason::kField);
    EXPECT_NE(r.status.message().find("frame dtype 9"), std::string::npos) << r.status;
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<proto::Member>> members = {
        proto::CreateMemberDirect(fbb, proto::Role::Unknown, 0, "tcp://x:1")};
    auto view = proto::CreateFleetViewDirect(fbb, "j", 1, 0, 0, 0, &members);
    DecodeResult r = DecodeMessage(RawWith(fbb, view, proto::Role::Coordinator), kMax);
    EXPECT_EQ(r.reason, bad_message_reason::kField);
    EXPECT_NE(r.status.message().find("member 0 has no role"), std::string::npos) << r.status;
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto view = proto::CreateFleetViewDirect(fbb, "j", 1, 2, 0, 0, nullptr, /*replicas=*/3);
    DecodeResult r = DecodeMessage(RawWith(fbb, view, proto::Role::Coordinator), kMax);
    EXPECT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("3 replicas of each key range for 2 servers"),
              std::string::npos)
        << r.status;
  }
}

TEST(WireCodecTest, RejectsPayloadCountAndLengthMismatch) {
  Message extra = PushOf({1, 2}, {2});
  extra.payloads.push_back(Payload::FromString("surplus"));
  EXPECT_EQ(DecodeMessage(extra, kMax).reason, bad_message_reason::kPayloadCount);

  Message missing = PushOf({1, 2}, {2});
  missing.payloads.clear();
  EXPECT_EQ(DecodeMessage(missing, kMax).reason, bad_message_reason::kPayloadCount);

  Message shorter = PushOf({1, 2}, {2});
  shorter.payloads[0] = Payload::Copy(shorter.payloads[0].data(), 4);
  DecodeResult r = DecodeMessage(shorter, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kPayloadLength);
  EXPECT_NE(r.status.message().find("declares 8 bytes but 4 arrived"), std::string::npos)
      << r.status;
  EXPECT_EQ(r.request_id, 42u);  // so that the ErrorReply answers the request
}

TEST(WireCodecTest, RejectsTensorOutsideItsFrame) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<float> values(4, 1.0f);
  std::vector<int64_t> shape = {8};
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
      fbb, "emb", 0, proto::DType::Float32, &shape, 0, 0, 32)};
  auto body = proto::CreatePsPushPullRequestDirect(fbb, &metas, true, 0);
  Message m = RawWith(fbb, body, proto::Role::Worker, {16}, {Payload::Copy(values.data(), 16)});
  DecodeResult r = DecodeMessage(m, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kTensor);
  EXPECT_NE(r.status.message().find("'emb'"), std::string::npos) << r.status;
}

TEST(WireCodecTest, RejectsShapeThatDisagreesWithLength) {
  Message m = PushOf({1, 2, 3, 4}, {3});  // 3 elements declared, 16 bytes sent
  DecodeResult r = DecodeMessage(m, kMax);
  EXPECT_EQ(r.reason, bad_message_reason::kTensor);
  EXPECT_NE(r.status.message().find("shape holds 3 elements"), std::string::npos) << r.status;
}

TEST(WireCodecTest, ErrorReplyCarriesStatus) {
  Status error = NotFoundError("key 17 is owned by server 1, not server 2");
  MessageHeader header;
  header.sender_role = Role::kServer;
  header.sender_rank = 2;
  header.request_id = 99;
  DecodedMessage d = Decoded(EncodeMessage(header, ErrorReplyOf(error)));
  EXPECT_EQ(d.header.request_id, 99u);
  EXPECT_EQ(StatusOf(std::get<ErrorReply>(d.body)), error);
  // An ErrorReply that claims success is still an error.
  EXPECT_EQ(StatusOf(ErrorReply{StatusCode::kOk, "fine"}).code(), StatusCode::kUnknown);
}

}  // namespace
}  // namespace tessera
