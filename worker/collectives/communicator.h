// Communicator: a process's place in a group of the job's workers: the collectives of
// collectives.h on that group, point-to-point messages, all-to-all, and groups within it
// (Split, DeviceMesh in device_mesh.h), all over the process's one transport endpoint. The
// world (every worker) is a Communicator; so is each group made from it, and every strategy and
// the PyTorch backend's process groups use one.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, Communicator::Connect(options));
//   // Collective over the world: ranks 0 and 2 form one group, 1 and 3 another.
//   ASSIGN_OR_RETURN(std::unique_ptr<Communicator> pair, world->Split(world->rank() % 2, tag));
//   RETURN_IF_ERROR(pair->AllReduce(grads, n, DataType::kFloat32, ReduceOp::kSum, "g", 1));
//   RETURN_IF_ERROR(pair->Send(bytes, size, /*dst=*/1, /*tag=*/7, "activations"));
//
// One endpoint, whatever the number of groups: a group's frames travel through the world's
// transport and wait in its CollectiveMailbox under tags that carry the group's id
// (channel/zmq/communicator_tags.h). A group's ring is set up as the world's is
// (ring_channel_setup.h): shared memory on the hops between ranks of one host, TCP links on the
// hops between hosts. Those links are connected sockets of the group's own (two per rank at
// most, from a listener that closes once they are up), so that a group across hosts moves its
// bytes as the world's ring does, not through the transport's I/O threads; a group within a
// host opens no socket at all. A group's ring runs on its callers' threads (no thread of its
// own). Gloo, by contrast, opens a device and pairs per group.
//
// Ranks: a communicator's ranks are 0 .. world_size()-1 (its "group ranks"); world_ranks()
// maps them to the world's. Errors name the communicator, the group rank and the world rank:
//   group 2 (world ranks 1, 3) rank 1 (world rank 3): allreduce tag=5 tensor=g rank=1: no
//   chunk from worker 0 (step 0) within 2000 ms
// (inside the ring's message, "worker N" is the group's rank N). A failure of the process (its
// FailureBus: the coordinator's notice that a worker died) fails every communicator's waits;
// Abort fails one communicator's alone.
//
// Tags: the world's collectives take any tag below 2^63, as before groups; a group's, tags
// below 2^32 (its callers count calls). Send / Recv are matched by (peer, tag) in the order
// each side calls them; every point-to-point tag space is a communicator's own.
//
// Direct reads: where every rank of a communicator (the world or a group) is on one host, and
// the kernel lets them read each other's memory (ProbeDirectReads at setup; a refusal is logged
// once and changes nothing else), all-reduces, reduce-scatters and all-gathers of at least
// direct_read_min_bytes read the peers' buffers directly (direct_read_collectives.h: one copy
// per byte) and smaller ones go round the ring, whose latency wins there. The channel's
// description says which, and from what size.
//
// Hierarchical all-reduce: where a communicator's ranks are on several hosts, the same number
// on each and at least two, setup also makes two groups of it: the ranks of this host, and the
// ranks at this rank's place on every host. An all-reduce of at least direct_read_min_bytes
// is then a reduce-scatter within the host (by direct reads where the kernel allows them), an
// all-reduce of this rank's slice across the hosts (the ring over links, one rank per host),
// and an all-gather within the host: each byte crosses between hosts 2(H-1)/H times for H
// hosts, as in the flat ring, but over H hops rather than W, and a host's ranks do the rest at
// memory speed. Every rank gets the same bits, not the flat ring's (the sums are grouped by
// host); direct_read_min_bytes 0 keeps the flat ring.
//
// Device memory: after UseDevice, each collective picks the NCCL backend for a buffer in device
// memory and the ring for host memory, through this one interface.
//
// Thread-safety: thread-safe; concurrent collectives need different tags (collectives.h), and
// Split is a collective like the others. UseDevice only before the collectives it serves.
#ifndef TESSERA_WORKER_COLLECTIVES_COMMUNICATOR_H_
#define TESSERA_WORKER_COLLECTIVES_COMMUNICATOR_H_

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
#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "common/transport/transport.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/channel/zmq/ring_zmq.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/comm_pool.h"
#include "worker/collectives/direct_read_collectives.h"
#include "worker/collectives/nccl/nccl_collectives.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {

