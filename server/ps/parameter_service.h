// ParameterService: the parameter server's request handlers, serving one TensorStore.
//
//   PushRequest -> stores every tensor's bytes, answers Ack. A push is stored whole or not at
//                  all: every tensor is checked first (float32, bytes present, key on this
//                  server, shape as stored), and one bad tensor gets an ErrorReply naming it.
//   PullRequest -> answers PullReply with the requested tensors' current values, one payload
//                  frame each, borrowed from the store's immutable buffers (no copy); any
//                  tensor that is missing or not on this server gets an ErrorReply naming it.
//                  The request's TensorMetas need only name and key; shapes come from the store.
//
// The handlers run on the transport's I/O thread and do their work inline: a push is one
// memcpy per tensor into the store and a pull only takes references, so neither blocks nor
// waits for anything. A store that applies an optimizer to large shards will need a work queue
// and its own threads instead.
//
// Thread-safety: the Serve* functions are thread-safe (the store is).
#ifndef TESSERA_SERVER_PS_PARAMETER_SERVICE_H_
#define TESSERA_SERVER_PS_PARAMETER_SERVICE_H_

#include <memory>

#include "common/base/payload.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/transport.h"
#include "server/ps/tensor_store.h"

namespace tessera::server {

// Sets the PushRequest and PullRequest handlers of `endpoint` to serve `store`. The handlers
// share ownership of the store, so it lives as long as the endpoint may still call them.
// REQUIRES: `endpoint` is not null.
void InstallParameterService(RpcEndpoint* endpoint, std::shared_ptr<TensorStore> store);

// The reply (Ack or ErrorReply) to a verified PushRequest `request`, after storing its tensors.
Message ServePush(TensorStore& store, const Envelope& request);
// The reply (PullReply or ErrorReply) to a verified PullRequest `request`.
Message ServePull(const TensorStore& store, const Envelope& request);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_PARAMETER_SERVICE_H_
