#include "server/ps/ps_metrics.h"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(PsMetricsTest, RegistersOnceAndRecordsWhatThePartsReport) {
  MetricsRegistry registry;
  auto metrics = PsMetrics::Register(&registry);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_TRUE(PsMetrics::Register(&registry).ok());  // idempotent
  PsMetrics& m = **metrics;
  m.NewJob(64, 128);
  m.DenseUpdate();
  m.DenseUpdate();
  m.SparseGradientBytes(8);
  m.AddWaiting(3);
  m.AddWaiting(-1);
  m.RecordReleasedLead(2);
  m.RecordReleasedLead(1);  // the largest stays
  m.SetStaleness(4);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_ps_parameter_bytes 64")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_optimizer_state_bytes 128")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_updates_total{kind=\"dense\"} 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_gradient_bytes_total{kind=\"sparse\"} 8")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_waiting_requests 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_max_released_staleness_steps 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_ps_staleness_steps 4")) << text;
  m.NewJob(0, 0);  // a new job's record starts again
  EXPECT_TRUE(Has(registry.RenderText(), "tessera_ps_max_released_staleness_steps 0"));
}

}  // namespace
}  // namespace tessera::server
