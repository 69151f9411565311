#include "common/config/config.h"

#include <CLI/CLI.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kCoordinatorFlag[] = "--coordinator=10.0.0.1:29500";

StatusOr<ProcessConfig> Parse(Role role, const std::vector<std::string>& args,
                              const Environment& env = {}, CLI::App* app = nullptr,
                              bool* help = nullptr) {
  std::vector<const char*> argv = {"tessera_test"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return ParseProcessConfig(role, static_cast<int>(argv.size()), argv.data(), env, app, help);
}

// The error message of a parse expected to fail.
std::string ParseError(Role role, const std::vector<std::string>& args,
                       const Environment& env = {}) {
  StatusOr<ProcessConfig> config = Parse(role, args, env);
  EXPECT_FALSE(config.ok()) << "expected an error";
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status();
  return config.status().message();
}

TEST(RoleTest, NamesRoundTrip) {
  for (Role role : {Role::kCoordinator, Role::kServer, Role::kWorker}) {
    StatusOr<Role> parsed = ParseRole(RoleName(role));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, role);
  }
  EXPECT_EQ(RoleName(Role::kWorker), "worker");
  EXPECT_THAT(ParseRole("trainer").status().message(), HasSubstr("\"trainer\""));
}

TEST(ProcessConfigTest, WorkerDefaults) {
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->role, Role::kWorker);
  EXPECT_EQ(config->rank, -1);
  EXPECT_EQ(config->local_rank, -1);
  EXPECT_EQ(config->num_workers, 1);
  EXPECT_EQ(config->num_servers, 0);
  EXPECT_EQ(config->coordinator, "10.0.0.1:29500");
  EXPECT_EQ(config->bind_host, "auto");
  EXPECT_EQ(config->port, 0);
  EXPECT_EQ(config->metrics_port, 0);
  EXPECT_EQ(config->job, "tessera");
  EXPECT_EQ(config->rendezvous_timeout_ms, 60000);
  EXPECT_EQ(config->heartbeat_interval_ms, 1000);
  EXPECT_EQ(config->heartbeat_timeout_ms, 4000);
  EXPECT_EQ(config->request_timeout_ms, 30000);
  EXPECT_EQ(config->max_message_bytes, uint64_t{1} << 30);
  EXPECT_EQ(config->log_level, LogLevel::kInfo);
  EXPECT_EQ(config->linger_seconds, 0);
  EXPECT_FALSE(config->cuda_tf32);
  EXPECT_EQ(config->sources.size(), 1u);
  EXPECT_EQ(config->sources.at("--coordinator"), "flag");
}

