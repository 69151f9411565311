#include "worker/torch/backend_metrics.h"

#include <string>

#include "common/metrics/metric_names.h"

namespace tessera::worker {
namespace {

constexpr std::string_view kOpNames[kTorchOpCount] = {
    "allreduce", "broadcast",      "reduce",   "allgather", "gather", "scatter",
    "reduce_scatter", "alltoall", "barrier", "send",      "recv"};
constexpr const char* kSizeClasses[] = {"<64KiB", "<1MiB", "<16MiB", ">=16MiB"};

int SizeClass(size_t bytes) {
  if (bytes < (size_t{64} << 10)) return 0;
  if (bytes < (size_t{1} << 20)) return 1;
  if (bytes < (size_t{16} << 20)) return 2;
  return 3;
}

}  // namespace

std::string_view TorchOpName(TorchOp op) { return kOpNames[static_cast<size_t>(op)]; }

StatusOr<std::unique_ptr<BackendMetrics>> BackendMetrics::Register(MetricsRegistry* registry) {
  namespace names = metric_names;
  std::unique_ptr<BackendMetrics> metrics(new BackendMetrics());
  ASSIGN_OR_RETURN(HistogramFamily * seconds,
                   registry->RegisterHistogram(names::kCollectiveSeconds.name,
                                               names::kCollectiveSeconds.help,
                                               {"op", "size_class"}, DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(CounterFamily * bytes,
                   registry->RegisterCounter(names::kCollectiveBytesTotal.name,
                                             names::kCollectiveBytesTotal.help, {"op"}));
  ASSIGN_OR_RETURN(CounterFamily * errors,
                   registry->RegisterCounter(names::kCollectiveErrorsTotal.name,
                                             names::kCollectiveErrorsTotal.help, {"op"}));
  for (size_t op = 0; op < kTorchOpCount; ++op) {
    const std::string name(kOpNames[op]);
    for (int size_class = 0; size_class < 4; ++size_class) {
      ASSIGN_OR_RETURN(metrics->seconds_[op][size_class],
                       seconds->WithLabels({name, kSizeClasses[size_class]}));
    }
    ASSIGN_OR_RETURN(metrics->bytes_[op], bytes->WithLabels({name}));
    ASSIGN_OR_RETURN(metrics->errors_[op], errors->WithLabels({name}));
  }
  return metrics;
}

void BackendMetrics::Record(TorchOp op, size_t bytes, double seconds, bool ok) {
  const size_t i = static_cast<size_t>(op);
  seconds_[i][SizeClass(bytes)]->Observe(seconds);
  bytes_[i]->Increment(static_cast<double>(bytes));
  if (!ok) errors_[i]->Increment();
}

}  // namespace tessera::worker
