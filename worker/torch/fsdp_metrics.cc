#include "worker/torch/fsdp_metrics.h"

#include <string>

#include "common/metrics/metric_names.h"

namespace tessera::worker {
namespace {

constexpr std::string_view kKindNames[kFsdpParamKindCount] = {"shard", "gathered",
                                                              "gradient_shard", "full_gradient"};
constexpr std::string_view kCollectiveNames[kFsdpCollectiveCount] = {
    "all_gather", "reduce_scatter", "all_reduce"};

// "a, b or c".
template <size_t N>
std::string Allowed(const std::string_view (&names)[N]) {
  std::string allowed;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) allowed += i + 1 == N ? " or " : ", ";
    allowed += names[i];
  }
  return allowed;
}

}  // namespace

std::string_view FsdpParamKindName(FsdpParamKind kind) {
  return kKindNames[static_cast<size_t>(kind)];
}

std::string_view FsdpCollectiveName(FsdpCollective op) {
  return kCollectiveNames[static_cast<size_t>(op)];
}

StatusOr<FsdpParamKind> ParseFsdpParamKind(std::string_view name) {
  for (size_t i = 0; i < kFsdpParamKindCount; ++i) {
    if (name == kKindNames[i]) return static_cast<FsdpParamKind>(i);
  }
  return InvalidArgumentError("FSDP parameter bytes kind '" + std::string(name) +
                              "' is not one of " + Allowed(kKindNames));
}

StatusOr<FsdpCollective> ParseFsdpCollective(std::string_view name) {
  for (size_t i = 0; i < kFsdpCollectiveCount; ++i) {
    if (name == kCollectiveNames[i]) return static_cast<FsdpCollective>(i);
  }
  return InvalidArgumentError("FSDP collective op '" + std::string(name) + "' is not one of " +
                              Allowed(kCollectiveNames));
}

StatusOr<std::unique_ptr<FsdpMetrics>> FsdpMetrics::Register(MetricsRegistry* registry) {
  namespace names = metric_names;
  std::unique_ptr<FsdpMetrics> metrics(new FsdpMetrics());
  ASSIGN_OR_RETURN(GaugeFamily * held,
                   registry->RegisterGauge(names::kFsdpParamBytes.name,
                                           names::kFsdpParamBytes.help, {"kind"}));
  ASSIGN_OR_RETURN(GaugeFamily * peak,
                   registry->RegisterGauge(names::kFsdpParamPeakBytes.name,
                                           names::kFsdpParamPeakBytes.help, {"kind"}));
  ASSIGN_OR_RETURN(HistogramFamily * seconds,
                   registry->RegisterHistogram(names::kFsdpCollectiveSeconds.name,
                                               names::kFsdpCollectiveSeconds.help, {"op"},
                                               DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(CounterFamily * bytes,
                   registry->RegisterCounter(names::kFsdpCollectiveBytesTotal.name,
                                             names::kFsdpCollectiveBytesTotal.help, {"op"}));
  ASSIGN_OR_RETURN(CounterFamily * waits,
                   registry->RegisterCounter(names::kFsdpPrefetchWaitsTotal.name,
                                             names::kFsdpPrefetchWaitsTotal.help));
  ASSIGN_OR_RETURN(CounterFamily * wait_seconds,
                   registry->RegisterCounter(names::kFsdpPrefetchWaitSecondsTotal.name,
                                             names::kFsdpPrefetchWaitSecondsTotal.help));
  for (size_t kind = 0; kind < kFsdpParamKindCount; ++kind) {
    const std::string name(kKindNames[kind]);
    ASSIGN_OR_RETURN(metrics->kinds_[kind].held_gauge, held->WithLabels({name}));
    ASSIGN_OR_RETURN(metrics->kinds_[kind].peak_gauge, peak->WithLabels({name}));
  }
  for (size_t op = 0; op < kFsdpCollectiveCount; ++op) {
    const std::string name(kCollectiveNames[op]);
    ASSIGN_OR_RETURN(metrics->seconds_[op], seconds->WithLabels({name}));
    ASSIGN_OR_RETURN(metrics->bytes_[op], bytes->WithLabels({name}));
  }
  ASSIGN_OR_RETURN(metrics->prefetch_waits_, waits->WithLabels({}));
  ASSIGN_OR_RETURN(metrics->prefetch_wait_seconds_, wait_seconds->WithLabels({}));
  return metrics;
}

void FsdpMetrics::AddParamBytes(FsdpParamKind which, int64_t delta) {
  Kind& kind = kinds_[static_cast<size_t>(which)];
  const int64_t held = kind.held.fetch_add(delta, std::memory_order_relaxed) + delta;
  // Add, not Set: concurrent adds land in any order and the gauge still ends at the sum.
  kind.held_gauge->Add(static_cast<double>(delta));
  if (held <= kind.peak.load(std::memory_order_relaxed)) return;
  // A new peak: under the mutex, so that of two racing peaks the larger is the one left.
  std::lock_guard<std::mutex> lock(peak_mu_);
  if (held <= kind.peak.load(std::memory_order_relaxed)) return;
  kind.peak.store(held, std::memory_order_relaxed);
  kind.peak_gauge->Set(static_cast<double>(held));
}

void FsdpMetrics::ObserveCollective(FsdpCollective op, double seconds, uint64_t bytes) {
  const size_t i = static_cast<size_t>(op);
  seconds_[i]->Observe(seconds);
  bytes_[i]->Increment(static_cast<double>(bytes));
}

void FsdpMetrics::PrefetchWait(double seconds) {
  prefetch_waits_->Increment();
  prefetch_wait_seconds_->Increment(seconds);
}

void FsdpMetrics::ResetPeaks() {
  std::lock_guard<std::mutex> lock(peak_mu_);
  for (Kind& kind : kinds_) {
    const int64_t held = kind.held.load(std::memory_order_relaxed);
    kind.peak.store(held, std::memory_order_relaxed);
    kind.peak_gauge->Set(static_cast<double>(held));
  }
}

FsdpMetrics::Snapshot FsdpMetrics::Read() const {
  Snapshot snapshot;
  for (size_t kind = 0; kind < kFsdpParamKindCount; ++kind) {
    snapshot.held[kind] = kinds_[kind].held.load(std::memory_order_relaxed);
    snapshot.peak[kind] = kinds_[kind].peak.load(std::memory_order_relaxed);
  }
  for (size_t op = 0; op < kFsdpCollectiveCount; ++op) {
    const Histogram::Snapshot seconds = seconds_[op]->Read();
    snapshot.collective_seconds[op] = seconds.sum;
    snapshot.collective_count[op] = seconds.count;
    snapshot.collective_bytes[op] = bytes_[op]->Value();
  }
  snapshot.prefetch_waits = static_cast<uint64_t>(prefetch_waits_->Value());
  snapshot.prefetch_wait_seconds = prefetch_wait_seconds_->Value();
  return snapshot;
}

}  // namespace tessera::worker
