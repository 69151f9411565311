// PsClient: a PyTorch process's membership of a parameter-server job, behind
// tessera.torch.ParameterServerOptimizer and ShardedEmbedding (no torch types here).
//
// Join registers the process as worker `rank` of a job of `world_size` workers with a running
// fleet's coordinator (`tessera-launch --servers S --workers 0`, or a coordinator and servers
// started by hand), waits for the job's other workers (the coordinator's rendezvous and the
// job's "start" barrier, as tessera-worker does) and gets the fleet view. From then on it is a
// PsEngine (worker/engines/ps_engine.h), the engine the native ps-* modes train with: rank 0
// initialises the servers from its parameters, every rank pulls them, each step pushes the
// gradients and pulls the servers' values, and the servers apply the same optimizer code.
// Dense parameters are one flat float32 buffer described by (name, shape) pairs in order, as
// a ParameterLayout.
//
// A failed server or worker of the job fails every pending and later call with the
// coordinator's notice naming it (peer failures are fatal to a PS worker, as in
// tessera-worker); otherwise a call fails after request_timeout_ms naming the server and the
// request.
//
// Thread-safety: every method may be called from any thread; calls are serialised.
#ifndef TESSERA_WORKER_TORCH_PS_CLIENT_H_
#define TESSERA_WORKER_TORCH_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/training/embedding_table.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "common/training/parameter_layout.h"
#include "common/transport/rpc_endpoint.h"
#include "common/security/credentials.h"
#include "worker/engines/ps_engine.h"

namespace tessera::worker {

struct PsClientOptions {
  std::string coordinator;  // HOST:PORT of the fleet's coordinator
  int rank = 0;
  int world_size = 1;
  std::string bind_host = "127.0.0.1";
  Credentials credentials;  // for the fleet's servers and coordinator
  std::string mode = "ps-sync";  // ps-sync | ps-async | ps-ssp
  int64_t staleness = 0;         // ps-ssp: the bound
  std::string optimizer = "sgd";
  std::string optimizer_params;  // "lr=0.1,momentum=0.9,weight_decay=1e-4" (optimizer.h)
  LrScheduleOptions schedule;
  uint64_t chunk_elements = 1 << 16;
  bool shared_memory = true;  // PsEngineOptions::shared_memory
  int64_t rendezvous_timeout_ms = 60000;  // joining: the coordinator and the job's workers
  int64_t request_timeout_ms = 30000;     // each push, pull or checkpoint
  int64_t heartbeat_timeout_ms = 4000;
};

class PsClient {
 public:
  // Fails naming the coordinator when it cannot be reached, with the coordinator's reason
  // when the job does not assemble, or InvalidArgument naming a bad option.
  static StatusOr<std::unique_ptr<PsClient>> Join(const PsClientOptions& options);
  // Leaves the fleet (a clean goodbye) if Leave was not called.
  ~PsClient();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int num_servers() const;
  const std::string& mode() const { return options_.mode; }
  // "sgd lr=0.1 ...", "constant": the effective settings, for logs and errors.
  std::string optimizer_description() const { return optimizer_.ToString(); }

  // Once. `names` and `shapes` describe the flat buffer `params` of `param_count` floats in
  // order. Rank 0
  // initialises the servers from `params` and the tables' specs; then every rank's `params`
  // receives the servers' values. A worker whose model has another number of elements than
  // rank 0's is refused by the servers (naming the chunk); see docs/pytorch.md for what is
  // not yet checked.
  Status Initialize(const std::vector<std::string>& names,
                    const std::vector<std::vector<int64_t>>& shapes,
                    const std::vector<EmbeddingTableSpec>& tables, float* params,
                    uint64_t param_count);
  // Floats per row of table `table` (an index into Initialize's tables), or -1 when there is
  // no such table.
  int64_t RowFloats(size_t table) const;
  // The current values of rows `ids` (any order, repeats allowed) of table `table` (an index
  // into Initialize's tables) into values (ids.size() x dim floats). An id outside the table
  // fails naming the table and the id.
  Status LookupRows(size_t table, const std::vector<int64_t>& ids, float* values);
  // During the backward pass of update `step`: grads[offset, offset + size) are final. Each
  // dense chunk whose elements are all final goes to its server at once (PsEngine's overlap),
  // read from `grads`, which must be the buffer Step then gets. `grads_owner` keeps `grads`
  // alive: the chunks are sent from there without a copy (null: each is copied).
  Status GradientsReady(int64_t step, float* grads, std::shared_ptr<const void> grads_owner,
                        uint64_t offset, uint64_t size);
  // Update number `step` (1-based, consecutive): pushes `grads` (the layout's size; sent
  // without a copy when `grads_owner` keeps them alive) and the tables' row gradients
  // (`sparse[t]`: ids, distinct, and ids.size() x dim grads), pulls the parameters after the
  // step into `params`. `grads` may be overwritten once Step returns.
  Status Step(int64_t step, float* params, float* grads, std::shared_ptr<const void> grads_owner,
              const std::vector<SparseRows>& sparse);
  // Rank 0 has every server write its shard of the state after `step`, and commits the
  // checkpoint under `root` (step-N/, MANIFEST.json, LATEST); other ranks return at once.
  Status SaveCheckpoint(const std::string& root, int64_t step);
  // After Initialize: rank 0 has the servers load step `step` (-1: the newest committed one
  // under `root`); every rank pulls the restored parameters into `params`. Returns the step.
  StatusOr<int64_t> RestoreCheckpoint(const std::string& root, int64_t step, float* params);

  // The process's Prometheus text: the PS client's and the transport's counters.
  std::string MetricsText() const;
  // Says goodbye to the coordinator and stops heartbeats. Idempotent.
  void Leave(const std::string& reason);
  // Leaves because the process is failing with `error` (an uncaught Python exception): the
  // coordinator relays it to every other process of the job at once. Idempotent with Leave.
  void LeaveWithError(const Status& error);

 private:
  PsClient(const PsClientOptions& options) : options_(options) {}
  Status Usable(const std::string& what) const;
  // `error` of a request, or the fleet failure behind it: a server that stops because another
  // member failed can answer (or vanish) before the coordinator's notice of that failure
  // reaches this worker, so an error that may come from a stopping peer waits up to a second
  // for the notice, which names the root cause, and returns it with `error` after it.
  Status WithRootCause(Status error) const;

  const PsClientOptions options_;
  OptimizerOptions optimizer_;
  int rank_ = 0;
  int world_size_ = 1;
  MetricsRegistry metrics_;
  std::unique_ptr<RpcEndpoint> endpoint_;
  std::unique_ptr<RendezvousClient> client_;  // after endpoint_: destroyed first
  std::unique_ptr<PsEngine> engine_;

  mutable std::mutex mu_;  // serialises the calls below
  ParameterLayout layout_;  // mu_
  std::vector<EmbeddingTableSpec> tables_;  // mu_
  bool initialized_ = false;  // mu_
  bool left_ = false;         // mu_
  int64_t last_step_ = 0;     // mu_
  int64_t backward_step_ = 0;  // mu_: the step whose backward reported gradients (0: none)
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_PS_CLIENT_H_
