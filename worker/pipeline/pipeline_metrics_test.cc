#include "worker/pipeline/pipeline_metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace tessera::worker {
namespace {

std::unique_ptr<PipelineMetrics> MustRegister(MetricsRegistry* registry) {
  auto metrics = PipelineMetrics::Register(registry);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(metrics).value() : nullptr;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

// A 1F1B-like step of rank 0 of 2 with 2 micro-batches: F0 F1 B0 B1, idle between.
PipelineStepRecord TwoMicroBatches() {
  PipelineStepRecord step;
  step.start_unix_seconds = 1800000000.5;
  step.seconds = 1.0;
  step.actions = {{PipelineOp::kForward, 0, 0, 0.0, 0.125},
                  {PipelineOp::kForward, 0, 1, 0.125, 0.25},
                  {PipelineOp::kBackward, 0, 0, 0.5, 0.75},
                  {PipelineOp::kBackward, 0, 1, 0.75, 0.875}};
  step.activation_bytes_sent = 4096;
  step.gradient_bytes_sent = 0;
  step.peak_held = 2;
  return step;
}

TEST(PipelineMetricsTest, AStepSetsItsTimelineAndAddsBusyIdleAndBytes) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  ASSERT_NE(metrics, nullptr);
  metrics->SetSchedule(0, 2, 0.25);
  ASSERT_TRUE(metrics->RecordStep(TwoMicroBatches()).ok());
  ASSERT_TRUE(metrics->RecordStep(TwoMicroBatches()).ok());
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_pipeline_steps_total 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_busy_seconds_total{stage=\"0\"} 1.25")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_idle_seconds_total 0.75")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_sent_bytes_total{kind=\"activation\"} 8192")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_sent_bytes_total{kind=\"gradient\"} 0")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_micro_batches_held 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_micro_batches_held_bound 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_rank 0")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_bubble_formula 0.25")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_last_step_start_seconds 1.8000000005e+09")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_last_step_seconds 1")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_action_start_seconds{op=\"B\",stage=\"0\","
                        "micro_batch=\"1\"} 0.75")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_action_end_seconds{op=\"F\",stage=\"0\","
                        "micro_batch=\"0\"} 0.125")) << text;
}

TEST(PipelineMetricsTest, ActionsTheNextStepDidNotRunReadNaN) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  ASSERT_NE(metrics, nullptr);
  ASSERT_TRUE(metrics->RecordStep(TwoMicroBatches()).ok());
  PipelineStepRecord forward_only = TwoMicroBatches();
  forward_only.actions.resize(2);
  ASSERT_TRUE(metrics->RecordStep(forward_only).ok());
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_pipeline_action_start_seconds{op=\"B\",stage=\"0\","
                        "micro_batch=\"0\"} NaN")) << text;
  EXPECT_TRUE(Has(text, "tessera_pipeline_action_start_seconds{op=\"F\",stage=\"0\","
                        "micro_batch=\"1\"} 0.125")) << text;
}

TEST(PipelineMetricsTest, BadRecordsAreRefusedNamingTheActionAndRecordNothing) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  ASSERT_NE(metrics, nullptr);
  struct Case {
    TimedAction action;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{PipelineOp::kSendActivation, 1, 0, 0, 0.1},
       "pipeline step record: action 1SEND_F0 is not a compute action (F, B, I or W)"},
      {{PipelineOp::kForward, -1, 0, 0, 0.1},
       "pipeline step record: action -1F0 has a negative stage or micro-batch"},
      {{PipelineOp::kBackwardWeight, 2, 3, 0.5, 0.25},
       "pipeline step record: action 2W3 runs from 0.500000 s to 0.250000 s, outside the "
       "step's 0 to 1.000000 s"},
      {{PipelineOp::kForward, 0, 0, 0.5, 1.5},
       "pipeline step record: action 0F0 runs from 0.500000 s to 1.500000 s, outside the "
       "step's 0 to 1.000000 s"},
      {{PipelineOp::kForward, 0, 1, 0.0, 0.1},
       "pipeline step record: action 0F1 is listed twice"},
  };
  for (const Case& c : cases) {
    PipelineStepRecord step = TwoMicroBatches();
    step.actions.push_back(c.action);
    Status status = metrics->RecordStep(step);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
  PipelineStepRecord negative = TwoMicroBatches();
  negative.seconds = -1;
  EXPECT_EQ(metrics->RecordStep(negative).code(), StatusCode::kInvalidArgument);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_pipeline_steps_total 0")) << text;
  EXPECT_EQ(text.find("tessera_pipeline_action_start_seconds{"), std::string::npos) << text;
}

TEST(PipelineMetricsTest, TheActionSeriesAreBounded) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  ASSERT_NE(metrics, nullptr);
  PipelineStepRecord step;
  step.seconds = 1;
  for (int m = 0; m < static_cast<int>(PipelineMetrics::kMaxActionSeries); ++m) {
    step.actions.push_back({PipelineOp::kForward, 0, m, 0, 0});
  }
  ASSERT_TRUE(metrics->RecordStep(step).ok());
  step.actions = {{PipelineOp::kBackward, 0, 0, 0, 0}};
  Status status = metrics->RecordStep(step);
  EXPECT_EQ(status.message(),
            "pipeline step record: 4097 distinct actions would be kept, more than the 4096 "
            "the metrics page allows");
}

// Records and renders from two threads at once, so that TSan sees both sides of mu_.
TEST(PipelineMetricsTest, StepsFromTwoThreadsWhileThePageRenders) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  ASSERT_NE(metrics, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        EXPECT_TRUE(metrics->RecordStep(TwoMicroBatches()).ok());
        metrics->SetSchedule(1, 2, 0.25);
      }
    });
  }
  for (int i = 0; i < 50; ++i) registry.RenderText();
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(Has(registry.RenderText(), "tessera_pipeline_steps_total 400"));
}

}  // namespace
}  // namespace tessera::worker
