// The parameter-server benchmark job (`tessera-worker --mode bench-ps`), Tessera's side of
// `tessera-bench ps`: the workers of a fleet with servers (started by tessera-launch, joined
// through the coordinator as in every mode) time push+pull steps of the PsEngine, the engine
// the ps-* modes train with, on a dense model of each --bench-sizes byte count:
//   1. every rank meets the others at a barrier; rank 0 initialises the servers with a fresh
//      job (--bench-ps-mode, ps-async by default; SGD with lr 0, so the values never change)
//      whose one tensor holds
//      element i = i mod 1000; a second barrier, and every rank pulls it;
//   2. --bench-warmup untimed steps (push the gradient, pull the parameters), then a barrier
//      and as many timed steps as fit in --bench-seconds (at least 5, at most 10000; or
//      --bench-iters), each timed on its own (ps-async: the workers do not wait for each
//      other, so each measures its own throughput while the others load the servers; ps-sync:
//      a step ends when every worker's push of it was applied, and the workers agree when to
//      stop, as training does, so that all time the same steps);
//   3. the pulled parameters must still be rank 0's values (verified), and every rank prints
//      one JSON line per size on stdout:
//        {"bench":"ps","system":"tessera","mode":M,"rank":R,"workers":W,"servers":S,"bytes":B,
//         "requests_per_step":Q,"iters":K,"median_s":...,"mean_s":...,"min_s":...}
//      where a step moves B bytes of gradients to the servers and B bytes of parameters back.
// The first error ends the job.
#ifndef TESSERA_WORKER_JOBS_PS_BENCH_JOB_H_
#define TESSERA_WORKER_JOBS_PS_BENCH_JOB_H_

#include <cstdint>
#include <functional>
#include <string>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/training/ps_job.h"
#include "common/transport/rpc_endpoint.h"
#include "worker/jobs/allreduce_bench_job.h"

namespace tessera::worker {

struct PsBenchOptions {
  AllReduceBenchFlags flags;        // --bench-sizes, --bench-warmup, --bench-iters, --bench-seconds
  uint64_t chunk_elements = 1 << 16;  // --ps-chunk-elements
  bool shared_memory = true;          // --ps-shared-memory
  PsConsistency consistency = PsConsistency::kAsync;  // --bench-ps-mode
  int64_t request_timeout_ms = 30000;
};

Status RunPsBench(RpcEndpoint* endpoint, RendezvousClient& client, MetricsRegistry* metrics,
                  const PsBenchOptions& options,
                  const std::function<void(const std::string&)>& print);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_JOBS_PS_BENCH_JOB_H_
