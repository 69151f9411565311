#include "common/wire/body_codec.h"

#include <string>
#include <utility>

namespace tessera::wire {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

// More elements than any frame's bytes could hold: a count beyond it cannot match its data, and
// multiplying it by an element's size could overflow.
constexpr uint64_t kMaxFrameElements = uint64_t{1} << 40;

// ---------------------------------------------------------------------------------------------
// Enums. Inbound values are checked: the FlatBuffers Verifier does not look at enum ranges.

Status OutOfRange(const std::string& field, int value) {
  return InvalidArgumentError(field + " " + std::to_string(value) + " is outside its range");
}

proto::DType WireDType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return proto::DType::Float32;
    case DataType::kFloat16: return proto::DType::Float16;
    case DataType::kBFloat16: return proto::DType::BFloat16;
    case DataType::kInt64: return proto::DType::Int64;
    case DataType::kInt32: return proto::DType::Int32;
    case DataType::kUInt8: return proto::DType::UInt8;
    case DataType::kFloat64: return proto::DType::Float64;
    case DataType::kInt8: return proto::DType::Int8;
    case DataType::kBool: return proto::DType::Bool;
  }
  return proto::DType::Float32;
}

StatusOr<DataType> DataTypeField(proto::DType dtype, const std::string& field) {
  std::optional<DataType> converted = DataTypeOf(dtype);
  if (!converted.has_value()) return OutOfRange(field + " dtype", static_cast<int>(dtype));
  return *converted;
}

StatusOr<Role> MemberRole(proto::Role role, const std::string& field) {
  ASSIGN_OR_RETURN(std::optional<Role> converted, RoleOf(role));
  if (!converted.has_value()) {
    return InvalidArgumentError(field + " has no role (coordinator, server or worker)");
  }
  return *converted;
}

proto::MemberState WireState(MemberState state) {
  switch (state) {
    case MemberState::kJoining: return proto::MemberState::Joining;
    case MemberState::kAlive: return proto::MemberState::Alive;
    case MemberState::kFailed: return proto::MemberState::Failed;
    case MemberState::kLeft: return proto::MemberState::Left;
  }
  return proto::MemberState::Joining;
}

StatusOr<MemberState> StateOf(proto::MemberState state) {
  switch (state) {
    case proto::MemberState::Joining: return MemberState::kJoining;
    case proto::MemberState::Alive: return MemberState::kAlive;
    case proto::MemberState::Failed: return MemberState::kFailed;
    case proto::MemberState::Left: return MemberState::kLeft;
  }
  return OutOfRange("member state", static_cast<int>(state));
}

proto::CollectiveOp WireOp(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return proto::CollectiveOp::AllReduce;
    case CollectiveOp::kReduceScatter: return proto::CollectiveOp::ReduceScatter;
    case CollectiveOp::kAllGather: return proto::CollectiveOp::AllGather;
    case CollectiveOp::kBroadcast: return proto::CollectiveOp::Broadcast;
    case CollectiveOp::kBarrier: return proto::CollectiveOp::Barrier;
    case CollectiveOp::kSendRecv: return proto::CollectiveOp::SendRecv;
    case CollectiveOp::kAllToAll: return proto::CollectiveOp::AllToAll;
  }
  return proto::CollectiveOp::AllReduce;
}

StatusOr<CollectiveOp> OpOf(proto::CollectiveOp op) {
  switch (op) {
    case proto::CollectiveOp::AllReduce: return CollectiveOp::kAllReduce;
    case proto::CollectiveOp::ReduceScatter: return CollectiveOp::kReduceScatter;
    case proto::CollectiveOp::AllGather: return CollectiveOp::kAllGather;
    case proto::CollectiveOp::Broadcast: return CollectiveOp::kBroadcast;
    case proto::CollectiveOp::Barrier: return CollectiveOp::kBarrier;
    case proto::CollectiveOp::SendRecv: return CollectiveOp::kSendRecv;
    case proto::CollectiveOp::AllToAll: return CollectiveOp::kAllToAll;
  }
  return OutOfRange("collective op", static_cast<int>(op));
}

