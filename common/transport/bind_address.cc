#include "common/transport/bind_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "common/base/host_port.h"
#include "common/base/quote.h"

namespace tessera {
namespace {

// Any port will do: connecting a UDP socket only looks up the route.
constexpr int kProbePort = 9;

bool IsIpLiteral(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

std::string AddressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = "";
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

// Interface name -> its first IPv4 address (IPv6 when it has none), for up interfaces.
std::map<std::string, std::string> InterfaceAddresses() {
  std::map<std::string, std::string> v4;
  std::map<std::string, std::string> v6;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return v4;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || (it->ifa_flags & IFF_UP) == 0) continue;
    if (it->ifa_addr->sa_family == AF_INET) {
      v4.emplace(it->ifa_name, AddressText(it->ifa_addr));
    } else if (it->ifa_addr->sa_family == AF_INET6) {
      v6.emplace(it->ifa_name, AddressText(it->ifa_addr));
    }
  }
  freeifaddrs(list);
  for (auto& [name, address] : v6) v4.emplace(name, address);
  return v4;
}

std::string ListInterfaces() {
  std::string text;
  for (const auto& [name, address] : InterfaceAddresses()) {
    text += (text.empty() ? "" : ", ") + name + " " + address;
  }
  return text.empty() ? "none found" : text;
}

// Where a process that listens everywhere (or has no coordinator to aim at) can be reached:
// the first interface that is not the loopback, else the loopback.
std::string FirstNonLoopbackAddress() {
  for (const auto& [name, address] : InterfaceAddresses()) {
    if (!IsLoopbackHost(address) && address.find(':') == std::string::npos) return address;
  }
  return "127.0.0.1";
}

// What `auto` advertises for a coordinator at `coordinator_host`.
StatusOr<BindAddress> Automatic(const std::string& coordinator_host) {
  if (coordinator_host.empty() || IsLoopbackHost(coordinator_host)) {
    return BindAddress{"127.0.0.1", "127.0.0.1",
                       coordinator_host.empty() ? "no coordinator" : "loopback coordinator"};
  }
  if (IsUnspecifiedHost(coordinator_host)) {
    // A coordinator listening everywhere: this process is the coordinator itself.
    std::string address = FirstNonLoopbackAddress();
    return BindAddress{address, address, "the first interface that is not the loopback"};
  }
  StatusOr<std::string> source = RouteSourceAddress(coordinator_host);
  if (!source.ok()) {
    return source.status().WithContext("--bind-host auto: finding the address on the route to "
                                       "the coordinator's host " + Quote(coordinator_host));
  }
  return BindAddress{*source, *source, "the route to " + coordinator_host};
}

}  // namespace

StatusOr<std::string> RouteSourceAddress(std::string_view host_view) {
  const std::string host = std::string(Unbracketed(host_view));
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(kProbePort);
  if (int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return UnavailableError("cannot resolve " + Quote(host) + ": " + gai_strerror(error));
  }
  std::string last_error = "no address";
  std::string source;
  // IPv4 first: it is what peers on the other hosts most likely resolve the name to as well.
  for (int family : {AF_INET, AF_INET6}) {
    for (addrinfo* it = found; it != nullptr && source.empty(); it = it->ai_next) {
      if (it->ai_family != family) continue;
      int fd = socket(it->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last_error = std::string("socket: ") + std::strerror(errno);
        continue;
      }
      sockaddr_storage local = {};
      socklen_t length = sizeof(local);
      if (connect(fd, it->ai_addr, it->ai_addrlen) != 0) {
        last_error = "no route to " + AddressText(it->ai_addr) + ": " + std::strerror(errno);
      } else if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
        last_error = std::string("getsockname: ") + std::strerror(errno);
      } else {
        source = AddressText(reinterpret_cast<sockaddr*>(&local));
      }
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (source.empty()) return UnavailableError(Quote(host) + ": " + last_error);
  return source;
}

StatusOr<std::string> InterfaceAddress(std::string_view name) {
  std::map<std::string, std::string> interfaces = InterfaceAddresses();
  auto it = interfaces.find(std::string(name));
  if (it == interfaces.end()) {
    return NotFoundError("no interface " + Quote(name) + " is up on this host (interfaces: " +
                         ListInterfaces() + ")");
  }
  return it->second;
}

std::string LoopbackScope() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat netns = {};
  // The calling thread's: a thread may have entered a namespace of its own (setns), and its
  // sockets are that namespace's.
  if (boot_id.empty() || (stat("/proc/thread-self/ns/net", &netns) != 0 &&
                          stat("/proc/self/ns/net", &netns) != 0)) {
    return "host " + LocalHostName();
  }
  return "boot " + boot_id + " netns " + std::to_string(netns.st_dev) + ":" +
         std::to_string(netns.st_ino);
}

bool IsAddressOfThisHost(std::string_view address) {
  std::string bare = std::string(Unbracketed(address));
  if (bare.rfind("::ffff:", 0) == 0) bare = bare.substr(7);  // IPv4-mapped IPv6
  if (bare.empty()) return false;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* it = list; it != nullptr && !found; it = it->ifa_next) {
    if (it->ifa_addr != nullptr) found = AddressText(it->ifa_addr) == bare;
  }
  freeifaddrs(list);
  return found;
}

StatusOr<BindAddress> ResolveBindAddress(std::string_view choice_view,
                                         std::string_view coordinator_view) {
  const std::string choice = std::string(Unbracketed(choice_view));
  const std::string coordinator_host = std::string(Unbracketed(coordinator_view));
  if (choice.empty()) return InvalidArgumentError("--bind-host is empty");
  if (choice == "auto") return Automatic(coordinator_host);
  if (choice == "localhost") return BindAddress{"127.0.0.1", "127.0.0.1", "localhost"};
  if (IsUnspecifiedHost(choice)) {
    ASSIGN_OR_RETURN(BindAddress automatic, Automatic(coordinator_host));
    const std::string every = choice == "*" ? "0.0.0.0" : choice;
    return BindAddress{every, automatic.advertise, "every interface; advertised: " + automatic.how};
  }
  if (IsIpLiteral(choice)) return BindAddress{choice, choice, "given"};
  StatusOr<std::string> interface = InterfaceAddress(choice);
  if (interface.ok()) return BindAddress{*interface, *interface, "interface " + choice};
  return InvalidArgumentError("--bind-host " + Quote(choice) +
                              " is not auto, an IP address or an interface of this host "
                              "(interfaces: " + ListInterfaces() + ")");
}

}  // namespace tessera
