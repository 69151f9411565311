#include "common/training/ps_job.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/messages/fleet_view.h"

namespace tessera {
namespace {

TEST(PsJobTest, ConfigRoundTripsThroughJson) {
  PsJobConfig config;
  config.consistency = PsConsistency::kSsp;
  config.staleness = 3;
  config.num_workers = 4;
  config.optimizer = DefaultOptimizerOptions(OptimizerKind::kAdamW);
  config.optimizer.lr = 0.0123f;
  config.schedule.kind = LrScheduleKind::kCosine;
  config.schedule.total_steps = 100;
  config.schedule.warmup_steps = 10;
  config.dense_elements = 12345;
  config.layout_fingerprint = 0xfedcba9876543210ULL;
  config.chunk_elements = 1000;
  config.tables = {{"emb.0", 50, 8, 17}};
  config.model = "{\"parameters\": []}";
  auto decoded = DecodePsJobConfig(EncodePsJobConfig(config));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(EncodePsJobConfig(*decoded), EncodePsJobConfig(config));
  EXPECT_EQ(decoded->optimizer.lr, 0.0123f);
  EXPECT_EQ(decoded->layout_fingerprint, 0xfedcba9876543210ULL);
  EXPECT_EQ(decoded->tables[0].init_seed, 17u);
  EXPECT_EQ(decoded->model, config.model);
  EXPECT_FALSE(DecodePsJobConfig("{\"mode\": \"ps-sync\"}").ok());
  EXPECT_NE(DecodePsJobConfig("{}").status().message().find("ps job config"), std::string::npos);
  config.staleness = -1;
  EXPECT_FALSE(ValidatePsJobConfig(config).ok());
  EXPECT_FALSE(ParsePsMode("ps-bsp").ok());
}

// Numbers a field's type cannot hold are refused naming the field (converting them was
// undefined behaviour: ps_job_config_fuzzer found 1e37 as dense_elements).
TEST(PsJobTest, NumbersOutOfTheirFieldsRangeAreRefused) {
  PsJobConfig config;
  config.dense_elements = 10;
  const std::string good = EncodePsJobConfig(config);
  ASSERT_TRUE(DecodePsJobConfig(good).ok());
  struct Case {
    std::string field, value, message;
  };
  for (const Case& c : std::vector<Case>{
           {"\"dense_elements\":10", "\"dense_elements\":1e37",
            "ps job config: dense_elements is 1e+37, not an integer in [0, 18446744073709551615]"},
           {"\"dense_elements\":10", "\"dense_elements\":-1",
            "dense_elements is -1, not an integer"},
           {"\"num_workers\":1", "\"num_workers\":4294967297",
            "num_workers is 4294967297, not an integer in [-2147483648, 2147483647]"},
           {"\"num_workers\":1", "\"num_workers\":1.5", "num_workers is 1.5, not an integer"},
           {"\"lr\":", "\"lr\":1e300,\"unused\":", "lr is 1e+300, not a finite float"}}) {
    SCOPED_TRACE(c.value);
    std::string json = good;
    const size_t at = json.find(c.field);
    ASSERT_NE(at, std::string::npos) << json;
    json.replace(at, c.field.size(), c.value);
    auto decoded = DecodePsJobConfig(json);
    EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find(c.message), std::string::npos) << decoded.status();
  }
}

TEST(PsJobTest, ChunksCoverTheBufferRoundRobinWithKeysInTheOwnersRange) {
  const uint64_t key_space = 1000;
  for (int servers : {1, 2, 3, 5}) {
    auto chunks = PlanDenseChunks(10007, 100, servers, key_space);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    ASSERT_EQ(chunks->size(), 101u);
    uint64_t next = 0;
    for (const DenseChunk& chunk : *chunks) {
      EXPECT_EQ(chunk.offset, next);
      next += chunk.size;
      EXPECT_EQ(chunk.server, static_cast<int>(chunk.index % servers));
      auto [begin, end] = ServerKeyRange(key_space, servers, chunk.server);
      EXPECT_GE(chunk.key, begin);
      EXPECT_LT(chunk.key, end);
    }
    EXPECT_EQ(next, 10007u);
    EXPECT_EQ(chunks->back().size, 7u);
  }
  EXPECT_TRUE(PlanDenseChunks(0, 100, 2, key_space)->empty());
  Status too_many = PlanDenseChunks(1000000, 1, 2, 100).status();
  EXPECT_NE(too_many.message().find("--ps-chunk-elements"), std::string::npos) << too_many;
  EXPECT_FALSE(PlanDenseChunks(10, 1, 0, 100).ok());
}

TEST(PsJobTest, ModelChecksNameTheFirstDifferenceOnBothSides) {
  ParameterLayout job;
  ASSERT_TRUE(job.Add("0.weight", {16, 8}).ok());
  ASSERT_TRUE(job.Add("0.bias", {16}).ok());
  const std::vector<EmbeddingTableSpec> tables = {{"users", 1000, 4, 0}};
  const std::string rank0 = DescribePsModel(job, tables);
  EXPECT_TRUE(CheckPsModel(rank0, rank0, 1).ok());

  ParameterLayout other_shape;
  ASSERT_TRUE(other_shape.Add("0.weight", {3, 8}).ok());
  ASSERT_TRUE(other_shape.Add("0.bias", {16}).ok());
  Status s = CheckPsModel(rank0, DescribePsModel(other_shape, tables), 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("worker 2's model differs from rank 0's: parameter 0 is "
                             "\"0.weight\" [3, 8] on worker 2, \"0.weight\" [16, 8] on rank 0"),
            std::string::npos)
      << s;

  ParameterLayout fewer;
  ASSERT_TRUE(fewer.Add("0.weight", {16, 8}).ok());
  s = CheckPsModel(rank0, DescribePsModel(fewer, tables), 1);
  EXPECT_NE(s.message().find("parameter 1 is missing on worker 1, \"0.bias\" [16] on rank 0"),
            std::string::npos)
      << s;

  s = CheckPsModel(rank0, DescribePsModel(job, {{"users", 999, 4, 0}}), 1);
  EXPECT_NE(s.message().find("embedding table 0 is \"users\" (999 rows of 4) on worker 1, "
                             "\"users\" (1000 rows of 4) on rank 0"),
            std::string::npos)
      << s;

  EXPECT_EQ(CheckPsModel(rank0, "not json", 1).code(), StatusCode::kInvalidArgument);
}

// The same processes running a second job (new endpoints, so new addresses) get a new token:
// a long-running server must not take the second job's init for a copy of the first's.
TEST(PsJobTest, JobTokensDifferForTheNextJobOfTheSameProcesses) {
  FleetView first;
  MemberInfo worker;
  worker.role = Role::kWorker;
  worker.rank = 0;
  worker.pid = 1234;
  worker.address = "tcp://127.0.0.1:40001";
  first.members.push_back(worker);
  FleetView same = first;
  EXPECT_EQ(PsJobToken(first), PsJobToken(same));
  FleetView next = first;
  next.members[0].address = "tcp://127.0.0.1:40002";
  EXPECT_NE(PsJobToken(first), PsJobToken(next));
  FleetView other_pid = first;
  other_pid.members[0].pid = 1235;
  EXPECT_NE(PsJobToken(first), PsJobToken(other_pid));
}

TEST(PsJobTest, SparseRowsSpreadOverServers) {
  std::vector<int> counts(3);
  for (int64_t id = 0; id < 3000; ++id) ++counts[SparseRowOwner(0, id, 3)];
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  EXPECT_EQ(SparseRowOwner(1, 7, 1), 0);
}

}  // namespace
}  // namespace tessera
