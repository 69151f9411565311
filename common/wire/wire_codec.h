// The wire layer: the one place where messages (common/messages) become bytes and bytes become
// trusted messages. Only this package sees the FlatBuffers schema (proto/wire.fbs); Bazel
// visibility keeps it so.
//
// A message on the wire is one header frame (a FlatBuffers tessera.proto.Header) and zero or
// more payload frames: every TensorData with bytes travels as a frame of its own, sent without
// a copy where its Payload owns its bytes.
//
// Inbound, DecodeMessage checks before anything is used: the size cap first (the FlatBuffers
// 2.0.8 Verifier asserts on buffers of 2 GiB or more), then the header with the FlatBuffers
// Verifier, the envelope version, the declared payload lengths against the frames actually
// received, every TensorData's slice against its frame and its dtype x shape, and every enum
// against its range. Only then does it convert the header into plain values; tensor bytes stay
// in their frames (TensorData::bytes views them).
//
// Thread-safety: free functions, thread-safe.
#ifndef TESSERA_COMMON_WIRE_WIRE_CODEC_H_
#define TESSERA_COMMON_WIRE_WIRE_CODEC_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/messages/message.h"

namespace tessera {

// Envelope version; receivers reject any other. Bump on incompatible schema changes.
// 2: PushRequest/PullRequest gone, PullReply is PsPushPullReply, CollectiveChunk has a kind.
// 3: DType Float64, Int8 and Bool, ReduceOp Product (torch.distributed's dtypes and ops): a
//    version-2 peer would reject them as out of range only once a call used them, mid-job,
//    instead of at the first message.
inline constexpr uint16_t kWireVersion = 3;

// Largest header we accept, independent of the message cap: headers carry metadata only.
inline constexpr uint64_t kMaxHeaderBytes = 16u << 20;

// The reason labels of tessera_bad_messages_total: one per way a message can be malformed.
namespace bad_message_reason {
inline constexpr std::string_view kTooLarge = "too_large";
inline constexpr std::string_view kEmptyHeader = "empty_header";
inline constexpr std::string_view kMalformedHeader = "malformed_header";
inline constexpr std::string_view kVersion = "version";
inline constexpr std::string_view kNoBody = "no_body";
inline constexpr std::string_view kPayloadCount = "payload_count";
inline constexpr std::string_view kPayloadLength = "payload_length";
inline constexpr std::string_view kTensor = "tensor";
inline constexpr std::string_view kField = "field";  // an enum outside its range
inline constexpr std::string_view kFraming = "framing";
}  // namespace bad_message_reason

struct DecodedMessage {
  MessageHeader header;
  MessageBody body;
};

struct DecodeResult {
  Status status;            // OK, or what is wrong, in words
  std::string_view reason;  // a bad_message_reason label when !status.ok()
  // The request id of a header that parsed but failed a later check (0 when it did not
  // parse), so the ErrorReply can answer the request it is about.
  uint64_t request_id = 0;
  std::optional<DecodedMessage> message;  // set when status is OK
};

// REQUIRES: max_message_bytes < 2 GiB (ProcessConfig validates it); the header frame's bytes
// are 8-byte aligned (FlatBuffers reads them in place).
DecodeResult DecodeMessage(const Message& message, uint64_t max_message_bytes);

// The frames of `body` with `header`'s fields. Tensor bytes are moved into payload frames.
Message EncodeMessage(const MessageHeader& header, MessageBody body);

}  // namespace tessera

#endif  // TESSERA_COMMON_WIRE_WIRE_CODEC_H_
