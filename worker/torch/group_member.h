// GroupMember: this process's place in one torch.distributed process group of the "tessera"
// backend, without any torch type: a transport endpoint, the ring (RingCollectives over the
// channel ring channel setup picks: shared memory on one host, TCP links across hosts), and
// point-to-point messages to any rank, set up through the group's RendezvousStore instead of a
// Tessera coordinator. process_group_tessera.cc turns torch's calls into these.
//
//   GroupMemberOptions options;  // rank, world_size, store, timeout_ms, ...
//   ASSIGN_OR_RETURN(std::unique_ptr<GroupMember> member, GroupMember::Join(options));
//   std::shared_future<Status> done = member->Submit([&] {
//     return member->AllReduce(data, n, DataType::kFloat32, ReduceOp::kSum, "allreduce");
//   });
//
// Threads: collectives run one at a time on the member's comm thread, in submission order,
// which is the order every rank must call them in (as torch requires). Receives run on a
// thread of their own, in their submission order, so a rank waiting for a message never
// holds up a collective its peer needs first; sends leave at once (their bytes are copied).
//
// Errors name the operation, this rank and the peer: "allreduce of 1024 x float32 rank=1: no
// frame from worker 0 (step 0) within 30000 ms". Ranks that call collectives that disagree
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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/data_type.h"
#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/metrics/metrics.h"
#include "common/transport/rpc_endpoint.h"
#include "common/security/credentials.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/channel/zmq/ring_zmq.h"
#include "worker/collectives/comm_thread.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/torch/rendezvous_store.h"

namespace tessera::worker {

struct GroupMemberOptions {
  int rank = 0;
  int world_size = 1;
  RendezvousStore* store = nullptr;  // not owned; used during Join only
  // Where this rank's transport (and its ring links) listen; peers reach it there.
  std::string bind_host = "127.0.0.1";
  // How this rank proves it belongs to the job (its transport and ring links).
  Credentials credentials;
  std::string ring_transport = "auto";  // auto, shm, links or zmq (ring_channel_setup.h)
  // Bounds Join and every operation, from its start (torch's process-group timeout).
  int64_t timeout_ms = 30 * 60 * 1000;
  size_t segment_bytes = 1 << 20;
  MetricsRegistry* metrics = nullptr;  // may be null; must outlive the member
};

class GroupMember {
 public:
  // Starts the endpoint, publishes its address in the store, reads every other rank's, and
  // connects the ring. Every rank of the group must call it. Errors name the rank or key that
  // was waited for.
  static StatusOr<std::unique_ptr<GroupMember>> Join(const GroupMemberOptions& options);
  // Drops what was submitted and not started, ends what runs (its futures hold CANCELLED),
  // then shuts the endpoint down.
  ~GroupMember();
  GroupMember(const GroupMember&) = delete;
  GroupMember& operator=(const GroupMember&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  // The ring's channel, as ring channel setup described it.
  const std::string& channel_description() const { return channel_description_; }

  // Queues `op` for the comm thread behind what was submitted before.
  std::shared_future<Status> Submit(std::function<Status()> op);
  // Queues `op` (which receives) for the receive thread.
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
  // Rank q gets send_counts[q] elements of `element_bytes` from `input` (laid out in rank
  // order); `output` gets recv_counts[q] elements from each rank q, in rank order. Every
  // rank's send_counts[q] must equal rank q's recv_counts[this rank]; a difference fails
  // naming both.
  Status AllToAll(const void* input, const std::vector<size_t>& send_counts, void* output,
                  const std::vector<size_t>& recv_counts, size_t element_bytes,
                  const std::string& what);
  // Rank 0 waits until every rank has arrived or `timeout_ms` passed, then releases them; on
  // a timeout it fails naming the first rank (or, with wait_all_ranks, every rank) missing, and
  // the others fail at their deadline quoting nothing more than that they were not released.
  Status MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks);

  // ---- Point to point, matched by (peer, tag) in the order each side calls them.
  // Send returns once the bytes are copied and queued (from any thread); Recv, only from
  // SubmitRecv's closures, waits for them: a size other than `bytes` fails naming both.
  Status Send(const void* data, size_t bytes, int dst, uint32_t tag, const std::string& what);
  Status Recv(void* data, size_t bytes, int src, uint32_t tag, const std::string& what);
  // Like Recv, from whichever other rank's message with `tag` comes first (the next of that
  // rank's (rank, tag) order); the rank it came from. Only from SubmitRecv's closures.
  StatusOr<int> RecvAny(void* data, size_t bytes, uint32_t tag, const std::string& what);

 private:
  struct Parts;  // endpoint, bus, mailbox, ring, point-to-point channel
  GroupMember(const GroupMemberOptions& options, std::unique_ptr<Parts> parts);

  // A point-to-point or all-to-all frame's tag: `space` (the high byte), the sender, `tag`.
  static uint64_t PeerTag(uint8_t space, int src, uint32_t tag);
  // Receives the frame (tag, slot), which `src` must have sent, into exactly `bytes` at `data`.
  Status TakeFrame(uint64_t tag, uint32_t slot, int src, void* data, size_t bytes,
                   Deadline deadline, const std::string& what);
  Status SendFrame(int dst, uint64_t tag, uint32_t slot, const void* data, size_t bytes,
                   CollectiveOp op);

  const GroupMemberOptions options_;
  std::unique_ptr<Parts> parts_;
  std::string channel_description_;
  uint64_t next_tag_ = 1;  // of ring calls and all-to-alls; comm thread only
  std::mutex p2p_mu_;
  std::map<std::pair<int, uint32_t>, uint32_t> sent_;      // slots by (dst, tag); p2p_mu_
  std::map<std::pair<int, uint32_t>, uint32_t> received_;  // slots by (src, tag); p2p_mu_
  int last_any_source_ = 0;  // the rank RecvAny last took from; receive thread only
  // Last members: their threads end (running what is queued) before the parts go.
  CommThread recv_thread_;
  CommThread comm_thread_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_GROUP_MEMBER_H_
