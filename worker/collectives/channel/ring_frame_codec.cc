#include "worker/collectives/channel/ring_frame_codec.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

constexpr uint32_t kFrameMagic = 0x4c525354;  // "TSRL"
constexpr size_t kNoticeFieldBytes = 8;         // origin i32, code u32

template <typename T>
void Put(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

Status OutOfRange(const char* field, int value) {
  return InvalidArgumentError(std::string("a frame header's ") + field + " " +
                              std::to_string(value) + " is outside its range");
}

}  // namespace

Payload FramePayload(const RingFrame& frame) {
  switch (frame.kind) {
    case RingFrameKind::kData: return frame.data;
    case RingFrameKind::kHandshake: return Payload();
    case RingFrameKind::kAbort: break;
  }
  const std::string& message = frame.notice.message;
  std::vector<uint8_t> bytes(kNoticeFieldBytes + message.size());
  Put<int32_t>(bytes.data(), frame.notice.origin);
  Put<uint32_t>(bytes.data() + 4, static_cast<uint32_t>(frame.notice.code));
  std::memcpy(bytes.data() + kNoticeFieldBytes, message.data(), message.size());
  return Payload::FromVector(std::move(bytes));
}

void EncodeFrameHeader(const RingFrame& frame, uint64_t payload_bytes, uint8_t* header) {
  std::memset(header, 0, kFrameHeaderBytes);
  Put<uint32_t>(header, kFrameMagic);
  Put<int32_t>(header + 4, frame.sender_rank);
  Put<uint64_t>(header + 8, frame.tag);
  Put<uint32_t>(header + 16, frame.slot);
  Put<uint32_t>(header + 20, frame.block);
  header[24] = static_cast<uint8_t>(frame.op);
  header[25] = static_cast<uint8_t>(frame.reduce_op);
  header[26] = static_cast<uint8_t>(frame.dtype);
  header[27] = static_cast<uint8_t>(frame.kind);
  Put<uint64_t>(header + 32, frame.element_offset);
  Put<uint64_t>(header + 40, frame.element_count);
  Put<uint64_t>(header + 48, frame.buffer_elements);
  Put<uint64_t>(header + 56, payload_bytes);
}

Status DecodeFrameHeader(const uint8_t* header, size_t max_payload_bytes, RingFrame* frame,
                         uint64_t* payload_bytes) {
  const uint32_t magic = Get<uint32_t>(header);
  if (magic != kFrameMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    return InvalidArgumentError("a frame header starts with " + std::string(hex) +
                                ", not the ring frame magic (is another program connected?)");
  }
  *payload_bytes = Get<uint64_t>(header + 56);
  if (*payload_bytes > max_payload_bytes) {
    return InvalidArgumentError("a frame declares " + std::to_string(*payload_bytes) +
                                " payload bytes, more than the limit of " +
                                std::to_string(max_payload_bytes));
  }
  const auto op = static_cast<CollectiveOp>(header[24]);
  const auto reduce_op = static_cast<ReduceOp>(header[25]);
  const auto dtype = static_cast<DataType>(header[26]);
  const auto kind = static_cast<RingFrameKind>(header[27]);
  if (CollectiveOpName(op) == "invalid") return OutOfRange("collective op", header[24]);
  if (ReduceOpName(reduce_op) == "invalid") return OutOfRange("reduce op", header[25]);
  if (DataTypeSize(dtype) == 0) return OutOfRange("dtype", header[26]);
  if (RingFrameKindName(kind) == "invalid") return OutOfRange("kind", header[27]);
  *frame = RingFrame();
  frame->kind = kind;
  frame->sender_rank = Get<int32_t>(header + 4);
  frame->tag = Get<uint64_t>(header + 8);
  frame->slot = Get<uint32_t>(header + 16);
  frame->block = Get<uint32_t>(header + 20);
  frame->op = op;
  frame->reduce_op = reduce_op;
  frame->dtype = dtype;
  frame->element_offset = Get<uint64_t>(header + 32);
  frame->element_count = Get<uint64_t>(header + 40);
  frame->buffer_elements = Get<uint64_t>(header + 48);
  return OkStatus();
}

Status AttachFramePayload(RingFrame* frame, Payload payload) {
  switch (frame->kind) {
    case RingFrameKind::kData:
      frame->data = std::move(payload);
      return OkStatus();
    case RingFrameKind::kHandshake:
      if (!payload.empty()) {
        return InvalidArgumentError("a handshake frame carries " +
                                    std::to_string(payload.size()) + " payload bytes");
      }
      return OkStatus();
    case RingFrameKind::kAbort: break;
  }
  if (payload.size() < kNoticeFieldBytes) {
    return InvalidArgumentError("an abort frame's notice has " + std::to_string(payload.size()) +
                                " bytes, fewer than its fields need");
  }
  frame->notice.origin = Get<int32_t>(payload.data());
  const auto code = static_cast<StatusCode>(Get<uint32_t>(payload.data() + 4));
  frame->notice.code = code == StatusCode::kOk || StatusCodeName(code) == "UNKNOWN"
                           ? StatusCode::kUnknown
                           : code;
  frame->notice.message.assign(reinterpret_cast<const char*>(payload.data()) + kNoticeFieldBytes,
                               payload.size() - kNoticeFieldBytes);
  return OkStatus();
}

}  // namespace tessera::worker
