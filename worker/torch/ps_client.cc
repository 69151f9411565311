#include "worker/torch/ps_client.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/quote.h"
#include "common/base/role.h"
#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::worker {
namespace {

// OutOfRange naming the table and the first id outside it.
Status CheckRowIds(const EmbeddingTableSpec& table, const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    if (id < 0 || id >= table.rows) {
      return OutOfRangeError("embedding table " + Quote(table.name) + ": row id " +
                             std::to_string(id) + " is outside [0, " +
                             std::to_string(table.rows) + ")");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<PsClient>> PsClient::Join(const PsClientOptions& options) {
  const std::string who = "parameter-server worker " + std::to_string(options.rank) + " of " +
                          std::to_string(options.world_size);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(who + ": the rank must be in [0, world_size)");
  }
  if (options.coordinator.empty()) {
    return InvalidArgumentError(who +
                                ": no coordinator: pass coordinator=\"HOST:PORT\" or set "
                                "TESSERA_COORDINATOR to the address of a running fleet "
                                "(tessera-launch --servers S --workers 0)");
  }
  ASSIGN_OR_RETURN(PsConsistency consistency, ParsePsMode(options.mode));
  if (consistency != PsConsistency::kSsp && options.staleness != 0) {
    return InvalidArgumentError(who + ": staleness=" + std::to_string(options.staleness) +
                                " is for mode ps-ssp, not " + options.mode);
  }
  if (options.staleness < 0) {
    return InvalidArgumentError(who + ": staleness=" + std::to_string(options.staleness) +
                                " must be >= 0");
  }
  if (options.chunk_elements < 1) return InvalidArgumentError(who + ": chunk_elements must be > 0");
  for (int64_t timeout :
       {options.rendezvous_timeout_ms, options.request_timeout_ms, options.heartbeat_timeout_ms}) {
    if (timeout <= 0) return InvalidArgumentError(who + ": timeouts must be positive");
  }
  std::unique_ptr<PsClient> client(new PsClient(options));
  StatusOr<OptimizerOptions> optimizer =
      ParseOptimizerOptions(options.optimizer, options.optimizer_params);
  if (!optimizer.ok()) return optimizer.status().WithContext("optimizer " + options.optimizer);
  RETURN_IF_ERROR(ValidateOptimizerOptions(*optimizer).WithContext("optimizer"));
  client->optimizer_ = *optimizer;

  ZmqTransportOptions transport;
  transport.credentials = options.credentials;
  transport.bind_host = options.bind_host;
  transport.role = Role::kWorker;
  transport.rank = options.rank;
  ASSIGN_OR_RETURN(client->endpoint_, StartZmqEndpoint(transport, &client->metrics_));
  RendezvousOptions join;
  join.coordinator_address = "tcp://" + options.coordinator;
  join.role = Role::kWorker;
  join.requested_rank = options.rank;
  join.num_workers = options.world_size;
  join.rendezvous_timeout_ms = options.rendezvous_timeout_ms;
  join.request_timeout_ms = std::min<int64_t>(options.request_timeout_ms, 30000);
  join.heartbeat_timeout_ms = options.heartbeat_timeout_ms;
  // A PS job cannot go on without a server or (ps-sync) a peer: the coordinator's notice fails
  // every pending request, naming who failed, as in tessera-worker.
  join.peer_failures_are_fatal = true;
  join.handlers_follow = true;  // the engine's, set below once it exists
  StatusOr<std::unique_ptr<RendezvousClient>> joined =
      RendezvousClient::Join(client->endpoint_.get(), join, &client->metrics_);
  if (!joined.ok()) {
    return Status(joined.status().code(), who + ": joining the fleet at " + options.coordinator +
                                              ": " + joined.status().message());
  }
  client->client_ = std::move(joined).value();
  client->rank_ = client->client_->rank();
  client->world_size_ = client->client_->view().num_workers;
  SetLogIdentity("worker", client->rank_);
  // The job's workers start together, as tessera-worker's do.
  RETURN_IF_ERROR(client->client_->Barrier("start", std::nullopt, options.rendezvous_timeout_ms)
                      .WithContext(who + ": barrier 'start' of the job's workers"));

  PsEngineOptions engine;
  engine.consistency = consistency;
  engine.staleness = options.staleness;
  engine.chunk_elements = options.chunk_elements;
  engine.shared_memory = options.shared_memory;
  engine.optimizer = client->optimizer_;
  engine.schedule = options.schedule;
  engine.request_timeout_ms = options.request_timeout_ms;
  // A checkpoint of any parameter-server mode restores into any other, as in tessera-worker
  // (whose mode registry lists the same; this backend does not see it).
  for (PsConsistency writer : {PsConsistency::kSync, PsConsistency::kAsync, PsConsistency::kSsp}) {
    engine.restores_checkpoints_of.emplace_back(PsModeName(writer));
  }
  ASSIGN_OR_RETURN(client->engine_,
                   PsEngine::Create(engine, client->endpoint_.get(), client->client_->view(),
                                    client->rank_, &client->metrics_));
  // A server's death is survived while every key range has a live copy (the fleet's
  // --replicas), as in tessera-worker; otherwise the failure names the range that was lost.
  client->client_->SetPeerLossHandler(
      [engine = client->engine_.get()](const FailureNotice& notice) {
        return engine->PeerLost(notice);
      });
  // A server that joined in a failed one's place gets its ranges back (ps-sync).
  client->client_->SetFleetChangeHandler(
      [engine = client->engine_.get()](const FleetView& view) { engine->FleetChanged(view); });
  TLOG(INFO) << who << " joined the fleet at " << options.coordinator << ": "
             << client->client_->view().num_servers << " servers, " << options.mode << ", "
             << client->optimizer_.ToString() << ", lr schedule " << options.schedule.ToString();
  return client;
}

PsClient::~PsClient() {
  Leave("the torch process is exiting");
  // The engine goes before the fleet client (members in reverse): no more questions for it.
  if (client_) {
    client_->SetPeerLossHandler(nullptr);
    client_->SetFleetChangeHandler(nullptr);
  }
}

int PsClient::num_servers() const { return client_->view().num_servers; }

int64_t PsClient::RowFloats(size_t table) const {
  std::lock_guard<std::mutex> lock(mu_);
  return table < tables_.size() ? tables_[table].dim : -1;
}

Status PsClient::Usable(const std::string& what) const {
  if (left_) return FailedPreconditionError(what + ": this worker has left the fleet");
  if (!initialized_) return FailedPreconditionError(what + ": before the initialisation");
  return client_->health().WithContext(what);
}

Status PsClient::WithRootCause(Status error) const {
  constexpr int64_t kNoticeWaitMs = 1000;
  const StatusCode code = error.code();
  if (code != StatusCode::kUnimplemented && code != StatusCode::kUnavailable &&
      code != StatusCode::kDeadlineExceeded && code != StatusCode::kAborted) {
    return error;
  }
  const Deadline deadline = Deadline::AfterMillis(kNoticeWaitMs);
  Status health = client_->health();
  while (health.ok() && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    health = client_->health();
  }
  if (health.ok() || health.message() == error.message()) return error;
  return Status(health.code(), health.message() + " (then: " + error.message() + ")");
}

Status PsClient::Initialize(const std::vector<std::string>& names,
                            const std::vector<std::vector<int64_t>>& shapes,
                            const std::vector<EmbeddingTableSpec>& tables, float* params,
                            uint64_t param_count) {
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return FailedPreconditionError("initialise: this worker has left the fleet");
  if (initialized_) return FailedPreconditionError("initialise: already initialised");
  if (names.size() != shapes.size()) {
    return InvalidArgumentError("initialise: " + std::to_string(names.size()) + " names for " +
                                std::to_string(shapes.size()) + " shapes");
  }
  ParameterLayout layout;
  for (size_t i = 0; i < names.size(); ++i) {
    RETURN_IF_ERROR(
        layout.Add(names[i], shapes[i]).status().WithContext("parameter " + Quote(names[i])));
  }
  if (layout.total_size() == 0) {
    return InvalidArgumentError("initialise: the model has no dense parameters");
  }
  if (layout.total_size() != param_count) {
    return InvalidArgumentError("initialise: the parameter buffer holds " +
                                std::to_string(param_count) + " floats, the parameters " +
                                std::to_string(layout.total_size()));
  }
  RETURN_IF_ERROR(client_->health().WithContext("initialise"));
  RETURN_IF_ERROR(engine_->Initialize(layout, tables, params));
  layout_ = std::move(layout);
  tables_ = tables;
  initialized_ = true;
  return OkStatus();
}

Status PsClient::LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("lookup"));
  if (table >= tables_.size()) {
    return InvalidArgumentError("lookup: no embedding table " + std::to_string(table) + " (" +
                                std::to_string(tables_.size()) + " tables)");
  }
  RETURN_IF_ERROR(CheckRowIds(tables_[table], ids));
  if (ids.empty()) return OkStatus();
  return WithRootCause(engine_->LookupRows(table, ids, values));
}