TEST(ProcessConfigTest, CoordinatorDefaultsToListeningOnLoopbackFreePort) {
  StatusOr<ProcessConfig> config = Parse(Role::kCoordinator, {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "127.0.0.1:0");
  EXPECT_TRUE(config->sources.empty());
}

TEST(ProcessConfigTest, ServerNeedsACoordinatorAndAWorkerMayRunStandalone) {
  std::string message = ParseError(Role::kServer, {});
  EXPECT_THAT(message, HasSubstr("--coordinator is required"));
  EXPECT_THAT(message, HasSubstr("MASTER_ADDR"));
  StatusOr<ProcessConfig> standalone = Parse(Role::kWorker, {});
  ASSERT_TRUE(standalone.ok()) << standalone.status();
  EXPECT_EQ(standalone->coordinator, "");
}

TEST(ProcessConfigTest, EveryFlagIsApplied) {
  StatusOr<ProcessConfig> config = Parse(
      Role::kWorker,
      {"--rank=2", "--local-rank", "1", "--num-workers=4", "--num-servers=3",
       "--coordinator=[::1]:7000", "--bind-host=0.0.0.0", "--port=5000", "--metrics-port=9100",
       "--job=exp-7.a_b", "--rendezvous-timeout-ms=5000", "--heartbeat-interval-ms=200",
       "--heartbeat-timeout-ms=900", "--request-timeout-ms=1234", "--max-message-bytes=4096",
       "--log-level=warn", "--linger=2.5", "--cuda-tf32=1"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 2);
  EXPECT_EQ(config->local_rank, 1);
  EXPECT_EQ(config->num_workers, 4);
  EXPECT_EQ(config->num_servers, 3);
  EXPECT_EQ(config->coordinator, "[::1]:7000");
  EXPECT_EQ(config->bind_host, "0.0.0.0");
  EXPECT_EQ(config->port, 5000);
  EXPECT_EQ(config->metrics_port, 9100);
  EXPECT_EQ(config->job, "exp-7.a_b");
  EXPECT_EQ(config->rendezvous_timeout_ms, 5000);
  EXPECT_EQ(config->heartbeat_interval_ms, 200);
  EXPECT_EQ(config->heartbeat_timeout_ms, 900);
  EXPECT_EQ(config->request_timeout_ms, 1234);
  EXPECT_EQ(config->max_message_bytes, 4096u);
  EXPECT_EQ(config->log_level, LogLevel::kWarning);
  EXPECT_EQ(config->linger_seconds, 2.5);
  EXPECT_TRUE(config->cuda_tf32);
  EXPECT_EQ(config->sources.size(), 17u);
}

TEST(ProcessConfigTest, WorldSizeIsAnAliasOfNumWorkers) {
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag, "--world-size=8"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_workers, 8);
}

// "-1" after a space is the flag's value (not an option), and -1 is no sentinel: a rank left
// to the coordinator is a --rank left out.
TEST(ProcessConfigTest, NegativeValueAfterSpaceIsTheValueAndRefused) {
  StatusOr<ProcessConfig> config =
      Parse(Role::kWorker, {kCoordinatorFlag, "--rank", "-1", "--num-workers", "2"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find(
                "--rank=-1 is out of range: must be >= 0 (leave it out to let the coordinator "
                "assign one)"),
            std::string::npos)
      << config.status();
  StatusOr<ProcessConfig> local = Parse(Role::kWorker, {kCoordinatorFlag, "--local-rank", "-1"});
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("--local-rank=-1 is out of range: must be >= 0"),
            std::string::npos)
      << local.status();
}

TEST(ProcessConfigTest, FlagsOverrideEnvironment) {
  Environment env = {{"RANK", "1"},        {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "1"},
                     {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"},  {"TESSERA_JOB", "envjob"},
                     {"TESSERA_NUM_SERVERS", "2"}, {"TESSERA_LOG_LEVEL", "debug"}};
  StatusOr<ProcessConfig> config =
      Parse(Role::kWorker,
            {"--rank=3", "--coordinator=flaghost:1", "--job=flagjob", "--num-servers=5",
             "--log-level=error"},
            env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 3);
  EXPECT_EQ(config->coordinator, "flaghost:1");
  EXPECT_EQ(config->job, "flagjob");
  EXPECT_EQ(config->num_servers, 5);
  EXPECT_EQ(config->log_level, LogLevel::kError);
  EXPECT_EQ(config->sources.at("--rank"), "flag");
  // Fields without a flag still come from the environment.
  EXPECT_EQ(config->num_workers, 4);
  EXPECT_EQ(config->local_rank, 1);
  EXPECT_EQ(config->sources.at("--num-workers"), "env WORLD_SIZE");
}

TEST(ProcessConfigTest, EnvironmentAppliedWhenNoFlag) {
  Environment env = {{"TESSERA_NUM_SERVERS", "2"},
                     {"TESSERA_JOB", "resnet"},
                     {"TESSERA_LOG_LEVEL", "debug"},
                     {"MASTER_ADDR", "node7"},
                     {"MASTER_PORT", "29500"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_servers, 2);
  EXPECT_EQ(config->job, "resnet");
  EXPECT_EQ(config->log_level, LogLevel::kDebug);
  EXPECT_EQ(config->coordinator, "node7:29500");
  EXPECT_EQ(config->sources.at("--coordinator"), "env MASTER_ADDR+MASTER_PORT");
}

TEST(ProcessConfigTest, TorchrunStyle) {
  Environment env = {{"RANK", "3"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"MASTER_ADDR", "10.1.2.3"},
                     {"MASTER_PORT", "29500"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 3);
  EXPECT_EQ(config->num_workers, 8);
  EXPECT_EQ(config->local_rank, 1);
  EXPECT_EQ(config->coordinator, "10.1.2.3:29500");
  EXPECT_EQ(config->sources.at("--rank"), "env RANK");
  EXPECT_EQ(config->sources.at("--local-rank"), "env LOCAL_RANK");
}

TEST(ProcessConfigTest, OpenMpiStyle) {
  Environment env = {{"OMPI_COMM_WORLD_RANK", "5"},
                     {"OMPI_COMM_WORLD_SIZE", "6"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 5);
  EXPECT_EQ(config->num_workers, 6);
  EXPECT_EQ(config->local_rank, 2);
  EXPECT_EQ(config->sources.at("--rank"), "env OMPI_COMM_WORLD_RANK");
}

TEST(ProcessConfigTest, SlurmStyle) {
  Environment env = {{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 7);
  EXPECT_EQ(config->num_workers, 16);
  EXPECT_EQ(config->local_rank, 3);
  EXPECT_EQ(config->sources.at("--num-workers"), "env SLURM_NTASKS");
}

TEST(ProcessConfigTest, AServerOrCoordinatorInASlurmStepIgnoresTheStepsTaskCount) {
  // `srun -n 2 tessera-server` inside a job of 4 workers: SLURM_NTASKS is the step's 2.
  const Environment step = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "3"}};
  for (Role role : {Role::kServer, Role::kCoordinator}) {
    StatusOr<ProcessConfig> config = Parse(role, {kCoordinatorFlag}, step);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->num_workers, 1) << "the default, not the step's task count";
    EXPECT_EQ(config->sources.count("--num-workers"), 0u);
  }
  // A worker step's tasks are the workers.
  StatusOr<ProcessConfig> worker = Parse(Role::kWorker, {kCoordinatorFlag}, step);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->num_workers, 2);
  // In the batch script itself (no step), SLURM_NTASKS is the job's.
  StatusOr<ProcessConfig> batch =
      Parse(Role::kServer, {kCoordinatorFlag}, {{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->num_workers, 4);
}

TEST(ProcessConfigTest, AWorkerInASlurmStepWithoutACoordinatorMeetsAtTheHeadNode) {
  const Environment step = {{"SLURM_JOB_ID", "4321"},  {"SLURM_STEP_ID", "0"},
                            {"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_NODEID", "0"},
                            {"SLURM_PROCID", "0"},     {"SLURM_NTASKS", "2"}};
  StatusOr<ProcessConfig> worker = Parse(Role::kWorker, {}, step);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->coordinator, "127.0.0.1:24321");
  EXPECT_TRUE(worker->slurm_rendezvous);
  EXPECT_EQ(worker->sources.at("--coordinator"),
            "Slurm: head node localhost, port 24321 from SLURM_JOB_ID");
  // A coordinator given any other way wins; servers never get one from Slurm.
  Environment master = step;
  master["MASTER_ADDR"] = "10.0.0.1";
  master["MASTER_PORT"] = "29500";
  StatusOr<ProcessConfig> given = Parse(Role::kWorker, {}, master);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->coordinator, "10.0.0.1:29500");
  EXPECT_FALSE(given->slurm_rendezvous);
  EXPECT_FALSE(Parse(Role::kWorker, {kCoordinatorFlag}, step)->slurm_rendezvous);
  StatusOr<ProcessConfig> server = Parse(Role::kServer, {}, step);
  EXPECT_FALSE(server.ok()) << "a server needs --coordinator";
  // The batch script itself is not a step: nothing to meet.
  Environment batch = step;
  batch.erase("SLURM_STEP_ID");
  StatusOr<ProcessConfig> outside = Parse(Role::kWorker, {}, batch);
  ASSERT_TRUE(outside.ok()) << outside.status();
  EXPECT_TRUE(outside->coordinator.empty());
}

TEST(ProcessConfigTest, TorchrunBeatsOpenMpiBeatsSlurm) {
  Environment all = {{"RANK", "1"},
                     {"WORLD_SIZE", "2"},
                     {"LOCAL_RANK", "0"},
                     {"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                     {"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "6"},
                     {"SLURM_LOCALID", "5"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, all);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 1);
  EXPECT_EQ(config->num_workers, 2);
  EXPECT_EQ(config->local_rank, 0);

  Environment mpi_in_slurm = all;
  mpi_in_slurm.erase("RANK");
  mpi_in_slurm.erase("WORLD_SIZE");
  mpi_in_slurm.erase("LOCAL_RANK");
  config = Parse(Role::kWorker, {kCoordinatorFlag}, mpi_in_slurm);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 3);
  EXPECT_EQ(config->num_workers, 4);
  EXPECT_EQ(config->local_rank, 3);
}

TEST(ProcessConfigTest, FamiliesAreNeverMixed) {
  // RANK alone selects the torchrun family; Slurm's size must not be paired with it.
  Environment env = {{"RANK", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "6"}};
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 0);
  EXPECT_EQ(config->num_workers, 1);
  EXPECT_EQ(config->sources.count("--num-workers"), 0u);
}

