// BackendMetrics: the Prometheus instruments of the "tessera" torch.distributed backend, one
// set per process (every group of the process adds to the same series):
//
//   tessera_collective_seconds{op, size_class}   histogram: time from the op's start on the
//                                                comm thread to its completion
//   tessera_collective_bytes_total{op}           bytes of the tensors the op moved or reduced
//   tessera_collective_errors_total{op}          ops that completed with an error
//
// op is torch's name for the call: allreduce, broadcast, reduce, allgather, gather, scatter,
// reduce_scatter, alltoall, barrier, send, recv. The histogram's _count is the number of ops.
//
// Thread-safety: Record from any thread (each instrument is an atomic update).
#ifndef TESSERA_WORKER_TORCH_BACKEND_METRICS_H_
#define TESSERA_WORKER_TORCH_BACKEND_METRICS_H_

#include <array>
#include <cstddef>
#include <memory>
#include <string_view>

#include "common/base/status.h"
#include "common/metrics/metrics.h"

namespace tessera::worker {

enum class TorchOp {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};
inline constexpr size_t kTorchOpCount = 11;

// The `op` label of `op`: "allreduce", "reduce_scatter", ...
std::string_view TorchOpName(TorchOp op);

class BackendMetrics {
 public:
  // Registers (or finds) the families in `registry`, which must outlive the result.
  static StatusOr<std::unique_ptr<BackendMetrics>> Register(MetricsRegistry* registry);

  // One finished op of `bytes` bytes that took `seconds`; ok=false counts an error too.
  void Record(TorchOp op, size_t bytes, double seconds, bool ok);

 private:
  BackendMetrics() = default;

  // seconds_[op][size class]: <64KiB, <1MiB, <16MiB, >=16MiB, as the all-reduce engine's.
  std::array<std::array<Histogram*, 4>, kTorchOpCount> seconds_{};
  std::array<Counter*, kTorchOpCount> bytes_{};
  std::array<Counter*, kTorchOpCount> errors_{};
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_BACKEND_METRICS_H_
