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

std::string MemberName(Role role, int rank) {
  std::string name(RoleName(role));
  if (role != Role::kCoordinator) name += " " + std::to_string(rank);
  return name;
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

proto::Role ToWireRole(Role role) {
  switch (role) {
    case Role::kCoordinator: return proto::Role::Coordinator;
    case Role::kServer: return proto::Role::Server;
    case Role::kWorker: return proto::Role::Worker;
  }
  return proto::Role::Unknown;
}

StatusOr<Role> FromWireRole(proto::Role role) {
  switch (role) {
    case proto::Role::Coordinator: return Role::kCoordinator;
    case proto::Role::Server: return Role::kServer;
    case proto::Role::Worker: return Role::kWorker;
    default: break;
  }
  return InvalidArgumentError("role " + std::to_string(static_cast<int>(role)) +
                              " is not a fleet member role");
}

namespace {

proto::MemberState ToWireState(MemberState state) {
  switch (state) {
    case MemberState::kJoining: return proto::MemberState::Joining;
    case MemberState::kAlive: return proto::MemberState::Alive;
    case MemberState::kFailed: return proto::MemberState::Failed;
    case MemberState::kLeft: return proto::MemberState::Left;
  }
  return proto::MemberState::Joining;
}

StatusOr<MemberState> FromWireState(proto::MemberState state) {
  switch (state) {
    case proto::MemberState::Joining: return MemberState::kJoining;
    case proto::MemberState::Alive: return MemberState::kAlive;
    case proto::MemberState::Failed: return MemberState::kFailed;
    case proto::MemberState::Left: return MemberState::kLeft;
  }
  return InvalidArgumentError("unknown member state " + std::to_string(static_cast<int>(state)));
}

std::string Str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

}  // namespace

flatbuffers::Offset<proto::FleetView> EncodeFleetView(flatbuffers::FlatBufferBuilder* fbb,
                                                      const FleetView& view) {
  std::vector<flatbuffers::Offset<proto::Member>> members;
  for (const MemberInfo& m : view.members) {
    members.push_back(proto::CreateMemberDirect(
        *fbb, ToWireRole(m.role), m.rank, m.address.c_str(), m.metrics_address.c_str(),
        m.host.c_str(), m.pid, ToWireState(m.state), m.key_begin, m.key_end));
  }
  return proto::CreateFleetViewDirect(*fbb, view.job.c_str(), view.epoch, view.num_servers,
                                      view.num_workers, view.key_space, &members);
}

StatusOr<FleetView> DecodeFleetView(const proto::FleetView& wire) {
  FleetView view;
  view.job = Str(wire.job());
  view.epoch = wire.epoch();
  view.num_servers = wire.num_servers();
  view.num_workers = wire.num_workers();
  view.key_space = wire.key_space();
  if (wire.members() != nullptr) {
    for (const proto::Member* m : *wire.members()) {
      MemberInfo info;
      ASSIGN_OR_RETURN(info.role, FromWireRole(m->role()));
      ASSIGN_OR_RETURN(info.state, FromWireState(m->state()));
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
  return view;
}

}  // namespace tessera
