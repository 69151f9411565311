// CudaBackend: ComputeBackend on one CUDA device. GEMM through cuBLAS, everything else as
// kernels, all enqueued in order on the backend's own stream.
//
// Two implementations serve this header (see //third_party/cuda:cuda.bzl): cuda_backend.cu,
// compiled by nvcc where the toolkit was found at build time, and cuda_backend_cpu.cc, where it
// was not (or with --repo_env=TESSERA_DISABLE_CUDA=1), whose CreateCudaBackend always returns
// UNAVAILABLE. The header names no CUDA type, so callers compile the same way in both builds.
//
// Numerics (what to expect against CpuBackend):
//   - Gemm is cublasSgemm in full float32 (results agree with OpenBLAS to ~1e-5 relative).
//     CudaBackendOptions::allow_tf32 lets cuBLAS use TF32 tensor cores instead (~1e-3
//     relative: a 10-bit mantissa on the inputs).
//   - Every op except ScatterAddRows is deterministic: the same inputs on the same device give
//     bit-identical results on every run (reductions use a fixed order that depends only on the
//     shape). ScatterAddRows adds with atomics, so when several rows share a slot their order,
//     and the last bits of the sum, vary from run to run.
//   - Op failures that the interface cannot return (a kernel fault, a lost device, scratch
//     memory for a loss that cannot be allocated) log the backend, the op, the CUDA call and
//     the runtime's error string at ERROR level and abort the process: the device state is
//     unknown afterwards. Since ops are asynchronous, a fault inside a kernel surfaces at the
//     next op that synchronises (CopyToHost, Synchronize, a loss, Free) and is reported there.
//
// Memory ops: Allocate/Free are cudaMalloc/cudaFree (Free waits for the device). CopyToDevice
// from ordinary (pageable) host memory returns once the source has been read, so the caller may
// reuse it at once; CopyToHost and the losses wait for every op issued before them.
//
// Every call makes the backend's device current on the calling thread for its duration and
// restores the previous device afterwards.
//
// Thread-safety: as ComputeBackend, one thread at a time. Distinct backends (even on the same
// device) may be used from distinct threads concurrently.
#ifndef TESSERA_WORKER_NN_CUDA_CUDA_BACKEND_H_
#define TESSERA_WORKER_NN_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "common/base/status.h"
#include "worker/nn/compute_backend.h"

namespace tessera::worker {

struct CudaBackendOptions {
  // GEMMs may use TF32 tensor cores instead of float32 (see Numerics above). The worker sets it
  // from its config (--cuda-tf32 or TESSERA_CUDA_TF32, common/config/config.h).
  bool allow_tf32 = false;
};

// A backend on CUDA device `device` (a runtime ordinal, after CUDA_VISIBLE_DEVICES); its name()
// is "cuda:<device>" and host_memory() is false.
// Errors: UNAVAILABLE when this build has no CUDA or the runtime finds no driver or no device
// (the message quotes the runtime's reason); INVALID_ARGUMENT when `device` is not in
// [0, device count); INTERNAL when the stream or the cuBLAS handle cannot be created.
StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(int device,
                                                            const CudaBackendOptions& options);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_CUDA_CUDA_BACKEND_H_
