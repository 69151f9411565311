// What processes and the coordinator tell each other to form and watch a fleet (rendezvous,
// heartbeats, barriers, failure notices), as plain values. The fleet view itself is in
// fleet_view.h.
//
//   member -> coordinator: RegisterRequest (reply: FleetView), Heartbeat (reply: HeartbeatAck),
//                          BarrierRequest (reply: BarrierRelease), Goodbye (reply: Ack)
//   coordinator -> member: FailureNotice (unsolicited)
#ifndef TESSERA_COMMON_MESSAGES_RENDEZVOUS_MESSAGES_H_
#define TESSERA_COMMON_MESSAGES_RENDEZVOUS_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/role.h"
#include "common/base/status.h"

namespace tessera {

struct RegisterRequest {
  Role role = Role::kWorker;
  int32_t requested_rank = -1;  // -1: any
  std::string address;          // where the member's transport listens (tcp://HOST:PORT)
  std::string metrics_address;  // where its /metrics is served
  std::string host;
  int64_t pid = 0;
  int32_t num_workers = 0;  // a worker's idea of its job's size (0: the coordinator's)
  // A server started with --join: it takes a failed server's place in a running fleet (its
  // requested_rank, or the lowest failed rank when -1).
  bool join = false;
};

struct Heartbeat {
  uint64_t sequence = 0;
};

struct HeartbeatAck {
  uint64_t epoch = 0;  // of the coordinator's fleet view
};

// The reason of the coordinator's notice (role coordinator) when it stopped without an error:
// its job is over, and whoever is still attached leaves.
inline std::string CoordinatorStoppedReason(const std::string& job) {
  return "the coordinator of job '" + job + "' has stopped";
}
inline bool IsCleanCoordinatorStop(const std::string& reason) {
  const std::string head = "the coordinator of job '", tail = "' has stopped";
  return reason.size() >= head.size() + tail.size() && reason.compare(0, head.size(), head) == 0 &&
         reason.compare(reason.size() - tail.size(), tail.size(), tail) == 0;
}

// The coordinator's word that a member failed: every wait for it ends with this.
struct FailureNotice {
  Role role = Role::kWorker;
  int32_t rank = -1;
  std::string address;
  std::string reason;
  // Elastic jobs (issue 47, common/messages/membership.h): not 0 when this notice is the job's
  // membership epoch of that number (a worker left, or joined when `joined`), which the other
  // processes survive: the servers stop counting the worker, the workers carry on.
  uint64_t membership_epoch = 0;
  int64_t membership_step = -1;  // the last step the job completed then
  int32_t world_size = 0;        // workers in the job after the change
  bool joined = false;
};

struct BarrierRequest {
  std::string name;
  uint64_t generation = 0;
  int64_t timeout_ms = 0;
  std::optional<Role> scope;  // only members of this role take part; none: every member
};

struct BarrierRelease {
  std::string name;
  uint64_t generation = 0;
};

// kOk: a clean departure, `reason` says why; else the process is stopping because of the
// error (`code`, `reason`).
struct Goodbye {
  std::string reason;
  StatusCode code = StatusCode::kOk;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_RENDEZVOUS_MESSAGES_H_
