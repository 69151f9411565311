// PsService on a real loopback endpoint, driven by hand-built requests from two "workers".
// Server 1 of 2 over a key space of 100 (it owns keys [50, 100)).
#include "server/ps/ps_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "common/training/embedding_table.h"
#include "common/training/ps_job.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "common/wire/wire_codec.h"

namespace tessera::server {
namespace {

constexpr int64_t kTimeoutMs = 10000;
constexpr uint64_t kKeySpace = 100;

using Reply = std::shared_future<StatusOr<Envelope>>;

std::vector<float> FloatsOf(const Envelope& reply, const proto::TensorMeta& meta) {
  std::vector<float> values(meta.byte_length() / sizeof(float));
  if (!values.empty()) {
    std::memcpy(values.data(),
                reply.message.payloads.at(static_cast<size_t>(meta.payload())).data() + meta.offset(),
                meta.byte_length());
  }
  return values;
}

class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZmqTransportOptions options;
    options.role = proto::Role::Server;
    options.rank = 1;
    auto server = StartZmqEndpoint(options, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    for (int w = 0; w < 2; ++w) {
      options.role = proto::Role::Worker;
      options.rank = w;
      auto client = StartZmqEndpoint(options, nullptr);
      ASSERT_TRUE(client.ok()) << client.status();
      workers_.push_back(std::move(client).value());
    }
    PsServiceOptions ps;
    ps.server_rank = 1;
    ps.num_servers = 2;
    ps.key_space = kKeySpace;
    auto service = PsService::Start(ps, server_.get(), &metrics_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(service).value();
  }

  void TearDown() override { service_.reset(); }

  Reply Call(int worker, Message message, uint64_t id) {
    return workers_[worker]->CallAsync(server_->address(), std::move(message), id,
                                       Deadline::AfterMillis(kTimeoutMs), "test request");
  }

  // A sync job of 10 dense floats in chunks of 4 (chunks 0, 1, 2: this server owns chunk 1,
  // key 50) and one table of 100 rows of 2; SGD with lr 0.5.
  PsJobConfig Config() {
    PsJobConfig config;
    config.num_workers = 2;
    config.optimizer = DefaultOptimizerOptions(OptimizerKind::kSgd);
    config.optimizer.lr = 0.5f;
    config.dense_elements = 10;
    config.chunk_elements = 4;
    config.tables = {{"emb.0", 100, 2, 42}};
    return config;
  }

  Status Init(const std::vector<float>& chunk1) {
    MessageBuilder b(proto::Role::Worker, 0);
    std::vector<int64_t> shape = {4};
    int32_t frame = b.AddPayload(Payload::Copy(chunk1.data(), 16));
    std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
        b.fbb(), "chunk1", 50, proto::DType::Float32, &shape, frame, 0, 16)};
    const std::string json = EncodePsJobConfig(Config());
    uint64_t id = workers_[0]->NextRequestId();
    return Call(0, b.Finish(proto::CreatePsInitRequestDirect(b.fbb(), json.c_str(), &metas, 7), id),
                id)
        .get()
        .status();
  }

  Reply PushPull(int worker, int64_t step, uint64_t key, const std::vector<float>& grads) {
    MessageBuilder b(proto::Role::Worker, worker);
    std::vector<int64_t> shape = {static_cast<int64_t>(grads.size())};
    int32_t frame = b.AddPayload(Payload::Copy(grads.data(), grads.size() * 4));
    std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
        b.fbb(), "chunk1", key, proto::DType::Float32, &shape, frame, 0, grads.size() * 4)};
    uint64_t id = workers_[worker]->NextRequestId();
    return Call(worker,
                b.Finish(proto::CreatePsPushPullRequestDirect(b.fbb(), &metas, true, 7), id, step),
                id);
  }

  Reply SparsePush(int worker, int64_t step, const std::vector<int64_t>& ids,
                   const std::vector<float>& grads) {
    MessageBuilder b(proto::Role::Worker, worker);
    std::vector<int64_t> id_shape = {static_cast<int64_t>(ids.size())};
    std::vector<int64_t> value_shape = {static_cast<int64_t>(grads.size())};
    int32_t id_frame = b.AddPayload(Payload::Copy(ids.data(), ids.size() * 8));
    int32_t value_frame = b.AddPayload(Payload::Copy(grads.data(), grads.size() * 4));
    auto id_meta = proto::CreateTensorMetaDirect(b.fbb(), "row_ids", 0, proto::DType::Int64,
                                                 &id_shape, id_frame, 0, ids.size() * 8);
    auto value_meta = proto::CreateTensorMetaDirect(b.fbb(), "values", 0, proto::DType::Float32,
                                                    &value_shape, value_frame, 0, grads.size() * 4);
    uint64_t id = workers_[worker]->NextRequestId();
    return Call(worker,
                b.Finish(proto::CreateSparsePushRequestDirect(b.fbb(), "emb.0", id_meta, value_meta),
                         id, step),
                id);
  }

  Reply SparsePull(int worker, int64_t step, const std::vector<int64_t>& ids) {
    MessageBuilder b(proto::Role::Worker, worker);
    std::vector<int64_t> shape = {static_cast<int64_t>(ids.size())};
    int32_t frame = b.AddPayload(Payload::Copy(ids.data(), ids.size() * 8));
    auto meta = proto::CreateTensorMetaDirect(b.fbb(), "row_ids", 0, proto::DType::Int64, &shape,
                                              frame, 0, ids.size() * 8);
    uint64_t id = workers_[worker]->NextRequestId();
    return Call(worker, b.Finish(proto::CreateSparsePullRequestDirect(b.fbb(), "emb.0", meta), id,
                                 step),
                id);
  }

  // Row ids of the table owned by server `owner`.
  std::vector<int64_t> RowsOf(int owner, size_t count) {
    std::vector<int64_t> rows;
    for (int64_t id = 0; rows.size() < count; ++id) {
      if (SparseRowOwner(0, id, 2) == owner) rows.push_back(id);
    }
    return rows;
  }

  MetricsRegistry metrics_;
  std::unique_ptr<RpcEndpoint> server_;
  std::vector<std::unique_ptr<RpcEndpoint>> workers_;
  std::unique_ptr<PsService> service_;
};

