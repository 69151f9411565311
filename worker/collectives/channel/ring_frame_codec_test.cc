#include "worker/collectives/channel/ring_frame_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

// A frame of `kind` whose every header field differs from its default and from the others'.
RingFrame Frame(RingFrameKind kind) {
  RingFrame frame;
  frame.kind = kind;
  frame.sender_rank = 2;
  frame.tag = 0x1122334455667788;
  frame.op = CollectiveOp::kReduceScatter;
  frame.reduce_op = ReduceOp::kMax;
  frame.dtype = DataType::kBFloat16;
  frame.buffer_elements = 0x0102030405060708;
  frame.slot = 0x90a0b0c0;
  if (kind == RingFrameKind::kData) {
    frame.block = 3;
    frame.element_offset = 0x1000000017;
    frame.element_count = 5;
    frame.data = Payload::FromString("0123456789");
  }
  if (kind == RingFrameKind::kAbort) {
    frame.notice = AbortNotice{1, StatusCode::kDeadlineExceeded,
                               "allreduce tag=5 rank=1: no frame from worker 0 (step 0)"};
  }
  return frame;
}

// Encodes `frame` as a direct channel does and decodes it again, payload included.
StatusOr<RingFrame> RoundTrip(const RingFrame& frame) {
  const Payload payload = FramePayload(frame);
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(frame, payload.size(), header);
  RingFrame got;
  uint64_t payload_bytes = 0;
  RETURN_IF_ERROR(DecodeFrameHeader(header, 1 << 20, &got, &payload_bytes));
  if (payload_bytes != payload.size()) return InternalError("the header declares another size");
  RETURN_IF_ERROR(AttachFramePayload(&got, payload));
  return got;
}

// A header of `frame` with byte `at` set to `value`, decoded.
Status DecodeWithByte(const RingFrame& frame, size_t at, uint8_t value) {
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(frame, FramePayload(frame).size(), header);
  header[at] = value;
  RingFrame got;
  uint64_t payload_bytes = 0;
  return DecodeFrameHeader(header, 1 << 20, &got, &payload_bytes);
}

std::string Text(const Payload& payload) {
  return std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
}

TEST(RingFrameCodecTest, EveryHeaderFieldOfEveryKindRoundTrips) {
  for (RingFrameKind kind :
       {RingFrameKind::kData, RingFrameKind::kHandshake, RingFrameKind::kAbort}) {
    SCOPED_TRACE(std::string(RingFrameKindName(kind)));
    const RingFrame sent = Frame(kind);
    StatusOr<RingFrame> got = RoundTrip(sent);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->kind, kind);
    EXPECT_EQ(got->sender_rank, 2);
    EXPECT_EQ(got->tag, sent.tag);
    EXPECT_EQ(got->op, CollectiveOp::kReduceScatter);
    EXPECT_EQ(got->reduce_op, ReduceOp::kMax);
    EXPECT_EQ(got->dtype, DataType::kBFloat16);
    EXPECT_EQ(got->buffer_elements, sent.buffer_elements);
    EXPECT_EQ(got->slot, sent.slot);
    EXPECT_EQ(got->block, sent.block);
    EXPECT_EQ(got->element_offset, sent.element_offset);
    EXPECT_EQ(got->element_count, sent.element_count);
    EXPECT_EQ(Text(got->data), Text(sent.data));
    EXPECT_EQ(got->notice.origin, sent.notice.origin);
    EXPECT_EQ(got->notice.code, sent.notice.code);
    EXPECT_EQ(got->notice.message, sent.notice.message);
  }
}

// Every value of every enum survives the byte it travels in.
TEST(RingFrameCodecTest, EveryEnumValueRoundTrips) {
  RingFrame frame = Frame(RingFrameKind::kHandshake);
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kReduceScatter,
                          CollectiveOp::kAllGather, CollectiveOp::kBroadcast,
                          CollectiveOp::kBarrier, CollectiveOp::kSendRecv,
                          CollectiveOp::kAllToAll}) {
    frame.op = op;
    EXPECT_EQ(RoundTrip(frame)->op, op);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin,
                      ReduceOp::kProduct}) {
    frame.reduce_op = op;
    EXPECT_EQ(RoundTrip(frame)->reduce_op, op);
  }
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                         DataType::kInt64, DataType::kInt32, DataType::kUInt8,
                         DataType::kFloat64, DataType::kInt8, DataType::kBool}) {
    frame.dtype = dtype;
    EXPECT_EQ(RoundTrip(frame)->dtype, dtype);
  }
}