proto::ReduceOp WireReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return proto::ReduceOp::Sum;
    case ReduceOp::kAverage: return proto::ReduceOp::Average;
    case ReduceOp::kMax: return proto::ReduceOp::Max;
    case ReduceOp::kMin: return proto::ReduceOp::Min;
    case ReduceOp::kProduct: return proto::ReduceOp::Product;
  }
  return proto::ReduceOp::Sum;
}

StatusOr<ReduceOp> ReduceOpOf(proto::ReduceOp op) {
  switch (op) {
    case proto::ReduceOp::Sum: return ReduceOp::kSum;
    case proto::ReduceOp::Average: return ReduceOp::kAverage;
    case proto::ReduceOp::Max: return ReduceOp::kMax;
    case proto::ReduceOp::Min: return ReduceOp::kMin;
    case proto::ReduceOp::Product: return ReduceOp::kProduct;
  }
  return OutOfRange("reduce op", static_cast<int>(op));
}

proto::FrameKind WireKind(RingFrameKind kind) {
  switch (kind) {
    case RingFrameKind::kData: return proto::FrameKind::Data;
    case RingFrameKind::kHandshake: return proto::FrameKind::Handshake;
    case RingFrameKind::kAbort: return proto::FrameKind::Abort;
  }
  return proto::FrameKind::Data;
}

StatusOr<RingFrameKind> KindOf(proto::FrameKind kind) {
  switch (kind) {
    case proto::FrameKind::Data: return RingFrameKind::kData;
    case proto::FrameKind::Handshake: return RingFrameKind::kHandshake;
    case proto::FrameKind::Abort: return RingFrameKind::kAbort;
  }
  return OutOfRange("frame kind", static_cast<int>(kind));
}

// Any code outside StatusCode becomes kUnknown (an error stays an error).
StatusCode CodeOf(proto::ErrorCode code) {
  const auto status_code = static_cast<StatusCode>(code);
  if (code == proto::ErrorCode::Ok) return StatusCode::kOk;
  if (StatusCodeName(status_code) == "UNKNOWN") return StatusCode::kUnknown;
  return status_code;
}

std::string Str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

// ---------------------------------------------------------------------------------------------
// Tensors

Offset<proto::TensorMeta> EncodeTensor(FlatBufferBuilder& fbb, TensorData tensor,
                                       std::vector<Payload>* payloads) {
  int32_t frame = -1;
  const uint64_t length = tensor.bytes.size();
  if (length > 0) {
    frame = static_cast<int32_t>(payloads->size());
    payloads->push_back(std::move(tensor.bytes));
  }
  return proto::CreateTensorMetaDirect(fbb, tensor.name.c_str(), tensor.key,
                                       WireDType(tensor.dtype), &tensor.shape, frame, 0, length);
}

std::vector<Offset<proto::TensorMeta>> EncodeTensors(FlatBufferBuilder& fbb,
                                                     std::vector<TensorData> tensors,
                                                     std::vector<Payload>* payloads) {
  std::vector<Offset<proto::TensorMeta>> metas;
  metas.reserve(tensors.size());
  for (TensorData& tensor : tensors) metas.push_back(EncodeTensor(fbb, std::move(tensor), payloads));
  return metas;
}

// A verified TensorMeta (wire_codec.cc checked its slice and dtype) as a TensorData viewing
// its frame; a missing one is an empty tensor.
TensorData DecodeTensor(const proto::TensorMeta* meta, const Message& message) {
  TensorData tensor;
  if (meta == nullptr) return tensor;
  tensor.name = Str(meta->name());
  tensor.key = meta->key();
  tensor.dtype = DataTypeOf(meta->dtype()).value_or(DataType::kFloat32);
  if (meta->shape() != nullptr) tensor.shape.assign(meta->shape()->begin(), meta->shape()->end());
  if (meta->payload() >= 0 && meta->byte_length() > 0) {
    const Payload& frame = message.payloads[static_cast<size_t>(meta->payload())];
    tensor.bytes = Payload::Borrow(frame.data() + meta->offset(), meta->byte_length(),
                                   frame.owner());
  }
  return tensor;
}

