// The modes of tessera-worker that are not training: jobs of a fleet member that run and exit
// (worker/jobs/). Each is a registry entry (mode_registry.h) like the training modes, so that
// --mode's validation and help and main's dispatch come from one table:
//   smoke            the foundation smoke job (worker/jobs/smoke_job.h);
//   bench-allreduce  timed ring all-reduces for `tessera-bench allreduce`
//                    (worker/jobs/allreduce_bench_job.h);
//   bench-ps         timed push+pull steps against the servers for `tessera-bench ps`
//                    (worker/jobs/ps_bench_job.h).
// A job runs once the worker joined the fleet; the benchmarks first meet the fleet at the
// "start" barrier as training does (the smoke job meets it itself).
//
// Thread-safety: run on the main thread, once.
#ifndef TESSERA_WORKER_MODES_JOB_MODES_H_
#define TESSERA_WORKER_MODES_JOB_MODES_H_

#include "common/base/status.h"
#include "worker/modes/mode_context.h"

namespace tessera::worker {

// A job mode's body. REQUIRES: context.client is not null (jobs run in a fleet).
using JobRunner = Status (*)(const ModeContext& context);

Status RunSmokeMode(const ModeContext& context);
// --bench-*: one JSON line per size on stdout (and the chosen ring channel, from rank 0).
Status RunAllReduceBenchMode(const ModeContext& context);
// --bench-*, --bench-ps-mode, --ps-chunk-elements, --ps-shared-memory.
Status RunPsBenchMode(const ModeContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_JOB_MODES_H_