// The payload is the data of a data frame (the same bytes, not a copy), nothing for a
// handshake, and the encoded notice of an abort.
TEST(RingFrameCodecTest, FramePayloadByKind) {
  const RingFrame data = Frame(RingFrameKind::kData);
  EXPECT_EQ(FramePayload(data).data(), data.data.data());
  RingFrame handshake = Frame(RingFrameKind::kHandshake);
  handshake.data = Payload::FromString("ignored");
  EXPECT_TRUE(FramePayload(handshake).empty());
  const RingFrame abort = Frame(RingFrameKind::kAbort);
  EXPECT_EQ(FramePayload(abort).size(), 8 + abort.notice.message.size());
}

TEST(RingFrameCodecTest, AnAbortNoticeRoundTripsThroughItsPayload) {
  RingFrame abort = Frame(RingFrameKind::kAbort);
  abort.notice = AbortNotice{7, StatusCode::kInvalidArgument, std::string("a\0b", 3)};
  StatusOr<RingFrame> got = RoundTrip(abort);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->notice.origin, 7);
  EXPECT_EQ(got->notice.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(got->notice.message, std::string("a\0b", 3));
  EXPECT_TRUE(got->data.empty());
  // An empty message is a notice all the same.
  abort.notice.message.clear();
  got = RoundTrip(abort);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->notice.message, "");
}

// A notice must describe a failure: an OK code, or one this build does not know, arrives as
// Unknown rather than as a failure that reads like success.
TEST(RingFrameCodecTest, ANoticeWithoutAFailureCodeArrivesAsUnknown) {
  for (int code : {0, 7, 99}) {
    RingFrame abort = Frame(RingFrameKind::kAbort);
    abort.notice.code = static_cast<StatusCode>(code);
    StatusOr<RingFrame> got = RoundTrip(abort);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->notice.code, StatusCode::kUnknown) << "code " << code;
  }
}

TEST(RingFrameCodecTest, RejectsABadMagic) {
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(Frame(RingFrameKind::kHandshake), 0, header);
  std::memcpy(header, "GET ", 4);
  RingFrame got;
  uint64_t payload_bytes = 0;
  Status decoded = DecodeFrameHeader(header, 1000, &got, &payload_bytes);
  EXPECT_EQ(decoded.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.message(),
            "a frame header starts with 0x20544547, not the ring frame magic (is another "
            "program connected?)");
}

TEST(RingFrameCodecTest, RejectsAPayloadOverTheCap) {
  const RingFrame frame = Frame(RingFrameKind::kData);
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(frame, 100, header);
  RingFrame got;
  uint64_t payload_bytes = 0;
  EXPECT_EQ(DecodeFrameHeader(header, 99, &got, &payload_bytes).message(),
            "a frame declares 100 payload bytes, more than the limit of 99");
  EXPECT_TRUE(DecodeFrameHeader(header, 100, &got, &payload_bytes).ok());
  EXPECT_EQ(payload_bytes, 100u);
}

TEST(RingFrameCodecTest, RejectsEachEnumOutOfRange) {
  const RingFrame frame = Frame(RingFrameKind::kHandshake);
  // The first values after the last ones (alltoall, product, bool).
  EXPECT_EQ(DecodeWithByte(frame, 24, 7).message(),
            "a frame header's collective op 7 is outside its range");
  EXPECT_EQ(DecodeWithByte(frame, 25, 5).message(),
            "a frame header's reduce op 5 is outside its range");
  EXPECT_EQ(DecodeWithByte(frame, 26, 9).message(),
            "a frame header's dtype 9 is outside its range");
  EXPECT_EQ(DecodeWithByte(frame, 26, 255).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeWithByte(frame, 27, 3).message(),
            "a frame header's kind 3 is outside its range");
  EXPECT_EQ(DecodeWithByte(frame, 27, 255).code(), StatusCode::kInvalidArgument);
}

TEST(RingFrameCodecTest, RejectsANoticeTooShortForItsFields) {
  RingFrame got = Frame(RingFrameKind::kAbort);
  Status attached = AttachFramePayload(&got, Payload::FromString("1234567"));
  EXPECT_EQ(attached.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(attached.message(),
            "an abort frame's notice has 7 bytes, fewer than its fields need");
  got = Frame(RingFrameKind::kAbort);
  EXPECT_EQ(AttachFramePayload(&got, Payload()).message(),
            "an abort frame's notice has 0 bytes, fewer than its fields need");
}

TEST(RingFrameCodecTest, RejectsAHandshakeWithAPayload) {
  RingFrame got = Frame(RingFrameKind::kHandshake);
  Status attached = AttachFramePayload(&got, Payload::FromString("xyz"));
  EXPECT_EQ(attached.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(attached.message(), "a handshake frame carries 3 payload bytes");
  EXPECT_TRUE(AttachFramePayload(&got, Payload()).ok());
}

}  // namespace
}  // namespace tessera::worker