TEST_F(PsServiceTest, SyncRepliesWaitForEveryWorkerThenCarryTheAveragedUpdate) {
  ASSERT_TRUE(Init({1, 2, 3, 4}).ok());
  Reply first = PushPull(0, 1, 50, {1, 1, 1, 1});
  // Worker 1 has not pushed step 1: worker 0's reply must wait.
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  Reply second = PushPull(1, 1, 50, {3, 3, 3, -1});
  for (Reply* reply : {&first, &second}) {
    auto result = reply->get();
    ASSERT_TRUE(result.ok()) << result.status();
    const auto* tensors = result->header->body_as_PullReply()->tensors();
    ASSERT_EQ(tensors->size(), 1u);
    // p - 0.5 * mean(g0, g1) = p - 0.5 * {2, 2, 2, 0}
    EXPECT_EQ(FloatsOf(*result, *tensors->Get(0)), (std::vector<float>{0, 1, 2, 4}));
  }
}

TEST_F(PsServiceTest, KeysAndRowsOfAnotherServerAreRefusedNamingTheOwner) {
  ASSERT_TRUE(Init({0, 0, 0, 0}).ok());
  auto wrong_key = PushPull(0, 1, 3, {1, 1, 1, 1}).get();
  EXPECT_NE(wrong_key.status().message().find("key 3 belongs to server 0, not server 1"),
            std::string::npos)
      << wrong_key.status();
  const int64_t foreign = RowsOf(0, 1)[0];
  auto wrong_row = SparsePush(0, 1, {foreign}, {1, 1}).get();
  EXPECT_NE(wrong_row.status().message().find("row " + std::to_string(foreign) +
                                              " of table 'emb.0' belongs to server 0"),
            std::string::npos)
      << wrong_row.status();
  auto wrong_size = PushPull(1, 1, 50, {1, 1}).get();
  EXPECT_NE(wrong_size.status().message().find("chunk 1 has 4 floats"), std::string::npos)
      << wrong_size.status();
}

TEST_F(PsServiceTest, SparseRowsExistOnlyOnceTouchedAndSyncAveragesThem) {
  ASSERT_TRUE(Init({0, 0, 0, 0}).ok());
  const std::vector<int64_t> rows = RowsOf(1, 3);
  // Step 1: worker 0 touches rows[0] twice (duplicates add up), worker 1 touches rows[1].
  ASSERT_TRUE(SparsePush(0, 1, {rows[0], rows[0]}, {1, 2, 3, 4}).get().ok());
  Reply pull = SparsePull(0, 2, {rows[0], rows[1], rows[2]});
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "a pull for step 2 must wait until step 1's rows are applied";
  ASSERT_TRUE(SparsePush(1, 1, {rows[1]}, {2, 2}).get().ok());
  auto result = pull.get();
  ASSERT_TRUE(result.ok()) << result.status();
  const auto* body = result->header->body_as_SparsePullReply();
  std::vector<float> values = FloatsOf(*result, *body->values());
  ASSERT_EQ(values.size(), 6u);
  std::vector<float> initial(2);
  // rows[0]: init - 0.5 * (1+3, 2+4) / 2 workers
  InitializeEmbeddingRow(42, rows[0], 2, initial.data());
  EXPECT_FLOAT_EQ(values[0], initial[0] - 0.5f * 2.0f);
  EXPECT_FLOAT_EQ(values[1], initial[1] - 0.5f * 3.0f);
  InitializeEmbeddingRow(42, rows[1], 2, initial.data());
  EXPECT_FLOAT_EQ(values[2], initial[0] - 0.5f * 1.0f);
  // rows[2] was never pushed: its initial value.
  InitializeEmbeddingRow(42, rows[2], 2, initial.data());
  EXPECT_EQ(values[4], initial[0]);
  EXPECT_EQ(values[5], initial[1]);
}

TEST_F(PsServiceTest, RequestsBeforeTheJobWaitForItsInit) {
  // Worker 1 pulls before worker 0 initialised the job: answered once the init arrives.
  MessageBuilder b(proto::Role::Worker, 1);
  std::vector<int64_t> shape = {4};
  std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
      b.fbb(), "chunk1", 50, proto::DType::Float32, &shape, -1, 0, 0)};
  uint64_t id = workers_[1]->NextRequestId();
  Reply early = Call(
      1, b.Finish(proto::CreatePsPushPullRequestDirect(b.fbb(), &metas, false, 7), id, 1), id);
  EXPECT_EQ(early.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  ASSERT_TRUE(Init({5, 6, 7, 8}).ok());
  auto result = early.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FloatsOf(*result, *result->header->body_as_PullReply()->tensors()->Get(0)),
            (std::vector<float>{5, 6, 7, 8}));
}

}  // namespace
}  // namespace tessera::server
