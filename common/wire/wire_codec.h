// The one place where wire bytes become trusted structures, and where headers are built.
//
// Every inbound message passes VerifyMessage before anything reads it: the size cap is checked
// first (the FlatBuffers 2.0.8 Verifier asserts on buffers of 2 GiB or more), then the header
// with the FlatBuffers Verifier, the envelope version, the declared payload lengths against the
// frames actually received, and every TensorMeta's slice against its frame and its dtype x
// shape. Only then may code call GetHeader-style accessors on it.
//
// Thread-safety: free functions are thread-safe; a MessageBuilder is used by one thread.
#ifndef TESSERA_COMMON_WIRE_WIRE_CODEC_H_
#define TESSERA_COMMON_WIRE_WIRE_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/payload.h"
#include "common/base/status.h"
#include "proto/wire_generated.h"

namespace tessera {

// Envelope version; receivers reject any other. Bump on incompatible schema changes.
inline constexpr uint16_t kWireVersion = 1;

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
inline constexpr std::string_view kFraming = "framing";
}  // namespace bad_message_reason

struct VerifyResult {
  Status status;                             // OK, or what is wrong, in words
  std::string_view reason;                   // a bad_message_reason label when !status.ok()
  const proto::Header* header = nullptr;     // valid while the message's header bytes live
  // The request id of a header that parsed but failed a later check (0 otherwise), so the
  // ErrorReply can answer the request it is about.
  uint64_t request_id = 0;
};

// REQUIRES: max_message_bytes < 2 GiB (ProcessConfig validates it).
VerifyResult VerifyMessage(const Message& message, uint64_t max_message_bytes);

// Bytes per element of `dtype`; 0 for a value outside the enum.
size_t DTypeSize(proto::DType dtype);
// Number of Body union values, NONE included: the size of a table indexed by body type.
inline constexpr size_t kBodyTypeCount = static_cast<size_t>(proto::Body::MAX) + 1;
std::string_view RoleLabel(proto::Role role);  // "coordinator", "server", "worker", ...
// "worker 2", "coordinator", "unknown sender".
std::string DescribeSender(const proto::Header& header);
std::string_view BodyName(proto::Body body);

// Builds one outbound message: header fields, a body table, and payload frames.
//
//   MessageBuilder b(proto::Role::Worker, rank);
//   int32_t frame = b.AddPayload(Payload::Borrow(grad, bytes, owner));
//   auto meta = proto::CreateTensorMetaDirect(b.fbb(), "w", 0, proto::DType::Float32, &shape,
//                                             frame, 0, bytes);
//   Message m = b.Finish(proto::CreatePushRequestDirect(b.fbb(), &metas), request_id, step);
class MessageBuilder {
 public:
  MessageBuilder(proto::Role role, int32_t rank) : role_(role), rank_(rank) {}

  flatbuffers::FlatBufferBuilder& fbb() { return fbb_; }
  // Appends a payload frame and returns its index for TensorMeta.payload.
  int32_t AddPayload(Payload payload) {
    message_.payloads.push_back(std::move(payload));
    return static_cast<int32_t>(message_.payloads.size() - 1);
  }

  template <typename Table>
  Message Finish(flatbuffers::Offset<Table> body, uint64_t request_id, int64_t step = -1) {
    return FinishWith(proto::BodyTraits<Table>::enum_value, body.Union(), request_id, step);
  }

 private:
  Message FinishWith(proto::Body type, flatbuffers::Offset<void> body, uint64_t request_id,
                     int64_t step);

  proto::Role role_;
  int32_t rank_;
  flatbuffers::FlatBufferBuilder fbb_;
  Message message_;
};

// An ErrorReply carrying `status` (code and message), answering `request_id`.
Message MakeErrorReply(proto::Role role, int32_t rank, uint64_t request_id, const Status& status);

// The Status an ErrorReply describes (never OK: an ErrorReply with code Ok is Unknown).
Status StatusFromErrorReply(const proto::ErrorReply& reply);

}  // namespace tessera

#endif  // TESSERA_COMMON_WIRE_WIRE_CODEC_H_
