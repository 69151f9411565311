// CPU-only implementation of worker/nn/cuda/cuda_backend.h, used where the build found no CUDA toolkit
// (or with --repo_env=TESSERA_DISABLE_CUDA=1). See cuda_backend.cu for the real one.
#include "worker/nn/cuda/cuda_backend.h"

#include <string>

namespace tessera::worker {

StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(int device,
                                                            const CudaBackendOptions& options) {
  return UnavailableError("this build has no CUDA (built without nvcc, or with "
                          "--repo_env=TESSERA_DISABLE_CUDA=1): cannot create backend cuda:" +
                          std::to_string(device));
}

}  // namespace tessera::worker
