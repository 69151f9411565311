#include "tests/emulated_hosts.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

std::string NetnsPath(const std::string& name) { return "/var/run/netns/" + name; }

Status Run(const std::string& command) {
  ASSIGN_OR_RETURN(auto result, RunWithInput(command, ""));
  if (result.first != 0) {
    return FailedPreconditionError("emulated hosts: `" + command + "` exited " +
                                   std::to_string(result.first) + ": " + result.second);
  }
  return OkStatus();
}

}  // namespace

bool NamespacesRequired() {
  const char* value = std::getenv("TESSERA_REQUIRE_NAMESPACES");
  return value != nullptr && std::string(value) == "1";
}

std::string EmulatedHosts::Address(int i) { return "10.77.0." + std::to_string(i + 1); }

StatusOr<std::unique_ptr<EmulatedHosts>> EmulatedHosts::Create(int num_hosts) {
  std::unique_ptr<EmulatedHosts> hosts(new EmulatedHosts());
  // Unique per test process, so tests running at once never share a namespace.
  static std::atomic<int> counter{0};
  const std::string prefix =
      "tessera-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-";
  hosts->switch_ = prefix + "switch";
  RETURN_IF_ERROR(Run("ip netns add " + hosts->switch_));
  RETURN_IF_ERROR(Run("ip -n " + hosts->switch_ + " link add br0 type bridge && ip -n " +
                      hosts->switch_ + " addr add " + kSwitchAddress + "/24 dev br0 && ip -n " +
                      hosts->switch_ + " link set br0 up && ip -n " + hosts->switch_ +
                      " link set lo up"));
  for (int i = 0; i < num_hosts; ++i) {
    const std::string ns = prefix + "host" + std::to_string(i);
    RETURN_IF_ERROR(Run("ip netns add " + ns));
    hosts->namespaces_.push_back(ns);
    const std::string port = "p" + std::to_string(i);
    RETURN_IF_ERROR(Run("ip -n " + ns + " link add eth0 type veth peer name " + port + " netns " +
                        hosts->switch_ + " && ip -n " + hosts->switch_ + " link set " + port +
                        " master br0 up && ip -n " + ns + " addr add " + Address(i) +
                        "/24 dev eth0 && ip -n " + ns + " link set eth0 up && ip -n " + ns +
                        " link set lo up"));
  }
  return hosts;
}

EmulatedHosts::~EmulatedHosts() {
  for (const std::string& ns : namespaces_) (void)Run("ip netns del " + ns);
  if (!switch_.empty()) (void)Run("ip netns del " + switch_);
}

std::vector<std::string> EmulatedHosts::Command(int i, const std::vector<std::string>& argv,
                                                bool private_shm, bool own_hostname) const {
  std::vector<std::string> command = {"/usr/bin/nsenter", "--net=" + NetnsPath(namespaces_.at(i)),
                                      "--"};
  if (private_shm || own_hostname) {
    command.push_back("/usr/bin/unshare");
    std::string script;
    if (private_shm) {
      command.insert(command.end(), {"--mount", "--propagation", "private"});
      script += "mount -t tmpfs tmpfs /dev/shm && ";
    }
    if (own_hostname) {
      command.push_back("--uts");
      script += "hostname " + HostName(i) + " && ";
    }
    command.insert(command.end(), {"/bin/sh", "-c", script + "exec \"$@\"", "sh"});
  }
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

std::string EmulatedHosts::HostName(int i) { return "emulated-host-" + std::to_string(i); }

std::vector<std::string> EmulatedHosts::SwitchCommand(const std::vector<std::string>& argv) const {
  return Concat({"/usr/bin/nsenter", "--net=" + NetnsPath(switch_), "--"}, argv);
}

Status EmulatedHosts::RunInHost(int i, const std::function<void()>& body) const {
  Status entered = OkStatus();
  std::thread thread([&] {
    const int fd = open(NetnsPath(namespaces_.at(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      entered = FailedPreconditionError("cannot enter " + namespaces_.at(i) + ": " +
                                        std::strerror(errno));
    } else {
      body();
    }
    if (fd >= 0) close(fd);
  });
  thread.join();
  return entered;
}

}  // namespace tessera::testing
