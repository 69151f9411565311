// Jobs started by other launchers: workers get NO --rank/--num-workers/--local-rank flags and
// take them from the environment that mpirun, Slurm (srun) or torchrun would set (see
// common/config/config.h). Each job is a 2-worker --mode allreduce run against a real coordinator and
// must end with bitwise the parameters of the same job started by tessera-launch (which passes
// --rank etc. as flags): a wrong rank (say, both workers using the local rank of another
// family) would feed the ranks other samples and give other parameters, or fail to register.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

// A small allreduce job: 2 workers x 16 samples, 20 steps.
std::vector<std::string> TrainingFlags(const std::string& save_params) {
  return {"--mode", "allreduce", "--steps", "20", "--batch-size", "16", "--optimizer", "adam",
          "--lr", "0.01", "--device", "cpu", "--log-every", "10", "--train-samples", "1280",
          "--hidden", "32", "--input-dim", "16", "--classes", "4", "--seed", "11",
          "--save-params", save_params};
}

std::vector<float> Load(const std::string& path) {
  auto loaded = worker::LoadParams(path);
  EXPECT_TRUE(loaded.ok()) << path << ": " << loaded.status();
  return loaded.ok() ? loaded->values : std::vector<float>();
}

std::string FindMpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = std::string(path != nullptr ? path : "") + ":/usr/bin:/usr/local/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/mpirun";
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

class EnvLaunchTest : public ::testing::Test {
 protected:
  // The reference: the same job under tessera-launch (ranks as flags), computed once.
  static const std::vector<float>& Reference() {
    static const std::vector<float>* reference = [] {
      FleetHarness harness;
      const std::string path = TempPath("reference.bin");
      std::vector<std::string> args = {"--workers", "2", "--mode", "allreduce", "--"};
      for (const std::string& flag : TrainingFlags(path)) args.push_back(flag);
      args.erase(args.begin() + 5, args.begin() + 7);  // --mode allreduce is the launcher's
      auto id = harness.Start("reference", "tools/tessera-launch", args);
      EXPECT_TRUE(id.ok()) << id.status();
      auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
      EXPECT_TRUE(exit.ok() && exit->success()) << harness.Output(*id);
      return new std::vector<float>(Load(path));
    }();
    return *reference;
  }

  // Starts a coordinator for 2 workers; returns HOST:PORT.
  std::string StartCoordinator() {
    auto address = harness_.StartCoordinator({"--num-workers", "2", "--num-servers", "0",
                                              "--rendezvous-timeout-ms", "60000"});
    EXPECT_TRUE(address.ok()) << address.status();
    return address.ok() ? *address : "";
  }

  // Starts worker `rank` through /usr/bin/env with `env` (VAR=VALUE) and no rank flags.
  int StartWorker(int rank, const std::vector<std::string>& env,
                  const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(BinaryPath("worker/tessera-worker"));
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto id = harness_.StartCommand("worker " + std::to_string(rank), argv);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : -1;
  }