TEST(ProcessConfigTest, ServerAndCoordinatorIgnoreRankVariables) {
  Environment env = {{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"}};
  StatusOr<ProcessConfig> server = Parse(Role::kServer, {kCoordinatorFlag}, env);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->rank, -1);
  EXPECT_EQ(server->local_rank, -1);
  EXPECT_EQ(server->num_workers, 4);

  StatusOr<ProcessConfig> coordinator = Parse(Role::kCoordinator, {}, env);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_EQ(coordinator->rank, -1);
  EXPECT_EQ(coordinator->num_workers, 4);
}

TEST(ProcessConfigTest, ServerRankIsCheckedAgainstNumServers) {
  StatusOr<ProcessConfig> ok =
      Parse(Role::kServer, {kCoordinatorFlag, "--rank=1", "--num-servers=2"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rank, 1);
  EXPECT_THAT(ParseError(Role::kServer, {kCoordinatorFlag, "--rank=2", "--num-servers=2"}),
              HasSubstr("--rank=2 is out of range: must be < --num-servers=2"));
}

TEST(ProcessConfigTest, CoordinatorHasNoRankOrPortFlag) {
  EXPECT_THAT(ParseError(Role::kCoordinator, {"--rank=0"}), HasSubstr("--rank"));
  EXPECT_THAT(ParseError(Role::kCoordinator, {"--port=5"}), HasSubstr("--port"));
  StatusOr<ProcessConfig> config = Parse(Role::kCoordinator, {"--coordinator=0.0.0.0:29500"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "0.0.0.0:29500");
}

TEST(ProcessConfigTest, CoordinatorListensOnMasterAddress) {
  Environment env = {{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "29500"}};
  StatusOr<ProcessConfig> config = Parse(Role::kCoordinator, {}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "[::1]:29500");
}

TEST(ProcessConfigTest, MasterAddressNeedsBothVariables) {
  std::string message = ParseError(Role::kWorker, {}, {{"MASTER_ADDR", "node1"}});
  EXPECT_THAT(message, HasSubstr("MASTER_ADDR=\"node1\" is set but MASTER_PORT is not"));
  message = ParseError(Role::kWorker, {}, {{"MASTER_PORT", "29500"}});
  EXPECT_THAT(message, HasSubstr("MASTER_PORT=\"29500\" is set but MASTER_ADDR is not"));
  // A --coordinator flag makes MASTER_* irrelevant, even half-set.
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, {{"MASTER_ADDR", "x"}});
  EXPECT_TRUE(config.ok()) << config.status();
}

struct BadCase {
  Role role;
  std::vector<std::string> args;
  Environment env;
  std::vector<std::string> expected;  // substrings of the message
};

TEST(ProcessConfigTest, BadValuesNameTheFlagOrVariable) {
  const std::string c = kCoordinatorFlag;
  const std::vector<BadCase> cases = {
      // Not integers / numbers.
      {Role::kWorker, {c, "--rank=abc"}, {}, {"--rank=\"abc\": not an integer"}},
      {Role::kWorker, {c, "--rank=1.5"}, {}, {"--rank=\"1.5\": not an integer"}},
      {Role::kWorker, {c, "--rank=0x1"}, {}, {"--rank=\"0x1\": not an integer"}},
      {Role::kWorker, {c, "--rank= 1"}, {}, {"--rank=\" 1\": not an integer"}},
      {Role::kWorker, {c, "--rank="}, {}, {"--rank", "missing"}},
      {Role::kWorker, {c, "--rank=99999999999"}, {}, {"--rank", "32-bit"}},
      {Role::kWorker, {c}, {{"RANK", "abc"}}, {"RANK=\"abc\": not an integer"}},
      {Role::kWorker, {c}, {{"WORLD_SIZE", ""}}, {"WORLD_SIZE=\"\": not an integer"}},
      {Role::kWorker, {c}, {{"OMPI_COMM_WORLD_SIZE", "4x"}}, {"OMPI_COMM_WORLD_SIZE=\"4x\""}},
      {Role::kWorker, {c}, {{"SLURM_LOCALID", "-"}}, {"SLURM_LOCALID=\"-\": not an integer"}},
      {Role::kWorker, {c}, {{"TESSERA_NUM_SERVERS", "two"}}, {"TESSERA_NUM_SERVERS=\"two\""}},
      {Role::kWorker, {c, "--linger=abc"}, {}, {"--linger=\"abc\": not a number"}},
      {Role::kWorker, {c, "--linger=inf"}, {}, {"--linger=\"inf\": not a finite number"}},
      {Role::kWorker, {c, "--max-message-bytes=-5"}, {},
       {"--max-message-bytes=\"-5\": must not be negative"}},
      {Role::kWorker, {c, "--log-level=verbose"}, {}, {"--log-level=\"verbose\"", "debug, info"}},
      {Role::kWorker, {c}, {{"TESSERA_LOG_LEVEL", "loud"}}, {"TESSERA_LOG_LEVEL=\"loud\""}},
      {Role::kWorker, {c, "--cuda-tf32=true"}, {}, {"--cuda-tf32=\"true\": expected 0 or 1"}},
      {Role::kWorker, {c}, {{"TESSERA_CUDA_TF32", "yes"}},
       {"TESSERA_CUDA_TF32=\"yes\": expected 0 or 1"}},
      {Role::kWorker, {c}, {{"TESSERA_CUDA_TF32", " 1"}}, {"TESSERA_CUDA_TF32=\" 1\""}},
      // Negative / out of range.
      {Role::kWorker, {c, "--rank=-2"}, {}, {"--rank=-2 is out of range: must be >= 0 (leave it out"}},
      {Role::kWorker, {c, "--rank=5", "--num-workers=4"}, {},
       {"--rank=5 is out of range: must be < --num-workers=4"}},
      {Role::kWorker, {c}, {{"RANK", "5"}, {"WORLD_SIZE", "4"}},
       {"--rank=5 (from RANK) is out of range: must be < --num-workers=4 (from WORLD_SIZE)"}},
      {Role::kWorker, {c}, {{"RANK", "-3"}}, {"--rank=-3 (from RANK) is out of range"}},
      {Role::kWorker, {c, "--local-rank=-5"}, {}, {"--local-rank=-5 is out of range"}},
      {Role::kWorker, {c, "--local-rank=4", "--num-workers=4"}, {},
       {"--local-rank=4 is out of range: must be < --num-workers=4"}},
      {Role::kWorker, {c, "--num-workers=0"}, {},
       {"--num-workers=0 is out of range: must be >= 1"}},
      {Role::kWorker, {c, "--world-size=-1"}, {}, {"--num-workers=-1 is out of range"}},
      {Role::kWorker, {c}, {{"SLURM_NTASKS", "0"}}, {"--num-workers=0 (from SLURM_NTASKS)"}},
      {Role::kWorker, {c, "--num-servers=-1"}, {},
       {"--num-servers=-1 is out of range: must be >= 0"}},
      {Role::kWorker, {c, "--port=70000"}, {}, {"--port=70000 is out of range: must be 0..65535"}},
      {Role::kWorker, {c, "--metrics-port=-1"}, {}, {"--metrics-port=-1 is out of range"}},
      {Role::kWorker, {c, "--port=9000", "--metrics-port=9000"}, {},
       {"--metrics-port=9000 is the same port as --port=9000"}},
      {Role::kCoordinator, {"--coordinator=127.0.0.1:9000", "--metrics-port=9000"}, {},
       {"--metrics-port=9000 is the same port as --coordinator"}},
      {Role::kWorker, {c, "--max-message-bytes=3000000000"}, {},
       {"--max-message-bytes=3000000000 is out of range", "2 GiB", "FlatBuffers"}},
      {Role::kWorker, {c, "--max-message-bytes=100"}, {},
       {"--max-message-bytes=100 is out of range: must be >= 4096"}},
      {Role::kWorker, {c, "--heartbeat-timeout-ms=1000"}, {},
       {"--heartbeat-timeout-ms=1000 must be greater than --heartbeat-interval-ms=1000"}},
      {Role::kWorker, {c, "--heartbeat-interval-ms=20000"}, {},
       {"--heartbeat-timeout-ms=4000 must be greater than --heartbeat-interval-ms=20000"}},
      {Role::kWorker, {c, "--request-timeout-ms=0"}, {},
       {"--request-timeout-ms=0 is out of range"}},
      {Role::kWorker, {c, "--rendezvous-timeout-ms=-1"}, {}, {"--rendezvous-timeout-ms=-1"}},
      {Role::kWorker, {c, "--heartbeat-interval-ms=999999999999"}, {},
       {"--heartbeat-interval-ms=999999999999 is out of range", "a week"}},
      {Role::kWorker, {c, "--linger=-1"}, {}, {"--linger=-1 is out of range"}},
      {Role::kWorker, {c, "--job=a b"}, {}, {"--job=\"a b\": may only contain"}},
      {Role::kWorker, {c}, {{"TESSERA_JOB", ""}}, {"--job=\"\" (from TESSERA_JOB): must be 1-64"}},
      {Role::kWorker, {c, "--job=" + std::string(65, 'j')}, {}, {"must be 1-64 characters"}},
      {Role::kWorker, {c}, {{"TESSERA_JOB", "x/y"}}, {"--job=\"x/y\" (from TESSERA_JOB)"}},
      {Role::kWorker, {c, "--bind-host=tcp://x"}, {}, {"--bind-host=\"tcp://x\": not a host"}},
      // Addresses.
      {Role::kWorker, {"--coordinator=localhost"}, {},
       {"--coordinator=\"localhost\"", "missing :PORT"}},
      {Role::kWorker, {"--coordinator=host:0"}, {}, {"--coordinator=\"host:0\"", "port 0"}},
      {Role::kWorker, {"--coordinator=host:99999"}, {}, {"--coordinator", "out of range 0..65535"}},
      {Role::kWorker, {"--coordinator=tcp://host:5"}, {}, {"--coordinator", "scheme"}},
      {Role::kWorker, {}, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "abc"}},
       {"MASTER_PORT=\"abc\": not an integer"}},
      {Role::kWorker, {}, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}},
       {"MASTER_PORT=\"0\": must be 1..65535"}},
      {Role::kWorker, {}, {{"MASTER_ADDR", "10.0.0.1:29500"}, {"MASTER_PORT", "29500"}},
       {"MASTER_ADDR=\"10.0.0.1:29500\": must be a host without a port"}},
      {Role::kWorker, {}, {{"MASTER_ADDR", ""}, {"MASTER_PORT", "1"}},
       {"MASTER_ADDR=\"\": empty host"}},
      // Command-line shape.
      {Role::kWorker, {c, "--bogus=1"}, {}, {"--bogus"}},
      {Role::kWorker, {c, "stray"}, {}, {"stray"}},
      {Role::kWorker, {c, "--rank=1", "--rank=2"}, {}, {"--rank"}},
      {Role::kWorker, {c, "--rank"}, {}, {"--rank"}},
  };
  for (const BadCase& bad : cases) {
    std::string where;
    for (const std::string& arg : bad.args) where += " " + arg;
    for (const auto& [name, value] : bad.env) where += " env " + name + "=" + value;
    SCOPED_TRACE(std::string(RoleName(bad.role)) + where);
    std::string message = ParseError(bad.role, bad.args, bad.env);
    for (const std::string& expected : bad.expected) EXPECT_THAT(message, HasSubstr(expected));
  }
}

