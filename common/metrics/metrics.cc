#include "common/metrics/metrics.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <set>
#include <type_traits>

namespace tessera {
namespace {

static_assert(std::atomic<double>::is_always_lock_free, "metric updates must be lock-free");

// std::atomic<double> has no fetch_add before C++20: compare-and-swap on the value's bits.
void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

bool IsValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return name.substr(0, 2) != "__";  // reserved for Prometheus' internal use
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// HELP text escapes backslash and newline; label values also escape the double quote.
void AppendEscaped(std::string_view text, bool escape_quote, std::string* out) {
  for (char c : text) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '"' && escape_quote) {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

// `{a="x",b="y"}`, with `le` last when given; empty when there are no labels at all.
std::string RenderLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values, const std::string* le) {
  if (names.empty() && le == nullptr) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i] + "=\"";
    AppendEscaped(values[i], /*escape_quote=*/true, &out);
    out += '"';
  }
  if (le != nullptr) out += (names.empty() ? "le=\"" : ",le=\"") + *le + '"';
  out += '}';
  return out;
}

void AppendSample(const std::string& name, std::string_view suffix, const std::string& labels,
                  double value, std::string* out) {
  *out += name;
  *out += suffix;
  *out += labels;
  *out += ' ';
  *out += FormatMetricValue(value);
  *out += '\n';
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) <= 9007199254740992.0) {  // 2^53: exact
    return std::to_string(static_cast<int64_t>(value));                        // -0 -> "0"
  }
  // Shortest round-trip digits, laid out like Go's strconv 'g' (what Prometheus itself
  // prints): fixed notation for decimal exponents -4..5, so 0.0001 rather than 1e-04.
  char buffer[64];
  char* end =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific).ptr;
  const char* exponent_text = std::find(buffer, end, 'e') + 1;  // "e-05", "e+06"
  if (*exponent_text == '+') ++exponent_text;                    // from_chars takes no '+'
  int exponent = 0;
  std::from_chars(exponent_text, end, exponent);
  if (exponent >= -4 && exponent < 6) {
    end = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed).ptr;
  }
  return std::string(buffer, end);
}

void Counter::Increment(double amount) {
  assert(amount >= 0 && "Counter::Increment: negative or NaN amount");
  if (!(amount >= 0)) return;  // optimised builds: keep the counter monotonic
  AtomicAdd(value_, amount);
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(bounds.size() + 1) {}

void Histogram::Observe(double value) {
  // Bucket i counts value <= bounds_[i]; the first such bound is the lower bound of value.
  size_t bucket = std::isnan(value)
                      ? bounds_.size()
                      : std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative_counts.reserve(counts_.size());
  for (const std::atomic<uint64_t>& count : counts_) {
    snapshot.count += count.load(std::memory_order_relaxed);
    snapshot.cumulative_counts.push_back(snapshot.count);
  }
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> DefaultLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

Status ValidateBuckets(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return InvalidArgumentError("bucket bound " + FormatMetricValue(bounds[i]) +
                                  " is not finite (+Inf is added automatically)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return InvalidArgumentError(
          "bucket bounds are not strictly increasing: " + FormatMetricValue(bounds[i - 1]) +
          " then " + FormatMetricValue(bounds[i]));
    }
  }
  return OkStatus();
}

