#include "worker/engines/ps_engine.h"

#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "common/wire/wire_codec.h"

namespace tessera::worker {
namespace {

constexpr proto::Role kRole = proto::Role::Worker;
enum OpIndex { kPushPull = 0, kSparsePush = 1, kSparsePull = 2 };

int32_t AddFloats(MessageBuilder* builder, const float* data, size_t count) {
  // Copied, not borrowed: a request may outlive the call that sent it (WaitAll gives up on a
  // stop or a timeout while the transport still queues it for a dead server). The copy costs
  // nothing extra: the transport sends an owned payload without copying, a borrowed one it
  // would have copied into ZeroMQ.
  return builder->AddPayload(Payload::Copy(data, count * sizeof(float)));
}

constexpr int64_t kStartingRetryMs = 20;

// A server that registered but has not installed its PsService yet (see Initialize), while
// there is time left to wait for it.
bool IsStillStarting(const Status& status, const Deadline& deadline) {
  return status.code() == StatusCode::kUnimplemented && !deadline.Expired();
}

}  // namespace

StatusOr<std::unique_ptr<PsEngine>> PsEngine::Create(const PsEngineOptions& options,
                                                     RpcEndpoint* endpoint, const FleetView& view,
                                                     int rank, MetricsRegistry* metrics) {
  std::unique_ptr<PsEngine> engine(new PsEngine(options, endpoint, view, rank));
  // Every worker of this job sees the same members (ranks and pids) at the start; the next
  // job's workers have other pids.
  uint64_t token = 0xcbf29ce484222325ULL;
  for (const MemberInfo* worker : view.OfRole(Role::kWorker)) {
    for (uint64_t part : {static_cast<uint64_t>(worker->rank), static_cast<uint64_t>(worker->pid)}) {
      token = (token ^ part) * 0x100000001b3ULL;
    }
  }
  engine->job_token_ = token;
  for (int s = 0; s < view.num_servers; ++s) {
    const MemberInfo* server = view.Find(Role::kServer, s);
    if (server == nullptr) {
      return FailedPreconditionError("the fleet view has no server " + std::to_string(s) + " of " +
                                     std::to_string(view.num_servers));
    }
    engine->server_addresses_.push_back(server->address);
  }
  if (view.num_servers < 1) {
    return InvalidArgumentError(std::string(PsModeName(options.consistency)) +
                                " needs parameter servers: start the fleet with --servers N "
                                "(tessera-launch) or --num-servers N");
  }
  namespace names = metric_names;
  ASSIGN_OR_RETURN(HistogramFamily * latency,
                   metrics->RegisterHistogram(names::kPsClientLatencySeconds.name,
                                              names::kPsClientLatencySeconds.help, {"op"},
                                              DefaultLatencyBuckets()));
  const char* ops[] = {"push_pull", "sparse_push", "sparse_pull"};
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(engine->latency_[i], latency->WithLabels({ops[i]}));
  }
  ASSIGN_OR_RETURN(CounterFamily * sent,
                   metrics->RegisterCounter(names::kPsClientBytesSentTotal.name,
                                            names::kPsClientBytesSentTotal.help, {"op"}));
  ASSIGN_OR_RETURN(engine->bytes_sent_, sent->WithLabels({"push_pull"}));
  ASSIGN_OR_RETURN(CounterFamily * received,
                   metrics->RegisterCounter(names::kPsClientBytesReceivedTotal.name,
                                            names::kPsClientBytesReceivedTotal.help, {"op"}));
  ASSIGN_OR_RETURN(engine->bytes_received_, received->WithLabels({"push_pull"}));
  return engine;
}

PsEngine::Reply PsEngine::Send(int server, Message message, uint64_t id, const std::string& what) {
  return endpoint_->CallAsync(server_addresses_[server], std::move(message), id,
                              Deadline::AfterMillis(options_.request_timeout_ms), what);
}

Status PsEngine::WaitAll(std::vector<std::pair<Reply, std::string>>* replies,
                         std::vector<StatusOr<Envelope>>* results) {
  Status first = OkStatus();
  results->clear();
  std::optional<Deadline> stop_grace;  // set once a stop is seen
  for (auto& [reply, what] : *replies) {
    while (options_.stop_requested &&
           reply.wait_for(std::chrono::milliseconds(kStopCheckMs)) != std::future_status::ready) {
      if (!stop_grace.has_value() && options_.stop_requested()) {
        stop_grace = Deadline::AfterMillis(kStopGraceMs);
      }
      if (stop_grace.has_value() && stop_grace->Expired()) {
        return CancelledError(what + ": stopped while waiting (the process was asked to stop, "
                              "and no reply came within " + std::to_string(kStopGraceMs) +
                              " ms)");
      }
    }
    StatusOr<Envelope> result = reply.get();
    if (!result.ok() && first.ok()) first = result.status().WithContext(what);
    results->push_back(std::move(result));
  }
  return first;
}

