// FleetView: who is in the job, where they listen, and which keys each server owns.
//
// The coordinator builds it once every expected process has registered and sends it to each
// of them; it is the same on every process, so anything computed from it (key placement,
// ring order) agrees everywhere.
#ifndef TESSERA_COMMON_MESSAGES_FLEET_VIEW_H_
#define TESSERA_COMMON_MESSAGES_FLEET_VIEW_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/base/role.h"

namespace tessera {

enum class MemberState { kJoining, kAlive, kFailed, kLeft };
std::string_view MemberStateName(MemberState state);

struct MemberInfo {
  Role role = Role::kWorker;
  int rank = -1;
  std::string address;          // tcp://HOST:PORT of its transport
  std::string metrics_address;  // http://HOST:PORT/metrics
  std::string host;
  int64_t pid = 0;
  MemberState state = MemberState::kJoining;
  uint64_t key_begin = 0;  // servers: owned keys [key_begin, key_end)
  uint64_t key_end = 0;

  // "worker 2" / "server 0" / "coordinator".
  std::string Name() const;
};

struct FleetView {
  std::string job;
  uint64_t epoch = 0;
  int num_servers = 0;
  int num_workers = 0;
  uint64_t key_space = 0;
  // Copies of each key range: range r (server r's keys and embedding rows) is held by servers
  // r, r + 1, ..., r + replicas - 1 (mod num_servers); the first live one is its primary.
  int replicas = 1;
  std::vector<MemberInfo> members;  // sorted by (role, rank)

  const MemberInfo* Find(Role role, int rank) const;
  std::vector<const MemberInfo*> OfRole(Role role) const;
  // The server whose key range holds `key`; NotFound naming the key space otherwise.
  StatusOr<const MemberInfo*> ServerOwningKey(uint64_t key) const;
};

// Server `rank` of `num_servers` owns keys [first, second): contiguous, as even as possible.
std::pair<uint64_t, uint64_t> ServerKeyRange(uint64_t key_space, int num_servers, int rank);

// The server that holds copy `k` (0: the first) of key range `range` (FleetView::replicas).
inline int RangeReplicaServer(int range, int k, int num_servers) {
  return (range + k) % num_servers;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_FLEET_VIEW_H_
