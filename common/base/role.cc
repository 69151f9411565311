#include "common/base/role.h"

#include "common/base/quote.h"

namespace tessera {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCoordinator: return "coordinator";
    case Role::kServer: return "server";
    case Role::kWorker: return "worker";
  }
  return "unknown";
}

StatusOr<Role> ParseRole(std::string_view name) {
  if (name == "coordinator") return Role::kCoordinator;
  if (name == "server") return Role::kServer;
  if (name == "worker") return Role::kWorker;
  return InvalidArgumentError("unknown role " + Quote(name) +
                              " (expected coordinator, server or worker)");
}

std::string MemberName(Role role, int rank) {
  std::string name(RoleName(role));
  if (role != Role::kCoordinator) name += " " + std::to_string(rank);
  return name;
}

}  // namespace tessera
