#include "server/ps/ps_test_fleet.h"

#include <cstdlib>
#include <utility>

#include "common/training/lr_schedule.h"
#include "common/transport/inproc/inproc_transport.h"

namespace tessera::server {

PsJobConfig TestConfig(PsConsistency consistency, int num_workers) {
  PsJobConfig config;
  config.consistency = consistency;
  config.num_workers = num_workers;
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kSgd);
  config.optimizer.lr = 0.5f;
  config.dense_elements = 10;
  config.chunk_elements = 4;
  config.layout_fingerprint = 99;
  config.tables = {{"emb.0", 100, 2, 42}};
  return config;
}

Floats RandomFloats(std::mt19937& random, size_t n) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Floats values(n);
  for (float& v : values) v = uniform(random);
  return values;
}

std::string TempRoot(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// ---- Reference -----------------------------------------------------------------------------

Reference::Reference(const PsJobConfig& config, ByKey values)
    : config_(config), values_(std::move(values)), table_(config.tables[0], config.optimizer) {}

void Reference::ApplyStep(int64_t step, const std::vector<ByKey>& grads) {
  for (auto& [key, values] : values_) {
    Floats sum = grads[0].at(key);
    for (size_t r = 1; r < grads.size(); ++r) {
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += grads[r].at(key)[j];
    }
    const float scale = 1.0f / static_cast<float>(grads.size());
    for (float& g : sum) g *= scale;
    Sgd(step - 1, sum, &values);
  }
}

void Reference::ApplyOne(const ByKey& grads) {
  for (const auto& [key, g] : grads) Sgd(updates_[key]++, g, &values_.at(key));
}

void Reference::ApplyRows(int64_t step, const std::vector<Ids>& ids,
                          const std::vector<Floats>& grads) {
  Ids all_ids;
  Floats all_grads;
  for (size_t r = 0; r < ids.size(); ++r) {
    all_ids.insert(all_ids.end(), ids[r].begin(), ids[r].end());
    all_grads.insert(all_grads.end(), grads[r].begin(), grads[r].end());
  }
  const float scale = 1.0f / static_cast<float>(ids.size());
  for (float& g : all_grads) g *= scale;
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, step - 1);
  ASSERT_TRUE(
      table_.ApplyGradients(lr, step, all_ids.data(), all_grads.data(), all_ids.size()).ok());
}

void Reference::ApplyRowPush(const Ids& ids, const Floats& grads) {
  const int64_t update = ++row_updates_;
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, update - 1);
  ASSERT_TRUE(table_.ApplyGradients(lr, update, ids.data(), grads.data(), ids.size()).ok());
}

Floats Reference::Rows(const Ids& ids) const {
  const size_t dim = static_cast<size_t>(table_.spec().dim);
  Floats rows(ids.size() * dim);
  for (size_t i = 0; i < ids.size(); ++i) table_.Read(ids[i], rows.data() + i * dim);
  return rows;
}

// SGD as the optimizer does it: p -= lr * g, element by element, in float.
void Reference::Sgd(int64_t updates_before, const Floats& g, Floats* p) {
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, updates_before);
  for (size_t j = 0; j < p->size(); ++j) (*p)[j] -= lr * g[j];
}

// ---- The fleet -----------------------------------------------------------------------------

