// HostedCoordinator: the job's coordinator, run inside worker rank 0 when a Slurm step of
// workers was given no coordinator (`srun -n N tessera-worker --mode allreduce ...`), as
// torch's TCPStore runs inside rank 0: nobody has to start one by hand.
//
// It listens at the config's coordinator address (the step's head node on the job's port,
// common/config/slurm.h) on an endpoint of its own, for the job's workers and no servers, and
// ends once every worker has left (--exit-when-workers-leave). Rank 0 keeps its process until
// then, so the other ranks never lose their coordinator before they are done.
//
// Thread-safety: Start, Finish and the destructor from one thread; the coordinator runs on its
// own.
#ifndef TESSERA_WORKER_HOSTED_COORDINATOR_H_
#define TESSERA_WORKER_HOSTED_COORDINATOR_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/security/credentials.h"
#include "common/transport/rpc_endpoint.h"
#include "coordinator/coordinator.h"

namespace tessera::worker {

class HostedCoordinator {
 public:
  // Binds the coordinator's address and starts serving.
  static StatusOr<std::unique_ptr<HostedCoordinator>> Start(const ProcessConfig& config,
                                                            const Credentials& credentials);
  ~HostedCoordinator();  // stops serving (members still there are told) and joins

  // Waits until the coordinator has ended (every worker has left, or failed) and returns how it
  // ended. Once `stop_requested` (this process was asked to stop: so were the others, or they
  // are told) it waits 1 s more at most for the others' goodbyes.
  Status Finish(const std::function<bool()>& stop_requested);

 private:
  HostedCoordinator() = default;

  std::unique_ptr<RpcEndpoint> endpoint_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::optional<Status> result_;  // guarded by mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_HOSTED_COORDINATOR_H_
