// Message: every message Tessera's processes exchange, as plain values: a header (who sent
// it, which request it is or answers, the training step) and one body of the types below.
//
// The wire layer (common/wire) is the only code that turns these into bytes and back; it
// verifies every inbound message before a body exists. Everything else builds and reads
// these structs.
//
//   Envelope reply = ...;                       // from RpcEndpoint::Call
//   const FleetView* view = reply.As<FleetView>();
//   if (view == nullptr) return UnexpectedBody<FleetView>(reply, "registration");
//
// Thread-safety: value types.
#ifndef TESSERA_COMMON_MESSAGES_MESSAGE_H_
#define TESSERA_COMMON_MESSAGES_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/base/role.h"
#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/messages/ps_messages.h"
#include "common/messages/rendezvous_messages.h"
#include "common/messages/ring_frame.h"

namespace tessera {

struct Ack {
  std::string detail;
};

// A request failed: the reply that carries its Status.
struct ErrorReply {
  StatusCode code = StatusCode::kUnknown;
  std::string message;
};

// Every body, in the order of MessageType.
using MessageBodyVariant =
    std::variant<RegisterRequest, FleetView, Heartbeat, HeartbeatAck, FailureNotice,
                 BarrierRequest, BarrierRelease, Goodbye, PsInitRequest, PsPushPullRequest,
                 PsPushPullReply, SparsePushRequest, SparsePullRequest, SparsePullReply,
                 CheckpointRequest, CheckpointReply, RingFrame, Ack, ErrorReply>;

// The variant above (std::get, std::get_if, std::holds_alternative and std::visit take it as
// it is), as a class whose copy, move and destruction are defined once, in message.cc. As an
// alias, every source that passed a message compiled the variant's visits over its 19 bodies
// again: about 1.5 CPU-seconds in each of 16 sources of the quickstart's build (issue 43; a
// clean build of //tools:tessera-launch went from 87.0 s to 81.0 s on a 2-core machine).
class MessageBody : public MessageBodyVariant {
 public:
  MessageBody();
  // One body, by its exact type (no conversions: a body is named, never guessed).
  template <typename Body, typename = std::enable_if_t<
                               !std::is_same_v<std::decay_t<Body>, MessageBody>>>
  MessageBody(Body&& body)  // NOLINT: implicit, as the variant's own
      : MessageBodyVariant(std::in_place_type<std::decay_t<Body>>, std::forward<Body>(body)) {}
  MessageBody(const MessageBody& other);
  MessageBody(MessageBody&& other) noexcept;
  MessageBody& operator=(const MessageBody& other);
  MessageBody& operator=(MessageBody&& other) noexcept;
  ~MessageBody();
};

enum class MessageType {
  kRegisterRequest,
  kFleetView,
  kHeartbeat,
  kHeartbeatAck,
  kFailureNotice,
  kBarrierRequest,
  kBarrierRelease,
  kGoodbye,
  kPsInitRequest,
  kPsPushPullRequest,
  kPsPushPullReply,
  kSparsePushRequest,
  kSparsePullRequest,
  kSparsePullReply,
  kCheckpointRequest,
  kCheckpointReply,
  kRingFrame,
  kAck,
  kErrorReply,
};
inline constexpr size_t kMessageTypeCount = std::variant_size_v<MessageBodyVariant>;
static_assert(static_cast<size_t>(MessageType::kErrorReply) + 1 == kMessageTypeCount,
              "MessageType and MessageBody list the bodies in the same order");

// The type of a body value, and of a body struct.
inline MessageType TypeOf(const MessageBody& body) {
  return static_cast<MessageType>(body.index());
}
template <typename Body, size_t I = 0>
constexpr MessageType TypeOfBody() {
  static_assert(I < kMessageTypeCount, "not a message body");
  if constexpr (std::is_same_v<std::variant_alternative_t<I, MessageBodyVariant>, Body>) {
    return static_cast<MessageType>(I);
  } else {
    return TypeOfBody<Body, I + 1>();
  }
}

// "RegisterRequest", "RingFrame", ... ("invalid" outside the enum): for logs, errors, and the
// `type` label of metrics.
std::string_view MessageTypeName(MessageType type);

struct MessageHeader {
  std::optional<Role> sender_role;  // none: a sender that did not say (a foreign client)
  int32_t sender_rank = -1;
  uint64_t request_id = 0;  // a reply carries the id of the request it answers
  int64_t step = -1;        // the training step the message belongs to (-1: none)

  // "worker 2", "coordinator", "unknown sender".
  std::string DescribeSender() const;
};

// A message to send: the sender fields of its header are the transport's identity.
struct OutgoingMessage {
  uint64_t request_id = 0;
  int64_t step = -1;
  MessageBody body;
};

// The Status an ErrorReply carries (never OK: an ErrorReply with code OK is Unknown), and back.
Status StatusOf(const ErrorReply& reply);
ErrorReply ErrorReplyOf(const Status& status);

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_MESSAGE_H_
