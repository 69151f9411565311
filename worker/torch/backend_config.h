// BackendConfig: how the "tessera" torch.distributed backend is set up, from the environment
// of the process that imports tessera.torch (torchrun, mp.spawn and plain processes have no
// flags to give it):
//
//   TESSERA_BIND_HOST       where each rank's transport and ring links listen, and the
//                           address its peers get (default 127.0.0.1: one host)
//   TESSERA_RING_TRANSPORT  auto (default), shm, links or zmq, as tessera-worker's flag
//
// Thread-safety: a pure function of the environment it is given.
#ifndef TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_
#define TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_

#include "common/base/status.h"
#include "common/config/config.h"
#include "worker/torch/group_member.h"

namespace tessera::worker {

// The options every process group of this process starts from (rank, world size, store and
// timeout come from torch). InvalidArgument naming the variable for a bad value.
StatusOr<GroupMemberOptions> BackendOptionsFrom(const Environment& env);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_BACKEND_CONFIG_H_