Status PsEngine::Initialize(const ParameterLayout& layout,
                            const std::vector<EmbeddingTableSpec>& tables, float* params) {
  ASSIGN_OR_RETURN(chunks_, PlanDenseChunks(layout.total_size(), options_.chunk_elements,
                                            view_.num_servers, view_.key_space));
  chunks_of_server_.assign(static_cast<size_t>(view_.num_servers), {});
  for (size_t i = 0; i < chunks_.size(); ++i) chunks_of_server_[chunks_[i].server].push_back(i);
  tables_ = tables;
  fingerprint_ = layout.Fingerprint();
  dense_elements_ = layout.total_size();
  PsJobConfig config;
  config.consistency = options_.consistency;
  config.staleness = options_.staleness;
  config.num_workers = view_.num_workers;
  config.optimizer = options_.optimizer;
  config.schedule = options_.schedule;
  config.dense_elements = layout.total_size();
  config.layout_fingerprint = layout.Fingerprint();
  config.chunk_elements = options_.chunk_elements;
  config.tables = tables;
  RETURN_IF_ERROR(ValidatePsJobConfig(config));
  // A server is in the fleet view from the moment it registers but serves ps-* requests only
  // once its PsService is installed, a moment later: a job attaching to a fleet that is still
  // starting is answered Unimplemented in between, so both first contacts retry that until
  // the request deadline.
  const Deadline serving_deadline = Deadline::AfterMillis(options_.request_timeout_ms);
  if (rank_ == 0) {
    const std::string json = EncodePsJobConfig(config);
    auto init = [&](int s) {
      MessageBuilder builder(kRole, rank_);
      std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
      for (size_t i : chunks_of_server_[s]) {
        const DenseChunk& chunk = chunks_[i];
        std::vector<int64_t> shape = {static_cast<int64_t>(chunk.size)};
        int32_t frame = AddFloats(&builder, params + chunk.offset, chunk.size);
        metas.push_back(proto::CreateTensorMetaDirect(
            builder.fbb(), ("chunk" + std::to_string(chunk.index)).c_str(), chunk.key,
            proto::DType::Float32, &shape, frame, 0, chunk.size * sizeof(float)));
      }
      uint64_t id = endpoint_->NextRequestId();
      Message message = builder.Finish(
          proto::CreatePsInitRequestDirect(builder.fbb(), json.c_str(), &metas, job_token_), id,
          0);
      return std::make_pair(
          Send(s, std::move(message), id, "init of server " + std::to_string(s)),
          "initialising server " + std::to_string(s));
    };
    std::vector<int> pending(static_cast<size_t>(view_.num_servers));
    for (int s = 0; s < view_.num_servers; ++s) pending[static_cast<size_t>(s)] = s;
    bool told = false;
    while (!pending.empty()) {
      std::vector<std::pair<Reply, std::string>> replies;
      for (int s : pending) replies.push_back(init(s));
      std::vector<StatusOr<Envelope>> results;
      Status first = WaitAll(&replies, &results);
      if (first.ok()) break;
      std::vector<int> starting;
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].ok()) continue;
        if (!IsStillStarting(results[i].status(), serving_deadline)) {
          return results[i].status().WithContext(replies[i].second);
        }
        starting.push_back(pending[i]);
      }
      if (!told) {
        TLOG(INFO) << starting.size() << " server(s) registered but not serving yet (starting): "
                   << first << "; retrying for up to " << options_.request_timeout_ms << " ms";
        told = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kStartingRetryMs));
      pending = std::move(starting);
    }
    TLOG(INFO) << "initialised " << view_.num_servers << " servers: " << chunks_.size()
               << " dense chunks of up to " << options_.chunk_elements << " floats, "
               << tables.size() << " embedding tables";
  }
  // Everyone, rank 0 included, starts from the servers' values.
  while (true) {
    Status pulled = PushPull(/*step=*/1, /*grads=*/nullptr, params);
    if (pulled.ok()) break;
    if (!IsStillStarting(pulled, serving_deadline)) return pulled.WithContext("initial pull");
    std::this_thread::sleep_for(std::chrono::milliseconds(kStartingRetryMs));
  }
  return OkStatus();
}

