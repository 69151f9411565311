// NcclStatus: the one adapter from an NCCL result (ncclResult_t) to a Status.
//
// Every NCCL result in Tessera that becomes a Status or a log line passes through here, so one
// result has one canonical code wherever it happens. The message names the call, the result
// and NCCL's own words:
// "ncclAllReduce(count=10, float32, sum): ncclRemoteError: remote process exited or there was a
// network error (NCCL: <the library's last error message>)".
//
// libnccl is loaded at run time (nccl_collectives.cu says why), so this adapter calls nothing in
// it: the caller, which holds the loaded library, passes its words in.
//
// Only CUDA sources include this header (it names ncclResult_t, from <nccl.h>): the .cu files of
// this package and this library's test. A CPU-only build compiles none of them.
//
// Thread-safety: a pure function of its arguments.
#ifndef TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_STATUS_H_
#define TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_STATUS_H_

#include <nccl.h>

#include <string_view>

#include "common/base/status.h"

namespace tessera::worker {

// OK for ncclSuccess. Otherwise "<call>: <result name>: <description>", then
// " (NCCL: <detail>)" when `detail` is not empty, with the code:
//   INVALID_ARGUMENT    ncclInvalidArgument
//   FAILED_PRECONDITION ncclInvalidUsage (e.g. a call on a communicator in the wrong state)
//   UNAVAILABLE         ncclSystemError (sockets, the network, shared memory) and
//                       ncclRemoteError (a peer went away)
//   INTERNAL            ncclUnhandledCudaError, ncclInternalError, and ncclInProgress, which is
//                       not an error: a caller passing it here has not waited for the call
//   UNKNOWN             a result this build does not know (a newer NCCL), named by its number
// `call` says what was called, e.g. "ncclAllReduce(count=10, float32, sum)"; `description` is
// ncclGetErrorString(result) and `detail` is ncclGetLastError(comm) (empty when it has none).
Status NcclStatus(ncclResult_t result, std::string_view call, std::string_view description,
                  std::string_view detail);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_NCCL_NCCL_STATUS_H_