std::vector<TensorData> DecodeTensors(
    const flatbuffers::Vector<Offset<proto::TensorMeta>>* metas, const Message& message) {
  std::vector<TensorData> tensors;
  if (metas == nullptr) return tensors;
  tensors.reserve(metas->size());
  for (const proto::TensorMeta* meta : *metas) tensors.push_back(DecodeTensor(meta, message));
  return tensors;
}

// ---------------------------------------------------------------------------------------------
// Encoding, one overload per body

using Encoded = std::pair<proto::Body, Offset<void>>;

template <typename Table>
Encoded As(Offset<Table> table) {
  // A copy of the constant: binding the static member to the pair's reference parameter would
  // need its out-of-line definition, which flatc does not emit (links only when inlined).
  return {proto::Body(proto::BodyTraits<Table>::enum_value), table.Union()};
}

class BodyEncoder {
 public:
  BodyEncoder(FlatBufferBuilder& fbb, std::vector<Payload>* payloads)
      : fbb_(fbb), payloads_(payloads) {}

  Encoded operator()(RegisterRequest& b) {
    return As(proto::CreateRegisterRequestDirect(fbb_, WireRole(b.role), b.requested_rank,
                                                 b.address.c_str(), b.metrics_address.c_str(),
                                                 b.host.c_str(), b.pid, b.num_workers, b.join));
  }
  Encoded operator()(FleetView& b) {
    std::vector<Offset<proto::Member>> members;
    for (const MemberInfo& m : b.members) {
      members.push_back(proto::CreateMemberDirect(
          fbb_, WireRole(m.role), m.rank, m.address.c_str(), m.metrics_address.c_str(),
          m.host.c_str(), m.pid, WireState(m.state), m.key_begin, m.key_end));
    }
    return As(proto::CreateFleetViewDirect(fbb_, b.job.c_str(), b.epoch, b.num_servers,
                                           b.num_workers, b.key_space, &members, b.replicas));
  }
  Encoded operator()(Heartbeat& b) { return As(proto::CreateHeartbeat(fbb_, b.sequence)); }
  Encoded operator()(HeartbeatAck& b) { return As(proto::CreateHeartbeatAck(fbb_, b.epoch)); }
  Encoded operator()(FailureNotice& b) {
    return As(proto::CreateFailureNoticeDirect(fbb_, WireRole(b.role), b.rank,
                                               b.address.c_str(), b.reason.c_str(),
                                               b.membership_epoch, b.membership_step,
                                               b.world_size, b.joined));
  }
  Encoded operator()(BarrierRequest& b) {
    return As(proto::CreateBarrierRequestDirect(fbb_, b.name.c_str(), b.generation,
                                                b.timeout_ms, WireRole(b.scope)));
  }
  Encoded operator()(BarrierRelease& b) {
    return As(proto::CreateBarrierReleaseDirect(fbb_, b.name.c_str(), b.generation));
  }
  Encoded operator()(Goodbye& b) {
    return As(proto::CreateGoodbyeDirect(fbb_, b.reason.c_str(),
                                         static_cast<proto::ErrorCode>(b.code)));
  }
  Encoded operator()(PsInitRequest& b) {
    auto tensors = EncodeTensors(fbb_, std::move(b.tensors), payloads_);
    auto copy = EncodeTensors(fbb_, std::move(b.copy), payloads_);
    return As(proto::CreatePsInitRequestDirect(fbb_, b.config.c_str(), &tensors, b.job_token,
                                               b.range, &copy, b.copy_step));
  }
  Encoded operator()(PsPushPullRequest& b) {
    auto tensors = EncodeTensors(fbb_, std::move(b.tensors), payloads_);
    return As(proto::CreatePsPushPullRequestDirect(
        fbb_, &tensors, b.has_gradients, b.job_token, b.model.empty() ? nullptr : b.model.c_str(),
        b.region_pid, b.region_fd, b.region_token_high, b.region_token_low, b.in_region, b.skip,
        b.stop, b.range, b.ack_only, b.join, b.forward_to.empty() ? nullptr : b.forward_to.c_str(),
        b.forwarded, b.dropped_by, b.stopped_by, b.joining, b.pushed_by,
        b.updates.empty() ? nullptr : &b.updates, b.region_writers, b.region_writer));
  }
  Encoded operator()(PsPushPullReply& b) {
    auto tensors = EncodeTensors(fbb_, std::move(b.tensors), payloads_);
    return As(proto::CreatePsPushPullReplyDirect(
        fbb_, &tensors, b.region_mapped,
        b.region_refusal.empty() ? nullptr : b.region_refusal.c_str(), b.skipped_by, b.stopped_by,
        b.joining, b.copied_to.empty() ? nullptr : b.copied_to.c_str()));
  }
  Encoded operator()(SparsePushRequest& b) {
    auto ids = EncodeTensor(fbb_, std::move(b.row_ids), payloads_);
    auto values = EncodeTensor(fbb_, std::move(b.values), payloads_);
    return As(proto::CreateSparsePushRequestDirect(
        fbb_, b.table.c_str(), ids, values, b.range,
        b.forward_to.empty() ? nullptr : b.forward_to.c_str(), b.forwarded, b.pushed_by, b.update));
  }
  Encoded operator()(SparsePullRequest& b) {
    auto ids = EncodeTensor(fbb_, std::move(b.row_ids), payloads_);
    return As(proto::CreateSparsePullRequestDirect(fbb_, b.table.c_str(), ids, b.range));
  }
  Encoded operator()(SparsePullReply& b) {
    auto ids = EncodeTensor(fbb_, std::move(b.row_ids), payloads_);
    auto values = EncodeTensor(fbb_, std::move(b.values), payloads_);
    return As(proto::CreateSparsePullReplyDirect(
        fbb_, b.table.c_str(), ids, values, b.copied_to.empty() ? nullptr : b.copied_to.c_str()));
  }
  Encoded operator()(CheckpointRequest& b) {
    return As(proto::CreateCheckpointRequestDirect(
        fbb_, b.directory.c_str(), b.step, b.restore, b.range, b.copy,
        b.forward_to.empty() ? nullptr : b.forward_to.c_str(), b.forward_rank));
  }
  Encoded operator()(CheckpointReply& b) {
    std::vector<Offset<flatbuffers::String>> files;
    for (const std::string& file : b.files) files.push_back(fbb_.CreateString(file));
    auto tensors = EncodeTensors(fbb_, std::move(b.tensors), payloads_);
    return As(proto::CreateCheckpointReplyDirect(fbb_, b.directory.c_str(), b.step, &files,
                                                 &b.bytes, &b.checksums, &tensors));
  }
  Encoded operator()(RingFrame& b) {
    Offset<proto::TensorMeta> data;
    if (b.kind == RingFrameKind::kData) {
      TensorData tensor{"", 0, b.dtype, {static_cast<int64_t>(b.element_count)},
                        std::move(b.data)};
      data = EncodeTensor(fbb_, std::move(tensor), payloads_);
    }
    Offset<flatbuffers::String> message;
    if (b.kind == RingFrameKind::kAbort) message = fbb_.CreateString(b.notice.message);
    proto::CollectiveChunkBuilder chunk(fbb_);
    chunk.add_kind(WireKind(b.kind));
    chunk.add_tag(b.tag);
    chunk.add_op(WireOp(b.op));
    chunk.add_reduce_op(WireReduceOp(b.reduce_op));
    chunk.add_dtype(WireDType(b.dtype));
    chunk.add_buffer_elements(b.buffer_elements);
    chunk.add_slot(b.slot);
    chunk.add_block(b.block);
    chunk.add_element_offset(b.element_offset);
    chunk.add_element_count(b.element_count);
    chunk.add_sequence(b.sequence);
    if (!data.IsNull()) chunk.add_data(data);
    if (b.kind == RingFrameKind::kAbort) {
      chunk.add_abort_origin(b.notice.origin);
      chunk.add_abort_code(static_cast<proto::ErrorCode>(b.notice.code));
      chunk.add_abort_message(message);
    }
    return As(chunk.Finish());
  }
  Encoded operator()(Ack& b) { return As(proto::CreateAckDirect(fbb_, b.detail.c_str())); }
  Encoded operator()(ErrorReply& b) {
    return As(proto::CreateErrorReplyDirect(fbb_, static_cast<proto::ErrorCode>(b.code),
                                            b.message.c_str()));
  }

