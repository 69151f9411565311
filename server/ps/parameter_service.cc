#include "server/ps/parameter_service.h"

#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/wire/wire_codec.h"

namespace tessera::server {
namespace {

constexpr proto::Role kRole = proto::Role::Server;

std::string NameOf(const proto::TensorMeta& meta) {
  return meta.name() == nullptr ? std::string() : meta.name()->str();
}

std::vector<int64_t> ShapeOf(const proto::TensorMeta& meta) {
  if (meta.shape() == nullptr) return {};
  return std::vector<int64_t>(meta.shape()->begin(), meta.shape()->end());
}

// The pushed tensor `meta` as a TensorValue borrowing its slice of the payload frame. The
// transport's verification already checked that the slice lies inside the frame and matches
// dtype x shape; what is left is what this store accepts.
StatusOr<TensorValue> ToTensorValue(const proto::TensorMeta& meta, const Message& message) {
  TensorValue value;
  value.name = NameOf(meta);
  value.key = meta.key();
  value.shape = ShapeOf(meta);
  if (value.name.empty()) {
    return InvalidArgumentError("a tensor with key " + std::to_string(value.key) + " has no name");
  }
  if (meta.dtype() != proto::DType::Float32) {
    return InvalidArgumentError("tensor '" + value.name + "' has dtype " +
                                proto::EnumNameDType(meta.dtype()) +
                                "; this server stores Float32 only");
  }
  if (meta.payload() < 0) {
    return InvalidArgumentError("tensor '" + value.name + "' carries no bytes (payload -1)");
  }
  const Payload& frame = message.payloads[static_cast<size_t>(meta.payload())];
  value.bytes = Payload::Borrow(frame.data() + meta.offset(), meta.byte_length(), frame.owner());
  return value;
}

Status StorePush(TensorStore& store, const proto::PushRequest& push, const Message& message) {
  std::vector<TensorValue> values;
  if (push.tensors() != nullptr) {
    for (const proto::TensorMeta* meta : *push.tensors()) {
      ASSIGN_OR_RETURN(TensorValue value, ToTensorValue(*meta, message));
      values.push_back(std::move(value));
    }
  }
  return store.Put(values);
}

std::string RequestContext(std::string_view what, const TensorStore& store,
                           const Envelope& request) {
  return std::string(what) + " from " + DescribeSender(*request.header) + " to server " +
         std::to_string(store.server_rank());
}

// Sends `reply` on the connection `envelope` arrived on. A failure (the requester vanished) is
// only logged: the requester's own deadline reports it on the other side.
void Answer(RpcEndpoint* endpoint, const Envelope& envelope, Message reply) {
  Status sent = endpoint->transport().Reply(envelope.origin, std::move(reply));
  if (!sent.ok()) {
    TLOG(WARNING) << "cannot answer " << BodyName(envelope.header->body_type()) << " from "
                  << DescribeSender(*envelope.header) << ": " << sent;
  }
}

}  // namespace

Message ServePush(TensorStore& store, const Envelope& request) {
  uint64_t id = request.header->request_id();
  const proto::PushRequest* push = request.header->body_as_PushRequest();
  Status stored = push == nullptr ? InvalidArgumentError("not a PushRequest")
                                  : StorePush(store, *push, request.message);
  if (!stored.ok()) {
    return MakeErrorReply(kRole, store.server_rank(), id,
                          stored.WithContext(RequestContext("push", store, request)));
  }
  size_t count = push->tensors() == nullptr ? 0 : push->tensors()->size();
  MessageBuilder builder(kRole, store.server_rank());
  std::string detail = "stored " + std::to_string(count) + " tensors on server " +
                       std::to_string(store.server_rank());
  return builder.Finish(proto::CreateAckDirect(builder.fbb(), detail.c_str()), id);
}

Message ServePull(const TensorStore& store, const Envelope& request) {
  uint64_t id = request.header->request_id();
  const proto::PullRequest* pull = request.header->body_as_PullRequest();
  if (pull == nullptr) {
    return MakeErrorReply(kRole, store.server_rank(), id, InvalidArgumentError("not a PullRequest"));
  }
  std::vector<StoredTensor> found;
  if (pull->tensors() != nullptr) {
    for (const proto::TensorMeta* meta : *pull->tensors()) {
      StatusOr<StoredTensor> tensor = store.Get(meta->key(), NameOf(*meta));
      if (!tensor.ok()) {
        return MakeErrorReply(kRole, store.server_rank(), id,
                              tensor.status().WithContext(RequestContext("pull", store, request)));
      }
      found.push_back(std::move(tensor).value());
    }
  }
  MessageBuilder builder(kRole, store.server_rank());
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
  for (const StoredTensor& tensor : found) {
    // The frame borrows the store's buffer: immutable, and kept alive by the reference the
    // Payload holds until ZeroMQ has sent it, even if a push replaces the value meanwhile.
    const std::vector<uint8_t>& bytes = *tensor.bytes;
    int32_t frame = builder.AddPayload(Payload::Borrow(bytes.data(), bytes.size(), tensor.bytes));
    metas.push_back(proto::CreateTensorMetaDirect(builder.fbb(), tensor.name.c_str(), tensor.key,
                                                  proto::DType::Float32, &tensor.shape, frame, 0,
                                                  bytes.size()));
  }
  return builder.Finish(proto::CreatePullReplyDirect(builder.fbb(), &metas), id);
}

void InstallParameterService(RpcEndpoint* endpoint, std::shared_ptr<TensorStore> store) {
  endpoint->SetHandler(proto::Body::PushRequest, [endpoint, store](Envelope envelope) {
    if (!envelope.origin.IsRequest()) {
      TLOG(WARNING) << "ignored a PushRequest from " << DescribeSender(*envelope.header)
                    << " that did not arrive as a request";
      return;
    }
    Answer(endpoint, envelope, ServePush(*store, envelope));
  });
  endpoint->SetHandler(proto::Body::PullRequest, [endpoint, store](Envelope envelope) {
    if (!envelope.origin.IsRequest()) {
      TLOG(WARNING) << "ignored a PullRequest from " << DescribeSender(*envelope.header)
                    << " that did not arrive as a request";
      return;
    }
    Answer(endpoint, envelope, ServePull(*store, envelope));
  });
}

}  // namespace tessera::server