// What the world's communicator is made from: this process's transport and where it delivers
// ring frames, and how rings are set up (ring_channel_setup.h). Groups inherit all of it.
struct CommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> peer_addresses;  // every worker's transport address, by world rank
  Transport* transport = nullptr;  // not owned; must outlive every communicator made from it
  std::shared_ptr<CollectiveMailbox> mailbox;  // where the endpoint delivers ring frames
  std::shared_ptr<FailureBus> failures;        // the process's
  std::string ring_transport = "auto";         // auto, shm, links or zmq
  int64_t timeout_ms = 30000;  // bounds every call, from its start
  int64_t setup_timeout_ms = 0;  // bounds the world's ring setup; 0: timeout_ms
  size_t segment_bytes = 1024 * 1024;
  int64_t links_spin_us = 0;
  Credentials credentials;             // who may join the world's TCP links
  MetricsRegistry* metrics = nullptr;  // may be null; not owned
  // Collectives of a whole buffer of at least this many bytes use direct reads where they can
  // (see above); 0: never. Every rank must use the same value (tessera-worker
  // --direct-read-min-bytes).
  size_t direct_read_min_bytes = kDefaultDirectReadMinBytes;
  // RingCollectivesOptions::one_shot_max_bytes: all-reduces on the ring of at most this many
  // bytes gather the whole buffers (tessera-worker --one-shot-max-bytes); 0: never.
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
  // How long the threads that run Enqueue's and EnqueueRecv's ops poll for the next op before
  // they sleep (CommPool's spin_us; tessera-worker --comm-spin-us). The world's counts for
  // every group.
  int64_t comm_spin_us = kDefaultCommSpinUs;
};