TEST(ProcessConfigTest, HelpListsEveryFlagWithDefaultAndEnvironment) {
  bool help = false;
  testing::internal::CaptureStdout();
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {"--help"}, {}, nullptr, &help);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_EQ(config.status().code(), StatusCode::kCancelled);
  for (const char* expected :
       {"--rank INT ", "--local-rank INT ", "--num-workers,--world-size INT=1",
        "--num-servers INT=0", "--coordinator HOST:PORT", "--bind-host HOST=auto",
        "--port PORT=0", "--metrics-port PORT=0", "--job NAME=tessera",
        "--rendezvous-timeout-ms MS=60000", "--heartbeat-interval-ms MS=1000",
        "--heartbeat-timeout-ms MS=4000", "--request-timeout-ms MS=30000",
        "--max-message-bytes BYTES=1073741824", "--log-level LEVEL=info", "--linger SECONDS=0",
        "--cuda-tf32 0|1=0", "RANK | OMPI_COMM_WORLD_RANK | SLURM_PROCID", "LOCAL_RANK",
        "WORLD_SIZE", "MASTER_ADDR + MASTER_PORT", "TESSERA_NUM_SERVERS", "TESSERA_JOB",
        "TESSERA_LOG_LEVEL", "TESSERA_CUDA_TF32", "TESSERA_SOCKET_IFNAME",
        "Precedence: flags > environment > defaults"}) {
    EXPECT_THAT(out, HasSubstr(expected));
  }
}

