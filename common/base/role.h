// Role: what a process of a Tessera fleet is. Every member of the fleet has exactly one.
#ifndef TESSERA_COMMON_BASE_ROLE_H_
#define TESSERA_COMMON_BASE_ROLE_H_

#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

enum class Role { kCoordinator, kServer, kWorker };

// "coordinator", "server", "worker" ("unknown" outside the enum).
std::string_view RoleName(Role role);
// The inverse of RoleName; InvalidArgument naming the text otherwise.
StatusOr<Role> ParseRole(std::string_view name);

// "worker 2", "server 0", "coordinator" (a coordinator has no rank worth naming).
std::string MemberName(Role role, int rank);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_ROLE_H_
