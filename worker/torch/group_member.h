// GroupMember: this process's place in one torch.distributed process group of the "tessera"
// backend, without any torch type: a Communicator (worker/collectives/communicator.h) and the
// threads that run the group's ops. process_group_tessera.cc turns torch's calls into these.
//
//   GroupMemberOptions options;  // rank, world_size, store, timeout_ms, ...
//   ASSIGN_OR_RETURN(std::unique_ptr<GroupMember> world, GroupMember::Join(options));
//   options.host = world->host();       // a new_group's member: over the world's endpoint
//   options.global_ranks = {0, 2};
//   ASSIGN_OR_RETURN(std::unique_ptr<GroupMember> pair, GroupMember::Join(options));
//   std::shared_future<Status> done = pair->Submit([&] {
//     return pair->AllReduce(data, n, DataType::kFloat32, ReduceOp::kSum, "allreduce");
//   });
//
// The default group's member makes the process's GroupHost: its transport endpoint, the
// world's communicator (set up through the group's RendezvousStore instead of a Tessera
// coordinator) and the threads that run every group's ops. A new_group's member is a group of
// that communicator (its members agree on its id through their store): no endpoint, listener
// or thread of its own, so a process holds one endpoint however many groups it makes. Without
// a host (the default group is another backend's), a group makes a host of its own.
//
// Threads: a group's collectives run one at a time, in submission order (which is the order
// every rank must call them in, as torch requires), and its receives likewise, on its
// communicator's queues (Communicator::Enqueue, EnqueueRecv): no group's op waits behind
// another's, nor a collective behind a receive, and the threads are as many as the most
// queues ever busy at once (one, for groups used one after the other). Sends leave at once
// (their bytes are copied).
//
// Errors name the operation, the group, its rank and the world rank and the peer, e.g.
// "group 1 (world ranks 1, 3) rank 0 (world rank 1): allreduce of 1024 x float32 rank=0: no
// frame from worker 1 (step 0) within 30000 ms". Ranks that call collectives that disagree
// (sizes, dtypes, ops) all fail naming what differs (the ring checks every frame).
//
// Thread-safety: Submit, SubmitRecv and Send from any thread; the other operations only from
// closures that Submit runs (one at a time); Recv only from SubmitRecv's.
#ifndef TESSERA_WORKER_TORCH_GROUP_MEMBER_H_
#define TESSERA_WORKER_TORCH_GROUP_MEMBER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/data_type.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "worker/collectives/communicator.h"
#include "worker/torch/rendezvous_store.h"

namespace tessera::worker {

// What a torch process's tessera groups share (group_member.cc): its endpoint, the world's
// communicator and the threads that run every group's ops.
class GroupHost;

struct GroupMemberOptions {
  int rank = 0;  // in the group
  int world_size = 1;  // the group's size
  RendezvousStore* store = nullptr;  // the group's (torch's prefix store); used during Join only
  // A new_group's: the process's host (the default group's member's host()) and the world
  // ranks of the group's members, in group rank order (torch's global_ranks_in_group). Null
  // and empty for the default group, which makes the host.
  std::shared_ptr<GroupHost> host;
  std::vector<int> global_ranks;
  // Where this rank's transport (and its ring links) listen; peers reach it there.
  std::string bind_host = "127.0.0.1";
  // How this rank proves it belongs to the job (its transport and ring links).
  Credentials credentials;
  std::string ring_transport = "auto";  // auto, shm, links or zmq (ring_channel_setup.h)
  // Bounds Join and every operation, from its start (torch's process-group timeout).
  int64_t timeout_ms = 30 * 60 * 1000;
  size_t segment_bytes = 1 << 20;
  // CommunicatorOptions::direct_read_min_bytes (TESSERA_DIRECT_READ_MIN_BYTES); 0: off.
  size_t direct_read_min_bytes = kDefaultDirectReadMinBytes;
  // CommunicatorOptions::one_shot_max_bytes (TESSERA_ONE_SHOT_MAX_BYTES); 0: off.
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
  // CommunicatorOptions::comm_spin_us (TESSERA_COMM_SPIN_US); also how long a Work's wait()
  // polls before it blocks. Only the default group's counts for the comm threads.
  int64_t comm_spin_us = kDefaultCommSpinUs;
  MetricsRegistry* metrics = nullptr;  // may be null; must outlive the member
};

class GroupMember {
 public:
  // The default group's member (no options.host): starts the endpoint, publishes its address
  // in the store, reads every other rank's, and connects the world's ring. A new_group's
  // member: agrees on the group's id with the other members through the store and sets up the
  // group's ring over the host's endpoint. Every rank of the group must call it. Errors name
  // the rank or key that was waited for.
  static StatusOr<std::unique_ptr<GroupMember>> Join(const GroupMemberOptions& options);
  // Fails what this group runs (CANCELLED: the group is being destroyed; the default group's
  // fails every group's), drops what it has queued, waits for what runs, and lets go of the
  // host (the last member's stops the threads and the endpoint).
  ~GroupMember();
  GroupMember(const GroupMember&) = delete;
  GroupMember& operator=(const GroupMember&) = delete;

  int rank() const { return communicator_->rank(); }
  int world_size() const { return communicator_->world_size(); }
  const std::shared_ptr<GroupHost>& host() const { return host_; }
  // The ring's channel, as ring channel setup described it.
  const std::string& channel_description() const {
    return communicator_->channel_description();
  }

  // Queues `op` behind the group's collectives submitted before.
  std::shared_future<Status> Submit(std::function<Status()> op);
  // Queues `op` (which receives) behind the group's receives submitted before.
  std::shared_future<Status> SubmitRecv(std::function<Status()> op);

  // ---- Collectives: every rank calls each with the same arguments but the buffers. `what`
  // names the call in errors. Only from Submit's closures.
  Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op, const std::string& what);
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& what);
  // `input` holds this rank's `count` elements; `output` gets every rank's, in rank order.
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& what);
  // `input` holds world_size x `count` elements; `output` gets this rank's `count`, reduced.
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                       ReduceOp op, const std::string& what);
  Status Barrier(const std::string& what);
  // Communicator::AllToAll.
  Status AllToAll(const void* input, const std::vector<size_t>& send_counts, void* output,
                  const std::vector<size_t>& recv_counts, size_t element_bytes,
                  const std::string& what);
  // Communicator::MonitoredBarrier.
  Status MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks);

  // ---- Point to point (Communicator's). Send from any thread; Recv and RecvAny only from
  // SubmitRecv's closures.
  Status Send(const void* data, size_t bytes, int dst, uint32_t tag, const std::string& what);
  Status Recv(void* data, size_t bytes, int src, uint32_t tag, const std::string& what);
  StatusOr<int> RecvAny(void* data, size_t bytes, uint32_t tag, const std::string& what);

 private:
  GroupMember(std::shared_ptr<GroupHost> host, std::unique_ptr<Communicator> own);

  const std::shared_ptr<GroupHost> host_;
  // A new_group's communicator (null for the default group's member, whose is the host's).
  std::unique_ptr<Communicator> own_;
  Communicator* const communicator_;  // own_ or the host's world
  uint64_t next_tag_ = 1;  // of collectives; on the communicator's op queue only
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_GROUP_MEMBER_H_
