// NCCL results as Status codes (worker/collectives/nccl/nccl_status.h). Compiled by nvcc like
// every CUDA source (//third_party/cuda:cuda.bzl), though it has no device code.
#include "worker/collectives/nccl/nccl_status.h"

#include <string>
#include <utility>

namespace tessera::worker {
namespace {

struct Meaning {
  StatusCode code;
  const char* name;  // nullptr: a result this build does not know
};

// Each result once; no default, so that -Wswitch names a result a newer <nccl.h> adds.
Meaning MeaningOf(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return {StatusCode::kOk, "ncclSuccess"};
    case ncclUnhandledCudaError: return {StatusCode::kInternal, "ncclUnhandledCudaError"};
    case ncclSystemError: return {StatusCode::kUnavailable, "ncclSystemError"};
    case ncclInternalError: return {StatusCode::kInternal, "ncclInternalError"};
    case ncclInvalidArgument: return {StatusCode::kInvalidArgument, "ncclInvalidArgument"};
    case ncclInvalidUsage: return {StatusCode::kFailedPrecondition, "ncclInvalidUsage"};
    case ncclRemoteError: return {StatusCode::kUnavailable, "ncclRemoteError"};
    case ncclInProgress: return {StatusCode::kInternal, "ncclInProgress"};
    case ncclNumResults: break;  // a count, not a result
  }
  return {StatusCode::kUnknown, nullptr};
}

}  // namespace

Status NcclStatus(ncclResult_t result, std::string_view call, std::string_view description,
                  std::string_view detail) {
  const Meaning meaning = MeaningOf(result);
  if (meaning.code == StatusCode::kOk) return OkStatus();
  std::string message(call);
  message += ": ";
  message += meaning.name != nullptr
                 ? std::string(meaning.name)
                 : "ncclResult_t " + std::to_string(static_cast<int>(result));
  message += ": ";
  message += description;
  if (!detail.empty()) {
    message += " (NCCL: ";
    message += detail;
    message += ")";
  }
  return Status(meaning.code, std::move(message));
}

}  // namespace tessera::worker