MetricFamilyBase::MetricFamilyBase(std::string name, std::string help, MetricType type,
                                   std::vector<std::string> label_names, std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

Status MetricFamilyBase::CheckLabelCount(const std::vector<std::string>& label_values) const {
  if (label_values.size() == label_names_.size()) return OkStatus();
  return InvalidArgumentError("metric " + name_ + " has " + std::to_string(label_names_.size()) +
                              " labels (" + Join(label_names_) + ") but got " +
                              std::to_string(label_values.size()) + " values (" +
                              Join(label_values) + ")");
}

template <typename Metric>
StatusOr<Metric*> MetricFamily<Metric>::WithLabels(const std::vector<std::string>& label_values) {
  RETURN_IF_ERROR(CheckLabelCount(label_values));
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Metric>& child = children_[label_values];
  if (child == nullptr) {
    if constexpr (std::is_same_v<Metric, Histogram>) {
      child.reset(new Histogram(bounds_));
    } else {
      child = std::make_unique<Metric>();
    }
  }
  return child.get();
}

template <typename Metric>
void MetricFamily<Metric>::Render(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (children_.empty()) return;
  *out += "# HELP " + name_ + ' ';
  AppendEscaped(help_, /*escape_quote=*/false, out);
  *out += "\n# TYPE " + name_ + ' ' + std::string(TypeName(type_)) + '\n';
  for (const auto& [label_values, child] : children_) {
    if constexpr (std::is_same_v<Metric, Histogram>) {
      Histogram::Snapshot snapshot = child->Read();
      for (size_t i = 0; i <= bounds_.size(); ++i) {
        std::string le = i < bounds_.size() ? FormatMetricValue(bounds_[i]) : "+Inf";
        AppendSample(name_, "_bucket", RenderLabels(label_names_, label_values, &le),
                     static_cast<double>(snapshot.cumulative_counts[i]), out);
      }
      std::string labels = RenderLabels(label_names_, label_values, nullptr);
      AppendSample(name_, "_sum", labels, snapshot.sum, out);
      AppendSample(name_, "_count", labels, static_cast<double>(snapshot.count), out);
    } else {
      AppendSample(name_, "", RenderLabels(label_names_, label_values, nullptr), child->Value(),
                   out);
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

template <typename Family>
StatusOr<Family*> MetricsRegistry::Register(std::string_view name, std::string_view help,
                                            MetricType type, std::vector<std::string> label_names,
                                            std::vector<double> bounds) {
  std::string context = "metric " + std::string(name);
  if (!IsValidName(name, /*allow_colon=*/true)) {
    return InvalidArgumentError("invalid metric name '" + std::string(name) +
                                "' (expected [a-zA-Z_:][a-zA-Z0-9_:]*, not starting with __)");
  }
  std::set<std::string_view> seen;
  for (const std::string& label : label_names) {
    if (!IsValidName(label, /*allow_colon=*/false)) {
      return InvalidArgumentError(context + ": invalid label name '" + label +
                                  "' (expected [a-zA-Z_][a-zA-Z0-9_]*, not starting with __)");
    }
    if (type == MetricType::kHistogram && label == "le") {
      return InvalidArgumentError(context + ": label name 'le' is reserved for histogram buckets");
    }
    if (!seen.insert(label).second) {
      return InvalidArgumentError(context + ": duplicate label name '" + label + "'");
    }
  }
  RETURN_IF_ERROR(ValidateBuckets(bounds).WithContext(context));

  std::lock_guard<std::mutex> lock(mu_);
  for (const std::unique_ptr<MetricFamilyBase>& family : families_) {
    if (family->name_ != name) continue;
    if (family->type_ == type && family->help_ == help && family->label_names_ == label_names &&
        family->bounds_ == bounds) {
      return static_cast<Family*>(family.get());
    }
    return AlreadyExistsError(context + " is already registered as a " +
                              std::string(TypeName(family->type_)) + " with labels (" +
                              Join(family->label_names_) +
                              ") and a different type, help, labels or buckets");
  }
  std::unique_ptr<Family> family(new Family(std::string(name), std::string(help), type,
                                            std::move(label_names), std::move(bounds)));
  Family* result = family.get();
  if (result->label_names_.empty()) (void)result->WithLabels({});  // renders 0 from the start
  families_.push_back(std::move(family));
  return result;
}

StatusOr<CounterFamily*> MetricsRegistry::RegisterCounter(std::string_view name,
                                                          std::string_view help,
                                                          std::vector<std::string> label_names) {
  return Register<CounterFamily>(name, help, MetricType::kCounter, std::move(label_names), {});
}

StatusOr<GaugeFamily*> MetricsRegistry::RegisterGauge(std::string_view name, std::string_view help,
                                                      std::vector<std::string> label_names) {
  return Register<GaugeFamily>(name, help, MetricType::kGauge, std::move(label_names), {});
}

StatusOr<HistogramFamily*> MetricsRegistry::RegisterHistogram(std::string_view name,
                                                              std::string_view help,
                                                              std::vector<std::string> label_names,
                                                              std::vector<double> bucket_bounds) {
  return Register<HistogramFamily>(name, help, MetricType::kHistogram, std::move(label_names),
                                   std::move(bucket_bounds));
}

std::string MetricsRegistry::RenderText() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::unique_ptr<MetricFamilyBase>& family : families_) family->Render(&out);
  return out;
}

}  // namespace tessera
