#include "common/wire/wire_codec.h"

#include <limits>
#include <utility>

#include "common/wire/body_codec.h"
#include "proto/wire_generated.h"

namespace tessera {
namespace {

DecodeResult Bad(std::string_view reason, std::string message) {
  DecodeResult result;
  result.status = InvalidArgumentError(std::move(message));
  result.reason = reason;
  return result;
}

// Bytes per element of `dtype`; 0 for a value outside the enum.
size_t DTypeSize(proto::DType dtype) {
  std::optional<DataType> converted = wire::DataTypeOf(dtype);
  return converted.has_value() ? DataTypeSize(*converted) : 0;
}

bool ValidDType(proto::DType dtype) { return DTypeSize(dtype) != 0; }

std::string_view BodyName(proto::Body body) {
  const char* name = proto::EnumNameBody(body);
  return name == nullptr || *name == '\0' ? std::string_view("invalid") : std::string_view(name);
}

// "worker 3", "coordinator", "unknown sender" (for a header whose role is out of range too).
std::string DescribeSender(const proto::Header& header) {
  MessageHeader described;
  StatusOr<std::optional<Role>> role = wire::RoleOf(header.sender_role());
  if (role.ok()) described.sender_role = *role;
  described.sender_rank = header.sender_rank();
  return described.DescribeSender();
}

// Checks one TensorMeta: dtype, shape, and (when bytes travel) that its slice lies inside its
// payload frame and holds exactly dtype x shape bytes.
Status VerifyTensor(const proto::TensorMeta* tensor, const Message& message,
                    std::string_view field) {
  std::string where = std::string(field);
  if (tensor == nullptr) return InvalidArgumentError(where + ": missing");
  if (tensor->name() != nullptr) where += " '" + tensor->name()->str() + "'";
  if (!ValidDType(tensor->dtype())) {
    return InvalidArgumentError(where + ": unknown dtype " +
                                std::to_string(static_cast<int>(tensor->dtype())));
  }
  if (!wire::ElementsAligned(tensor->shape())) {
    return InvalidArgumentError(where + ": misaligned shape");
  }
  uint64_t elements = 1;
  if (tensor->shape() != nullptr) {
    for (int64_t dim : *tensor->shape()) {
      if (dim < 0) return InvalidArgumentError(where + ": negative dimension " + std::to_string(dim));
      if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
        return InvalidArgumentError(where + ": shape overflows");
      }
      elements *= static_cast<uint64_t>(dim);
    }
  }
  int32_t index = tensor->payload();
  if (index < 0) return OkStatus();  // metadata only (a pull request)
  if (static_cast<size_t>(index) >= message.payloads.size()) {
    return InvalidArgumentError(where + ": payload frame " + std::to_string(index) +
                                " does not exist (message has " +
                                std::to_string(message.payloads.size()) + ")");
  }
  uint64_t frame = message.payloads[index].size();
  uint64_t offset = tensor->offset();
  uint64_t length = tensor->byte_length();
  if (offset > frame || length > frame - offset) {
    return InvalidArgumentError(where + ": bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset) + "+" + std::to_string(length) +
                                ") exceed payload frame " + std::to_string(index) + " of " +
                                std::to_string(frame) + " bytes");
  }
  size_t element_size = DTypeSize(tensor->dtype());
  if (elements > std::numeric_limits<uint64_t>::max() / element_size ||
      elements * element_size != length) {
    return InvalidArgumentError(where + ": shape holds " + std::to_string(elements) +
                                " elements of " + std::to_string(element_size) +
                                " bytes but byte_length is " + std::to_string(length));
  }
  return OkStatus();
}

Status VerifyTensorList(
    const flatbuffers::Vector<flatbuffers::Offset<proto::TensorMeta>>* tensors,
    const Message& message, std::string_view field) {
  if (tensors == nullptr) return OkStatus();
  for (flatbuffers::uoffset_t i = 0; i < tensors->size(); ++i) {
    RETURN_IF_ERROR(
        VerifyTensor(tensors->Get(i), message, std::string(field) + "[" + std::to_string(i) + "]"));
  }
  return OkStatus();
}

// The TensorMetas of every body that carries tensor bytes.
Status VerifyBodyTensors(const proto::Header& header, const Message& message) {
  switch (header.body_type()) {
    case proto::Body::PsPushPullReply:
      return VerifyTensorList(header.body_as_PsPushPullReply()->tensors(), message, "tensors");
    case proto::Body::SparsePushRequest: {
      auto* body = header.body_as_SparsePushRequest();
      RETURN_IF_ERROR(VerifyTensor(body->row_ids(), message, "row_ids"));
      return VerifyTensor(body->values(), message, "values");
    }
    case proto::Body::SparsePullRequest:
      return VerifyTensor(header.body_as_SparsePullRequest()->row_ids(), message, "row_ids");
    case proto::Body::SparsePullReply: {
      auto* body = header.body_as_SparsePullReply();
      RETURN_IF_ERROR(VerifyTensor(body->row_ids(), message, "row_ids"));
      return VerifyTensor(body->values(), message, "values");
    }
    case proto::Body::CollectiveChunk: {
      const proto::TensorMeta* data = header.body_as_CollectiveChunk()->data();
      return data == nullptr ? OkStatus() : VerifyTensor(data, message, "data");  // handshake
    }
    case proto::Body::PsInitRequest:
      return VerifyTensorList(header.body_as_PsInitRequest()->tensors(), message, "tensors");
    case proto::Body::PsPushPullRequest:
      return VerifyTensorList(header.body_as_PsPushPullRequest()->tensors(), message, "tensors");
    default:
      return OkStatus();
  }
}

// The checks after the FlatBuffers Verifier accepted the header.
DecodeResult VerifyTail(const proto::Header* header, const Message& message) {
  namespace reason = bad_message_reason;
  if (header->version() != kWireVersion) {
    return Bad(reason::kVersion, "wire version " + std::to_string(header->version()) +
                                     " from " + DescribeSender(*header) + ", expected " +
                                     std::to_string(kWireVersion));
  }
  if (header->body_type() == proto::Body::NONE || header->body() == nullptr ||
      BodyName(header->body_type()) == "invalid") {
    return Bad(reason::kNoBody, "header from " + DescribeSender(*header) +
                                    " has no known body (type " +
                                    std::to_string(static_cast<int>(header->body_type())) + ")");
  }
  if (!wire::ElementsAligned(header->payload_lengths())) {
    return Bad(reason::kMalformedHeader, std::string(BodyName(header->body_type())) + " from " +
                                             DescribeSender(*header) +
                                             ": misaligned payload lengths");
  }
  size_t declared = header->payload_lengths() ? header->payload_lengths()->size() : 0;
  if (declared != message.payloads.size()) {
    return Bad(reason::kPayloadCount, std::string(BodyName(header->body_type())) + " from " +
                                          DescribeSender(*header) + " declares " +
                                          std::to_string(declared) + " payload frames but " +
                                          std::to_string(message.payloads.size()) + " arrived");
  }
  for (size_t i = 0; i < declared; ++i) {
    uint64_t length = header->payload_lengths()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (length != message.payloads[i].size()) {
      return Bad(reason::kPayloadLength,
                 std::string(BodyName(header->body_type())) + " from " + DescribeSender(*header) +
                     ": payload frame " + std::to_string(i) + " declares " +
                     std::to_string(length) + " bytes but " +
                     std::to_string(message.payloads[i].size()) + " arrived");
    }
  }
  Status tensors = VerifyBodyTensors(*header, message);
  if (!tensors.ok()) {
    return Bad(reason::kTensor, std::string(BodyName(header->body_type())) + " from " +
                                    DescribeSender(*header) + ": " + tensors.message());
  }
  return DecodeResult();
}

}  // namespace

