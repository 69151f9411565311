#include "worker/torch/fsdp_metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace tessera::worker {
namespace {

std::unique_ptr<FsdpMetrics> MustRegister(MetricsRegistry* registry) {
  auto metrics = FsdpMetrics::Register(registry);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(metrics).value() : nullptr;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(FsdpMetricsTest, NamesParseBackAndUnknownOnesNameTheAllowedValues) {
  for (auto kind : {FsdpParamKind::kShard, FsdpParamKind::kGathered,
                    FsdpParamKind::kGradientShard, FsdpParamKind::kFullGradient}) {
    auto parsed = ParseFsdpParamKind(FsdpParamKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  for (auto op : {FsdpCollective::kAllGather, FsdpCollective::kReduceScatter,
                  FsdpCollective::kAllReduce}) {
    auto parsed = ParseFsdpCollective(FsdpCollectiveName(op));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, op);
  }
  auto kind = ParseFsdpParamKind("gradients");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kind.status().message(),
            "FSDP parameter bytes kind 'gradients' is not one of shard, gathered, "
            "gradient_shard or full_gradient");
  auto op = ParseFsdpCollective("allgather");
  ASSERT_FALSE(op.ok());
  EXPECT_EQ(op.status().message(),
            "FSDP collective op 'allgather' is not one of all_gather, reduce_scatter or "
            "all_reduce");
}

TEST(FsdpMetricsTest, EverySeriesRendersZeroBeforeTheFirstCall) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  const std::string text = registry.RenderText();
  for (const char* kind : {"shard", "gathered", "gradient_shard", "full_gradient"}) {
    EXPECT_TRUE(Has(text, std::string("tessera_fsdp_param_bytes{kind=\"") + kind + "\"} 0"))
        << text;
    EXPECT_TRUE(Has(text, std::string("tessera_fsdp_param_peak_bytes{kind=\"") + kind + "\"} 0"));
  }
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    EXPECT_TRUE(Has(text, std::string("tessera_fsdp_collective_seconds_count{op=\"") + op +
                              "\"} 0"));
    EXPECT_TRUE(Has(text, std::string("tessera_fsdp_collective_bytes_total{op=\"") + op +
                              "\"} 0"));
  }
  EXPECT_TRUE(Has(text, "tessera_fsdp_prefetch_waits_total 0"));
  EXPECT_TRUE(Has(text, "tessera_fsdp_prefetch_wait_seconds_total 0"));
  EXPECT_NE(text.find("# TYPE tessera_fsdp_param_bytes gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE tessera_fsdp_collective_seconds histogram"), std::string::npos);
}

TEST(FsdpMetricsTest, HeldBytesGoUpAndDownAndThePeakKeepsTheMost) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  metrics->AddParamBytes(FsdpParamKind::kShard, 1000);
  metrics->AddParamBytes(FsdpParamKind::kGathered, 4000);   // unit 1 gathered
  metrics->AddParamBytes(FsdpParamKind::kGathered, 6000);   // unit 2 prefetched
  metrics->AddParamBytes(FsdpParamKind::kGathered, -4000);  // unit 1 resharded
  metrics->AddParamBytes(FsdpParamKind::kFullGradient, 4000);
  metrics->AddParamBytes(FsdpParamKind::kFullGradient, -4000);
  FsdpMetrics::Snapshot read = metrics->Read();
  EXPECT_EQ(read.held[0], 1000);
  EXPECT_EQ(read.peak[0], 1000);
  EXPECT_EQ(read.held[1], 6000);
  EXPECT_EQ(read.peak[1], 10000);
  EXPECT_EQ(read.held[2], 0);
  EXPECT_EQ(read.peak[2], 0);
  EXPECT_EQ(read.held[3], 0);
  EXPECT_EQ(read.peak[3], 4000);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_fsdp_param_bytes{kind=\"gathered\"} 6000")) << text;
  EXPECT_TRUE(Has(text, "tessera_fsdp_param_peak_bytes{kind=\"gathered\"} 10000")) << text;
  EXPECT_TRUE(Has(text, "tessera_fsdp_param_peak_bytes{kind=\"full_gradient\"} 4000")) << text;

  // A reset starts the next peak from what is held now.
  metrics->ResetPeaks();
  read = metrics->Read();
  EXPECT_EQ(read.peak[1], 6000);
  EXPECT_EQ(read.peak[3], 0);
  metrics->AddParamBytes(FsdpParamKind::kGathered, 1000);
  EXPECT_EQ(metrics->Read().peak[1], 7000);
  EXPECT_TRUE(Has(registry.RenderText(), "tessera_fsdp_param_peak_bytes{kind=\"gathered\"} 7000"));
}

