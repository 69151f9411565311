// PsMetrics: the parameter server's metrics (common/metrics/metric_names.h, "Parameter
// server"), registered once by the service and updated by its parts.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SERVER_PS_PS_METRICS_H_
#define TESSERA_SERVER_PS_PS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "common/base/status.h"
#include "common/metrics/metrics.h"

namespace tessera::server {

class PsMetrics {
 public:
  // Registers the families in `registry` (idempotent, see MetricsRegistry), which must outlive
  // the result.
  static StatusOr<std::unique_ptr<PsMetrics>> Register(MetricsRegistry* registry);

  // A new job holds `parameter_bytes` of dense values and `state_bytes` of optimizer state;
  // the staleness record starts again.
  void NewJob(double parameter_bytes, double state_bytes);
  // This server holds `ranges` key ranges of the job (its own and its replicas).
  void SetKeyRanges(int ranges) { key_ranges_->Set(static_cast<double>(ranges)); }

  void DenseUpdate() { dense_updates_->Increment(); }
  void SparseUpdate() { sparse_updates_->Increment(); }
  void DenseGradientBytes(double bytes) { dense_gradient_bytes_->Increment(bytes); }
  void SparseGradientBytes(double bytes) { sparse_gradient_bytes_->Increment(bytes); }
  // A chunk's values were copied before an update: a reply still held them.
  void DenseValuesCopied() { values_copies_->Increment(); }
  // A push refused because a gradient held NaN or Inf.
  void DenseNonFinitePush() { dense_nonfinite_->Increment(); }
  void SparseNonFinitePush() { sparse_nonfinite_->Increment(); }
  // ps-sync: a chunk's update dropped because a worker skipped the step.
  void DenseUpdateSkipped() { skipped_updates_->Increment(); }
  // A request arrived again (resent or duplicated): served once.
  void RequestRepeated() { repeated_requests_->Increment(); }

  // ps-ssp: the current gap between the fastest and the slowest worker, and the lead of a
  // reply just released (the gauge keeps the largest).
  void SetStaleness(int64_t spread) { staleness_->Set(static_cast<double>(spread)); }
  void RecordReleasedLead(int64_t lead);

  // Dense replies held back by the consistency model: `delta` more (or fewer).
  void AddWaiting(int64_t delta);

 private:
  PsMetrics() = default;

  Gauge* parameter_bytes_ = nullptr;
  Gauge* state_bytes_ = nullptr;
  Gauge* staleness_ = nullptr;
  Gauge* max_released_staleness_ = nullptr;
  Gauge* waiting_ = nullptr;
  Gauge* key_ranges_ = nullptr;
  Counter* dense_updates_ = nullptr;
  Counter* sparse_updates_ = nullptr;
  Counter* dense_gradient_bytes_ = nullptr;
  Counter* sparse_gradient_bytes_ = nullptr;
  Counter* values_copies_ = nullptr;
  Counter* dense_nonfinite_ = nullptr;
  Counter* sparse_nonfinite_ = nullptr;
  Counter* skipped_updates_ = nullptr;
  Counter* repeated_requests_ = nullptr;

  std::mutex lead_mu_;
  int64_t max_lead_ = 0;  // guarded by lead_mu_ (so the gauge never moves down)
  std::atomic<int64_t> waiting_count_{0};
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_PS_METRICS_H_
