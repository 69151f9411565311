// The conversions between every message body and its FlatBuffers table, for wire_codec.cc.
// Internal to common/wire.
#ifndef TESSERA_COMMON_WIRE_BODY_CODEC_H_
#define TESSERA_COMMON_WIRE_BODY_CODEC_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/messages/message.h"
#include "proto/wire_generated.h"

namespace tessera::wire {

// The body of a verified header (its tensors' slices checked against `message`'s frames).
// InvalidArgument naming the field for an enum outside its range.
StatusOr<MessageBody> DecodeBody(const proto::Header& header, const Message& message);

// Builds `body` into `fbb`; tensor bytes are appended to `payloads`.
std::pair<proto::Body, flatbuffers::Offset<void>> EncodeBody(
    flatbuffers::FlatBufferBuilder& fbb, MessageBody body, std::vector<Payload>* payloads);

// Role and DataType as the wire has them (used by the header codec too).
proto::Role WireRole(std::optional<Role> role);
// None for Unknown; InvalidArgument for values outside the enum.
StatusOr<std::optional<Role>> RoleOf(proto::Role role);
std::optional<DataType> DataTypeOf(proto::DType dtype);

}  // namespace tessera::wire

#endif  // TESSERA_COMMON_WIRE_BODY_CODEC_H_