  void ExpectSuccess(int id) {
    auto exit = harness_.WaitExit(id, Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << harness_.Output(id);
    EXPECT_TRUE(exit->success()) << exit->Describe() << "\n" << harness_.Output(id);
  }

  // `output` shows worker `rank` took its rank, local rank and world size from `source`
  // (e.g. "SLURM_PROCID") and trained as "worker R of 2".
  static void ExpectRankFrom(const std::string& output, int rank, const std::string& rank_var,
                             const std::string& local_var, const std::string& size_var) {
    EXPECT_NE(output.find("--rank=" + std::to_string(rank) + " (env " + rank_var + ")"),
              std::string::npos)
        << output;
    EXPECT_NE(output.find("--local-rank=" + std::to_string(rank) + " (env " + local_var + ")"),
              std::string::npos)
        << output;
    EXPECT_NE(output.find("--num-workers=2 (env " + size_var + ")"), std::string::npos) << output;
    EXPECT_NE(output.find("worker " + std::to_string(rank) + " of 2"), std::string::npos)
        << output;
  }

  FleetHarness harness_;
};

TEST_F(EnvLaunchTest, MpirunStartsTheWorkers) {
  const std::string mpirun = FindMpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed; tools/install_deps.sh "
                                      "installs openmpi-bin";
  const std::vector<float>& reference = Reference();
  const std::string coordinator = StartCoordinator();
  const std::string path = TempPath("mpirun.bin");
  // mpirun refuses to run as root unless told twice; harmless for other users.
  std::vector<std::string> argv = {"/usr/bin/env",
                                   "OMPI_ALLOW_RUN_AS_ROOT=1",
                                   "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                   mpirun,
                                   "--oversubscribe",
                                   "-np",
                                   "2",
                                   BinaryPath("worker/tessera-worker"),
                                   "--coordinator",
                                   coordinator};
  for (const std::string& flag : TrainingFlags(path)) argv.push_back(flag);
  auto id = harness_.StartCommand("mpirun", argv);
  ASSERT_TRUE(id.ok()) << id.status();
  ExpectSuccess(*id);
  const std::string output = harness_.Output(*id);
  for (int rank = 0; rank < 2; ++rank) {
    ExpectRankFrom(output, rank, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_SIZE");
  }
  EXPECT_EQ(Load(path), reference);
}

TEST_F(EnvLaunchTest, SlurmVariablesWithMasterAddrAndPort) {
  const std::vector<float>& reference = Reference();
  const std::string coordinator = StartCoordinator();
  const size_t colon = coordinator.rfind(':');
  const std::string path = TempPath("slurm.bin");
  std::vector<int> ids;
  for (int rank = 0; rank < 2; ++rank) {
    ids.push_back(StartWorker(rank,
                              {"SLURM_PROCID=" + std::to_string(rank), "SLURM_NTASKS=2",
                               "SLURM_LOCALID=" + std::to_string(rank),
                               "MASTER_ADDR=" + coordinator.substr(0, colon),
                               "MASTER_PORT=" + coordinator.substr(colon + 1)},
                              TrainingFlags(path)));
  }
  for (int rank = 0; rank < 2; ++rank) {
    ExpectSuccess(ids[rank]);
    const std::string output = harness_.Output(ids[rank]);
    ExpectRankFrom(output, rank, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS");
    EXPECT_NE(output.find("(env MASTER_ADDR+MASTER_PORT)"), std::string::npos) << output;
  }
  EXPECT_EQ(Load(path), reference);
}

TEST_F(EnvLaunchTest, TorchrunVariables) {
  const std::vector<float>& reference = Reference();
  const std::string coordinator = StartCoordinator();
  const size_t colon = coordinator.rfind(':');
  const std::string path = TempPath("torchrun.bin");
  std::vector<int> ids;
  // Started in reverse order: ranks come from RANK, not from who registers first.
  for (int rank = 1; rank >= 0; --rank) {
    ids.insert(ids.begin(),
               StartWorker(rank,
                           {"RANK=" + std::to_string(rank), "WORLD_SIZE=2",
                            "LOCAL_RANK=" + std::to_string(rank),
                            "MASTER_ADDR=" + coordinator.substr(0, colon),
                            "MASTER_PORT=" + coordinator.substr(colon + 1)},
                           TrainingFlags(path)));
  }
  for (int rank = 0; rank < 2; ++rank) {
    ExpectSuccess(ids[rank]);
    ExpectRankFrom(harness_.Output(ids[rank]), rank, "RANK", "LOCAL_RANK", "WORLD_SIZE");
  }
  EXPECT_EQ(Load(path), reference);
}

// A bad variable is rejected at start (exit 2) with the variable's name and value.
TEST_F(EnvLaunchTest, BadVariableIsNamed) {
  int id = StartWorker(0, {"SLURM_PROCID=two", "SLURM_NTASKS=2", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=1"},
                       {"--mode", "allreduce"});
  auto exit = harness_.WaitExit(id, Deadline::AfterMillis(30000));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->status, 2) << exit->Describe();
  EXPECT_NE(harness_.Output(id).find("SLURM_PROCID=\"two\": not an integer"), std::string::npos)
      << harness_.Output(id);

  id = StartWorker(0, {"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"},
                   {"--mode", "allreduce"});
  exit = harness_.WaitExit(id, Deadline::AfterMillis(30000));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->status, 2) << exit->Describe();
  EXPECT_NE(harness_.Output(id).find("--rank=2 (from RANK) is out of range: must be < "
                                     "--num-workers=2 (from WORLD_SIZE)"),
            std::string::npos)
      << harness_.Output(id);
}

}  // namespace
}  // namespace tessera::testing
