#include "common/transport/zmq/zmq_endpoint.h"

#include <utility>

namespace tessera {

StatusOr<std::unique_ptr<RpcEndpoint>> StartZmqEndpoint(const ZmqTransportOptions& options,
                                                        MetricsRegistry* metrics) {
  ASSIGN_OR_RETURN(std::unique_ptr<ZmqTransport> transport,
                   ZmqTransport::Create(options, metrics));
  return RpcEndpoint::Start(std::move(transport), options.role, options.rank, metrics);
}

}  // namespace tessera
