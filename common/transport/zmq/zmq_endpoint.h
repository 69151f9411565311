// StartZmqEndpoint: an RpcEndpoint over a new ZmqTransport, the wiring every process's main
// does (through ProcessRuntime) and tests over real sockets repeat.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<RpcEndpoint> endpoint, StartZmqEndpoint(options, &metrics));
#ifndef TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_ENDPOINT_H_
#define TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_ENDPOINT_H_

#include <memory>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_transport.h"

namespace tessera {

// Binds a ZmqTransport with `options` and starts an endpoint on it, named by options.role and
// options.rank. `metrics` may be null; otherwise it must outlive the endpoint.
StatusOr<std::unique_ptr<RpcEndpoint>> StartZmqEndpoint(const ZmqTransportOptions& options,
                                                        MetricsRegistry* metrics);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_ZMQ_ZMQ_ENDPOINT_H_
