#include "server/ps/ps_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metric_names.h"
#include "common/training/checkpoint.h"
#include "common/training/embedding_table.h"
#include "common/training/optimizer.h"
#include "common/training/ps_job.h"

namespace tessera::server {
namespace {

// How long a checkpoint request waits for the step it names to be applied everywhere.
constexpr int64_t kCheckpointWaitMs = 60000;

}  // namespace

// A request whose reply waits for one or more chunks (or a table) to allow it.
struct PendingReply {
  Origin origin;
  uint64_t request_id = 0;
  std::vector<std::vector<float>> values;  // per part, filled when the part is released
  std::vector<std::string> names;          // dense: chunk names, for the reply
  std::vector<uint64_t> keys;
  std::atomic<int> remaining{0};
  // Sparse pulls: the table and the rows asked for.
  bool sparse = false;
  std::string table;
  std::vector<int64_t> ids;
};

// Who may be released: a part of a PendingReply, with its condition.
struct Waiter {
  std::shared_ptr<PendingReply> reply;
  size_t part = 0;
  int64_t need_version = -1;    // released once version >= need_version
  int64_t need_min_clock = -1;  // ps-ssp: released once the slowest clock >= this
  int64_t step = 0;             // ps-ssp: the push's step (for the staleness record)
};

struct Chunk {
  std::mutex mu;
  DenseChunk where;
  std::vector<float> values;  // guarded by mu
  std::vector<float> state;   // guarded by mu
  int64_t version = 0;        // updates applied; guarded by mu
  // ps-sync: gradients of a step by rank, until all arrived; guarded by mu.
  std::map<int64_t, std::vector<std::vector<float>>> pending;
  std::map<int64_t, int> arrived;
  std::vector<int64_t> clocks;  // ps-ssp: last step each worker pushed; guarded by mu
  std::vector<Waiter> waiters;  // guarded by mu
};

struct Table {
  std::mutex mu;
  size_t index = 0;
  EmbeddingTableSpec spec;               // fixed at init: read without mu
  std::unique_ptr<EmbeddingTable> rows;  // guarded by mu (a restore replaces it)
  int64_t version = 0;                   // guarded by mu
  struct RankRows {
    std::vector<int64_t> ids;
    std::vector<float> grads;
  };
  std::map<int64_t, std::vector<RankRows>> pending;  // ps-sync; guarded by mu
  std::map<int64_t, int> arrived;                    // guarded by mu
  std::vector<Waiter> waiters;                       // guarded by mu
};

struct Job {
  PsJobConfig config;
  uint64_t token = 0;  // PsInitRequest.job_token
  std::map<uint64_t, std::unique_ptr<Chunk>> chunks;  // by key
  std::map<std::string, std::unique_ptr<Table>> tables;
};

class PsService::Impl : public std::enable_shared_from_this<PsService::Impl> {
 public:
  Impl(const PsServiceOptions& options, RpcEndpoint* endpoint) : options_(options),
                                                                 endpoint_(endpoint) {}

  Status Init(MetricsRegistry* metrics) {
    namespace names = metric_names;
    auto gauge = [&](const names::MetricName& m) -> StatusOr<Gauge*> {
      ASSIGN_OR_RETURN(GaugeFamily * family, metrics->RegisterGauge(m.name, m.help));
      return family->WithLabels({});
    };
    ASSIGN_OR_RETURN(parameter_bytes_, gauge(names::kPsParameterBytes));
    ASSIGN_OR_RETURN(state_bytes_, gauge(names::kPsOptimizerStateBytes));
    ASSIGN_OR_RETURN(staleness_, gauge(names::kPsStaleness));
    ASSIGN_OR_RETURN(max_released_staleness_, gauge(names::kPsMaxReleasedStaleness));
    ASSIGN_OR_RETURN(waiting_, gauge(names::kPsWaitingRequests));
    ASSIGN_OR_RETURN(CounterFamily * updates,
                     metrics->RegisterCounter(names::kPsUpdatesTotal.name,
                                              names::kPsUpdatesTotal.help, {"kind"}));
    ASSIGN_OR_RETURN(dense_updates_, updates->WithLabels({"dense"}));
    ASSIGN_OR_RETURN(sparse_updates_, updates->WithLabels({"sparse"}));
    ASSIGN_OR_RETURN(CounterFamily * bytes,
                     metrics->RegisterCounter(names::kPsGradientBytesTotal.name,
                                              names::kPsGradientBytesTotal.help, {"kind"}));
    ASSIGN_OR_RETURN(dense_gradient_bytes_, bytes->WithLabels({"dense"}));
    ASSIGN_OR_RETURN(sparse_gradient_bytes_, bytes->WithLabels({"sparse"}));
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      threads_.emplace_back([this] { WorkLoop(); });
    }
    return OkStatus();
  }