TEST(FsdpMetricsTest, CollectivesAndPrefetchWaitsAccumulate) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  metrics->ObserveCollective(FsdpCollective::kAllGather, 0.002, 4096);
  metrics->ObserveCollective(FsdpCollective::kAllGather, 0.003, 4096);
  metrics->ObserveCollective(FsdpCollective::kReduceScatter, 0.5, 1 << 20);
  metrics->PrefetchWait(0.25);
  metrics->PrefetchWait(0.5);
  const FsdpMetrics::Snapshot read = metrics->Read();
  EXPECT_DOUBLE_EQ(read.collective_seconds[0], 0.005);
  EXPECT_EQ(read.collective_count[0], 2u);
  EXPECT_EQ(read.collective_bytes[0], 8192);
  EXPECT_EQ(read.collective_count[1], 1u);
  EXPECT_EQ(read.collective_count[2], 0u);
  EXPECT_EQ(read.prefetch_waits, 2u);
  EXPECT_DOUBLE_EQ(read.prefetch_wait_seconds, 0.75);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_fsdp_collective_seconds_count{op=\"all_gather\"} 2")) << text;
  EXPECT_TRUE(Has(text, "tessera_fsdp_collective_seconds_bucket{op=\"reduce_scatter\","
                        "le=\"0.5\"} 1")) << text;
  EXPECT_TRUE(Has(text, "tessera_fsdp_collective_bytes_total{op=\"reduce_scatter\"} 1048576"));
  EXPECT_TRUE(Has(text, "tessera_fsdp_prefetch_waits_total 2"));
  EXPECT_TRUE(Has(text, "tessera_fsdp_prefetch_wait_seconds_total 0.75"));
}

// Units on several threads gather and free at once: the held gauge ends at the sum and the
// peak is one some thread saw.
TEST(FsdpMetricsTest, ConcurrentUpdatesLoseNothing) {
  MetricsRegistry registry;
  auto metrics = MustRegister(&registry);
  constexpr int kThreads = 4;
  constexpr int kRounds = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < kRounds; ++i) {
        metrics->AddParamBytes(FsdpParamKind::kGathered, 100 + t);
        metrics->ObserveCollective(FsdpCollective::kAllGather, 0.001, 100 + t);
        metrics->AddParamBytes(FsdpParamKind::kGathered, -(100 + t));
      }
      metrics->AddParamBytes(FsdpParamKind::kShard, 10);
    });
  }
  for (std::thread& thread : threads) thread.join();
  const FsdpMetrics::Snapshot read = metrics->Read();
  EXPECT_EQ(read.held[1], 0);
  EXPECT_GE(read.peak[1], 103);
  EXPECT_LE(read.peak[1], 100 + 101 + 102 + 103);
  EXPECT_EQ(read.held[0], 10 * kThreads);
  EXPECT_EQ(read.collective_count[0], uint64_t{kThreads} * kRounds);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Has(text, "tessera_fsdp_param_bytes{kind=\"gathered\"} 0")) << text;
  EXPECT_TRUE(Has(text, "tessera_fsdp_param_peak_bytes{kind=\"gathered\"} " +
                            std::to_string(read.peak[1])));
}

TEST(FsdpMetricsTest, RegisteringTwiceInOneRegistryFindsTheSameFamilies) {
  MetricsRegistry registry;
  auto first = MustRegister(&registry);
  auto second = MustRegister(&registry);
  first->ObserveCollective(FsdpCollective::kAllReduce, 0.1, 8);
  EXPECT_EQ(second->Read().collective_count[2], 1u);
}

}  // namespace
}  // namespace tessera::worker
