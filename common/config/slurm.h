// Slurm: what a process inside a Slurm allocation learns from it (issue 20, item 3).
//
// Inside an allocation (SLURM_JOB_ID set), tessera-launch and ring-mode workers need no
// addresses: the job's first node is the head node, which hosts the coordinator on a port
// derived from the job id, and the nodes, this node's index and the tasks come from Slurm's
// variables. Node lists use Slurm's hostlist syntax: "n[1-3,7]", "gpu-[01-04]", "a,b[2-3]",
// "r[1-2]-n[1-2]" (several bracket groups expand as a product; zero padding is kept).
//
// Thread-safety: functions only.
#ifndef TESSERA_COMMON_CONFIG_SLURM_H_
#define TESSERA_COMMON_CONFIG_SLURM_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/config/environment.h"

namespace tessera {

// The host names of a Slurm hostlist, in order. InvalidArgument quoting the list and the
// offset of what is wrong (unbalanced brackets, a range that runs backwards, a non-number).
StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist);

// The coordinator's port of Slurm job `job_id`: 20000 + job_id mod 10000, below Linux's
// ephemeral range (32768-60999), so an OS-picked port never takes it.
int SlurmJobPort(int64_t job_id);

// What Slurm tells this task about its job and step.
struct SlurmJob {
  int64_t job_id = 0;
  // The step's nodes (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST), expanded; [0] is the head.
  std::vector<std::string> nodes;
  int node_id = 0;  // SLURM_NODEID: this node's index in `nodes`
  // SLURM_STEP_NUM_TASKS / SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID when set.
  std::optional<int> num_tasks;
  std::optional<int> proc_id;
  std::optional<int> local_id;
  bool in_step = false;  // SLURM_STEP_ID set: started by srun, not the batch script itself
};

// std::nullopt outside Slurm (no SLURM_JOB_ID); an error naming the variable when one is
// malformed.
StatusOr<std::optional<SlurmJob>> ReadSlurmJob(const Environment& env);

// The head node's address: a name resolution of `node`, else the NodeAddr that
// `scontrol show node NODE` reports (run through `scontrol`, replaceable for tests). The error
// names both attempts.
using CommandRunner = std::function<StatusOr<std::string>(const std::vector<std::string>&)>;
StatusOr<std::string> ResolveSlurmNode(const std::string& node, const CommandRunner& scontrol);
// Runs argv (argv[0] looked up in PATH) and returns its standard output.
StatusOr<std::string> RunCommand(const std::vector<std::string>& argv);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_SLURM_H_
