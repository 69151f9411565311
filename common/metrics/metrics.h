// The Prometheus metrics registry: counters, gauges and histograms with labels, rendered in
// the text exposition format 0.0.4.
//
//   MetricsRegistry registry;                       // one per process, owned by the runtime
//   ASSIGN_OR_RETURN(CounterFamily* sent,
//                    registry.RegisterCounter("tessera_messages_sent_total", "...", {"type"}));
//   ASSIGN_OR_RETURN(Counter* pushes, sent->WithLabels({"push"}));
//   pushes->Increment();                            // hot path: one atomic operation
//
// A family is a metric name with help text and a fixed list of label names; it has one child
// per distinct list of label values. Families and children are never removed, so the pointers
// handed out stay valid for the registry's lifetime. Keep label values low-cardinality (role,
// rank, op, peer), never tensor names or keys.
//
// Thread-safety: everything is thread-safe. Updating a child (Increment, Set, Add, Observe) is
// lock-free and does no lookup; registering a family or looking up a child takes a mutex, so
// look children up once and keep the pointer.
#ifndef TESSERA_COMMON_METRICS_METRICS_H_
#define TESSERA_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tessera {

enum class MetricType { kCounter, kGauge, kHistogram };

// A value that only goes up (events, bytes).
class Counter {
 public:
  // REQUIRES: amount >= 0 (a negative increment is a bug: asserted in debug builds, ignored
  // in optimised ones).
  void Increment(double amount = 1);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (members, queue depth, a timestamp).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into buckets with fixed upper bounds (`le`, inclusive); the last bucket,
// +Inf, is implicit. A NaN observation lands in +Inf and makes the sum NaN, as in Prometheus.
class Histogram {
 public:
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Buckets are read one by one while others may observe: the counts are consistent with
  // each other (cumulative, count == +Inf bucket) but the sum may be off by in-flight ones.
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  template <typename Metric>
  friend class MetricFamily;
  explicit Histogram(const std::vector<double>& bounds);  // REQUIRES: ValidateBuckets(bounds)

  const std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> counts_;  // per bucket, not cumulative; size bounds_+1
  std::atomic<double> sum_{0};
};

// Latency buckets in seconds, 100 us .. 10 s (1, 2.5, 5 steps per decade).
std::vector<double> DefaultLatencyBuckets();

// OK when `bounds` are finite and strictly increasing (an empty list is valid: +Inf only).
Status ValidateBuckets(const std::vector<double>& bounds);

// Common part of a family: its identity, label names and the checks on label values.
class MetricFamilyBase {
 public:
  virtual ~MetricFamilyBase() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }

 protected:
  MetricFamilyBase(std::string name, std::string help, MetricType type,
                   std::vector<std::string> label_names, std::vector<double> bounds);
  Status CheckLabelCount(const std::vector<std::string>& label_values) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only

 private:
  friend class MetricsRegistry;
  virtual void Render(std::string* out) const = 0;  // samples of every child
};

template <typename Metric>
class MetricFamily final : public MetricFamilyBase {
 public:
  // Returns the child for `label_values` (one per label name, in order), creating it on first
  // use. InvalidArgument naming the family if the count is wrong. Takes the family's mutex.
  StatusOr<Metric*> WithLabels(const std::vector<std::string>& label_values);

 private:
  friend class MetricsRegistry;
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names, std::vector<double> bounds)
      : MetricFamilyBase(std::move(name), std::move(help), type, std::move(label_names),
                         std::move(bounds)) {}
  void Render(std::string* out) const override;

  mutable std::mutex mu_;
  // Sorted by label values, which makes the rendering deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;  // guarded by mu_
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;
extern template class MetricFamily<Counter>;
extern template class MetricFamily<Gauge>;
extern template class MetricFamily<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family, or returns the existing one if a family of that name was registered
  // with the same type, help, label names (and buckets), so modules can register
  // idempotently. AlreadyExists if the name is taken by a different family; InvalidArgument
  // naming the bad name for an invalid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or label name
  // ([a-zA-Z_][a-zA-Z0-9_]*, no duplicates); names starting with "__" are reserved. A family
  // without labels has its one child from the start, so it renders 0 before the first update.
  StatusOr<CounterFamily*> RegisterCounter(std::string_view name, std::string_view help,
                                           std::vector<std::string> label_names = {});
  StatusOr<GaugeFamily*> RegisterGauge(std::string_view name, std::string_view help,
                                       std::vector<std::string> label_names = {});
  // Also InvalidArgument for bad buckets (see ValidateBuckets) or a label named "le".
  StatusOr<HistogramFamily*> RegisterHistogram(std::string_view name, std::string_view help,
                                               std::vector<std::string> label_names,
                                               std::vector<double> bucket_bounds);

  // The text exposition format 0.0.4: families in registration order, children sorted by
  // label values; families that have no child yet are left out.
  std::string RenderText() const;

 private:
  template <typename Family>
  StatusOr<Family*> Register(std::string_view name, std::string_view help, MetricType type,
                             std::vector<std::string> label_names, std::vector<double> bounds);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamilyBase>> families_;  // guarded by mu_
};

// Prometheus number formatting: integers without exponent where exact, else the shortest
// round-trip form; "NaN", "+Inf", "-Inf". Exposed for tests and for the `le` label.
std::string FormatMetricValue(double value);

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_METRICS_H_