 private:
  FlatBufferBuilder& fbb_;
  std::vector<Payload>* payloads_;
};

// ---------------------------------------------------------------------------------------------
// Decoding, one function per body

StatusOr<MessageBody> DecodeFleetView(const proto::FleetView& wire) {
  FleetView view;
  view.job = Str(wire.job());
  view.epoch = wire.epoch();
  view.num_servers = wire.num_servers();
  view.num_workers = wire.num_workers();
  view.key_space = wire.key_space();
  view.replicas = wire.replicas();
  if (view.replicas < 1 || (view.num_servers > 0 && view.replicas > view.num_servers)) {
    return InvalidArgumentError("fleet view: " + std::to_string(view.replicas) +
                                " replicas of each key range for " +
                                std::to_string(view.num_servers) + " servers");
  }
  if (wire.members() != nullptr) {
    for (const proto::Member* m : *wire.members()) {
      MemberInfo info;
      const std::string field = "member " + std::to_string(view.members.size());
      ASSIGN_OR_RETURN(info.role, MemberRole(m->role(), field));
      ASSIGN_OR_RETURN(info.state, StateOf(m->state()));
      info.rank = m->rank();
      info.address = Str(m->address());
      info.metrics_address = Str(m->metrics_address());
      info.host = Str(m->host());
      info.pid = m->pid();
      info.key_begin = m->key_begin();
      info.key_end = m->key_end();
      view.members.push_back(std::move(info));
    }
  }
  return MessageBody(std::move(view));
}