DecodeResult DecodeMessage(const Message& message, uint64_t max_message_bytes) {
  namespace reason = bad_message_reason;
  uint64_t total = message.TotalBytes();
  if (total > max_message_bytes) {
    return Bad(reason::kTooLarge, "message of " + std::to_string(total) +
                                      " bytes exceeds the maximum of " +
                                      std::to_string(max_message_bytes) + " bytes");
  }
  if (message.header.empty()) return Bad(reason::kEmptyHeader, "empty header frame");
  if (message.header.size() > kMaxHeaderBytes) {
    return Bad(reason::kTooLarge, "header frame of " + std::to_string(message.header.size()) +
                                      " bytes exceeds the maximum of " +
                                      std::to_string(kMaxHeaderBytes) + " bytes");
  }
  flatbuffers::Verifier verifier(message.header.data(), message.header.size(),
                                 /*max_depth=*/16, /*max_tables=*/1u << 20);
  if (!proto::VerifyHeaderBuffer(verifier)) {
    return Bad(reason::kMalformedHeader,
               "header frame of " + std::to_string(message.header.size()) +
                   " bytes is not a valid tessera.proto.Header");
  }
  const proto::Header* header = proto::GetHeader(message.header.data());
  DecodeResult result = VerifyTail(header, message);
  result.request_id = header->request_id();
  if (!result.status.ok()) return result;

  const std::string what = std::string(BodyName(header->body_type())) + " from " +
                           DescribeSender(*header);
  StatusOr<std::optional<Role>> role = wire::RoleOf(header->sender_role());
  if (!role.ok()) return Bad(reason::kField, what + ": sender " + role.status().message());
  StatusOr<MessageBody> body = wire::DecodeBody(*header, message);
  if (!body.ok()) return Bad(reason::kField, what + ": " + body.status().message());
  DecodedMessage decoded;
  decoded.header.sender_role = *role;
  decoded.header.sender_rank = header->sender_rank();
  decoded.header.request_id = header->request_id();
  decoded.header.step = header->step();
  decoded.body = std::move(body).value();
  result.message = std::move(decoded);
  return result;
}

Message EncodeMessage(const MessageHeader& header, MessageBody body) {
  flatbuffers::FlatBufferBuilder fbb;
  Message message;
  auto [type, encoded] = wire::EncodeBody(fbb, std::move(body), &message.payloads);
  std::vector<uint64_t> lengths;
  lengths.reserve(message.payloads.size());
  for (const Payload& p : message.payloads) lengths.push_back(p.size());
  auto lengths_offset = fbb.CreateVector(lengths);
  proto::HeaderBuilder builder(fbb);
  builder.add_version(kWireVersion);
  builder.add_sender_role(wire::WireRole(header.sender_role));
  builder.add_sender_rank(header.sender_rank);
  builder.add_request_id(header.request_id);
  builder.add_step(header.step);
  builder.add_body_type(type);
  builder.add_body(encoded);
  builder.add_payload_lengths(lengths_offset);
  proto::FinishHeaderBuffer(fbb, builder.Finish());

  auto buffer = std::make_shared<flatbuffers::DetachedBuffer>(fbb.Release());
  const uint8_t* data = buffer->data();
  const size_t size = buffer->size();
  message.header = Payload::Borrow(data, size, std::move(buffer));
  return message;
}

}  // namespace tessera
