// PsService: the server side of the parameter-server modes (ps-sync, ps-async, ps-ssp).
//
// Worker rank 0 initialises the job (PsInitRequest: the PsJobConfig as JSON and the initial
// values of this server's dense chunks, common/training/ps_job.h); from then on the service holds:
//   - its dense chunks, each with its optimizer state and its own lock (no global lock on the
//     hot path: requests for different chunks proceed in parallel on the service's threads);
//   - the embedding rows hashed to it (EmbeddingTable, created on first touch from the seeded
//     initial values, so only touched rows exist and only touched rows travel).
// Requests (common/messages/ps_messages.h):
//   PsPushPullRequest   gradients for chunks -> PsPushPullReply with their values, released by
//                       the consistency model:
//                         ps-sync  the W workers' gradients of step t are summed in rank order,
//                                  averaged and applied once (the optimizer's step t); replies
//                                  wait until then, so every worker sees the same parameters;
//                         ps-async each push is applied as it arrives; the reply is immediate;
//                         ps-ssp   as async, but the reply to a push of step t waits until the
//                                  slowest worker has pushed step t - K (--staleness K).
//                       Without gradients: a pull of the values after step header.step - 1.
//                       ps-sync stop agreement: a push saying `stop` (its worker was asked to
//                       stop) makes every reply with the values after that step name the
//                       lowest such rank (stopped_by), so every worker stops after it.
//   SparsePushRequest   row gradients of one table -> Ack (ps-sync: applied once all W workers
//                       pushed their rows for the step, summed in rank order and averaged).
//   SparsePullRequest   rows -> SparsePullReply (ps-sync: after step header.step - 1 applied).
//   CheckpointRequest   write (ps-sync: once the step is applied everywhere) or restore this
//                       server's shard of a step -> CheckpointReply; or (`copy`) the shard of
//                       the step in the reply, no file: a range copied to a server that joined
//                       (ps-async, ps-ssp: with `forward_to`, DenseShard::CopyTo's cut, after
//                       which every update of the range is forwarded to the joined server).
//   PsInitRequest with `copy` (a server that joined in a failed one's place): the range's job
//                       starts from that copy, at its step (or each chunk's version and clocks);
//                       requests parked for it (forwards too) go then.
// Every error names the key, chunk, table or row, and the owner where another server owns it.
// A request parked before its job's init longer than PsServiceOptions::park_limit_ms is
// answered FailedPrecondition, naming its job token and how long it waited.
//
// Replicated ranges (--replicas): a server holds its own key range and the ranges of the
// servers before it whose copies it keeps; every request names its range (`range`, -1: the
// server's own), and each range is a part of the job of its own (init, chunks, rows, ledger,
// checkpoint file). A backup's push (`ack_only`) is applied like any other and answered
// without the values.
//
// Forwarded updates (--replicas 2): the workers push to each range's primary only, naming its
// backup (`forward_to`); the primary sends each update it applies there (StepForwarder,
// `forwarded`), and the replies with its values go once the backup has it. In ps-sync an
// update is a step (the averaged gradients and the step's notes), which costs the backup one
// gradient per step instead of one per worker; in ps-async and ps-ssp it is a push, with its
// update numbers on the primary, which the backup applies in that order: both copies apply
// the same updates in the same order. A primary that fails leaves the backup at its last
// update or before it; the workers push again what was not answered to the backup, which
// applies it or, when it took it already, answers with its values (ConsistencyPolicy::kApplied).
// Workers on this host push in a region every copy of the range mapped (worker_regions.h): a
// forward to the backup then names the chunks instead of carrying them (in ps-sync, of a step
// every worker pushed in its region, whose gradients the backup averages there itself), and
// the backup acknowledges it once applied.
//
// The service is thin: it reads the requests, hands them to the job's parts on its work queue
// (work_queue.h) and answers. The parts: DenseShard (dense_shard.h) and SparseTables
// (sparse_tables.h), both releasing replies by a ConsistencyPolicy (consistency_policy.h);
// checkpoints (CheckpointRequest) by SaveShard / RestoreShard (shard_checkpoint.h). Requests of
// a job not initialised yet are parked until its init. A request delivered twice (the same
// worker and request id) changes the state once: copies of pushes and checkpoints are dropped
// (request_ledger.h), as is a copy of the init of the current job.
//
// Thread-safety: thread-safe. Handlers run on the transport's I/O thread and only queue work.
#ifndef TESSERA_SERVER_PS_PS_SERVICE_H_
#define TESSERA_SERVER_PS_PS_SERVICE_H_

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/transport/rpc_endpoint.h"

namespace tessera::server {

struct PsServiceOptions {
  int server_rank = 0;
  int num_servers = 1;
  uint64_t key_space = 0;
  int threads = 2;  // threads applying updates
  int64_t forward_timeout_ms = 30000;  // a forwarded step unanswered this long is given up
  // A request parked for its job's init (see above) that waited this long is answered with an
  // error at the next request parked or init (a request of a job no worker initialises here,
  // such as one of a replaced job, would otherwise be held forever). tessera-server: twice
  // --request-timeout-ms.
  int64_t park_limit_ms = 60000;
  // A reply held this long is logged once, saying what holds it (DenseShard::
  // DescribeLongWaits: a slow worker under ps-ssp's bound, a backup that does not acknowledge,
  // a step some worker has not pushed); 0: never. tessera-server: a third of
  // --request-timeout-ms, so the log says why before the worker's deadline does.
  int64_t long_wait_ms = 10000;
};

class PsService {
 public:
  // Starts the threads and installs the handlers on `endpoint`.
  static StatusOr<std::unique_ptr<PsService>> Start(const PsServiceOptions& options,
                                                    RpcEndpoint* endpoint,
                                                    MetricsRegistry* metrics);
  // Replaces the handlers with ones answering UNAVAILABLE "server R has stopped", then stops
  // the threads (requests still waiting are dropped: their workers were told by the
  // coordinator, or time out).
  ~PsService();

  // The member at `address` was declared failed (`why`, the coordinator's notice): steps are
  // not forwarded there any more, and those waiting for it go on.
  void PeerLost(const std::string& address, const std::string& why);

  // Elastic jobs (issue 47): worker `rank` left the job or died (`why`): it stops counting in
  // every job part here (DenseShard::RemoveWorker, SparseTables::RemoveWorker), so a ps-sync
  // step waiting only for it completes with the workers that pushed. Returns at once; the
  // work runs on the service's queue. A rank outside a job is ignored.
  void WorkerLeft(int rank, const std::string& why);

  class Impl;

 private:
  explicit PsService(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_PS_SERVICE_H_