StatusOr<MessageBody> DecodeRingFrame(const proto::CollectiveChunk& wire,
                                      const Message& message) {
  RingFrame frame;
  ASSIGN_OR_RETURN(frame.kind, KindOf(wire.kind()));
  frame.tag = wire.tag();
  ASSIGN_OR_RETURN(frame.op, OpOf(wire.op()));
  ASSIGN_OR_RETURN(frame.reduce_op, ReduceOpOf(wire.reduce_op()));
  ASSIGN_OR_RETURN(frame.dtype, DataTypeField(wire.dtype(), "frame"));
  frame.buffer_elements = wire.buffer_elements();
  frame.slot = wire.slot();
  frame.block = wire.block();
  frame.element_offset = wire.element_offset();
  frame.element_count = wire.element_count();
  frame.sequence = wire.sequence();
  frame.data = DecodeTensor(wire.data(), message).bytes;
  // A data frame's bytes are exactly its elements; other kinds carry none (the ring checks the
  // count against the call, so these are what makes the two agree).
  if (frame.kind == RingFrameKind::kData) {
    const uint64_t element_bytes = DataTypeSize(frame.dtype);
    if (frame.element_count > kMaxFrameElements ||
        frame.data.size() != frame.element_count * element_bytes) {
      return InvalidArgumentError("frame: " + std::to_string(frame.element_count) + " " +
                                  std::string(DataTypeName(frame.dtype)) + " elements in " +
                                  std::to_string(frame.data.size()) + " bytes of data");
    }
  } else if (!frame.data.empty()) {
    return InvalidArgumentError("frame: a " + std::string(RingFrameKindName(frame.kind)) +
                                " frame carries " +
                                std::to_string(frame.data.size()) + " bytes of data");
  }
  if (frame.kind == RingFrameKind::kAbort) {
    frame.notice.origin = wire.abort_origin();
    frame.notice.code = CodeOf(wire.abort_code());
    if (frame.notice.code == StatusCode::kOk) frame.notice.code = StatusCode::kUnknown;
    frame.notice.message = Str(wire.abort_message());
  }
  return MessageBody(std::move(frame));
}

}  // namespace

proto::Role WireRole(std::optional<Role> role) {
  if (!role.has_value()) return proto::Role::Unknown;
  switch (*role) {
    case Role::kCoordinator: return proto::Role::Coordinator;
    case Role::kServer: return proto::Role::Server;
    case Role::kWorker: return proto::Role::Worker;
  }
  return proto::Role::Unknown;
}