Status PsEngine::PushPull(int64_t step, const float* grads, float* params) {
  const bool push = grads != nullptr;
  std::vector<std::pair<Reply, std::string>> replies;
  std::vector<std::vector<size_t>> groups;  // the chunks of each request
  double sent = 0;
  for (int s = 0; s < view_.num_servers; ++s) {
    const auto& mine = chunks_of_server_[s];
    const size_t per = static_cast<size_t>(std::max(1, options_.chunks_per_request));
    for (size_t begin = 0; begin < mine.size(); begin += per) {
      std::vector<size_t> group(mine.begin() + begin,
                                mine.begin() + std::min(mine.size(), begin + per));
      MessageBuilder builder(kRole, rank_);
      std::vector<flatbuffers::Offset<proto::TensorMeta>> metas;
      for (size_t i : group) {
        const DenseChunk& chunk = chunks_[i];
        std::vector<int64_t> shape = {static_cast<int64_t>(chunk.size)};
        int32_t frame = -1;
        uint64_t bytes = 0;
        if (push) {
          frame = AddFloats(&builder, grads + chunk.offset, chunk.size);
          bytes = chunk.size * sizeof(float);
          sent += static_cast<double>(bytes);
        }
        metas.push_back(proto::CreateTensorMetaDirect(
            builder.fbb(), ("chunk" + std::to_string(chunk.index)).c_str(), chunk.key,
            proto::DType::Float32, &shape, frame, 0, bytes));
      }
      uint64_t id = endpoint_->NextRequestId();
      Message message = builder.Finish(
          proto::CreatePsPushPullRequestDirect(builder.fbb(), &metas, push, job_token_), id, step);
      std::string what = std::string(push ? "push-pull" : "pull") + " of step " +
                         std::to_string(step) + " (" + std::to_string(group.size()) +
                         " chunks from chunk " + std::to_string(chunks_[group[0]].index) +
                         ") with server " + std::to_string(s);
      replies.emplace_back(Send(s, std::move(message), id, what), what);
      groups.push_back(std::move(group));
    }
  }
  auto started = SteadyClock::now();
  std::vector<StatusOr<Envelope>> results;
  RETURN_IF_ERROR(WaitAll(&replies, &results));
  latency_[kPushPull]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  bytes_sent_->Increment(sent);
  for (size_t r = 0; r < results.size(); ++r) {
    const Envelope& reply = *results[r];
    if (reply.header->body_type() != proto::Body::PullReply) {
      return InternalError(replies[r].second + ": the server answered " +
                           std::string(BodyName(reply.header->body_type())));
    }
    const auto* tensors = reply.header->body_as_PullReply()->tensors();
    if (tensors == nullptr || tensors->size() != groups[r].size()) {
      return DataLossError(replies[r].second + ": the reply has the wrong number of chunks");
    }
    for (size_t k = 0; k < groups[r].size(); ++k) {
      const DenseChunk& chunk = chunks_[groups[r][k]];
      const proto::TensorMeta* meta = tensors->Get(static_cast<flatbuffers::uoffset_t>(k));
      if (meta->key() != chunk.key || meta->byte_length() != chunk.size * sizeof(float)) {
        return DataLossError(replies[r].second + ": chunk " + std::to_string(chunk.index) +
                             " came back as key " + std::to_string(meta->key()) + " with " +
                             std::to_string(meta->byte_length()) + " bytes");
      }
      std::memcpy(params + chunk.offset,
                  reply.message.payloads[meta->payload()].data() + meta->offset(),
                  meta->byte_length());
      bytes_received_->Increment(static_cast<double>(meta->byte_length()));
    }
  }
  return OkStatus();
}

