// EmulatedHosts: several "hosts" on this machine for tests that cross hosts (issue 20).
//
// Each host is a network namespace with its own loopback and one interface, eth0, at
// 10.77.0.(i+1)/24; a bridge in one more namespace (the "switch", itself reachable at
// 10.77.0.254, where a cluster's controller can run) joins them, so nothing is
// added to the machine's own network and deleting the namespaces removes everything. A process
// started through Command(i, ...) runs inside host i; with private shared memory, also in its
// own mount namespace with a fresh tmpfs on /dev/shm, so a shared-memory transport really has
// to cross over TCP. See ../shared/notes/clusters.md.
//
// Namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN). Where they are refused, Create fails
// with FailedPrecondition and tests skip, unless TESSERA_REQUIRE_NAMESPACES=1 (set by .ci/run),
// which turns the skip into a failure.
//
// Thread-safety: one thread owns an EmulatedHosts; RunInHost may be called from any thread.
#ifndef TESSERA_TESTS_EMULATED_HOSTS_H_
#define TESSERA_TESTS_EMULATED_HOSTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera::testing {

class EmulatedHosts {
 public:
  static StatusOr<std::unique_ptr<EmulatedHosts>> Create(int num_hosts);
  ~EmulatedHosts();  // deletes the namespaces (their processes must be gone)

  int size() const { return static_cast<int>(namespaces_.size()); }
  // 10.77.0.(i+1): host i's address on the shared network.
  static std::string Address(int i);
  // `argv` run inside host i (nsenter, no fork: the pid started is argv's). With
  // `private_shm`, /dev/shm is a fresh tmpfs of its own; with `own_hostname`, its host name is
  // HostName(i) instead of this machine's (a UTS namespace), so a coordinator on another
  // emulated host cannot take it for one of its own host's processes (whose pids it checks).
  std::vector<std::string> Command(int i, const std::vector<std::string>& argv,
                                   bool private_shm = true, bool own_hostname = false) const;
  // "emulated-host-i".
  static std::string HostName(int i);
  // `argv` run in the switch's network namespace (at kSwitchAddress).
  std::vector<std::string> SwitchCommand(const std::vector<std::string>& argv) const;
  static constexpr const char* kSwitchAddress = "10.77.0.254";
  // Runs `body` on a thread that has entered host i's network namespace (sockets it opens are
  // host i's), and waits for it.
  Status RunInHost(int i, const std::function<void()>& body) const;

 private:
  EmulatedHosts() = default;

  std::string switch_;                  // the bridge's namespace
  std::vector<std::string> namespaces_;  // host i's network namespace
};

// Whether the suite must not skip tests that need namespaces (TESSERA_REQUIRE_NAMESPACES=1).
bool NamespacesRequired();

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_EMULATED_HOSTS_H_
