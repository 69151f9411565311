// The smoke job (`tessera-worker --mode smoke`): exercises every path a real job uses, checks
// every value, and exits:
//   1. barrier "start" (servers and workers);
//   2. with servers: push a probe tensor "worker<r>.probe" (values r*1000 + i) to server
//      r % S (a key in its range); barrier "pushed" (workers); pull every other worker's
//      probe from its owner and check every value;
//   3. --rounds ring all-reduces of --tensor-elements floats (values rank + 1 + i) among the
//      workers, --round-interval-ms apart, each checked against the closed form;
//   4. barrier "done" (workers).
// Each phase logs a report line with its timing; the first error ends the job.
#ifndef TESSERA_WORKER_JOBS_SMOKE_JOB_H_
#define TESSERA_WORKER_JOBS_SMOKE_JOB_H_

#include <cstdint>

#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/process/process_runtime.h"
#include "common/rendezvous/rendezvous_client.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"

namespace tessera::worker {

// The largest --tensor-elements: 1 GiB of float32.
inline constexpr int64_t kMaxSmokeTensorElements = int64_t{1} << 28;

// Its flags (--tensor-elements, --rounds, --round-interval-ms) are on worker_flags.h's
// command line.
struct SmokeFlags {
  int64_t tensor_elements = 1024;
  int64_t rounds = 1;
  int64_t round_interval_ms = 0;
};

// Runs the job for this worker (already a fleet member through `client`): probes pushed to
// and pulled from the servers on the parameter-server protocol, then verified all-reduces
// among the workers through the transport. `mailbox` is where the endpoint delivers ring
// frames; `failures` the process's failure bus.
Status RunSmokeJob(ProcessRuntime& runtime, RendezvousClient& client,
                   std::shared_ptr<CollectiveMailbox> mailbox,
                   std::shared_ptr<FailureBus> failures, const SmokeFlags& flags);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_JOBS_SMOKE_JOB_H_
