#include "tests/slurm_cluster.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/base/deadline.h"

namespace tessera::testing {
namespace {

bool Installed(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string ShellQuote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

StatusOr<std::unique_ptr<SlurmCluster>> SlurmCluster::Start(const EmulatedHosts& hosts) {
  for (const char* daemon : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                             "/usr/bin/srun"}) {
    if (!Installed(daemon)) {
      return FailedPreconditionError(std::string(daemon) +
                                     " is not installed (tools/install_deps.sh installs Slurm)");
    }
  }
  // Short and outside TEST_TMPDIR: munge's socket path must fit a sockaddr_un.
  static std::atomic<int> counter{0};
  const std::string dir =
      "/tmp/tessera-slurm-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::unique_ptr<SlurmCluster> cluster(new SlurmCluster(hosts, dir));
  ASSIGN_OR_RETURN(auto made,
                   RunWithInput("rm -rf " + dir + " && mkdir -p " + dir + "/state " + dir +
                                    "/log " + dir + "/munge " + dir + "/munge-sock && chmod 700 " +
                                    dir + "/munge && chmod 755 " + dir + " " + dir +
                                    "/munge-sock && mungekey -c -k " + dir + "/munge/munge.key",
                                ""));
  if (made.first != 0) return FailedPreconditionError("preparing " + dir + ": " + made.second);
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  std::string short_host = host;
  short_host = short_host.substr(0, short_host.find('.'));

  std::ostringstream conf;
  conf << "ClusterName=tesseratest\n"
       << "SlurmctldHost=" << short_host << "(" << EmulatedHosts::kSwitchAddress << ")\n"
       << "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n"
       << "AuthInfo=socket=" << dir << "/munge-sock/munge.sock\nCredType=cred/munge\n"
       << "SlurmctldPort=6817\nSlurmdPort=6818\n"
       << "StateSaveLocation=" << dir << "/state\nSlurmdSpoolDir=" << dir << "/spool/%n\n"
       << "SlurmctldPidFile=" << dir << "/slurmctld.pid\nSlurmdPidFile=" << dir
       << "/slurmd-%n.pid\n"
       << "SlurmctldLogFile=" << dir << "/log/slurmctld.log\nSlurmdLogFile=" << dir
       << "/log/slurmd-%n.log\n"
       << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
       << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
       << "JobCompType=jobcomp/none\nMailProg=/bin/true\nMpiDefault=none\n"
       << "SwitchType=switch/none\nSchedulerType=sched/backfill\nSelectType=select/cons_tres\n"
       << "SelectTypeParameters=CR_CPU\nReturnToService=2\nSlurmctldTimeout=30\n"
       << "SlurmdTimeout=30\nInactiveLimit=0\nKillWait=5\nMinJobAge=300\n";
  std::string nodes;
  for (int i = 0; i < hosts.size(); ++i) {
    const std::string name = "n" + std::to_string(i + 1);
    conf << "NodeName=" << name << " NodeHostname=" << short_host
         << " NodeAddr=" << EmulatedHosts::Address(i) << " Port=" << 17001 + i
         << " CPUs=2 RealMemory=1000 State=UNKNOWN\n";
    nodes += (nodes.empty() ? "" : ",") + name;
    RETURN_IF_ERROR(RunWithInput("mkdir -p " + dir + "/spool/" + name, "").status());
  }
  conf << "PartitionName=debug Nodes=" << nodes << " Default=YES MaxTime=INFINITE State=UP\n";
  cluster->conf_ = dir + "/slurm.conf";
  {
    std::ofstream out(cluster->conf_);
    out << conf.str();
  }

  FleetHarness& daemons = cluster->daemons_;
  RETURN_IF_ERROR(daemons
                      .StartCommand("munged", {"/usr/sbin/munged", "-F", "--force",
                                               "--socket=" + dir + "/munge-sock/munge.sock",
                                               "--key-file=" + dir + "/munge/munge.key",
                                               "--pid-file=" + dir + "/munge-sock/munged.pid",
                                               "--log-file=" + dir + "/log/munged.log",
                                               "--seed-file=" + dir + "/munge/munged.seed"})
                      .status());
  RETURN_IF_ERROR(daemons
                      .StartCommand("slurmctld", hosts.SwitchCommand({"/usr/sbin/slurmctld", "-D",
                                                                      "-c", "-f", cluster->conf_}))
                      .status());
  for (int i = 0; i < hosts.size(); ++i) {
    const std::string name = "n" + std::to_string(i + 1);
    RETURN_IF_ERROR(
        daemons
            .StartCommand("slurmd " + name, hosts.Command(i, {"/usr/sbin/slurmd", "-D", "-N", name,
                                                              "-f", cluster->conf_}))
            .status());
  }
  // Ready when every node is idle (0.3-0.5 s here).
  const Deadline deadline = Deadline::AfterMillis(30000);
  std::string last;
  while (!deadline.Expired()) {
    StatusOr<std::pair<int, std::string>> shown = cluster->Run({"sinfo", "-h", "-N", "-o", "%N %t"});
    if (shown.ok()) {
      last = shown->second;
      int idle = 0;
      for (size_t at = last.find(" idle"); at != std::string::npos; at = last.find(" idle", at + 1)) {
        ++idle;
      }
      if (idle == hosts.size()) return cluster;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return FailedPreconditionError("the Slurm nodes did not become idle within 30 s (sinfo: " +
                                 last + ")\n" + cluster->Logs());
}

SlurmCluster::~SlurmCluster() {
  daemons_.StopAll();
  (void)RunWithInput("rm -rf " + dir_, "");
}

std::vector<std::string> SlurmCluster::ClientCommand(int host,
                                                     const std::vector<std::string>& argv) const {
  std::vector<std::string> command = {"/usr/bin/env", "SLURM_CONF=" + conf_};
  command.insert(command.end(), argv.begin(), argv.end());
  return hosts_.Command(host, command, /*private_shm=*/false);
}

StatusOr<std::pair<int, std::string>> SlurmCluster::Run(const std::vector<std::string>& argv) const {
  std::string command;
  for (const std::string& arg : ClientCommand(0, argv)) command += ShellQuote(arg) + " ";
  return RunWithInput(command, "");
}

std::string SlurmCluster::Logs() const {
  std::string logs;
  for (const char* name : {"slurmctld.log", "slurmd-n1.log", "slurmd-n2.log", "munged.log"}) {
    logs += std::string("--- ") + name + "\n" + ReadWholeFile(dir_ + "/log/" + name);
  }
  return logs;
}

}  // namespace tessera::testing
