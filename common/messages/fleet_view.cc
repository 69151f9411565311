#include "common/messages/fleet_view.h"

#include <algorithm>

namespace tessera {

std::string_view MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kJoining: return "joining";
    case MemberState::kAlive: return "alive";
    case MemberState::kFailed: return "failed";
    case MemberState::kLeft: return "left";
  }
  return "unknown";
}

std::string MemberInfo::Name() const { return MemberName(role, rank); }

const MemberInfo* FleetView::Find(Role role, int rank) const {
  for (const MemberInfo& m : members) {
    if (m.role == role && m.rank == rank) return &m;
  }
  return nullptr;
}

std::vector<const MemberInfo*> FleetView::OfRole(Role role) const {
  std::vector<const MemberInfo*> out;
  for (const MemberInfo& m : members) {
    if (m.role == role) out.push_back(&m);
  }
  std::sort(out.begin(), out.end(),
            [](const MemberInfo* a, const MemberInfo* b) { return a->rank < b->rank; });
  return out;
}

StatusOr<const MemberInfo*> FleetView::ServerOwningKey(uint64_t key) const {
  for (const MemberInfo& m : members) {
    if (m.role == Role::kServer && key >= m.key_begin && key < m.key_end) return &m;
  }
  return NotFoundError("no server owns key " + std::to_string(key) + " (key space " +
                       std::to_string(key_space) + ", " + std::to_string(num_servers) +
                       " servers)");
}

std::pair<uint64_t, uint64_t> ServerKeyRange(uint64_t key_space, int num_servers, int rank) {
  if (num_servers <= 0) return {0, 0};
  uint64_t n = static_cast<uint64_t>(num_servers);
  uint64_t r = static_cast<uint64_t>(rank);
  uint64_t base = key_space / n;
  uint64_t extra = key_space % n;  // the first `extra` servers own one key more
  uint64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

}  // namespace tessera
