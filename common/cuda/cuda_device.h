// CUDA devices: whether this build has CUDA, which devices the machine has, and a self-test.
//
// Two implementations serve this header (see //third_party/cuda:cuda.bzl): cuda_device.cu,
// compiled by nvcc where the toolkit was found at build time, and cuda_device_cpu.cc, where it
// was not (or with --repo_env=TESSERA_DISABLE_CUDA=1). The header names no CUDA type, so
// callers compile the same way in both builds.
//
// Nothing here aborts: a machine without a driver or a GPU is a normal case (CudaDeviceCount()
// is 0 and the others return UNAVAILABLE with the CUDA runtime's reason).
//
// Thread-safety: all functions are thread-safe (the CUDA runtime is). CudaSelfTest makes
// `index` the calling thread's current device while it runs and restores the previous one.
#ifndef TESSERA_COMMON_CUDA_CUDA_DEVICE_H_
#define TESSERA_COMMON_CUDA_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tessera {

struct CudaDeviceInfo {
  int index = 0;                    // CUDA runtime ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;                 // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;            // compute capability, e.g. 9.0 for Hopper
  int compute_minor = 0;
  uint64_t total_memory_bytes = 0;  // global memory
  int multiprocessors = 0;          // streaming multiprocessors
};

// True when this binary was built with nvcc (the CUDA implementation), false for the CPU-only
// fallback. Says nothing about whether a device is present.
bool CudaCompiledIn();

// Number of usable CUDA devices; 0 without CUDA, without a driver, or without a device.
int CudaDeviceCount();

// Properties of device `index`. Errors: UNAVAILABLE when the build has no CUDA or the runtime
// finds no driver/device (the message quotes the runtime's reason); INVALID_ARGUMENT when
// `index` is not in [0, CudaDeviceCount()).
StatusOr<CudaDeviceInfo> QueryCudaDevice(int index);

// Runs a small real kernel on device `index` (y = a*x + y over 1M floats), copies the result
// back and compares it with the same computation on the CPU. OK when they agree; otherwise the
// error names the CUDA call that failed and the runtime's error string, or the first wrong
// element. Errors as QueryCudaDevice for a bad index or a missing driver/device.
Status CudaSelfTest(int index);

}  // namespace tessera

#endif  // TESSERA_COMMON_CUDA_CUDA_DEVICE_H_
