// Two emulated hosts on this machine for the benchmarks' child processes (tessera-bench torch
// --fsdp --hybrid-netns): network namespaces "<tag>-h0" (10.77.0.1) and "<tag>-h1" (10.77.0.2)
// joined by a bridge, made by tools/bench/emulated_hosts.sh (see ../shared/notes/clusters.md).
// A process started through Wrap() runs inside one host's network namespace, in a mount
// namespace with a /dev/shm of its own and a UTS namespace with the host's own hostname
// ("emulated-h0", "emulated-h1"), so that what groups ranks by hostname or by shared memory
// sees two hosts. Needs root. Not thread-safe.
#ifndef TESSERA_TOOLS_BENCH_EMULATED_HOSTS_H_
#define TESSERA_TOOLS_BENCH_EMULATED_HOSTS_H_

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera::tools {

class EmulatedHosts {
 public:
  static constexpr int kHosts = 2;

  // Makes the hosts; an error (naming the command's output) when that fails, e.g. not root.
  static StatusOr<std::unique_ptr<EmulatedHosts>> Create();
  // Deletes the namespaces (the processes started in them must have exited).
  ~EmulatedHosts();

  // The address of host `host` (0 or 1), e.g. for TESSERA_BIND_HOST.
  static std::string Address(int host);

  // argv run inside host `host`: the environment variables given first (`env` NAME=VALUE
  // ...), and then the command.
  std::vector<std::string> Wrap(int host, const std::vector<std::string>& argv) const;

 private:
  EmulatedHosts(std::string script, std::string tag)
      : script_(std::move(script)), tag_(std::move(tag)) {}

  const std::string script_;  // emulated_hosts.sh
  const std::string tag_;
};

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_EMULATED_HOSTS_H_
