// tessera-bench security [--sizes 64K,1M,16M] [--paths transport,ps,allreduce] [--seconds 1]
//                        [--repeats 3] [--json]
//
// security: what authentication and encryption cost (issue 15), each beside the same path with
// no security, in the same run, on the three paths the data takes:
//   transport  request/ack throughput of RpcEndpoint over ZmqTransport (tessera-bench transport)
//   ps         push+pull of one worker's tensor through tessera-server over sockets (tessera-launch
//              --servers 1 --workers 2 --mode bench-ps --ps-shared-memory=false)
//   allreduce  ring all-reduce over ring links, 2 workers (tessera-launch --mode bench-allreduce
//              --ring-transport links)
// with three settings: insecure (--insecure), authenticated (the default on the loopback) and
// encrypted (--encrypt on). Settings alternate within each repeat, each repeat starting with
// the next, and each figure is the best of --repeats, so drift on a shared machine and the
// position in a repeat hit all three alike. Goal: authenticated >= 0.95x
// insecure from 64 KiB up.
#ifndef TESSERA_TOOLS_BENCH_SECURITY_BENCH_H_
#define TESSERA_TOOLS_BENCH_SECURITY_BENCH_H_

#include "tools/bench/bench_util.h"

namespace tessera::tools {

// Adds the `security` subcommand to `parent`.
BenchCommand AddSecurityBench(CLI::App* parent);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_SECURITY_BENCH_H_
