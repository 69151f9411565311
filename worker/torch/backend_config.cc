#include "worker/torch/backend_config.h"

#include <cctype>

#include "common/base/quote.h"

namespace tessera::worker {

StatusOr<GroupMemberOptions> BackendOptionsFrom(const Environment& env) {
  GroupMemberOptions options;
  if (auto it = env.find("TESSERA_BIND_HOST"); it != env.end()) {
    const std::string& host = it->second;
    bool plain = !host.empty();
    for (char c : host) plain &= !std::isspace(static_cast<unsigned char>(c)) && c != '/';
    if (!plain || host == "0.0.0.0" || host == "*") {
      return InvalidArgumentError(
          "TESSERA_BIND_HOST=" + Quote(host) +
          ": give this host's address that its peers can reach (a name or an IP address; not "
          "0.0.0.0, which peers cannot connect to)");
    }
    options.bind_host = host;
  }
  if (auto it = env.find("TESSERA_RING_TRANSPORT"); it != env.end()) {
    const std::string& kind = it->second;
    if (kind != "auto" && kind != "shm" && kind != "links" && kind != "zmq") {
      return InvalidArgumentError("TESSERA_RING_TRANSPORT=" + Quote(kind) +
                                  " is not one of auto, shm, links, zmq");
    }
    options.ring_transport = kind;
  }
  return options;
}

}  // namespace tessera::worker
