// tessera-worker's command line: every flag of every mode (the training flags of
// training_setup.h, the parameter-server, all-reduce and ring flags, and the smoke and benchmark
// jobs' flags), registered in this one place. CLI11 is a large header (about 5 s of compile time
// per source file that includes it here): the worker's other sources hold their flags as plain
// structs and never include it.
//
// Thread-safety: plain functions; the command line is parsed once, in main().
#ifndef TESSERA_WORKER_WORKER_FLAGS_H_
#define TESSERA_WORKER_WORKER_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "worker/collectives/channel/links/ring_links.h"
#include "worker/jobs/allreduce_bench_job.h"
#include "worker/jobs/smoke_job.h"
#include "worker/training_setup.h"

namespace CLI {
class App;
}

namespace tessera::worker {

struct WorkerFlags {
  std::string mode = "local";
  SmokeFlags smoke;
  AllReduceBenchFlags bench;
  TrainingFlags training;
  int64_t staleness = 2;
  uint64_t ps_chunk_elements = 1 << 16;
  bool ps_shared_memory = true;
  int64_t ps_resend_ms = 2000;
  std::string bench_ps_mode = "ps-async";
  double bucket_mb = 25;
  bool no_overlap = false;
  uint64_t segment_kb = 1024;
  std::string ring_transport = "auto";
  int64_t ring_spin_us = kDefaultRingSpinCapUs;
};

// A command line with every flag of tessera-worker bound to `flags` (with help text and
// defaults), ready for RunProcess (common/process/process_runtime.h). REQUIRES: `flags`
// outlives it.
std::shared_ptr<CLI::App> WorkerCommandLine(WorkerFlags* flags);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_WORKER_FLAGS_H_
