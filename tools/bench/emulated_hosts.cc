#include "tools/bench/emulated_hosts.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "tools/bench/bench_util.h"

namespace tessera::tools {

StatusOr<std::unique_ptr<EmulatedHosts>> EmulatedHosts::Create() {
  if (geteuid() != 0) {
    return FailedPreconditionError("emulated hosts need root (network namespaces)");
  }
  ASSIGN_OR_RETURN(std::string script, FindRunfile("tools/bench/emulated_hosts.sh"));
  const std::string tag = "tbh" + std::to_string(getpid());
  std::unique_ptr<EmulatedHosts> hosts(new EmulatedHosts(script, tag));
  StatusOr<ChildOutput> made =
      RunToCompletion("emulated_hosts.sh make_hosts",
                      {"/bin/bash", "-c", "set -e; tag=\"$1\"; source \"$2\"; make_hosts", "sh",
                       tag, script},
                      30'000);
  if (!made.ok()) return made.status();  // the destructor deletes what was made
  return hosts;
}

EmulatedHosts::~EmulatedHosts() {
  (void)RunToCompletion("emulated_hosts.sh delete_hosts",
                        {"/bin/bash", "-c", "tag=\"$1\"; source \"$2\"; delete_hosts", "sh",
                         tag_, script_},
                        30'000);
}

std::string EmulatedHosts::Address(int host) { return "10.77.0." + std::to_string(host + 1); }

std::vector<std::string> EmulatedHosts::Wrap(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped = {
      "/usr/bin/nsenter", "--net=/var/run/netns/" + tag_ + "-h" + std::to_string(host),
      "/usr/bin/unshare", "--mount", "--uts", "--propagation", "private", "/bin/sh", "-c",
      "mount -t tmpfs tmpfs /dev/shm && hostname \"$0\" && exec \"$@\"",
      "emulated-h" + std::to_string(host)};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

}  // namespace tessera::tools
