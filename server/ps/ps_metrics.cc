#include "server/ps/ps_metrics.h"

#include "common/metrics/metric_names.h"

namespace tessera::server {

StatusOr<std::unique_ptr<PsMetrics>> PsMetrics::Register(MetricsRegistry* registry) {
  namespace names = metric_names;
  std::unique_ptr<PsMetrics> m(new PsMetrics());
  auto gauge = [&](const names::MetricName& name) -> StatusOr<Gauge*> {
    ASSIGN_OR_RETURN(GaugeFamily * family, registry->RegisterGauge(name.name, name.help));
    return family->WithLabels({});
  };
  ASSIGN_OR_RETURN(m->parameter_bytes_, gauge(names::kPsParameterBytes));
  ASSIGN_OR_RETURN(m->state_bytes_, gauge(names::kPsOptimizerStateBytes));
  ASSIGN_OR_RETURN(m->staleness_, gauge(names::kPsStaleness));
  ASSIGN_OR_RETURN(m->max_released_staleness_, gauge(names::kPsMaxReleasedStaleness));
  ASSIGN_OR_RETURN(m->waiting_, gauge(names::kPsWaitingRequests));
  ASSIGN_OR_RETURN(m->key_ranges_, gauge(names::kPsKeyRanges));
  ASSIGN_OR_RETURN(CounterFamily * updates,
                   registry->RegisterCounter(names::kPsUpdatesTotal.name,
                                             names::kPsUpdatesTotal.help, {"kind"}));
  ASSIGN_OR_RETURN(m->dense_updates_, updates->WithLabels({"dense"}));
  ASSIGN_OR_RETURN(m->sparse_updates_, updates->WithLabels({"sparse"}));
  ASSIGN_OR_RETURN(CounterFamily * bytes,
                   registry->RegisterCounter(names::kPsGradientBytesTotal.name,
                                             names::kPsGradientBytesTotal.help, {"kind"}));
  ASSIGN_OR_RETURN(m->dense_gradient_bytes_, bytes->WithLabels({"dense"}));
  ASSIGN_OR_RETURN(m->sparse_gradient_bytes_, bytes->WithLabels({"sparse"}));
  ASSIGN_OR_RETURN(CounterFamily * copies,
                   registry->RegisterCounter(names::kPsValuesCopiesTotal.name,
                                             names::kPsValuesCopiesTotal.help, {}));
  ASSIGN_OR_RETURN(m->values_copies_, copies->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * nonfinite,
                   registry->RegisterCounter(names::kPsNonFinitePushesTotal.name,
                                             names::kPsNonFinitePushesTotal.help, {"kind"}));
  ASSIGN_OR_RETURN(m->dense_nonfinite_, nonfinite->WithLabels({"dense"}));
  ASSIGN_OR_RETURN(m->sparse_nonfinite_, nonfinite->WithLabels({"sparse"}));
  ASSIGN_OR_RETURN(CounterFamily * skipped,
                   registry->RegisterCounter(names::kPsSkippedUpdatesTotal.name,
                                             names::kPsSkippedUpdatesTotal.help, {}));
  ASSIGN_OR_RETURN(m->skipped_updates_, skipped->WithLabels({}));
  ASSIGN_OR_RETURN(CounterFamily * repeated,
                   registry->RegisterCounter(names::kPsRepeatedRequestsTotal.name,
                                             names::kPsRepeatedRequestsTotal.help, {}));
  ASSIGN_OR_RETURN(m->repeated_requests_, repeated->WithLabels({}));
  return m;
}

void PsMetrics::NewJob(double parameter_bytes, double state_bytes) {
  parameter_bytes_->Set(parameter_bytes);
  state_bytes_->Set(state_bytes);
  std::lock_guard<std::mutex> lock(lead_mu_);
  max_lead_ = 0;
  max_released_staleness_->Set(0);
}

void PsMetrics::RecordReleasedLead(int64_t lead) {
  std::lock_guard<std::mutex> lock(lead_mu_);
  if (lead <= max_lead_) return;
  max_lead_ = lead;
  max_released_staleness_->Set(static_cast<double>(lead));
}

void PsMetrics::AddWaiting(int64_t delta) {
  const int64_t now = waiting_count_.fetch_add(delta) + delta;
  waiting_->Set(static_cast<double>(now));
}

}  // namespace tessera::server