Status PsClient::GradientsReady(int64_t step, float* grads,
                                std::shared_ptr<const void> grads_owner, uint64_t offset,
                                uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("gradients of step " + std::to_string(step)));
  if (step != last_step_ + 1) {
    return InvalidArgumentError("gradients of step " + std::to_string(step) + " after step " +
                                std::to_string(last_step_));
  }
  if (offset > layout_.total_size() || size > layout_.total_size() - offset) {
    return InvalidArgumentError("gradients of step " + std::to_string(step) + ": elements [" +
                                std::to_string(offset) + ", " + std::to_string(offset + size) +
                                ") are outside the model's " +
                                std::to_string(layout_.total_size()));
  }
  if (backward_step_ != step) {
    engine_->SetGradientOwner(std::move(grads_owner));
    engine_->OnBackwardStart(step, grads);
    backward_step_ = step;
  }
  engine_->OnGradientsReady(offset, size);
  return OkStatus();
}

Status PsClient::Step(int64_t step, float* params, float* grads,
                      std::shared_ptr<const void> grads_owner,
                      const std::vector<SparseRows>& sparse) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("step " + std::to_string(step)));
  if (step != last_step_ + 1) {
    return InvalidArgumentError("step " + std::to_string(step) + " after step " +
                                std::to_string(last_step_) + ": steps are consecutive");
  }
  for (size_t t = 0; t < std::min(sparse.size(), tables_.size()); ++t) {
    RETURN_IF_ERROR(
        CheckRowIds(tables_[t], sparse[t].ids).WithContext("step " + std::to_string(step)));
  }
  backward_step_ = 0;
  engine_->SetGradientOwner(std::move(grads_owner));
  RETURN_IF_ERROR(WithRootCause(engine_->Step(step, params, grads, sparse)));
  last_step_ = step;
  return OkStatus();
}

Status PsClient::SaveCheckpoint(const std::string& root, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("checkpoint of step " + std::to_string(step)));
  if (root.empty()) return InvalidArgumentError("checkpoint: no directory");
  return engine_->SaveCheckpoint(root, step, nullptr)
      .WithContext("checkpoint of step " + std::to_string(step) + " in " + root);
}

StatusOr<int64_t> PsClient::RestoreCheckpoint(const std::string& root, int64_t step,
                                              float* params) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("restore from " + root));
  if (step < 0) {
    ASSIGN_OR_RETURN(step, LatestCheckpointStep(root));
  }
  RETURN_IF_ERROR(engine_->RestoreCheckpoint(root, step, params)
                      .WithContext("restoring step " + std::to_string(step) + " from " + root));
  last_step_ = step;
  return step;
}

std::string PsClient::MetricsText() const { return metrics_.RenderText(); }

void PsClient::Leave(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return;
  left_ = true;
  if (client_) client_->Leave(reason);
}

void PsClient::LeaveWithError(const Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (left_) return;
  left_ = true;
  if (client_) client_->LeaveWithError(error);
}

}  // namespace tessera::worker