class Communicator final : public Collectives {
 public:
  // The world's communicator: sets up its ring (collective: every rank calls it). Errors name
  // what was waited for.
  static StatusOr<std::unique_ptr<Communicator>> Connect(const CommunicatorOptions& options);
  // A group's: fails what still waits in it (Abort) and forgets its id. Every communicator's:
  // closes its queues (CloseQueues).
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(world_ranks_.size()); }
  // 0 for the world; a group's id is the same on each of its ranks.
  uint32_t id() const { return id_; }
  int world_rank() const { return world_ranks_[static_cast<size_t>(rank_)]; }
  // The world rank of each of this communicator's ranks.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // "the world" or "group 2 (world ranks 1, 3)".
  const std::string& name() const { return name_; }
  // The ring's channel, as ring channel setup described it.
  const std::string& channel_description() const { return channel_description_; }
  int64_t timeout_ms() const { return timeout_ms_; }

  // ---- Collectives (collectives.h), on this communicator's ranks.
  Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor, uint64_t tag) override;
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                       const std::string& tensor, uint64_t tag) override;
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t tag) override;
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& tensor,
                   uint64_t tag) override;
  Status Barrier(uint64_t tag) override;
  // Rank q gets send_counts[q] elements of `element_bytes` from `input` (laid out in rank
  // order); `output` gets recv_counts[q] elements from each rank q, in rank order. Every rank's
  // send_counts[q] must equal rank q's recv_counts[this rank]: a difference fails naming both.
  // Uneven counts (zero included) are fine. `tag` as a collective's.
  Status AllToAll(const void* input, const std::vector<size_t>& send_counts, void* output,
                  const std::vector<size_t>& recv_counts, size_t element_bytes,
                  const std::string& what, uint32_t tag);
  // Rank 0 waits until every rank has arrived or `timeout_ms` passed, then releases them; on a
  // timeout it fails naming the first rank (or, with wait_all_ranks, every rank) missing, in
  // Gloo's words, and the others fail at their deadline.
  Status MonitoredBarrier(int64_t timeout_ms, bool wait_all_ranks, uint32_t tag);

  // ---- Point to point, matched by (peer, tag) in the order each side calls them. Send returns
  // once the bytes are copied and queued (it never waits for the receiver); Recv waits up to
  // the communicator's timeout: a message of another size fails naming both sizes. At most
  // kMaxPointToPointRanks ranks.
  static constexpr int kMaxPointToPointRanks = 4096;
  Status Send(const void* data, size_t bytes, int dst, uint32_t tag, const std::string& what);
  Status Recv(void* data, size_t bytes, int src, uint32_t tag, const std::string& what);
  // Like Recv, from whichever other rank's next message with `tag` comes first; the rank it
  // came from. Ranks are taken in turn, so that one that sends often does not starve others.
  StatusOr<int> RecvAny(void* data, size_t bytes, uint32_t tag, const std::string& what);

  // ---- Asynchronous: on threads the world and its groups share (a CommPool, comm_pool.h),
  // which start only when used. Each communicator has two queues: ops run one at a time in
  // the order queued, never behind another queue's (so a collective of one group blocked on
  // peers that run another group's first does not hold that one up), and receives likewise.
  // Queues `op` (collectives, in the order every rank queues them); the future holds what it
  // returns, or CANCELLED if the communicator closes first.
  std::shared_future<Status> Enqueue(std::function<Status()> op);
  // Queues `op` (a receive) behind this communicator's receives queued before.
  std::shared_future<Status> EnqueueRecv(std::function<Status()> op);
  // Recv on the receive queue: returns at once. `data` must stay valid until the future is set.
  std::shared_future<Status> RecvAsync(void* data, size_t bytes, int src, uint32_t tag,
                                       std::string what);
  // Drops what this communicator has queued (CANCELLED, "<why>: not started") and waits for
  // what runs. Abort first to end a wait on peers. Not from the communicator's own ops.
  void CloseQueues(const std::string& why);

  // ---- Device memory.
  // Makes this communicator's NCCL backend (nccl/nccl_collectives.h; collective over its
  // ranks, with options' rank and world size this communicator's), after which the collectives
  // above take buffers in device memory too, picked per buffer (IsDeviceMemory): host buffers
  // still go round the ring. UNAVAILABLE in a build without CUDA or on a machine without a
  // GPU, after which every buffer is the ring's as before.
  Status UseDevice(NcclCollectivesOptions options);

  // ---- Groups.
  // Collective over this communicator (every rank calls it, with the same tag): the ranks that
  // pass the same color >= 0 form a group, in this communicator's rank order; each gets its
  // group (a rank whose color is negative gets null). As MPI_Comm_split. One call makes every
  // group of a partition (a mesh's rows, say) at once.
  StatusOr<std::unique_ptr<Communicator>> Split(int color, uint64_t tag);
  // Collective over this communicator: the group of `ranks` (this communicator's ranks, in the
  // group's rank order); null on the ranks not in it.
  StatusOr<std::unique_ptr<Communicator>> Split(const std::vector<int>& ranks, uint64_t tag);
  // Collective over `ranks` only, whose members agreed on `id` beforehand (torch's store does,
  // for its new_group, where only members call): the group of `ranks` (this communicator's
  // ranks, in group order), with its own timeout. AlreadyExists if this process has a live
  // group with that id; InvalidArgument for ranks that are repeated, out of range or without
  // this rank.
  StatusOr<std::unique_ptr<Communicator>> Group(const std::vector<int>& ranks, uint32_t id,
                                                int64_t timeout_ms);
  // The smallest id this process could give a new group: each member of a group proposes its
  // own, and the group takes the largest.
  uint32_t NextGroupId() const;

  // Fails every wait of this communicator (its hierarchical groups' included), and every later
  // call, with `why` (a group's only, not its parent's; the world's fails the process).
  void Abort(const Status& why);

 private:
  struct Process;  // what the world and its groups share: the endpoint's parts, group ids

  Communicator(std::shared_ptr<Process> process, uint32_t id, int rank,
               std::vector<int> world_ranks, int64_t timeout_ms);
  // Sets up the ring and the point-to-point channel (collective over the members), within
  // setup_timeout_ms.
  Status Start(const std::string& ring_transport, int64_t setup_timeout_ms);

  // "group 2 (world ranks 1, 3) rank 1 (world rank 3)": the prefix of every error.
  std::string Where() const;
  // `status`, prefixed with Where() if it failed.
  Status Named(Status status) const;
  // "worker 3" for this communicator's rank q (its world rank).
  std::string Worker(int rank) const;
  Status Checked(const std::string& what, int peer) const;
  Status SendFrame(int dst, uint64_t tag, uint32_t slot, const void* data, size_t bytes,
                   CollectiveOp op);
  // Copies `frame`'s payload (from rank `src`) to `data`, which takes exactly `bytes`: another
  // size is InvalidArgument naming both.
  Status CopyPayload(const RingFrame& frame, int src, void* data, size_t bytes,
                     const std::string& what) const;
  // Receives the frame (tag, slot), which `src` must have sent, into exactly `bytes` at `data`.
  Status TakeFrame(uint64_t tag, uint32_t slot, int src, void* data, size_t bytes,
                   Deadline deadline, const std::string& what);

  const std::shared_ptr<Process> process_;
  const uint32_t id_;
  const int rank_;
  const std::vector<int> world_ranks_;
  const int64_t timeout_ms_;
  const std::string name_;
  // The world's: the process's bus. A group's: its own, failed by Abort and by the process's.
  std::shared_ptr<FailureBus> failures_;
  std::shared_ptr<void> parent_subscription_;  // a group's: the process's failure into its bus
  // The backend for `buffer`: the device's if it is in device memory and UseDevice made one;
  // else direct reads for a whole buffer of `bytes` >= direct_read_min_bytes where set up.
  Collectives& For(const void* buffer, size_t bytes = 0);

  std::shared_ptr<CommPool::Strand> ops_;       // Enqueue's queue
  std::shared_ptr<CommPool::Strand> receives_;  // EnqueueRecv's
  std::unique_ptr<RingCollectives> ring_;
  // The host's ranks reading each other's buffers; null where not all on one host, refused or
  // off. Uses ring_ for its control.
  std::unique_ptr<DirectReadCollectives> direct_;
  size_t direct_min_bytes_ = 0;
  // The hierarchical all-reduce's groups (see above): this host's ranks and this rank's place
  // on every host; null where it does not apply.
  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Communicator> across_;
  // Makes host_ and across_ where they apply; a note for the channel's description.
  StatusOr<std::string> StartHierarchy(const std::vector<std::string>& addresses);
  Status HierarchicalAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                               const std::string& tensor, uint64_t tag);
  std::unique_ptr<Collectives> device_;  // NCCL, once UseDevice made it
  std::unique_ptr<RingZmq> peers_;  // point-to-point and all-to-all frames
  std::string channel_description_;
  std::mutex p2p_mu_;
  std::map<std::pair<int, uint32_t>, uint32_t> sent_;      // messages by (dst, tag); p2p_mu_
  std::map<std::pair<int, uint32_t>, uint32_t> received_;  // by (src, tag); p2p_mu_
  int last_any_source_ = 0;                                 // guarded by p2p_mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_COMMUNICATOR_H_
