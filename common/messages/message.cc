#include "common/messages/message.h"

namespace tessera {

MessageBody::MessageBody() = default;
MessageBody::MessageBody(const MessageBody& other) = default;
MessageBody::MessageBody(MessageBody&& other) noexcept = default;
MessageBody& MessageBody::operator=(const MessageBody& other) = default;
MessageBody& MessageBody::operator=(MessageBody&& other) noexcept = default;
MessageBody::~MessageBody() = default;

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kRegisterRequest: return "RegisterRequest";
    case MessageType::kFleetView: return "FleetView";
    case MessageType::kHeartbeat: return "Heartbeat";
    case MessageType::kHeartbeatAck: return "HeartbeatAck";
    case MessageType::kFailureNotice: return "FailureNotice";
    case MessageType::kBarrierRequest: return "BarrierRequest";
    case MessageType::kBarrierRelease: return "BarrierRelease";
    case MessageType::kGoodbye: return "Goodbye";
    case MessageType::kPsInitRequest: return "PsInitRequest";
    case MessageType::kPsPushPullRequest: return "PsPushPullRequest";
    case MessageType::kPsPushPullReply: return "PsPushPullReply";
    case MessageType::kSparsePushRequest: return "SparsePushRequest";
    case MessageType::kSparsePullRequest: return "SparsePullRequest";
    case MessageType::kSparsePullReply: return "SparsePullReply";
    case MessageType::kCheckpointRequest: return "CheckpointRequest";
    case MessageType::kCheckpointReply: return "CheckpointReply";
    case MessageType::kRingFrame: return "RingFrame";
    case MessageType::kAck: return "Ack";
    case MessageType::kErrorReply: return "ErrorReply";
  }
  return "invalid";
}

std::string MessageHeader::DescribeSender() const {
  if (!sender_role.has_value()) return "unknown sender";
  if (*sender_role == Role::kCoordinator || sender_rank < 0) {
    return std::string(RoleName(*sender_role));
  }
  return MemberName(*sender_role, sender_rank);
}

Status StatusOf(const ErrorReply& reply) {
  std::string message = reply.message.empty() ? "(no message)" : reply.message;
  if (reply.code == StatusCode::kOk) return Status(StatusCode::kUnknown, std::move(message));
  return Status(reply.code, std::move(message));
}

ErrorReply ErrorReplyOf(const Status& status) { return ErrorReply{status.code(), status.message()}; }

}  // namespace tessera