TEST(ProcessConfigTest, BindHostFromTheSocketInterfaceVariableOrItsFlag) {
  StatusOr<ProcessConfig> config =
      Parse(Role::kServer, {kCoordinatorFlag}, {{"TESSERA_SOCKET_IFNAME", "eth1"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->bind_host, "eth1");
  EXPECT_EQ(config->sources.at("--bind-host"), "env TESSERA_SOCKET_IFNAME");
  StatusOr<ProcessConfig> flag = Parse(Role::kServer, {kCoordinatorFlag, "--bind-host=eth0"},
                                       {{"TESSERA_SOCKET_IFNAME", "eth1"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->bind_host, "eth0");
}

TEST(ProcessConfigTest, CudaTf32FromTheEnvironmentOrItsFlag) {
  for (const auto& [value, want] :
       {std::pair<const char*, bool>{"1", true}, {"0", false}, {"", false}}) {
    SCOPED_TRACE(std::string("TESSERA_CUDA_TF32=") + value);
    StatusOr<ProcessConfig> config =
        Parse(Role::kWorker, {kCoordinatorFlag}, {{"TESSERA_CUDA_TF32", value}});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->cuda_tf32, want);
    EXPECT_EQ(config->sources.at("--cuda-tf32"), "env TESSERA_CUDA_TF32");
  }
  StatusOr<ProcessConfig> flag =
      Parse(Role::kWorker, {kCoordinatorFlag, "--cuda-tf32=0"}, {{"TESSERA_CUDA_TF32", "1"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_FALSE(flag->cuda_tf32);
  EXPECT_EQ(flag->sources.at("--cuda-tf32"), "flag");
  // Servers and the coordinator have no CUDA backend: they neither read the variable nor take
  // the flag.
  StatusOr<ProcessConfig> server =
      Parse(Role::kServer, {kCoordinatorFlag}, {{"TESSERA_CUDA_TF32", "garbage"}});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE(server->cuda_tf32);
  EXPECT_THAT(ParseError(Role::kServer, {kCoordinatorFlag, "--cuda-tf32=1"}),
              HasSubstr("--cuda-tf32"));
}

TEST(ProcessConfigTest, HelpWinsOverBadValues) {
  bool help = false;
  testing::internal::CaptureStdout();
  StatusOr<ProcessConfig> config =
      Parse(Role::kWorker, {"--rank=abc", "-h"}, {{"RANK", "zzz"}}, nullptr, &help);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_EQ(config.status().code(), StatusCode::kCancelled);
  EXPECT_THAT(out, HasSubstr("--rank"));
}

TEST(ProcessConfigTest, CoordinatorHelpHasNoRankOrPort) {
  bool help = false;
  testing::internal::CaptureStdout();
  StatusOr<ProcessConfig> config = Parse(Role::kCoordinator, {"--help"}, {}, nullptr, &help);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_THAT(out, HasSubstr("--coordinator HOST:PORT=127.0.0.1:0"));
  EXPECT_THAT(out, Not(HasSubstr("--rank ")));
  EXPECT_THAT(out, Not(HasSubstr("--port ")));
}

TEST(ProcessConfigTest, BinaryAddsItsOwnFlags) {
  CLI::App app("tessera worker");
  std::string model = "mlp";
  int steps = 0;
  app.add_option("--model", model, "Model to train");
  app.add_option("--steps", steps, "Training steps");
  StatusOr<ProcessConfig> config =
      Parse(Role::kWorker, {kCoordinatorFlag, "--model=resnet", "--steps=7", "--rank=0"}, {}, &app);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(model, "resnet");
  EXPECT_EQ(steps, 7);
  EXPECT_EQ(config->rank, 0);

  CLI::App help_app("tessera worker");
  help_app.add_option("--model", model, "Model to train");
  bool help = false;
  testing::internal::CaptureStdout();
  config = Parse(Role::kWorker, {"--help"}, {}, &help_app, &help);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_THAT(out, HasSubstr("--model"));
  EXPECT_THAT(out, HasSubstr("--heartbeat-timeout-ms"));
}

TEST(CommandLineTest, DeclaresTheBinarysFlagsBesideTheCommonOnes) {
  CommandLine command_line("tessera-coordinator: the rendezvous point", "tessera-coordinator");
  bool join = false;
  bool dashboard = true;
  std::string file_sd;
  int replicas = 1;
  uint64_t key_space = 1024;
  command_line.AddFlag("--join", &join, "Join a running fleet");
  command_line.AddFlag("--dashboard,!--no-dashboard", &dashboard, "Serve the dashboard");
  command_line.AddOption("--file-sd", &file_sd, "Targets file");
  command_line.AddOption("--replicas", &replicas, "Copies of each range", 1, 64,
                         /*show_default=*/true);
  command_line.AddOption("--key-space", &key_space, "Number of keys", uint64_t{1},
                         uint64_t{1} << 62, /*show_default=*/false);
  StatusOr<ProcessConfig> config =
      Parse(Role::kCoordinator,
            {"--join", "--no-dashboard", "--file-sd=/tmp/sd.json", "--replicas=3",
             "--key-space=4611686018427387904"},
            {}, command_line.app());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(join);
  EXPECT_FALSE(dashboard);
  EXPECT_EQ(file_sd, "/tmp/sd.json");
  EXPECT_EQ(replicas, 3);
  EXPECT_EQ(key_space, uint64_t{1} << 62);
}

TEST(CommandLineTest, RangesAreCheckedAndHelpShowsWhatWasAsked) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--replicas=0"}, {"--replicas=65"},
                                             {"--key-space=0"}, {"--replicas=two"}}) {
    CommandLine command_line("tessera-coordinator");
    int replicas = 1;
    uint64_t key_space = 1024;
    command_line.AddOption("--replicas", &replicas, "Copies", 1, 64, /*show_default=*/true);
    command_line.AddOption("--key-space", &key_space, "Keys", uint64_t{1}, uint64_t{1} << 62,
                           /*show_default=*/false);
    StatusOr<ProcessConfig> config = Parse(Role::kCoordinator, args, {}, command_line.app());
    ASSERT_FALSE(config.ok()) << args[0];
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(args[0].substr(0, args[0].find('='))));
  }

  CommandLine command_line("tessera-coordinator: the rendezvous point", "tessera-coordinator");
  int replicas = 2;
  uint64_t key_space = 1024;
  command_line.AddOption("--replicas", &replicas, "Copies", 1, 64, /*show_default=*/true);
  command_line.AddOption("--key-space", &key_space, "Keys", uint64_t{1}, uint64_t{1} << 62,
                         /*show_default=*/false);
  bool help = false;
  testing::internal::CaptureStdout();
  StatusOr<ProcessConfig> config =
      Parse(Role::kCoordinator, {"--help"}, {}, command_line.app(), &help);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_THAT(out, HasSubstr("tessera-coordinator: the rendezvous point"));
  EXPECT_THAT(out, HasSubstr("INT in [1 - 64]"));
  EXPECT_THAT(out, HasSubstr("=2"));  // the default, asked for
  EXPECT_THAT(out, Not(HasSubstr("=1024")));
}

TEST(ProcessConfigTest, BinaryFlagClashIsAnInternalError) {
  CLI::App app("tessera worker");
  int rank = 0;
  app.add_option("--rank", rank);
  StatusOr<ProcessConfig> config = Parse(Role::kWorker, {kCoordinatorFlag}, {}, &app);
  EXPECT_EQ(config.status().code(), StatusCode::kInternal);
}

TEST(ApplyEnvironmentTest, SkipsFieldsGivenAsFlags) {
  ProcessConfig config = DefaultProcessConfig(Role::kWorker);
  config.rank = 2;
  config.sources["--rank"] = "flag";
  ASSERT_TRUE(ApplyEnvironment({{"RANK", "not even a number"}, {"WORLD_SIZE", "3"}}, &config).ok());
  EXPECT_EQ(config.rank, 2);
  EXPECT_EQ(config.num_workers, 3);
}

TEST(ValidateConfigTest, DefaultsOfEachRoleAreValidOnceACoordinatorIsKnown) {
  EXPECT_TRUE(ValidateConfig(DefaultProcessConfig(Role::kCoordinator)).ok());
  // A worker without a coordinator is a standalone --mode local worker.
  EXPECT_TRUE(ValidateConfig(DefaultProcessConfig(Role::kWorker)).ok());
  EXPECT_FALSE(ValidateConfig(DefaultProcessConfig(Role::kServer)).ok());
  for (Role role : {Role::kServer, Role::kWorker}) {
    ProcessConfig config = DefaultProcessConfig(role);
    config.coordinator = "localhost:1";
    EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
  }
}

TEST(ValidateConfigTest, FieldsSetInCodeAreNamedByFlag) {
  ProcessConfig config = DefaultProcessConfig(Role::kCoordinator);
  config.rank = 0;
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("--rank=0: the coordinator has no rank"));
  config = DefaultProcessConfig(Role::kWorker);
  config.coordinator = "h:1";
  config.max_message_bytes = uint64_t{1} << 31;
  EXPECT_THAT(ValidateConfig(config).message(),
              HasSubstr("--max-message-bytes=2147483648 is out of range"));
  config.max_message_bytes = kMaxMessageBytesLimit;
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.bind_host = "";
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("--bind-host is empty"));
}

