// FsdpMetrics: the Prometheus instruments tessera.torch.fsdp (the Python FSDP) feeds
// through tessera.torch._C, one set per process whatever the process group's backend:
//
//   tessera_fsdp_param_bytes{kind}             gauge: bytes held now
//   tessera_fsdp_param_peak_bytes{kind}        gauge: most bytes held since the start or the
//                                              last ResetPeaks()
//   tessera_fsdp_collective_seconds{op}        histogram: issue to completion, as FSDP sees it
//   tessera_fsdp_collective_bytes_total{op}    bytes of the collectives' buffers
//   tessera_fsdp_prefetch_waits_total          waits for a prefetched all-gather not yet done
//   tessera_fsdp_prefetch_wait_seconds_total   the time of those waits
//
// kind: shard (the rank's flat parameter shards), gathered (unsharded flat parameters
// allocated), gradient_shard (sharded gradients), full_gradient (unsharded gradients awaiting
// reduce-scatter). op: all_gather, reduce_scatter, all_reduce (hybrid sharding's replicate
// step).
//
// Thread-safety: every member function from any thread. AddParamBytes, ObserveCollective and
// PrefetchWait are a few atomic updates and allocate nothing; AddParamBytes takes a mutex
// only when it raises a peak (ResetPeaks takes it too), so that a peak gauge never goes back
// to an older, smaller peak.
#ifndef TESSERA_WORKER_TORCH_FSDP_METRICS_H_
#define TESSERA_WORKER_TORCH_FSDP_METRICS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>

#include "common/base/status.h"
#include "common/metrics/metrics.h"

namespace tessera::worker {

enum class FsdpParamKind { kShard, kGathered, kGradientShard, kFullGradient };
inline constexpr size_t kFsdpParamKindCount = 4;

enum class FsdpCollective { kAllGather, kReduceScatter, kAllReduce };
inline constexpr size_t kFsdpCollectiveCount = 3;

// The label values: "shard", "gathered", ...; "all_gather", "reduce_scatter", "all_reduce".
std::string_view FsdpParamKindName(FsdpParamKind kind);
std::string_view FsdpCollectiveName(FsdpCollective op);
// InvalidArgument naming `name` and the allowed values when it is none of them.
StatusOr<FsdpParamKind> ParseFsdpParamKind(std::string_view name);
StatusOr<FsdpCollective> ParseFsdpCollective(std::string_view name);

class FsdpMetrics {
 public:
  // Registers (or finds) the families in `registry`, which must outlive the result. Two
  // FsdpMetrics of one registry would each keep their own peaks: make one per registry.
  static StatusOr<std::unique_ptr<FsdpMetrics>> Register(MetricsRegistry* registry);

  // Adds `delta` bytes (negative: freed) to what is held of `kind`, and raises its peak when
  // the sum exceeds it.
  void AddParamBytes(FsdpParamKind kind, int64_t delta);
  // One collective of `bytes` bytes that took `seconds` from issue to completion.
  void ObserveCollective(FsdpCollective op, double seconds, uint64_t bytes);
  // FSDP waited `seconds` for a prefetched all-gather that had not finished.
  void PrefetchWait(double seconds);
  // Sets each kind's peak to what it holds now (e.g. to measure one step's peak).
  void ResetPeaks();

  // The instruments' values, read one by one (not a consistent cut while others update).
  struct Snapshot {
    std::array<int64_t, kFsdpParamKindCount> held{};
    std::array<int64_t, kFsdpParamKindCount> peak{};
    std::array<double, kFsdpCollectiveCount> collective_seconds{};  // the histogram's _sum
    std::array<uint64_t, kFsdpCollectiveCount> collective_count{};  // and its _count
    std::array<double, kFsdpCollectiveCount> collective_bytes{};
    uint64_t prefetch_waits = 0;
    double prefetch_wait_seconds = 0;
  };
  Snapshot Read() const;

 private:
  FsdpMetrics() = default;

  struct Kind {
    std::atomic<int64_t> held{0};
    std::atomic<int64_t> peak{0};  // written under peak_mu_, read without it
    Gauge* held_gauge = nullptr;
    Gauge* peak_gauge = nullptr;
  };

  std::array<Kind, kFsdpParamKindCount> kinds_;
  std::mutex peak_mu_;
  std::array<Histogram*, kFsdpCollectiveCount> seconds_{};
  std::array<Counter*, kFsdpCollectiveCount> bytes_{};
  Counter* prefetch_waits_ = nullptr;
  Counter* prefetch_wait_seconds_ = nullptr;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_FSDP_METRICS_H_