StatusOr<std::optional<Role>> RoleOf(proto::Role role) {
  switch (role) {
    case proto::Role::Unknown: return std::optional<Role>();
    case proto::Role::Coordinator: return std::optional<Role>(Role::kCoordinator);
    case proto::Role::Server: return std::optional<Role>(Role::kServer);
    case proto::Role::Worker: return std::optional<Role>(Role::kWorker);
  }
  return OutOfRange("role", static_cast<int>(role));
}

std::optional<DataType> DataTypeOf(proto::DType dtype) {
  switch (dtype) {
    case proto::DType::Float32: return DataType::kFloat32;
    case proto::DType::Float16: return DataType::kFloat16;
    case proto::DType::BFloat16: return DataType::kBFloat16;
    case proto::DType::Int64: return DataType::kInt64;
    case proto::DType::Int32: return DataType::kInt32;
    case proto::DType::UInt8: return DataType::kUInt8;
    case proto::DType::Float64: return DataType::kFloat64;
    case proto::DType::Int8: return DataType::kInt8;
    case proto::DType::Bool: return DataType::kBool;
  }
  return std::nullopt;
}

std::pair<proto::Body, flatbuffers::Offset<void>> EncodeBody(FlatBufferBuilder& fbb,
                                                             MessageBody body,
                                                             std::vector<Payload>* payloads) {
  return std::visit(BodyEncoder(fbb, payloads), body);
}