Status PsEngine::LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) {
  if (table >= tables_.size()) {
    return InvalidArgumentError("no embedding table " + std::to_string(table));
  }
  const EmbeddingTableSpec& spec = tables_[table];
  const size_t dim = static_cast<size_t>(spec.dim);
  std::vector<std::vector<int64_t>> ids_of(static_cast<size_t>(view_.num_servers));
  std::vector<std::vector<size_t>> positions_of(ids_of.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int owner = SparseRowOwner(table, ids[i], view_.num_servers);
    ids_of[owner].push_back(ids[i]);
    positions_of[owner].push_back(i);
  }
  std::vector<std::pair<Reply, std::string>> replies;
  std::vector<int> servers;
  for (int s = 0; s < view_.num_servers; ++s) {
    if (ids_of[s].empty()) continue;
    MessageBuilder builder(kRole, rank_);
    std::vector<int64_t> shape = {static_cast<int64_t>(ids_of[s].size())};
    int32_t frame = builder.AddPayload(
        Payload::Copy(ids_of[s].data(), ids_of[s].size() * sizeof(int64_t)));  // see AddFloats
    auto meta = proto::CreateTensorMetaDirect(builder.fbb(), "row_ids", 0, proto::DType::Int64,
                                              &shape, frame, 0,
                                              ids_of[s].size() * sizeof(int64_t));
    uint64_t id = endpoint_->NextRequestId();
    Message message = builder.Finish(
        proto::CreateSparsePullRequestDirect(builder.fbb(), spec.name.c_str(), meta), id,
        last_step_ + 1);
    std::string what = "pull of " + std::to_string(ids_of[s].size()) + " rows of table '" +
                       spec.name + "' from server " + std::to_string(s);
    replies.emplace_back(Send(s, std::move(message), id, what), what);
    servers.push_back(s);
  }
  auto started = SteadyClock::now();
  std::vector<StatusOr<Envelope>> results;
  RETURN_IF_ERROR(WaitAll(&replies, &results));
  latency_[kSparsePull]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  for (size_t r = 0; r < results.size(); ++r) {
    const int s = servers[r];
    const Envelope& reply = *results[r];
    const auto* body = reply.header->body_as_SparsePullReply();
    if (body == nullptr || body->values() == nullptr ||
        body->values()->byte_length() != ids_of[s].size() * dim * sizeof(float)) {
      return DataLossError(replies[r].second + ": the reply does not hold " +
                           std::to_string(ids_of[s].size()) + " rows of " + std::to_string(dim));
    }
    const uint8_t* bytes =
        reply.message.payloads[body->values()->payload()].data() + body->values()->offset();
    for (size_t k = 0; k < positions_of[s].size(); ++k) {
      std::memcpy(values + positions_of[s][k] * dim, bytes + k * dim * sizeof(float),
                  dim * sizeof(float));
    }
  }
  return OkStatus();
}

Status PsEngine::Step(int64_t step, float* params, float* grads,
                      const std::vector<SparseRows>& sparse) {
  if (sparse.size() != tables_.size()) {
    return InvalidArgumentError("gradients for " + std::to_string(sparse.size()) +
                                " embedding tables, the job has " + std::to_string(tables_.size()));
  }
  // Sparse rows first (their acks are waited for below, with the dense replies): ps-sync
  // servers need a push, possibly empty, from every worker for every table.
  std::vector<std::pair<Reply, std::string>> acks;
  std::vector<std::vector<int64_t>> id_buffers;
  std::vector<std::vector<float>> grad_buffers;
  auto started = SteadyClock::now();
  for (size_t t = 0; t < tables_.size(); ++t) {
    const size_t dim = static_cast<size_t>(tables_[t].dim);
    const SparseRows& rows = sparse[t];
    std::vector<std::vector<int64_t>> ids_of(static_cast<size_t>(view_.num_servers));
    std::vector<std::vector<float>> grads_of(ids_of.size());
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      const int owner = SparseRowOwner(t, rows.ids[i], view_.num_servers);
      ids_of[owner].push_back(rows.ids[i]);
      grads_of[owner].insert(grads_of[owner].end(), rows.grads.begin() + i * dim,
                             rows.grads.begin() + (i + 1) * dim);
    }
    for (int s = 0; s < view_.num_servers; ++s) {
      if (ids_of[s].empty() && options_.consistency != PsConsistency::kSync) continue;
      id_buffers.push_back(std::move(ids_of[s]));
      grad_buffers.push_back(std::move(grads_of[s]));
      const auto& ids = id_buffers.back();
      const auto& values = grad_buffers.back();
      MessageBuilder builder(kRole, rank_);
      std::vector<int64_t> id_shape = {static_cast<int64_t>(ids.size())};
      std::vector<int64_t> value_shape = {static_cast<int64_t>(values.size())};
      int32_t id_frame = builder.AddPayload(Payload::Copy(ids.data(), ids.size() * sizeof(int64_t)));
      int32_t value_frame =
          builder.AddPayload(Payload::Copy(values.data(), values.size() * sizeof(float)));
      auto id_meta = proto::CreateTensorMetaDirect(builder.fbb(), "row_ids", 0,
                                                   proto::DType::Int64, &id_shape, id_frame, 0,
                                                   ids.size() * sizeof(int64_t));
      auto value_meta = proto::CreateTensorMetaDirect(builder.fbb(), "values", 0,
                                                      proto::DType::Float32, &value_shape,
                                                      value_frame, 0, values.size() * sizeof(float));
      uint64_t id = endpoint_->NextRequestId();
      Message message = builder.Finish(
          proto::CreateSparsePushRequestDirect(builder.fbb(), tables_[t].name.c_str(), id_meta,
                                               value_meta),
          id, step);
      std::string what = "push of " + std::to_string(ids.size()) + " rows of table '" +
                         tables_[t].name + "' at step " + std::to_string(step) + " to server " +
                         std::to_string(s);
      acks.emplace_back(Send(s, std::move(message), id, what), what);
    }
  }
  Status dense = PushPull(step, grads, params);
  std::vector<StatusOr<Envelope>> results;
  Status sparse_status = WaitAll(&acks, &results);
  if (!acks.empty()) {
    latency_[kSparsePush]->Observe(std::chrono::duration<double>(SteadyClock::now() - started).count());
  }
  RETURN_IF_ERROR(dense);
  RETURN_IF_ERROR(sparse_status);
  last_step_ = step;
  return OkStatus();
}

