// Fuzz target (issue 15): the environment a launcher hands a process (mpirun's, Slurm's,
// torchrun's and Tessera's variables) as ApplyEnvironment and ReadSlurmJob read it. Input: one
// variable per line, its first byte choosing the name (mod the list below), the rest of the
// line its value. Seeds: environment_fuzz_corpus/.
//
// Workers get a --coordinator first: without one, a Slurm step's worker resolves the head node
// (a name lookup and `scontrol`), which is not parsing and not for a fuzzer to run.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config/config.h"
#include "common/config/slurm.h"

namespace {

constexpr const char* kNames[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",         "SLURM_LOCALID",              "SLURM_NTASKS",
    "RANK",                 "LOCAL_RANK",                 "WORLD_SIZE",
    "MASTER_ADDR",          "MASTER_PORT",                "TESSERA_NUM_SERVERS",
    "TESSERA_JOB",          "TESSERA_LOG_LEVEL",          "TESSERA_SOCKET_IFNAME",
    "TESSERA_CUDA_TF32",    "SLURM_JOB_ID",               "SLURM_STEP_ID",
    "SLURM_JOB_NODELIST",   "SLURM_STEP_NODELIST",        "SLURM_NODEID",
    "SLURM_NNODES",         "SLURM_JOB_NUM_NODES",        "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  Environment env;
  size_t at = 0;
  while (at < size) {
    const size_t end = std::find(data + at, data + size, '\n') - data;
    if (end > at) {
      const char* name = kNames[data[at] % (sizeof(kNames) / sizeof(kNames[0]))];
      env[name] = std::string(reinterpret_cast<const char*>(data) + at + 1, end - at - 1);
    }
    at = end + 1;
  }
  (void)ReadSlurmJob(env);
  for (Role role : {Role::kCoordinator, Role::kServer, Role::kWorker}) {
    ProcessConfig config;
    config.role = role;
    if (role == Role::kWorker) config.coordinator = "127.0.0.1:1";
    if (ApplyEnvironment(env, &config).ok()) (void)ValidateConfig(config);
  }
  return 0;
}
