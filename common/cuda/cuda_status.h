// CudaStatus: the one adapter from a CUDA runtime error (cudaError_t) to a Status.
//
//   RETURN_IF_ERROR(CudaStatus(cudaMalloc(&x, bytes),
//                              "cudaMalloc(x, " + std::to_string(bytes) + " bytes)"));
//
// Every CUDA runtime result in Tessera that becomes a Status, a log line or an abort passes
// through here, so one error has one canonical code wherever it happens (out of memory is
// RESOURCE_EXHAUSTED in the device self-test, the compute backend and NCCL's padding alike).
// The message names the call and quotes the runtime's name and description of the error:
// "cudaMalloc(x, 4194304 bytes): cudaErrorMemoryAllocation: out of memory".
//
// Only CUDA sources include this header, since it names cudaError_t: the .cu implementations of
// //third_party/cuda:cuda.bzl's cuda_library targets, and this library's test. A CPU-only build
// (no toolkit, or --repo_env=TESSERA_DISABLE_CUDA=1) compiles none of them.
//
// Thread-safety: a pure function of its arguments. The runtime's error names and descriptions
// are static tables: no driver or device is needed.
#ifndef TESSERA_COMMON_CUDA_CUDA_STATUS_H_
#define TESSERA_COMMON_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string_view>

#include "common/base/status.h"

namespace tessera {

// OK for cudaSuccess. Otherwise "<call>: <error name>: <error description>" with the code:
//   RESOURCE_EXHAUSTED  out of device memory or launch resources, too many peers or MPS clients
//   INVALID_ARGUMENT    an invalid value, pointer, device, symbol, handle or launch shape
//   UNAVAILABLE         no usable driver or device here (a normal condition, not a bug), or the
//                       MPS server cannot be reached
//   FAILED_PRECONDITION the binary has no code this device can run (e.g. sm_90 code on an older
//                       GPU), or the operation is not permitted in this state
//   UNIMPLEMENTED       not supported by this device, driver or build
//   DEADLINE_EXCEEDED   the runtime's own timeouts (a kernel stopped by the watchdog)
//   DATA_LOSS           uncorrectable ECC or NVLink errors
//   INTERNAL            everything else: a kernel fault (illegal address, launch failure), an
//                       unknown error. After a kernel fault the context is unusable.
// `call` says what was called, with what matters of its arguments, e.g. "cudaSetDevice(1)".
Status CudaStatus(cudaError_t error, std::string_view call);

}  // namespace tessera

#endif  // TESSERA_COMMON_CUDA_CUDA_STATUS_H_
