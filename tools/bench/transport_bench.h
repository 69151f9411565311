// tessera-bench transport [--sizes 4096,1048576] [--seconds 2] [--window 8] [--json]
//
// transport: request/acknowledge throughput of Tessera's messaging (RpcEndpoint over
// ZmqTransport: verified headers, zero-copy payload frames) against raw ZeroMQ DEALER/ROUTER
// sockets doing the same exchange with no framing or checks, and memcpy of the same buffer
// (what one copy of the bytes would cost). Both messaging paths go over loopback TCP with
// `window` messages in flight.
#ifndef TESSERA_TOOLS_BENCH_TRANSPORT_BENCH_H_
#define TESSERA_TOOLS_BENCH_TRANSPORT_BENCH_H_

#include "common/base/status.h"
#include "common/security/credentials.h"
#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `transport` subcommand to `parent`.
BenchCommand AddTransportBench(CLI::App* parent);

// Tessera's request/ack throughput (bytes/s) of `size`-byte pushes with `window` in flight for
// `seconds`, both endpoints holding `credentials` (tessera-bench security compares them).
StatusOr<double> TesseraTransportRate(size_t size, double seconds, int window,
                                      const Credentials& credentials);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TRANSPORT_BENCH_H_
