// SlurmCluster: a real Slurm (Debian's slurmctld, slurmd and munge, started without systemd)
// on emulated hosts, for tests of Slurm-native launching (issue 20; see
// ../shared/notes/clusters.md).
//
// slurmctld runs in the hosts' switch (10.77.0.254); node i ("n1", "n2", ...) is one slurmd
// inside host i, with that host's private /dev/shm, so tasks on different nodes share neither
// network stack nor shared memory. Node names do not resolve on the hosts: a task finds a
// node's address the way a cluster without DNS entries for them would, from `scontrol`.
// Client commands (srun, sbatch, squeue, scancel) run on a host like on a login node.
//
// Start fails with FailedPrecondition when the daemons are not installed (tools/install_deps.sh
// installs them) or do not come up; tests then skip unless namespaces are required.
//
// Thread-safety: one thread owns a SlurmCluster.
#ifndef TESSERA_TESTS_SLURM_CLUSTER_H_
#define TESSERA_TESTS_SLURM_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "tests/emulated_hosts.h"
#include "tests/fleet_harness.h"

namespace tessera::testing {

class SlurmCluster {
 public:
  // One node per host of `hosts`, which must outlive the cluster.
  static StatusOr<std::unique_ptr<SlurmCluster>> Start(const EmulatedHosts& hosts);
  ~SlurmCluster();  // stops the daemons and removes the scratch directory

  // `argv` (a Slurm client command) run on host `host` with SLURM_CONF set.
  std::vector<std::string> ClientCommand(int host, const std::vector<std::string>& argv) const;
  // Runs a client command on host 0 to its end: its exit status and output.
  StatusOr<std::pair<int, std::string>> Run(const std::vector<std::string>& argv) const;
  // The scratch directory (logs, the configuration; tests may write job scripts here).
  const std::string& dir() const { return dir_; }
  // Every daemon's output and log so far, for a failing test's message.
  std::string Logs() const;

 private:
  SlurmCluster(const EmulatedHosts& hosts, std::string dir) : hosts_(hosts), dir_(std::move(dir)) {}

  const EmulatedHosts& hosts_;
  const std::string dir_;
  std::string conf_;
  FleetHarness daemons_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SLURM_CLUSTER_H_
