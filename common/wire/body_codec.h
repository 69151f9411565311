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

// Whether a vector's elements are aligned for their type. FlatBuffers' Verifier (2.0.8) checks
// the alignment of a vector's 4-byte length but not of the 8-byte elements after it, so a
// crafted header can place an [int64] where reading one is a misaligned load (undefined
// behaviour; found by wire_decode_fuzzer). Builders always align them: such a header is
// refused before a vector of 8-byte scalars is read.
template <typename T>
bool ElementsAligned(const flatbuffers::Vector<T>* vector) {
  // An empty vector has nothing to read (builders do not align its empty data).
  return vector == nullptr || vector->size() == 0 ||
         reinterpret_cast<uintptr_t>(vector->Data()) % alignof(T) == 0;
}

// Role and DataType as the wire has them (used by the header codec too).
proto::Role WireRole(std::optional<Role> role);
// None for Unknown; InvalidArgument for values outside the enum.
StatusOr<std::optional<Role>> RoleOf(proto::Role role);
std::optional<DataType> DataTypeOf(proto::DType dtype);

}  // namespace tessera::wire

#endif  // TESSERA_COMMON_WIRE_BODY_CODEC_H_
