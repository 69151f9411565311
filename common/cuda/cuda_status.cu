// The CUDA runtime's errors as Status codes (common/cuda/cuda_status.h). Compiled by nvcc like
// every CUDA source (//third_party/cuda:cuda.bzl), though it has no device code.
#include "common/cuda/cuda_status.h"

#include <string>
#include <utility>

namespace tessera {
namespace {

// Each error code once. Codes not listed are INTERNAL: kernel faults (illegal address, launch
// failure, assert, ...), stream-capture misuse and the unknown error are bugs or a broken
// device, nothing a caller can act on.
StatusCode CodeOf(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return StatusCode::kOk;

    case cudaErrorMemoryAllocation:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorTooManyPeers:
    case cudaErrorMpsMaxClientsReached:
    case cudaErrorMpsMaxConnectionsReached:
      return StatusCode::kResourceExhausted;

    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidSymbol:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidTexture:
    case cudaErrorInvalidTextureBinding:
    case cudaErrorInvalidChannelDescriptor:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidFilterSetting:
    case cudaErrorInvalidNormSetting:
    case cudaErrorInvalidSurface:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidResourceType:
    case cudaErrorInvalidResourceConfiguration:
    case cudaErrorInvalidClusterSize:
    case cudaErrorCooperativeLaunchTooLarge:
      return StatusCode::kInvalidArgument;

    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsServerNotReady:
      return StatusCode::kUnavailable;

    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorNotPermitted:
      return StatusCode::kFailedPrecondition;

    case cudaErrorNotSupported:
    case cudaErrorNotYetImplemented:
    case cudaErrorCdpNotSupported:
      return StatusCode::kUnimplemented;

    case cudaErrorLaunchTimeout:
    case cudaErrorTimeout:
      return StatusCode::kDeadlineExceeded;

    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
      return StatusCode::kDataLoss;

    default:
      return StatusCode::kInternal;
  }
}

}  // namespace

Status CudaStatus(cudaError_t error, std::string_view call) {
  const StatusCode code = CodeOf(error);
  if (code == StatusCode::kOk) return OkStatus();
  std::string message(call);
  message += ": ";
  message += cudaGetErrorName(error);
  message += ": ";
  message += cudaGetErrorString(error);
  return Status(code, std::move(message));
}

}  // namespace tessera
