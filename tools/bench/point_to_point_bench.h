// The point-to-point part of `tessera-bench groups` (groups_bench.h): Communicator::Send and
// Recv between two processes, beside raw ZeroMQ and the shared-memory limit in the same run.
//
// Each peer kind runs as a pair of processes, this binary in its hidden peer mode (the
// `groups` subcommand's --p2p-peer flags), one pair after the other:
//   - tessera: as tessera-worker wires it, a ZeroMQ endpoint (authenticated with a key of the
//     run's own), a CollectiveMailbox for its ring frames, a FailureBus, and the world's
//     Communicator::Connect of the two; messages by Send / Recv (one tag);
//   - zmq: a PAIR socket each over tcp://127.0.0.1, one message per send, received into the
//     caller's buffer (the copy out that Recv makes too);
//   - shm: a file-backed shared mapping, one slot per direction, a sequence word spun on (then
//     yielded: the cores are shared) and the bytes copied in and out; latency only.
// A pair ping-pongs: rank 0 sends, rank 1 receives and sends back the same bytes, rank 0
// receives. Latency is half the median round trip of --p2p-latency-iters of --latency-bytes
// (after a tenth as many untimed); bandwidth is --bandwidth-bytes over half the median round
// trip of --p2p-bandwidth-iters (after one untimed). The bandwidth limit is the single copy:
// memcpy of --bandwidth-bytes between two buffers of the parent, median of as many copies.
#ifndef TESSERA_TOOLS_BENCH_POINT_TO_POINT_BENCH_H_
#define TESSERA_TOOLS_BENCH_POINT_TO_POINT_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "tools/bench/bench_util.h"

namespace tessera::tools {

struct PointToPointOptions {
  size_t latency_bytes = 8;
  size_t bandwidth_bytes = size_t{16} << 20;
  int latency_iters = 2000;
  int bandwidth_iters = 20;
  int64_t timeout_ms = 120'000;  // per pair of processes
  bool progress = false;         // "measuring ..." on stderr
};

// Seconds and bytes per second; latencies one way.
struct PointToPointFigures {
  double tessera_latency_s = 0, zmq_latency_s = 0, shm_latency_s = 0;
  double tessera_bytes_per_second = 0, zmq_bytes_per_second = 0, memcpy_bytes_per_second = 0;
};

// Runs the three pairs as children of this binary (/proc/self/exe), one pair at a time, and
// the memcpy limit in this process. Errors name the pair and quote the failing child's stderr.
StatusOr<PointToPointFigures> MeasurePointToPoint(const PointToPointOptions& options);

// A peer process: what the hidden flags of `groups` give it.
struct PointToPointPeerFlags {
  std::string kind;       // tessera, zmq or shm; empty: not a peer
  int rank = 0;           // 0 times, 1 answers
  std::string directory;  // where the pair meet (addresses, the shared region, the job key)
  size_t latency_bytes = 8;
  size_t bandwidth_bytes = 0;  // 0: latency only
  int latency_iters = 0;
  int bandwidth_iters = 0;
  int64_t timeout_ms = 120'000;
};

// Adds the hidden peer flags to `groups`.
void AddPointToPointPeerFlags(CLI::App* app, PointToPointPeerFlags* flags);

// Runs one peer; rank 0 prints {"bench":"groups_p2p","kind":...,"latency_s":...,
// "bytes_per_second":...} on stdout. Returns the exit status (errors on stderr).
int RunPointToPointPeer(const PointToPointPeerFlags& flags);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_POINT_TO_POINT_BENCH_H_