void PsServiceTest::Start(Fleet fleet) {
  fleet_ = fleet;
  auto network = std::make_shared<InProcessNetwork>();
  auto transport = [&](const std::string& name,
                       const std::optional<FaultOptions>& faults) -> std::unique_ptr<Transport> {
    auto inner = InProcessTransport::Create(network, name);
    EXPECT_TRUE(inner.ok()) << inner.status();
    if (!faults.has_value()) return std::move(inner).value();
    auto faulty = std::make_unique<FaultyTransport>(std::move(inner).value(), *faults);
    if (name == "server") {
      server_faults_ = faulty.get();
    } else {
      worker_faults_.push_back(faulty.get());
    }
    return faulty;
  };
  auto server = RpcEndpoint::Start(transport("server", fleet.server_faults), Role::kServer,
                                   fleet.server_rank, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(server).value();
  for (int w = 0; w < fleet.num_workers; ++w) {
    auto worker = RpcEndpoint::Start(transport("worker" + std::to_string(w), fleet.worker_faults),
                                     Role::kWorker, w, nullptr);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers_.push_back(std::move(worker).value());
  }
  PsServiceOptions options;
  options.server_rank = fleet.server_rank;
  options.num_servers = fleet.num_servers;
  options.key_space = kTestKeySpace;
  options.park_limit_ms = fleet.park_limit_ms;
  options.long_wait_ms = fleet.long_wait_ms;
  auto service = PsService::Start(options, server_.get(), &metrics_);
  ASSERT_TRUE(service.ok()) << service.status();
  service_ = std::move(service).value();
  if (fleet.with_primary) {
    auto primary = RpcEndpoint::Start(transport("primary", std::nullopt), Role::kServer, 0, nullptr);
    ASSERT_TRUE(primary.ok()) << primary.status();
    primary_ = std::move(primary).value();
    options.server_rank = 0;
    auto primary_service = PsService::Start(options, primary_.get(), &primary_metrics_);
    ASSERT_TRUE(primary_service.ok()) << primary_service.status();
    primary_service_ = std::move(primary_service).value();
  }
  if (fleet.with_last) {
    auto last = RpcEndpoint::Start(transport("last", std::nullopt), Role::kServer, 1, nullptr);
    ASSERT_TRUE(last.ok()) << last.status();
    last_ = std::move(last).value();
    options.server_rank = 1;
    auto last_service = PsService::Start(options, last_.get(), &last_metrics_);
    ASSERT_TRUE(last_service.ok()) << last_service.status();
    last_service_ = std::move(last_service).value();
  }
}

Reply PsServiceTest::SendToServer(const RpcEndpoint& server, int worker, MessageBody body,
                                  int64_t step, const std::string& what) {
  return workers_[worker]->CallAsync(server.address(), std::move(body), step,
                                     Deadline::AfterMillis(kTestTimeoutMs), what, fleet_.resend_ms);
}

Status PsServiceTest::InitRangeZero(const RpcEndpoint& server, const PsJobConfig& config,
                                    const ByKey& values, const std::string& what) {
  PsInitRequest init{EncodePsJobConfig(config), {}, kTestToken, 0};
  for (const auto& [key, v] : values) init.tensors.push_back(TensorData::Floats("chunk", key, v));
  return SendToServer(server, 0, std::move(init), 0, what).get().status();
}

Reply PsServiceTest::SendToLast(int worker, MessageBody body, int64_t step,
                                const std::string& what) {
  return SendToServer(*last_, worker, std::move(body), step, what);
}

Status PsServiceTest::InitLast(const PsJobConfig& config, const ByKey& values) {
  return InitRangeZero(*last_, config, values, "init of range 0 on the third server");
}

Reply PsServiceTest::SendToPrimary(int worker, MessageBody body, int64_t step,
                                   const std::string& what) {
  return SendToServer(*primary_, worker, std::move(body), step, what);
}

Status PsServiceTest::InitPrimary(const PsJobConfig& config, const ByKey& values) {
  return InitRangeZero(*primary_, config, values, "init of server 0");
}

Reply PsServiceTest::PushToPrimary(int worker, int64_t step, const ByKey& grads,
                                   const std::string& backup) {
  PsPushPullRequest request{{}, true, kTestToken, {}};
  request.range = 0;
  request.forward_to = backup;
  for (const auto& [key, g] : grads) request.tensors.push_back(TensorData::Floats("chunk", key, g));
  return SendToPrimary(worker, std::move(request), step,
                       "push-pull of step " + std::to_string(step) + " by worker " +
                           std::to_string(worker) + " to server 0");
}

ByKey PsServiceTest::InitialValues(const PsJobConfig& config, int range) const {
  if (range < 0) range = fleet_.server_rank;
  auto plan = PlanDenseChunks(config.dense_elements, config.chunk_elements, fleet_.num_servers,
                              kTestKeySpace);
  EXPECT_TRUE(plan.ok()) << plan.status();
  ByKey values;
  for (const DenseChunk& chunk : *plan) {
    if (chunk.server != range) continue;
    Floats v(chunk.size);
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(chunk.index) + j / 8.0f;
    values[chunk.key] = v;
  }
  return values;
}

Ids PsServiceTest::RowsOwnedBy(int owner, size_t count) const {
  Ids rows;
  for (int64_t id = 0; rows.size() < count; ++id) {
    if (SparseRowOwner(0, id, fleet_.num_servers) == owner) rows.push_back(id);
  }
  return rows;
}

ByKey PsServiceTest::RandomGrads(std::mt19937& random, const ByKey& like) {
  ByKey grads;
  for (const auto& [key, v] : like) grads[key] = RandomFloats(random, v.size());
  return grads;
}

Reply PsServiceTest::Send(int worker, MessageBody body, int64_t step, const std::string& what,
                          int64_t timeout_ms) {
  return workers_[worker]->CallAsync(server_->address(), std::move(body), step,
                                     Deadline::AfterMillis(timeout_ms), what, fleet_.resend_ms);
}

Status PsServiceTest::Init(const PsJobConfig& config, const ByKey& values, int range) {
  PsInitRequest init{EncodePsJobConfig(config), {}, kTestToken, range};
  for (const auto& [key, v] : values) init.tensors.push_back(TensorData::Floats("chunk", key, v));
  return Send(0, std::move(init), 0, "init").get().status();
}

Reply PsServiceTest::PushPull(int worker, int64_t step, const ByKey& grads, int64_t timeout_ms) {
  PsPushPullRequest request{{}, true, kTestToken, {}};
  for (const auto& [key, g] : grads) request.tensors.push_back(TensorData::Floats("chunk", key, g));
  return Send(worker, std::move(request), step,
              "push-pull of step " + std::to_string(step) + " by worker " + std::to_string(worker),
              timeout_ms);
}

Reply PsServiceTest::Pull(int worker, int64_t step, const std::vector<uint64_t>& keys) {
  PsPushPullRequest request{{}, false, kTestToken, {}};
  for (uint64_t key : keys) {
    request.tensors.push_back(TensorData{"chunk", key, DataType::kFloat32, {}, Payload()});
  }
  return Send(worker, std::move(request), step, "pull of step " + std::to_string(step));
}

Reply PsServiceTest::SparsePush(int worker, int64_t step, const Ids& ids, const Floats& grads) {
  return Send(worker,
              SparsePushRequest{"emb.0", TensorData::Int64s("row_ids", ids),
                                TensorData::Floats("values", 0, grads)},
              step, "sparse push of step " + std::to_string(step));
}

Reply PsServiceTest::SparsePull(int worker, int64_t step, const Ids& ids) {
  return Send(worker, SparsePullRequest{"emb.0", TensorData::Int64s("row_ids", ids)}, step,
              "sparse pull of step " + std::to_string(step));
}

Reply PsServiceTest::Checkpoint(const std::string& root, int64_t step, bool restore) {
  return Send(0, CheckpointRequest{root, step, restore}, step, restore ? "restore" : "checkpoint");
}

ByKey PsServiceTest::ValuesOf(const Reply& reply) {
  const StatusOr<Envelope>& result = reply.get();
  EXPECT_TRUE(result.ok()) << result.status();
  ByKey values;
  const PsPushPullReply* body = result.ok() ? result->As<PsPushPullReply>() : nullptr;
  if (body == nullptr) return values;
  for (const TensorData& tensor : body->tensors) values[tensor.key] = tensor.Read<float>();
  return values;
}

Floats PsServiceTest::RowsOf(const Reply& reply) {
  const StatusOr<Envelope>& result = reply.get();
  EXPECT_TRUE(result.ok()) << result.status();
  const SparsePullReply* body = result.ok() ? result->As<SparsePullReply>() : nullptr;
  return body == nullptr ? Floats() : body->values.Read<float>();
}

double PsServiceTest::GaugeValue(const metric_names::MetricName& name) {
  auto family = metrics_.RegisterGauge(name.name, name.help);
  return family.ok() ? (*family)->WithLabels({}).value()->Value() : -1;
}

double PsServiceTest::DenseUpdates() {
  auto family = metrics_.RegisterCounter(metric_names::kPsUpdatesTotal.name,
                                         metric_names::kPsUpdatesTotal.help, {"kind"});
  return family.ok() ? (*family)->WithLabels({"dense"}).value()->Value() : -1;
}

}  // namespace tessera::server
