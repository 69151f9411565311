// CPU-only implementation of worker/collectives/nccl/nccl_collectives.h, used where the build found no CUDA
// toolkit (or with --repo_env=TESSERA_DISABLE_CUDA=1). See nccl_collectives.cu for the real one.
#include "worker/collectives/nccl/nccl_collectives.h"

#include <string>

namespace tessera::worker {

StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(const NcclCollectivesOptions& options,
                                                             Collectives* /*host*/) {
  return UnavailableError("this build has no CUDA (built without nvcc, or with "
                          "--repo_env=TESSERA_DISABLE_CUDA=1): cannot create NCCL collectives "
                          "for rank " + std::to_string(options.rank) + " on cuda:" +
                          std::to_string(options.device));
}

bool IsDeviceMemory(const void* /*pointer*/) { return false; }

}  // namespace tessera::worker