StatusOr<MessageBody> DecodeBody(const proto::Header& header, const Message& message) {
  switch (header.body_type()) {
    case proto::Body::RegisterRequest: {
      const auto& b = *header.body_as_RegisterRequest();
      RegisterRequest body;
      ASSIGN_OR_RETURN(body.role, MemberRole(b.role(), "the registering process"));
      body.requested_rank = b.requested_rank();
      body.address = Str(b.address());
      body.metrics_address = Str(b.metrics_address());
      body.host = Str(b.host());
      body.pid = b.pid();
      body.num_workers = b.num_workers();
      body.join = b.join();
      return MessageBody(std::move(body));
    }
    case proto::Body::FleetView: return DecodeFleetView(*header.body_as_FleetView());
    case proto::Body::Heartbeat: return MessageBody(Heartbeat{header.body_as_Heartbeat()->sequence()});
    case proto::Body::HeartbeatAck: return MessageBody(HeartbeatAck{header.body_as_HeartbeatAck()->epoch()});
    case proto::Body::FailureNotice: {
      const auto& b = *header.body_as_FailureNotice();
      FailureNotice body;
      ASSIGN_OR_RETURN(body.role, MemberRole(b.role(), "the failed process"));
      body.rank = b.rank();
      body.address = Str(b.address());
      body.reason = Str(b.reason());
      body.membership_epoch = b.membership_epoch();
      body.membership_step = b.membership_step();
      body.world_size = b.world_size();
      body.joined = b.joined();
      return MessageBody(std::move(body));
    }
    case proto::Body::BarrierRequest: {
      const auto& b = *header.body_as_BarrierRequest();
      BarrierRequest body;
      body.name = Str(b.name());
      body.generation = b.generation();
      body.timeout_ms = b.timeout_ms();
      ASSIGN_OR_RETURN(body.scope, RoleOf(b.scope()));
      return MessageBody(std::move(body));
    }
    case proto::Body::BarrierRelease: {
      const auto& b = *header.body_as_BarrierRelease();
      return MessageBody(BarrierRelease{Str(b.name()), b.generation()});
    }
    case proto::Body::Goodbye: {
      const auto& b = *header.body_as_Goodbye();
      return MessageBody(Goodbye{Str(b.reason()), CodeOf(b.code())});
    }
    case proto::Body::PsInitRequest: {
      const auto& b = *header.body_as_PsInitRequest();
      return MessageBody(PsInitRequest{Str(b.config()), DecodeTensors(b.tensors(), message),
                                       b.job_token(), b.range(),
                                       DecodeTensors(b.copy(), message), b.copy_step()});
    }
    case proto::Body::PsPushPullRequest: {
      const auto& b = *header.body_as_PsPushPullRequest();
      if (!ElementsAligned(b.updates())) {
        return InvalidArgumentError("push-pull request: a misaligned vector of update numbers");
      }
      PsPushPullRequest body{DecodeTensors(b.tensors(), message),
                             b.has_gradients(),
                             b.job_token(),
                             Str(b.model()),
                             b.region_pid(),
                             b.region_fd(),
                             b.region_token_high(),
                             b.region_token_low(),
                             b.in_region(),
                             b.skip(),
                             b.stop(),
                             b.range(),
                             b.ack_only(),
                             b.join(),
                             Str(b.forward_to()),
                             b.forwarded(),
                             b.dropped_by(),
                             b.stopped_by(),
                             b.joining(),
                             b.pushed_by()};
      if (b.updates() != nullptr) body.updates.assign(b.updates()->begin(), b.updates()->end());
      body.region_writers = b.region_writers();
      body.region_writer = b.region_writer();
      return MessageBody(std::move(body));
    }
    case proto::Body::PsPushPullReply: {
      const auto& b = *header.body_as_PsPushPullReply();
      return MessageBody(PsPushPullReply{DecodeTensors(b.tensors(), message), b.region_mapped(),
                                         Str(b.region_refusal()), b.skipped_by(), b.stopped_by(),
                                         b.joining(), Str(b.copied_to())});
    }
    case proto::Body::SparsePushRequest: {
      const auto& b = *header.body_as_SparsePushRequest();
      return MessageBody(SparsePushRequest{
          Str(b.table()), DecodeTensor(b.row_ids(), message), DecodeTensor(b.values(), message),
          b.range(), Str(b.forward_to()), b.forwarded(), b.pushed_by(), b.update()});
    }
    case proto::Body::SparsePullRequest: {
      const auto& b = *header.body_as_SparsePullRequest();
      return MessageBody(
          SparsePullRequest{Str(b.table()), DecodeTensor(b.row_ids(), message), b.range()});
    }
    case proto::Body::SparsePullReply: {
      const auto& b = *header.body_as_SparsePullReply();
      return MessageBody(SparsePullReply{Str(b.table()), DecodeTensor(b.row_ids(), message),
                                         DecodeTensor(b.values(), message), Str(b.copied_to())});
    }
    case proto::Body::CheckpointRequest: {
      const auto& b = *header.body_as_CheckpointRequest();
      return MessageBody(CheckpointRequest{Str(b.directory()), b.step(), b.restore(), b.range(),
                                           b.copy(), Str(b.forward_to()), b.forward_rank()});
    }
    case proto::Body::CheckpointReply: {
      const auto& b = *header.body_as_CheckpointReply();
      CheckpointReply body;
      body.directory = Str(b.directory());
      body.step = b.step();
      if (b.files() != nullptr) {
        for (const flatbuffers::String* file : *b.files()) body.files.push_back(Str(file));
      }
      if (!ElementsAligned(b.bytes()) || !ElementsAligned(b.checksums())) {
        return InvalidArgumentError("checkpoint reply: a misaligned vector of sizes or checksums");
      }
      if (b.bytes() != nullptr) body.bytes.assign(b.bytes()->begin(), b.bytes()->end());
      if (b.checksums() != nullptr) {
        body.checksums.assign(b.checksums()->begin(), b.checksums()->end());
      }
      body.tensors = DecodeTensors(b.tensors(), message);
      return MessageBody(std::move(body));
    }
    case proto::Body::CollectiveChunk:
      return DecodeRingFrame(*header.body_as_CollectiveChunk(), message);
    case proto::Body::Ack: return MessageBody(Ack{Str(header.body_as_Ack()->detail())});
    case proto::Body::ErrorReply: {
      const auto& b = *header.body_as_ErrorReply();
      return MessageBody(ErrorReply{CodeOf(b.code()), Str(b.message())});
    }
    case proto::Body::NONE: break;
  }
  return InvalidArgumentError("no known body (type " +
                              std::to_string(static_cast<int>(header.body_type())) + ")");
}

}  // namespace tessera::wire
