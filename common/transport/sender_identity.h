// SenderIdentity: who a transport's process is (role and rank), for the header of every
// message it sends. Backends hold one; SetIdentity changes it when a process learns its rank.
//
// Thread-safety: thread-safe (a sender's role and rank are read together).
#ifndef TESSERA_COMMON_TRANSPORT_SENDER_IDENTITY_H_
#define TESSERA_COMMON_TRANSPORT_SENDER_IDENTITY_H_

#include <atomic>
#include <cstdint>
#include <optional>

#include "common/base/role.h"
#include "common/messages/message.h"

namespace tessera {

class SenderIdentity {
 public:
  SenderIdentity() = default;
  SenderIdentity(std::optional<Role> role, int32_t rank) { Set(role, rank); }

  void Set(std::optional<Role> role, int32_t rank) {
    const uint64_t role_code = role.has_value() ? static_cast<uint64_t>(*role) + 1 : 0;
    packed_.store((role_code << 32) | static_cast<uint32_t>(rank), std::memory_order_relaxed);
  }

  // A header from this sender.
  MessageHeader Header(uint64_t request_id, int64_t step) const {
    const uint64_t packed = packed_.load(std::memory_order_relaxed);
    MessageHeader header;
    const uint64_t role_code = packed >> 32;
    if (role_code > 0) header.sender_role = static_cast<Role>(role_code - 1);
    header.sender_rank = static_cast<int32_t>(static_cast<uint32_t>(packed));
    header.request_id = request_id;
    header.step = step;
    return header;
  }

 private:
  // The role's value + 1 (0: none) in the high half, the rank in the low half: one atomic, so
  // a header never mixes an old role with a new rank. Initially no role, rank -1.
  std::atomic<uint64_t> packed_{0xffffffff};
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_SENDER_IDENTITY_H_
