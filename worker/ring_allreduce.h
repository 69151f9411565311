// RingAllReduce: sums a float32 buffer across the workers of a job, in place, over the
// transport (the bandwidth-optimal ring of Patarasuk & Yuan, as in Gloo and NCCL).
//
//   CollectiveContext context{rank, world_size, worker_addresses, &endpoint.transport(),
//                             mailbox.get(), Deadline::AfterMillis(30000), /*tag=*/7};
//   RETURN_IF_ERROR(RingAllReduce({gradients.data(), gradients.size(), "layer3.w"}, context));
//
// The algorithm and its words are defined in ring_allreduce.cc, above the loop.
//
// Every rank must call it with the same tag, the same element count and the same peer list;
// a rank whose peers disagree (another length, another op) fails with an error naming the
// peer. The call returns when this rank's buffer holds the sum, or with the first error:
//   allreduce tag=3 rank=2: no chunk from worker 1 (step 4) within 30000 ms
//   allreduce tag=3 rank=2: waiting for worker 1 (step 4): worker 1 (tcp://...) failed: ...
// after a failure, the buffer's contents are unspecified.
//
// Thread-safety: concurrent calls are fine if their tags differ and their buffers don't overlap.
#ifndef TESSERA_WORKER_RING_ALLREDUCE_H_
#define TESSERA_WORKER_RING_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "common/transport.h"
#include "worker/collective_mailbox.h"

namespace tessera::worker {

// Everything a collective knows about the world: who it is, who its peers are, how it reaches
// them, and how long it may take. Algorithms see this, never sockets.
struct CollectiveContext {
  int rank = 0;
  int world_size = 1;
  // The transport address of every worker, indexed by rank (this rank's own entry included),
  // in the order of the fleet view, so that every rank sees the same ring.
  std::vector<std::string> peer_addresses;
  Transport* transport = nullptr;      // sends chunks; not owned
  CollectiveMailbox* mailbox = nullptr;  // receives chunks; not owned
  Deadline deadline{SteadyClock::time_point::max()};
  // Unique among the collectives that may run at the same time on these workers; every rank
  // uses the same tag for the same operation.
  uint64_t tag = 0;
};

struct RingAllReduceArgs {
  float* data = nullptr;  // count elements, summed in place; may be null when count == 0
  size_t count = 0;
  std::string tensor;     // optional, for error messages ("tensor=layer3.w")
};

// See the file comment. InvalidArgument for a context that cannot work (rank outside
// [0, world_size), peer list of another size, null transport or mailbox).
Status RingAllReduce(const RingAllReduceArgs& args, const CollectiveContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_RING_ALLREDUCE_H_
