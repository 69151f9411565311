// BindAddress: where a process listens and the address it gives the others (--bind-host).
//
// Across hosts, a process must advertise an address its peers can reach, and the one it
// listens on must be on that path. `auto` (the default) picks it as Gloo and NCCL pick their
// interface: the local end of the route to the coordinator, i.e. the source address the kernel
// would use to connect there. A loopback coordinator (or none) keeps everything on 127.0.0.1.
// An interface name (`eth0`) takes that interface's IPv4 address. An unspecified address
// (0.0.0.0, ::) listens everywhere and advertises what `auto` would, never 0.0.0.0.
//
// Thread-safety: functions only; they read the system's interfaces and routes.
#ifndef TESSERA_COMMON_TRANSPORT_BIND_ADDRESS_H_
#define TESSERA_COMMON_TRANSPORT_BIND_ADDRESS_H_

#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

struct BindAddress {
  std::string listen;     // what sockets bind: an IP address (0.0.0.0 or :: for every interface)
  std::string advertise;  // what others connect to: a specific IP address
  std::string how;        // how it was chosen, for logs: "route to 10.77.0.1"
};

// `choice`: "auto", an IP address, "localhost" or an interface name of this host.
// `coordinator_host`: the host of --coordinator ("" when the process has none). Errors name the
// choice, and for an unknown name list this host's interfaces.
StatusOr<BindAddress> ResolveBindAddress(std::string_view choice,
                                         std::string_view coordinator_host);

// The source address a connection from here to `host` (a name or an IP address) would use.
// No packet is sent: a UDP socket is connected and asked for its local address.
StatusOr<std::string> RouteSourceAddress(std::string_view host);

// Whether `address` (an IP address) belongs to one of this host's interfaces.
bool IsAddressOfThisHost(std::string_view address);

// The IPv4 address of interface `name` (e.g. "eth0"); NotFound listing the interfaces.
StatusOr<std::string> InterfaceAddress(std::string_view name);

// Where this process's loopback addresses lead: "boot BOOT_ID netns DEV:INODE" (the machine's
// boot id and the network namespace's identity, /proc/sys/kernel/random/boot_id and
// /proc/thread-self/ns/net). Two processes reach each other at 127.0.0.1 only if theirs are equal:
// network namespaces (containers, the emulated hosts of tests/emulated_hosts.h) share a
// machine and often a host name, but not a loopback, and a UTS namespace changes the host name
// only. Where /proc cannot tell, "host HOSTNAME".
std::string LoopbackScope();

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_BIND_ADDRESS_H_