TEST(DescribeConfigTest, OneLinePerFieldWithSource) {
  StatusOr<ProcessConfig> config =
      Parse(Role::kWorker, {kCoordinatorFlag, "--port=5000"}, {{"RANK", "0"}});
  ASSERT_TRUE(config.ok()) << config.status();
  std::string text = DescribeConfig(*config);
  EXPECT_THAT(text, HasSubstr("role: worker\n"));
  EXPECT_THAT(text, HasSubstr("--rank=0 (env RANK)\n"));
  EXPECT_THAT(text, HasSubstr("--port=5000 (flag)\n"));
  EXPECT_THAT(text, HasSubstr("--coordinator=\"10.0.0.1:29500\" (flag)\n"));
  EXPECT_THAT(text, HasSubstr("--max-message-bytes=1073741824 (default)\n"));
  EXPECT_THAT(text, HasSubstr("--log-level=info (default)\n"));
  EXPECT_THAT(text, HasSubstr("--cuda-tf32=0 (default)\n"));
  EXPECT_THAT(text, HasSubstr("--insecure=0 (default)\n"));
  EXPECT_THAT(text, HasSubstr("--encrypt=auto (default)\n"));
  EXPECT_THAT(text, HasSubstr("--metrics-bind-host=\"loopback\" (default)\n"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 25);  // role + 24 flags
}

TEST(SecurityFlagsTest, KeyFileInsecureAndEncryptFromFlagsOrEnvironment) {
  StatusOr<ProcessConfig> flags =
      Parse(Role::kServer, {kCoordinatorFlag, "--auth-key-file", "/k", "--insecure", "--encrypt",
                            "on"},
            {});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->auth_key_file, "/k");
  EXPECT_TRUE(flags->insecure);
  EXPECT_EQ(flags->encrypt, "on");
  StatusOr<ProcessConfig> env =
      Parse(Role::kWorker, {kCoordinatorFlag},
            {{"TESSERA_AUTH_KEY_FILE", "/e"}, {"TESSERA_INSECURE", "1"}, {"TESSERA_ENCRYPT", "off"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->auth_key_file, "/e");
  EXPECT_TRUE(env->insecure);
  EXPECT_EQ(env->encrypt, "off");
  EXPECT_EQ(env->sources.at("--auth-key-file"), "env TESSERA_AUTH_KEY_FILE");
  EXPECT_THAT(Parse(Role::kWorker, {kCoordinatorFlag, "--encrypt", "yes"}, {}).status().message(),
              HasSubstr("expected auto, on or off"));
  EXPECT_THAT(Parse(Role::kWorker, {kCoordinatorFlag}, {{"TESSERA_INSECURE", "yes"}})
                  .status()
                  .message(),
              HasSubstr("TESSERA_INSECURE"));
}

TEST(MetricsHttpFlagsTest, BindHostTlsAndAuthFromFlagsOrEnvironment) {
  StatusOr<ProcessConfig> defaults = Parse(Role::kCoordinator, {}, {});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->metrics_bind_host, "loopback");
  EXPECT_EQ(defaults->metrics_tls_cert, "");
  EXPECT_EQ(defaults->metrics_auth_file, "");

  StatusOr<ProcessConfig> flags =
      Parse(Role::kServer,
            {kCoordinatorFlag, "--metrics-bind-host", "auto", "--metrics-tls-cert", "/c.pem",
             "--metrics-tls-key", "/k.pem", "--metrics-auth-file", "/a"},
            {{"TESSERA_METRICS_BIND_HOST", "10.0.0.9"}});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->metrics_bind_host, "auto");  // the flag beats the environment
  EXPECT_EQ(flags->metrics_tls_cert, "/c.pem");
  EXPECT_EQ(flags->metrics_tls_key, "/k.pem");
  EXPECT_EQ(flags->metrics_auth_file, "/a");

  StatusOr<ProcessConfig> env = Parse(Role::kWorker, {kCoordinatorFlag},
                                      {{"TESSERA_METRICS_BIND_HOST", "eth0"},
                                       {"TESSERA_METRICS_TLS_CERT", "/ec.pem"},
                                       {"TESSERA_METRICS_TLS_KEY", "/ek.pem"},
                                       {"TESSERA_METRICS_AUTH_FILE", "/ea"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->metrics_bind_host, "eth0");
  EXPECT_EQ(env->metrics_tls_cert, "/ec.pem");
  EXPECT_EQ(env->metrics_tls_key, "/ek.pem");
  EXPECT_EQ(env->metrics_auth_file, "/ea");
  EXPECT_EQ(env->sources.at("--metrics-bind-host"), "env TESSERA_METRICS_BIND_HOST");

  // TLS takes both files.
  StatusOr<ProcessConfig> cert_only =
      Parse(Role::kWorker, {kCoordinatorFlag, "--metrics-tls-cert", "/c.pem"}, {});
  ASSERT_FALSE(cert_only.ok());
  EXPECT_THAT(cert_only.status().message(), HasSubstr("--metrics-tls-cert=\"/c.pem\" needs "
                                                      "--metrics-tls-key too"));
  StatusOr<ProcessConfig> key_only =
      Parse(Role::kWorker, {kCoordinatorFlag}, {{"TESSERA_METRICS_TLS_KEY", "/k.pem"}});
  ASSERT_FALSE(key_only.ok());
  EXPECT_THAT(key_only.status().message(), HasSubstr("(from TESSERA_METRICS_TLS_KEY) needs "
                                                     "--metrics-tls-cert too"));
  EXPECT_THAT(Parse(Role::kWorker, {kCoordinatorFlag, "--metrics-bind-host", ""}, {})
                  .status()
                  .message(),
              HasSubstr("--metrics-bind-host is empty"));
  EXPECT_THAT(Parse(Role::kWorker, {kCoordinatorFlag, "--metrics-bind-host", "a b"}, {})
                  .status()
                  .message(),
              HasSubstr("--metrics-bind-host=\"a b\""));
}

TEST(CurrentEnvironmentTest, ReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("TESSERA_CONFIG_TEST_VAR", "a=b", 1), 0);
  Environment env = CurrentEnvironment();
  ASSERT_EQ(env.count("TESSERA_CONFIG_TEST_VAR"), 1u);
  EXPECT_EQ(env.at("TESSERA_CONFIG_TEST_VAR"), "a=b");
  unsetenv("TESSERA_CONFIG_TEST_VAR");
}

}  // namespace
}  // namespace tessera