StatusOr<std::vector<ShardFileInfo>> PsEngine::CheckpointServers(const std::string& root,
                                                                  int64_t step, bool restore) {
  std::vector<std::pair<Reply, std::string>> replies;
  for (int s = 0; s < view_.num_servers; ++s) {
    MessageBuilder builder(kRole, rank_);
    uint64_t id = endpoint_->NextRequestId();
    Message message = builder.Finish(
        proto::CreateCheckpointRequestDirect(builder.fbb(), root.c_str(), step, restore), id, step);
    std::string what = std::string(restore ? "restore" : "checkpoint") + " of step " +
                       std::to_string(step) + " on server " + std::to_string(s);
    replies.emplace_back(Send(s, std::move(message), id, what), what);
  }
  std::vector<StatusOr<Envelope>> results;
  RETURN_IF_ERROR(WaitAll(&replies, &results));
  std::vector<ShardFileInfo> files;
  for (size_t r = 0; r < results.size(); ++r) {
    const auto* body = results[r]->header->body_as_CheckpointReply();
    if (body == nullptr || body->files() == nullptr || body->files()->size() != 1 ||
        body->bytes() == nullptr || body->checksums() == nullptr ||
        body->bytes()->size() != 1 || body->checksums()->size() != 1) {
      return DataLossError(replies[r].second + ": the reply does not describe one shard file");
    }
    files.push_back({body->files()->Get(0)->str(), body->bytes()->Get(0),
                     body->checksums()->Get(0)});
  }
  return files;
}

Status PsEngine::SaveCheckpoint(const std::string& root, int64_t step, const float* params) {
  if (rank_ != 0) return OkStatus();
  RETURN_IF_ERROR(PrepareCheckpointStep(root, step));
  ASSIGN_OR_RETURN(std::vector<ShardFileInfo> files, CheckpointServers(root, step, false));
  CheckpointManifest manifest;
  manifest.step = step;
  manifest.mode = std::string(PsModeName(options_.consistency));
  manifest.layout_fingerprint = fingerprint_;
  manifest.dense_elements = dense_elements_;
  manifest.num_servers = view_.num_servers;
  manifest.chunk_elements = options_.chunk_elements;
  manifest.files = std::move(files);
  RETURN_IF_ERROR(CommitCheckpoint(root, manifest));
  TLOG(INFO) << "checkpoint of step " << step << " committed in "
             << CheckpointStepDirectory(root, step) << " (" << manifest.files.size()
             << " server shards)";
  return OkStatus();
}

Status PsEngine::RestoreCheckpoint(const std::string& root, int64_t step, float* params) {
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
    if (manifest.mode.rfind("ps-", 0) != 0) {
      return FailedPreconditionError("checkpoint " + CheckpointStepDirectory(root, step) +
                                     " was written in mode " + manifest.mode +
                                     "; a ps-* job resumes from a ps-* checkpoint");
    }
    RETURN_IF_ERROR(CheckpointServers(root, step, true).status());
  }
  // Every rank: the restored values (servers answer once their versions reached `step`).
  last_step_ = step;
  return PushPull(step + 1, /*grads=*/nullptr, params).WithContext("pull after restore");
}

}  // namespace tessera::worker
