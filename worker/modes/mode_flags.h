// ModeFlags: the flags of tessera-worker that belong to its modes (the parameter-server,
// all-reduce and ring flags, and the smoke and benchmark jobs' flags), as a plain struct.
// worker_flags.cc registers them on the command line; the strategies and jobs of
// mode_registry.h read them. Every mode accepts all of them (a flag another mode takes is
// ignored), as tessera-worker always did.
//
// Thread-safety: a plain struct, filled once by the command line in main().
#ifndef TESSERA_WORKER_MODES_MODE_FLAGS_H_
#define TESSERA_WORKER_MODES_MODE_FLAGS_H_

#include <cstdint>
#include <string>

#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/direct_read_collectives.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/collectives/spin_wait.h"
#include "worker/jobs/allreduce_bench_job.h"
#include "worker/jobs/smoke_job.h"

namespace tessera::worker {

struct ModeFlags {
  SmokeFlags smoke;
  AllReduceBenchFlags bench;
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
  // CommThread's and CommPool's spin_us (spin_wait.h).
  int64_t comm_spin_us = kDefaultCommSpinUs;
  // CommunicatorOptions::direct_read_min_bytes (0: off).
  uint64_t direct_read_min_bytes = kDefaultDirectReadMinBytes;
  // CommunicatorOptions::one_shot_max_bytes (0: off).
  uint64_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
  // --mode hsdp: the ranks of a shard group (consecutive); 0: each host's ranks.
  int shard_group_size = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_MODE_FLAGS_H_
