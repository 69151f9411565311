// CPU-only implementation of common/cuda/cuda_device.h, used where the build found no CUDA toolkit
// (or with --repo_env=TESSERA_DISABLE_CUDA=1). See cuda_device.cu for the real one.
#include "common/cuda/cuda_device.h"

namespace tessera {
namespace {

Status NotBuiltWithCuda() {
  return UnavailableError("Tessera was built without CUDA (no nvcc at build time)");
}

}  // namespace

bool CudaCompiledIn() { return false; }

int CudaDeviceCount() { return 0; }

StatusOr<CudaDeviceInfo> QueryCudaDevice(int index) { return NotBuiltWithCuda(); }

Status CudaSelfTest(int index) { return NotBuiltWithCuda(); }

}  // namespace tessera