  void InstallHandlers() {
    std::weak_ptr<Impl> weak = shared_from_this();
    auto route = [weak](void (Impl::*serve)(const Envelope&)) {
      return [weak, serve](Envelope envelope) {
        auto self = weak.lock();
        if (self == nullptr || !envelope.origin.IsRequest()) return;
        self->Post([self, serve, envelope = std::move(envelope)] { (self.get()->*serve)(envelope); });
      };
    };
    endpoint_->SetHandler(MessageType::kPsInitRequest, route(&Impl::ServeInit));
    endpoint_->SetHandler(MessageType::kPsPushPullRequest, route(&Impl::ServePushPull));
    endpoint_->SetHandler(MessageType::kSparsePushRequest, route(&Impl::ServeSparsePush));
    endpoint_->SetHandler(MessageType::kSparsePullRequest, route(&Impl::ServeSparsePull));
    endpoint_->SetHandler(MessageType::kCheckpointRequest, route(&Impl::ServeCheckpoint));
  }

  void Stop() {
    for (MessageType type : {MessageType::kPsInitRequest, MessageType::kPsPushPullRequest,
                             MessageType::kSparsePushRequest, MessageType::kSparsePullRequest,
                             MessageType::kCheckpointRequest}) {
      endpoint_->ClearHandler(type);
    }
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
  void Post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_back(std::move(work));
    }
    queue_cv_.notify_one();
  }

  void WorkLoop() {
    while (true) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  void AnswerError(const Envelope& request, const Status& status) {
    endpoint_->ReplyError(request,
                          status.WithContext("server " + std::to_string(options_.server_rank)));
  }

  std::shared_ptr<Job> CurrentJob() {
    std::lock_guard<std::mutex> lock(job_mu_);
    return job_;
  }

  // ---- Init --------------------------------------------------------------------------------
  void ServeInit(const Envelope& request) {
    const PsInitRequest* init = request.As<PsInitRequest>();
    StatusOr<PsJobConfig> config = DecodePsJobConfig(init->config);
    if (!config.ok()) return AnswerError(request, config.status());
    auto plan = PlanDenseChunks(config->dense_elements, config->chunk_elements,
                                options_.num_servers, options_.key_space);
    if (!plan.ok()) return AnswerError(request, plan.status());
    auto job = std::make_shared<Job>();
    job->config = *config;
    job->token = init->job_token;
    std::map<uint64_t, const TensorData*> given;
    for (const TensorData& tensor : init->tensors) given[tensor.key] = &tensor;
    const size_t state_per_element = StateFloatsPerElement(config->optimizer.kind);
    double bytes = 0;
    for (const DenseChunk& where : *plan) {
      if (where.server != options_.server_rank) continue;
      auto it = given.find(where.key);
      if (it == given.end() || it->second->dtype != DataType::kFloat32 ||
          it->second->bytes.size() != where.size * sizeof(float)) {
        return AnswerError(request, InvalidArgumentError(
                                        "init: chunk " + std::to_string(where.index) + " (key " +
                                        std::to_string(where.key) + ", " +
                                        std::to_string(where.size) +
                                        " floats) is missing or has the wrong size"));
      }
      auto chunk = std::make_unique<Chunk>();
      chunk->where = where;
      chunk->values = it->second->Read<float>();
      chunk->state.resize(state_per_element * where.size);
      InitOptimizerState(config->optimizer, chunk->state.data(), where.size);
      chunk->clocks.assign(static_cast<size_t>(config->num_workers), 0);
      bytes += static_cast<double>(where.size) * sizeof(float);
      job->chunks[where.key] = std::move(chunk);
    }
    if (given.size() != job->chunks.size()) {
      return AnswerError(request, InvalidArgumentError(
                                      "init: " + std::to_string(given.size()) +
                                      " chunks sent, this server owns " +
                                      std::to_string(job->chunks.size())));
    }
    for (size_t t = 0; t < config->tables.size(); ++t) {
      auto table = std::make_unique<Table>();
      table->index = t;
      table->spec = config->tables[t];
      table->rows = std::make_unique<EmbeddingTable>(config->tables[t], config->optimizer);
      job->tables[config->tables[t].name] = std::move(table);
    }
    parameter_bytes_->Set(bytes);
    state_bytes_->Set(bytes * static_cast<double>(state_per_element));
    max_released_staleness_->Set(0);
    std::vector<Envelope> early;
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      if (job_ != nullptr) TLOG(INFO) << "a new job replaces the previous one";
      job_ = job;
      early.swap(before_init_);
    }
    TLOG(INFO) << PsModeName(config->consistency) << " job for " << config->num_workers
               << " workers: " << job->chunks.size() << " dense chunks ("
               << static_cast<uint64_t>(bytes) << " bytes), " << config->tables.size()
               << " embedding tables, " << config->optimizer.ToString();
    endpoint_->Reply(request, Ack{});
    for (Envelope& envelope : early) Post([self = shared_from_this(), envelope] {
      self->Dispatch(envelope);
    });
  }

  void Dispatch(const Envelope& envelope) {
    switch (envelope.type()) {
      case MessageType::kPsPushPullRequest: return ServePushPull(envelope);
      case MessageType::kSparsePushRequest: return ServeSparsePush(envelope);
      case MessageType::kSparsePullRequest: return ServeSparsePull(envelope);
      default: return;
    }
  }

  // A request before the job exists waits for the init (other workers start as fast as rank
  // 0). Returns null after parking it.
  std::shared_ptr<Job> JobOrPark(const Envelope& request, std::optional<uint64_t> token = {}) {
    std::lock_guard<std::mutex> lock(job_mu_);
    if (job_ == nullptr || (token.has_value() && *token != job_->token)) {
      before_init_.push_back(request);
      return nullptr;
    }
    return job_;
  }

  Status CheckRank(const Job& job, const Envelope& request) {
    const int rank = request.header.sender_rank;
    if (rank < 0 || rank >= job.config.num_workers) {
      return InvalidArgumentError("worker rank " + std::to_string(rank) + " is outside the job's " +
                                  std::to_string(job.config.num_workers) + " workers");
    }
    return OkStatus();
  }

  // ---- Dense -------------------------------------------------------------------------------
  void ServePushPull(const Envelope& request) {
    // A pull of a job the servers were not initialised for yet (a worker faster than rank 0,
    // on servers still holding the previous job) waits for that job's init.
    const PsPushPullRequest* body = request.As<PsPushPullRequest>();
    std::shared_ptr<Job> job = JobOrPark(request, body->job_token);
    if (job == nullptr) return;
    if (Status status = CheckRank(*job, request); !status.ok()) return AnswerError(request, status);
    const int rank = request.header.sender_rank;
    const int64_t step = request.header.step;
    const bool push = body->has_gradients;
    if (push && step < 1) {
      return AnswerError(request, InvalidArgumentError("push of step " + std::to_string(step) +
                                                       "; steps start at 1"));
    }
    std::vector<Chunk*> chunks;
    std::vector<std::vector<float>> grads;
    for (const TensorData& tensor : body->tensors) {
      auto it = job->chunks.find(tensor.key);
      if (it == job->chunks.end()) {
        return AnswerError(request, NotFoundError(OwnerMessage(*job, tensor.key)));
      }
      Chunk* chunk = it->second.get();
      if (push && (tensor.dtype != DataType::kFloat32 ||
                   tensor.bytes.size() != chunk->where.size * sizeof(float))) {
        return AnswerError(request, InvalidArgumentError(
                                        "chunk " + std::to_string(chunk->where.index) + " has " +
                                        std::to_string(chunk->where.size) + " floats; the push "
                                        "carries " + std::to_string(tensor.bytes.size()) +
                                        " bytes of " + std::string(DataTypeName(tensor.dtype))));
      }
      chunks.push_back(chunk);
      if (push) grads.push_back(tensor.Read<float>());
    }
    auto reply = std::make_shared<PendingReply>();
    reply->origin = request.origin;
    reply->request_id = request.header.request_id;
    reply->values.resize(chunks.size());
    for (Chunk* chunk : chunks) {
      reply->names.push_back("chunk" + std::to_string(chunk->where.index));
      reply->keys.push_back(chunk->where.key);
    }
    reply->remaining = static_cast<int>(chunks.size());
    if (chunks.empty()) return Send(reply);
    const PsJobConfig& config = job->config;
    for (size_t i = 0; i < chunks.size(); ++i) {
      Chunk& chunk = *chunks[i];
      std::lock_guard<std::mutex> lock(chunk.mu);
      Waiter waiter{reply, i};
      if (!push) {
        // The values after step - 1 in every mode (after a restore, versions restart at the
        // checkpoint's step).
        waiter.need_version = step - 1;
      } else {
        dense_gradient_bytes_->Increment(static_cast<double>(grads[i].size() * sizeof(float)));
        switch (config.consistency) {
          case PsConsistency::kSync: {
            auto& slots = chunk.pending[step];
            slots.resize(static_cast<size_t>(config.num_workers));
            if (!slots[rank].empty()) {
              return AnswerError(request, AlreadyExistsError(
                                              "worker " + std::to_string(rank) + " pushed step " +
                                              std::to_string(step) + " twice"));
            }
            slots[rank] = std::move(grads[i]);
            if (++chunk.arrived[step] == config.num_workers) ApplySync(config, step, &chunk);
            waiter.need_version = step;
            break;
          }
          case PsConsistency::kAsync:
          case PsConsistency::kSsp:
            ApplyOne(config, grads[i].data(), &chunk);
            chunk.clocks[rank] = std::max(chunk.clocks[rank], step);
            if (config.consistency == PsConsistency::kSsp) {
              waiter.need_min_clock = step - config.staleness;
              waiter.step = step;
            }
            break;
        }
      }
      chunk.waiters.push_back(std::move(waiter));
      waiting_count_.fetch_add(1);
      ReleaseReady(config, &chunk);
    }
  }

  std::string OwnerMessage(const Job& job, uint64_t key) {
    for (int s = 0; s < options_.num_servers; ++s) {
      auto [begin, end] = ServerKeyRange(options_.key_space, options_.num_servers, s);
      if (key >= begin && key < end && s != options_.server_rank) {
        return "key " + std::to_string(key) + " belongs to server " + std::to_string(s) +
               ", not server " + std::to_string(options_.server_rank);
      }
    }
    return "key " + std::to_string(key) + " is not a chunk of this job on server " +
           std::to_string(options_.server_rank) + " (" + std::to_string(job.chunks.size()) +
           " chunks here)";
  }

  // ps-sync: every worker's gradient of `step` is here: sum in rank order, average, apply.
  // REQUIRES: chunk->mu held.
  void ApplySync(const PsJobConfig& config, int64_t step, Chunk* chunk) {
    auto& slots = chunk->pending[step];
    std::vector<float>& sum = slots[0];
    for (size_t r = 1; r < slots.size(); ++r) {
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += slots[r][j];
    }
    const float scale = 1.0f / static_cast<float>(config.num_workers);
    for (float& g : sum) g *= scale;
    const float lr = LearningRate(config.schedule, config.optimizer.lr, step - 1);
    DenseUpdate(config.optimizer, lr, step, chunk->values.data(), sum.data(), sum.size(),
                chunk->state.data());
    chunk->version = step;
    chunk->pending.erase(step);
    chunk->arrived.erase(step);
    dense_updates_->Increment();
  }

  // ps-async / ps-ssp: one worker's gradient, applied at once. REQUIRES: chunk->mu held.
  void ApplyOne(const PsJobConfig& config, const float* grad, Chunk* chunk) {
    const int64_t step = chunk->version + 1;
    const float lr = LearningRate(config.schedule, config.optimizer.lr, step - 1);
    DenseUpdate(config.optimizer, lr, step, chunk->values.data(), grad, chunk->values.size(),
                chunk->state.data());
    chunk->version = step;
    dense_updates_->Increment();
  }

  // Releases every waiter of `chunk` whose condition holds. REQUIRES: chunk->mu held.
  void ReleaseReady(const PsJobConfig& config, Chunk* chunk) {
    const int64_t slowest = *std::min_element(chunk->clocks.begin(), chunk->clocks.end());
    const int64_t fastest = *std::max_element(chunk->clocks.begin(), chunk->clocks.end());
    if (config.consistency == PsConsistency::kSsp) staleness_->Set(static_cast<double>(fastest - slowest));
    auto ready = [&](const Waiter& w) {
      if (w.need_version >= 0 && chunk->version < w.need_version) return false;
      if (w.need_min_clock >= 0 && slowest < w.need_min_clock) return false;
      return true;
    };
    std::vector<Waiter> keep;
    for (Waiter& waiter : chunk->waiters) {
      if (!ready(waiter)) {
        keep.push_back(std::move(waiter));
        continue;
      }
      if (waiter.need_min_clock >= 0) {
        const double lead = static_cast<double>(waiter.step - slowest);
        if (lead > max_released_staleness_->Value()) max_released_staleness_->Set(lead);
      }
      waiter.reply->values[waiter.part] = chunk->values;
      if (--waiter.reply->remaining == 0) Send(waiter.reply);
    }
    waiting_count_.fetch_sub(static_cast<int64_t>(chunk->waiters.size() - keep.size()));
    chunk->waiters.swap(keep);
    waiting_->Set(static_cast<double>(waiting_count_.load()));
  }

  void Send(const std::shared_ptr<PendingReply>& reply) {
    MessageBody body;
    if (reply->sparse) {
      body = SparsePullReply{reply->table, TensorData::Int64s("row_ids", std::move(reply->ids)),
                             TensorData::Floats("values", 0, std::move(reply->values[0]))};
    } else {
      PsPushPullReply values;
      for (size_t i = 0; i < reply->values.size(); ++i) {
        values.tensors.push_back(
            TensorData::Floats(reply->names[i], reply->keys[i], std::move(reply->values[i])));
      }
      body = std::move(values);
    }
    const MessageType type = TypeOf(body);
    Status sent = endpoint_->transport().Reply(
        reply->origin, OutgoingMessage{reply->request_id, -1, std::move(body)});
    if (!sent.ok()) TLOG(WARNING) << MessageTypeName(type) << ": " << sent;
  }

  // ---- Checkpoints -------------------------------------------------------------------------
  void ServeCheckpoint(const Envelope& request) {
    std::shared_ptr<Job> job = CurrentJob();
    if (job == nullptr) {
      return AnswerError(request, FailedPreconditionError("checkpoint: no job was initialised"));
    }
    const CheckpointRequest* body = request.As<CheckpointRequest>();
    const std::string& root = body->directory;
    const int64_t step = body->step;
    StatusOr<ShardFileInfo> info =
        body->restore ? RestoreShard(*job, root, step) : SaveShard(*job, root, step);
    if (!info.ok()) return AnswerError(request, info.status());
    endpoint_->Reply(request,
                     CheckpointReply{root, step, {info->file}, {info->bytes}, {info->checksum}});
  }

  std::string ShardName() const {
    return "server-" + std::to_string(options_.server_rank) + ".ckpt";
  }

  // Waits (ps-sync) until every chunk and table has applied `step`, then writes the shard.
  StatusOr<ShardFileInfo> SaveShard(Job& job, const std::string& root, int64_t step) {
    const bool sync = job.config.consistency == PsConsistency::kSync;
    const Deadline deadline = Deadline::AfterMillis(kCheckpointWaitMs);
    std::string behind;
    do {
      behind.clear();
      if (!sync) break;
      for (auto& [key, chunk] : job.chunks) {
        std::lock_guard<std::mutex> lock(chunk->mu);
        if (chunk->version < step) behind = "chunk " + std::to_string(chunk->where.index);
      }
      for (auto& [name, table] : job.tables) {
        std::lock_guard<std::mutex> lock(table->mu);
        if (table->version < step) behind = "table '" + name + "'";
      }
      if (behind.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } while (!deadline.Expired());
    if (!behind.empty()) {
      return DeadlineExceededError("checkpoint of step " + std::to_string(step) + ": " + behind +
                                   " has not applied that step after " +
                                   std::to_string(kCheckpointWaitMs) + " ms");
    }
    CheckpointShard shard;
    for (auto& [key, chunk] : job.chunks) {
      std::lock_guard<std::mutex> lock(chunk->mu);
      const std::string name = "chunk" + std::to_string(chunk->where.index);
      shard.floats[name + ".values"] = chunk->values;
      shard.floats[name + ".state"] = chunk->state;
    }
    for (auto& [name, table] : job.tables) {
      std::lock_guard<std::mutex> lock(table->mu);
      table->rows->Export(&shard.ints[name + ".ids"], &shard.floats[name + ".values"],
                          &shard.floats[name + ".state"]);
    }
    RETURN_IF_ERROR(PrepareCheckpointStep(root, step));
    ASSIGN_OR_RETURN(ShardFileInfo info,
                     WriteCheckpointShard(CheckpointStepDirectory(root, step) + "/" + ShardName(),
                                          shard));
    TLOG(INFO) << "checkpoint of step " << step << ": " << info.file << " (" << info.bytes
               << " bytes)";
    return info;
  }

  StatusOr<ShardFileInfo> RestoreShard(Job& job, const std::string& root, int64_t step) {
    ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
    const std::string directory = CheckpointStepDirectory(root, step);
    const PsJobConfig& config = job.config;
    if (manifest.num_servers != options_.num_servers ||
        manifest.chunk_elements != config.chunk_elements ||
        manifest.dense_elements != config.dense_elements ||
        manifest.layout_fingerprint != config.layout_fingerprint) {
      return FailedPreconditionError(
          "checkpoint " + directory + " was written by " + std::to_string(manifest.num_servers) +
          " servers with chunks of " + std::to_string(manifest.chunk_elements) + " floats for a "
          "model of " + std::to_string(manifest.dense_elements) + " parameters; this job has " +
          std::to_string(options_.num_servers) + " servers, chunks of " +
          std::to_string(config.chunk_elements) + ", " + std::to_string(config.dense_elements) +
          " parameters");
    }
    const ShardFileInfo* mine = nullptr;
    for (const ShardFileInfo& file : manifest.files) {
      if (file.file == ShardName()) mine = &file;
    }
    if (mine == nullptr) {
      return DataLossError(directory + "/MANIFEST.json lists no " + ShardName());
    }
    const std::string path = directory + "/" + mine->file;
    ASSIGN_OR_RETURN(CheckpointShard shard, ReadCheckpointShard(path, *mine));
    auto take = [&](const std::string& name, size_t size) -> StatusOr<std::vector<float>> {
      auto it = shard.floats.find(name);
      if (it == shard.floats.end() || (size > 0 && it->second.size() != size)) {
        return DataLossError(path + ": entry '" + name + "' is missing or has the wrong size");
      }
      return std::move(it->second);
    };
    // Everything is checked before anything changes.
    std::map<Chunk*, std::pair<std::vector<float>, std::vector<float>>> chunks;
    for (auto& [key, chunk] : job.chunks) {
      const std::string name = "chunk" + std::to_string(chunk->where.index);
      ASSIGN_OR_RETURN(std::vector<float> values, take(name + ".values", chunk->where.size));
      ASSIGN_OR_RETURN(std::vector<float> state, take(name + ".state", chunk->state.size()));
      chunks[chunk.get()] = {std::move(values), std::move(state)};
    }
    std::vector<std::unique_ptr<EmbeddingTable>> tables;
    for (auto& [name, table] : job.tables) {
      ASSIGN_OR_RETURN(std::vector<float> values, take(name + ".values", 0));
      ASSIGN_OR_RETURN(std::vector<float> state, take(name + ".state", 0));
      auto restored = std::make_unique<EmbeddingTable>(table->spec, config.optimizer);
      RETURN_IF_ERROR(restored->Import(shard.ints[name + ".ids"], values, state).WithContext(path));
      tables.push_back(std::move(restored));
    }
    for (auto& [chunk, saved] : chunks) {
      std::lock_guard<std::mutex> lock(chunk->mu);
      chunk->values = std::move(saved.first);
      chunk->state = std::move(saved.second);
      chunk->version = step;
      chunk->pending.clear();
      chunk->arrived.clear();
      std::fill(chunk->clocks.begin(), chunk->clocks.end(), step);
      ReleaseReady(config, chunk);
    }
    size_t t = 0;
    for (auto& [name, table] : job.tables) {
      std::lock_guard<std::mutex> lock(table->mu);
      table->rows = std::move(tables[t++]);
      table->version = step;
      table->pending.clear();
      table->arrived.clear();
      ReleaseTable(table.get());
    }
    TLOG(INFO) << "restored the checkpoint of step " << step << " from " << path;
    return *mine;
  }

  // ---- Sparse ------------------------------------------------------------------------------
  StatusOr<Table*> FindTable(const Job& job, const std::string& table) {
    auto it = job.tables.find(table);
    if (it == job.tables.end()) {
      return NotFoundError("no embedding table '" + table + "' in this job");
    }
    return it->second.get();
  }

  Status CheckOwnedRows(const Table& table, const std::vector<int64_t>& ids) {
    for (int64_t id : ids) {
      const int owner = SparseRowOwner(table.index, id, options_.num_servers);
      if (owner != options_.server_rank) {
        return InvalidArgumentError("row " + std::to_string(id) + " of table '" +
                                    table.spec.name + "' belongs to server " +
                                    std::to_string(owner) + ", not server " +
                                    std::to_string(options_.server_rank));
      }
    }
    return OkStatus();
  }

  void ServeSparsePush(const Envelope& request) {
    std::shared_ptr<Job> job = JobOrPark(request);
    if (job == nullptr) return;
    if (Status status = CheckRank(*job, request); !status.ok()) return AnswerError(request, status);
    const SparsePushRequest* body = request.As<SparsePushRequest>();
    StatusOr<Table*> found = FindTable(*job, body->table);
    if (!found.ok()) return AnswerError(request, found.status());
    Table& table = **found;
    if (body->row_ids.dtype != DataType::kInt64 || body->values.dtype != DataType::kFloat32) {
      return AnswerError(request, InvalidArgumentError(
                                      "sparse push to table '" + table.spec.name + "': row ids of " +
                                      std::string(DataTypeName(body->row_ids.dtype)) +
                                      " and values of " +
                                      std::string(DataTypeName(body->values.dtype)) +
                                      ", expected int64 and float32"));
    }
    std::vector<int64_t> ids = body->row_ids.Read<int64_t>();
    std::vector<float> grads = body->values.Read<float>();
    const size_t dim = static_cast<size_t>(table.spec.dim);
    if (grads.size() != ids.size() * dim) {
      return AnswerError(request, InvalidArgumentError(
                                      "sparse push to table '" + table.spec.name + "': " +
                                      std::to_string(ids.size()) + " rows but " +
                                      std::to_string(grads.size()) + " floats (dim " +
                                      std::to_string(dim) + ")"));
    }
    if (Status status = CheckOwnedRows(table, ids); !status.ok()) return AnswerError(request, status);
    const PsJobConfig& config = job->config;
    const int rank = request.header.sender_rank;
    const int64_t step = request.header.step;
    sparse_gradient_bytes_->Increment(static_cast<double>(grads.size() * sizeof(float)));
    Status applied = OkStatus();
    {
      std::lock_guard<std::mutex> lock(table.mu);
      if (config.consistency == PsConsistency::kSync) {
        auto& slots = table.pending[step];
        slots.resize(static_cast<size_t>(config.num_workers));
        slots[rank] = {std::move(ids), std::move(grads)};
        if (++table.arrived[step] == config.num_workers) {
          std::vector<int64_t> all_ids;
          std::vector<float> all_grads;
          for (auto& part : slots) {  // rank order
            all_ids.insert(all_ids.end(), part.ids.begin(), part.ids.end());
            all_grads.insert(all_grads.end(), part.grads.begin(), part.grads.end());
          }
          const float scale = 1.0f / static_cast<float>(config.num_workers);
          for (float& g : all_grads) g *= scale;
          const float lr = LearningRate(config.schedule, config.optimizer.lr, step - 1);
          applied = table.rows->ApplyGradients(lr, step, all_ids.data(), all_grads.data(),
                                               all_ids.size());
          table.version = step;
          table.pending.erase(step);
          table.arrived.erase(step);
          sparse_updates_->Increment();
        }
      } else {
        const int64_t update = table.version + 1;
        const float lr = LearningRate(config.schedule, config.optimizer.lr, update - 1);
        applied = table.rows->ApplyGradients(lr, update, ids.data(), grads.data(), ids.size());
        table.version = update;
        sparse_updates_->Increment();
      }
      ReleaseTable(&table);
    }
    if (!applied.ok()) return AnswerError(request, applied);
    endpoint_->Reply(request, Ack{});
  }

  void ServeSparsePull(const Envelope& request) {
    std::shared_ptr<Job> job = JobOrPark(request);
    if (job == nullptr) return;
    const SparsePullRequest* body = request.As<SparsePullRequest>();
    StatusOr<Table*> found = FindTable(*job, body->table);
    if (!found.ok()) return AnswerError(request, found.status());
    Table& table = **found;
    if (body->row_ids.dtype != DataType::kInt64) {
      return AnswerError(request, InvalidArgumentError(
                                      "sparse pull from table '" + table.spec.name +
                                      "': row ids of " +
                                      std::string(DataTypeName(body->row_ids.dtype)) +
                                      ", expected int64"));
    }
    auto reply = std::make_shared<PendingReply>();
    reply->origin = request.origin;
    reply->request_id = request.header.request_id;
    reply->sparse = true;
    reply->table = table.spec.name;
    reply->ids = body->row_ids.Read<int64_t>();
    reply->values.resize(1);
    reply->remaining = 1;
    for (int64_t id : reply->ids) {
      if (id < 0 || id >= table.spec.rows) {
        return AnswerError(request, InvalidArgumentError(
                                        "row " + std::to_string(id) + " of table '" + reply->table +
                                        "' is outside [0, " +
                                        std::to_string(table.spec.rows) + ")"));
      }
    }
    if (Status status = CheckOwnedRows(table, reply->ids); !status.ok()) {
      return AnswerError(request, status);
    }
    std::lock_guard<std::mutex> lock(table.mu);
    Waiter waiter{reply, 0};
    waiter.need_version =
        job->config.consistency == PsConsistency::kSync ? request.header.step - 1 : 0;
    table.waiters.push_back(std::move(waiter));
    ReleaseTable(&table);
  }

  // REQUIRES: table->mu held.
  void ReleaseTable(Table* table) {
    std::vector<Waiter> keep;
    const size_t dim = static_cast<size_t>(table->spec.dim);
    for (Waiter& waiter : table->waiters) {
      if (table->version < waiter.need_version) {
        keep.push_back(std::move(waiter));
        continue;
      }
      PendingReply& reply = *waiter.reply;
      reply.values[0].resize(reply.ids.size() * dim);
      Status looked_up = table->rows->Lookup(reply.ids.data(), reply.ids.size(),
                                             reply.values[0].data());
      if (!looked_up.ok()) {  // checked on arrival; kept for safety
        TLOG(ERROR) << "sparse pull: " << looked_up;
        continue;
      }
      if (--reply.remaining == 0) Send(waiter.reply);
    }
    table->waiters.swap(keep);
  }

  const PsServiceOptions options_;
  RpcEndpoint* const endpoint_;

  std::mutex job_mu_;
  std::shared_ptr<Job> job_;              // guarded by job_mu_
  std::vector<Envelope> before_init_;     // guarded by job_mu_

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;  // guarded by queue_mu_
  bool stopping_ = false;                    // guarded by queue_mu_
  std::vector<std::thread> threads_;

  Gauge* parameter_bytes_ = nullptr;
  Gauge* state_bytes_ = nullptr;
  Gauge* staleness_ = nullptr;
  Gauge* max_released_staleness_ = nullptr;
  Gauge* waiting_ = nullptr;
  std::atomic<int64_t> waiting_count_{0};  // dense waiters over all chunks
  Counter* dense_updates_ = nullptr;
  Counter* sparse_updates_ = nullptr;
  Counter* dense_gradient_bytes_ = nullptr;
  Counter* sparse_gradient_bytes_ = nullptr;
};

StatusOr<std::unique_ptr<PsService>> PsService::Start(const PsServiceOptions& options,
                                                      RpcEndpoint* endpoint,
                                                      MetricsRegistry* metrics) {
  auto impl = std::make_shared<Impl>(options, endpoint);
  RETURN_IF_ERROR(impl->Init(metrics));
  impl->InstallHandlers();
  return std::unique_ptr<PsService>(new PsService(impl));
}

PsService::~PsService() { impl_->Stop(); }

}  // namespace tessera::server
