#include "common/metrics/metrics.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metric_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(FormatMetricValueTest, PrometheusSpelling) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(-7), "-7");
  EXPECT_EQ(FormatMetricValue(1e6), "1000000");
  EXPECT_EQ(FormatMetricValue(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(0.005), "0.005");
  EXPECT_EQ(FormatMetricValue(0.0001), "0.0001");
  EXPECT_EQ(FormatMetricValue(0.00001), "1e-05");
  EXPECT_EQ(FormatMetricValue(123456.5), "123456.5");
  EXPECT_EQ(FormatMetricValue(1234567.5), "1.2345675e+06");
  EXPECT_EQ(FormatMetricValue(-0.25), "-0.25");
  EXPECT_EQ(FormatMetricValue(0.001234), "0.001234");
  EXPECT_EQ(FormatMetricValue(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(FormatMetricValue(1763711304.125), "1.763711304125e+09");
  EXPECT_EQ(FormatMetricValue(2.5), "2.5");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(kInf), "+Inf");
  EXPECT_EQ(FormatMetricValue(-kInf), "-Inf");
  EXPECT_EQ(FormatMetricValue(kNaN), "NaN");
}

TEST(MetricsRegistryTest, RendersCounterWithoutLabelsFromTheStart) {
  MetricsRegistry registry;
  StatusOr<CounterFamily*> family = registry.RegisterCounter("a_total", "Things.");
  ASSERT_TRUE(family.ok()) << family.status();
  EXPECT_EQ(registry.RenderText(), "# HELP a_total Things.\n# TYPE a_total counter\na_total 0\n");
  (*family)->WithLabels({}).value()->Increment();
  (*family)->WithLabels({}).value()->Increment(2.5);
  EXPECT_EQ(registry.RenderText(), "# HELP a_total Things.\n# TYPE a_total counter\na_total 3.5\n");
}

TEST(MetricsRegistryTest, RendersLabelsSortedAndEscaped) {
  MetricsRegistry registry;
  CounterFamily* family =
      registry
          .RegisterCounter("msgs_total", "Help with \\ and\nnewline \"quoted\".", {"type", "peer"})
          .value();
  family->WithLabels({"push", "b"}).value()->Increment(3);
  family->WithLabels({"pull", "a\\b\"c\nd"}).value()->Increment();
  EXPECT_EQ(registry.RenderText(),
            "# HELP msgs_total Help with \\\\ and\\nnewline \"quoted\".\n"
            "# TYPE msgs_total counter\n"
            "msgs_total{type=\"pull\",peer=\"a\\\\b\\\"c\\nd\"} 1\n"
            "msgs_total{type=\"push\",peer=\"b\"} 3\n");
}

TEST(MetricsRegistryTest, RendersGauges) {
  MetricsRegistry registry;
  GaugeFamily* members = registry.RegisterGauge("members", "Members.", {"role"}).value();
  Gauge* servers = members->WithLabels({"server"}).value();
  servers->Set(4);
  servers->Add(-1.5);
  members->WithLabels({"a"}).value()->Set(kNaN);
  members->WithLabels({"b"}).value()->Set(-kInf);
  members->WithLabels({"c"}).value()->Set(kInf);
  EXPECT_EQ(servers->Value(), 2.5);
  EXPECT_EQ(registry.RenderText(),
            "# HELP members Members.\n# TYPE members gauge\n"
            "members{role=\"a\"} NaN\n"
            "members{role=\"b\"} -Inf\n"
            "members{role=\"c\"} +Inf\n"
            "members{role=\"server\"} 2.5\n");
}

TEST(MetricsRegistryTest, RendersHistogramBucketsCumulatively) {
  MetricsRegistry registry;
  HistogramFamily* family =
      registry.RegisterHistogram("lat_seconds", "Latency.", {"op"}, {0.005, 0.1, 1}).value();
  Histogram* h = family->WithLabels({"push"}).value();
  h->Observe(0.005);  // le is inclusive
  h->Observe(0.05);
  h->Observe(0.05);
  h->Observe(3);
  h->Observe(kInf);
  EXPECT_EQ(registry.RenderText(),
            "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{op=\"push\",le=\"0.005\"} 1\n"
            "lat_seconds_bucket{op=\"push\",le=\"0.1\"} 3\n"
            "lat_seconds_bucket{op=\"push\",le=\"1\"} 3\n"
            "lat_seconds_bucket{op=\"push\",le=\"+Inf\"} 5\n"
            "lat_seconds_sum{op=\"push\"} +Inf\n"
            "lat_seconds_count{op=\"push\"} 5\n");
}

TEST(MetricsRegistryTest, RendersHistogramWithoutLabels) {
  MetricsRegistry registry;
  Histogram* h = registry.RegisterHistogram("wait_seconds", "Wait.", {}, {1, 2.5})
                     .value()
                     ->WithLabels({})
                     .value();
  h->Observe(2);
  h->Observe(0.25);
  h->Observe(kNaN);  // +Inf bucket, sum NaN
  Histogram::Snapshot snapshot = h->Read();
  EXPECT_EQ(snapshot.cumulative_counts, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(registry.RenderText(),
            "# HELP wait_seconds Wait.\n# TYPE wait_seconds histogram\n"
            "wait_seconds_bucket{le=\"1\"} 1\n"
            "wait_seconds_bucket{le=\"2.5\"} 2\n"
            "wait_seconds_bucket{le=\"+Inf\"} 3\n"
            "wait_seconds_sum NaN\n"
            "wait_seconds_count 3\n");
}

TEST(MetricsRegistryTest, FamiliesInRegistrationOrderAndEmptyOnesLeftOut) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.RegisterGauge("zeta", "Z.").ok());
  ASSERT_TRUE(registry.RegisterCounter("labelled_total", "No child yet.", {"x"}).ok());
  ASSERT_TRUE(registry.RegisterCounter("alpha_total", "A.").ok());
  EXPECT_EQ(registry.RenderText(),
            "# HELP zeta Z.\n# TYPE zeta gauge\nzeta 0\n"
            "# HELP alpha_total A.\n# TYPE alpha_total counter\nalpha_total 0\n");
}

TEST(MetricsRegistryTest, RejectsInvalidMetricNames) {
  MetricsRegistry registry;
  for (const char* name : {"", "1abc", "a-b", "a b", "__reserved", "é"}) {
    StatusOr<CounterFamily*> family = registry.RegisterCounter(name, "h");
    ASSERT_FALSE(family.ok()) << name;
    EXPECT_EQ(family.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(family.status().message(), HasSubstr("'" + std::string(name) + "'"));
  }
  EXPECT_TRUE(registry.RegisterCounter("ns:sub_total", "Colons are allowed.").ok());
  EXPECT_TRUE(registry.RegisterCounter("_x9_total", "h").ok());
}

TEST(MetricsRegistryTest, RejectsInvalidLabelNames) {
  MetricsRegistry registry;
  for (const char* label : {"", "a:b", "1a", "__name__", "a-b"}) {
    StatusOr<GaugeFamily*> family = registry.RegisterGauge("g", "h", {"ok", label});
    ASSERT_FALSE(family.ok()) << label;
    EXPECT_EQ(family.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(family.status().message(), HasSubstr("'" + std::string(label) + "'"));
  }
  StatusOr<GaugeFamily*> duplicate = registry.RegisterGauge("g", "h", {"a", "a"});
  EXPECT_THAT(duplicate.status().message(), HasSubstr("duplicate label name 'a'"));
  StatusOr<HistogramFamily*> le = registry.RegisterHistogram("h", "h", {"le"}, {1});
  EXPECT_THAT(le.status().message(), HasSubstr("'le'"));
  EXPECT_TRUE(registry.RegisterGauge("g", "h", {"le"}).ok());  // reserved in histograms only
}

TEST(MetricsRegistryTest, RejectsBadBuckets) {
  MetricsRegistry registry;
  for (const std::vector<double>& bounds :
       std::vector<std::vector<double>>{{1, 1}, {2, 1}, {1, kInf}, {kNaN}, {-kInf, 0}}) {
    StatusOr<HistogramFamily*> family = registry.RegisterHistogram("h_seconds", "h", {}, bounds);
    ASSERT_FALSE(family.ok());
    EXPECT_EQ(family.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(family.status().message(), HasSubstr("metric h_seconds"));
  }
  EXPECT_TRUE(ValidateBuckets(DefaultLatencyBuckets()).ok());
  EXPECT_TRUE(ValidateBuckets({}).ok());
}

TEST(MetricsRegistryTest, WrongLabelCountNamesTheFamily) {
  MetricsRegistry registry;
  GaugeFamily* family = registry.RegisterGauge("fleet_members", "h", {"role", "state"}).value();
  StatusOr<Gauge*> child = family->WithLabels({"server"});
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(child.status().message(), HasSubstr("fleet_members"));
  EXPECT_THAT(child.status().message(), HasSubstr("role, state"));
  EXPECT_FALSE(family->WithLabels({"a", "b", "c"}).ok());
}

TEST(MetricsRegistryTest, ChildrenAreStable) {
  MetricsRegistry registry;
  CounterFamily* family = registry.RegisterCounter("c_total", "h", {"k"}).value();
  Counter* a = family->WithLabels({"a"}).value();
  for (int i = 0; i < 100; ++i) family->WithLabels({std::to_string(i)}).value()->Increment();
  EXPECT_EQ(family->WithLabels({"a"}).value(), a);
}

TEST(MetricsRegistryTest, IdenticalReRegistrationReturnsTheSameFamily) {
  MetricsRegistry registry;
  CounterFamily* first = registry.RegisterCounter("x_total", "X.", {"a"}).value();
  EXPECT_EQ(registry.RegisterCounter("x_total", "X.", {"a"}).value(), first);
  HistogramFamily* h = registry.RegisterHistogram("h_seconds", "H.", {}, {1, 2}).value();
  EXPECT_EQ(registry.RegisterHistogram("h_seconds", "H.", {}, {1, 2}).value(), h);

  std::vector<Status> conflicts = {
      registry.RegisterCounter("x_total", "Other help.", {"a"}).status(),
      registry.RegisterCounter("x_total", "X.", {"b"}).status(),
      registry.RegisterCounter("x_total", "X.").status(),
      registry.RegisterGauge("x_total", "X.", {"a"}).status(),
      registry.RegisterHistogram("h_seconds", "H.", {}, {1, 3}).status(),
  };
  for (const Status& status : conflicts) {
    EXPECT_EQ(status.code(), StatusCode::kAlreadyExists) << status;
    EXPECT_THAT(status.message(), HasSubstr("is already registered"));
  }
  // The rendering has each family once.
  EXPECT_EQ(registry.RenderText().find("# TYPE x_total"),
            registry.RenderText().rfind("# TYPE x_total"));
}

#ifndef NDEBUG
TEST(CounterDeathTest, NegativeIncrementIsABug) {
  Counter counter;
  EXPECT_DEATH(counter.Increment(-1), "negative");
}
#endif

TEST(MetricsRegistryTest, ConcurrentUpdatesSumExactly) {
  MetricsRegistry registry;
  CounterFamily* counters = registry.RegisterCounter("ops_total", "h", {"t"}).value();
  GaugeFamily* gauges = registry.RegisterGauge("level", "h").value();
  HistogramFamily* histograms =
      registry.RegisterHistogram("lat_seconds", "h", {"t"}, DefaultLatencyBuckets()).value();
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* shared = counters->WithLabels({"shared"}).value();
      Counter* own = counters->WithLabels({std::to_string(t)}).value();
      Gauge* level = gauges->WithLabels({}).value();
      Histogram* latency = histograms->WithLabels({"x"}).value();
      for (int i = 0; i < kIterations; ++i) {
        shared->Increment();
        own->Increment(2);
        level->Add(1);
        latency->Observe(0.5);
        if (i % 5000 == 0) (void)registry.RenderText();  // readers race with writers
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counters->WithLabels({"shared"}).value()->Value(), kThreads * kIterations);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(counters->WithLabels({std::to_string(t)}).value()->Value(), 2 * kIterations);
  }
  EXPECT_EQ(gauges->WithLabels({}).value()->Value(), kThreads * kIterations);
  Histogram::Snapshot snapshot = histograms->WithLabels({"x"}).value()->Read();
  EXPECT_EQ(snapshot.count, static_cast<uint64_t>(kThreads * kIterations));
  EXPECT_EQ(snapshot.sum, 0.5 * kThreads * kIterations);
}

// Every metric in metric_names.h with its type and labels, plus edge-case values.
void PopulateWithAllMetrics(MetricsRegistry* registry) {
  namespace names = metric_names;
  auto counter = [&](const names::MetricName& m, std::vector<std::string> labels) {
    return registry->RegisterCounter(m.name, m.help, std::move(labels)).value();
  };
  auto gauge = [&](const names::MetricName& m, std::vector<std::string> labels) {
    return registry->RegisterGauge(m.name, m.help, std::move(labels)).value();
  };
  auto histogram = [&](const names::MetricName& m, std::vector<std::string> labels) {
    return registry->RegisterHistogram(m.name, m.help, std::move(labels), DefaultLatencyBuckets())
        .value();
  };
  counter(names::kBadMessagesTotal, {"reason"})
      ->WithLabels({"bad \"version\"\n"})
      .value()
      ->Increment();
  counter(names::kMessagesReceivedTotal, {"type"})->WithLabels({"push"}).value()->Increment(7);
  counter(names::kMessagesSentTotal, {"type"})->WithLabels({"pull"}).value()->Increment(3);
  counter(names::kBytesReceivedTotal, {})->WithLabels({}).value()->Increment(1e12);
  counter(names::kBytesSentTotal, {})->WithLabels({}).value()->Increment(1.5e300);
  counter(names::kSendFailuresTotal, {})->WithLabels({}).value()->Increment(2);
  histogram(names::kRpcLatencySeconds, {"type"})->WithLabels({"push"}).value()->Observe(0.003);
  gauge(names::kProcessStartTimeSeconds, {})->WithLabels({}).value()->Set(1763711304.123);
  gauge(names::kBuildInfo, {"role", "version"})->WithLabels({"worker", "0.1.0"}).value()->Set(1);
  GaugeFamily* members = gauge(names::kFleetMembers, {"role", "state"});
  members->WithLabels({"server", "alive"}).value()->Set(2);
  members->WithLabels({"worker", "failed"}).value()->Set(kNaN);
  counter(names::kHeartbeatsReceivedTotal, {})->WithLabels({}).value()->Increment(10);
  counter(names::kFailuresDetectedTotal, {"role"})->WithLabels({"worker\\1"}).value()->Increment();
  Histogram* barrier = histogram(names::kBarrierWaitSeconds, {})->WithLabels({}).value();
  barrier->Observe(0.0001);
  barrier->Observe(12);
  gauge(names::kPsParameterBytes, {})->WithLabels({}).value()->Set(4e6);
  gauge(names::kPsOptimizerStateBytes, {})->WithLabels({}).value()->Set(8e6);
  counter(names::kPsUpdatesTotal, {"kind"})->WithLabels({"dense"}).value()->Increment(3);
  counter(names::kPsGradientBytesTotal, {"kind"})->WithLabels({"sparse"}).value()->Increment(64);
  gauge(names::kPsStaleness, {})->WithLabels({}).value()->Set(2);
  gauge(names::kPsMaxReleasedStaleness, {})->WithLabels({}).value()->Set(3);
  gauge(names::kPsWaitingRequests, {})->WithLabels({}).value()->Set(1);
  histogram(names::kPsClientLatencySeconds, {"op"})->WithLabels({"push_pull"}).value()->Observe(0.01);
  counter(names::kPsClientBytesSentTotal, {"op"})->WithLabels({"push_pull"}).value()->Increment(8);
  counter(names::kPsClientBytesReceivedTotal, {"op"})->WithLabels({"sparse_pull"}).value()->Increment(8);
  histogram(names::kCollectiveSeconds, {"op", "size_class"})
      ->WithLabels({"allreduce", "<1MiB"})
      .value()
      ->Observe(0.002);
  counter(names::kCollectiveBytesTotal, {"op"})->WithLabels({"allreduce"}).value()->Increment(4096);
  counter(names::kCollectiveErrorsTotal, {"op"})->WithLabels({"recv"}).value()->Increment();
  gauge(names::kDdpBucketsInFlight, {})->WithLabels({}).value()->Set(2);
  gauge(names::kDdpOverlapRatio, {})->WithLabels({}).value()->Set(0.75);
  histogram(names::kDdpWaitSeconds, {})->WithLabels({}).value()->Observe(0.001);
  gauge(names::kModelStateBytes, {"kind"})->WithLabels({"optimizer_state"}).value()->Set(8e6);
  gauge(names::kModelStatePeakBytes, {"kind"})->WithLabels({"parameters"}).value()->Set(9e6);
  gauge(names::kFsdpParamBytes, {"kind"})->WithLabels({"gathered"}).value()->Set(4096);
  gauge(names::kFsdpParamPeakBytes, {"kind"})->WithLabels({"full_gradient"}).value()->Set(8192);
  histogram(names::kFsdpCollectiveSeconds, {"op"})
      ->WithLabels({"reduce_scatter"})
      .value()
      ->Observe(0.004);
  counter(names::kFsdpCollectiveBytesTotal, {"op"})
      ->WithLabels({"all_gather"})
      .value()
      ->Increment(8);
  counter(names::kFsdpPrefetchWaitsTotal, {})->WithLabels({}).value()->Increment(2);
  counter(names::kFsdpPrefetchWaitSecondsTotal, {})->WithLabels({}).value()->Increment(0.01);
  gauge(names::kTrainStep, {})->WithLabels({}).value()->Set(10);
  gauge(names::kTrainLoss, {})->WithLabels({}).value()->Set(0.5);
  counter(names::kTrainSamplesTotal, {})->WithLabels({}).value()->Increment(640);
  histogram(names::kTrainStepPhaseSeconds, {"phase"})->WithLabels({"compute"}).value()->Observe(0.01);
  gauge(names::kTrainEvalAccuracy, {})->WithLabels({}).value()->Set(0.9);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

TEST(MetricsRegistryTest, PromtoolAcceptsTheExposition) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  ASSERT_EQ(std::system((std::string("test -x ") + kPromtool).c_str()), 0)
      << kPromtool << " is missing: install Debian's prometheus package (the project's setup "
      << "scripts do); this test needs the real promtool";
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmpdir, nullptr) << "TEST_TMPDIR is not set; run under bazel test";

  MetricsRegistry registry;
  PopulateWithAllMetrics(&registry);
  std::string exposition_path = std::string(tmpdir) + "/metrics.txt";
  std::string output_path = std::string(tmpdir) + "/promtool.out";
  {
    std::ofstream out(exposition_path);
    out << registry.RenderText();
  }
  std::string command = std::string(kPromtool) + " check metrics < " + exposition_path + " > " +
                        output_path + " 2>&1";
  int rc = std::system(command.c_str());
  std::string output = ReadFile(output_path);
  ASSERT_TRUE(WIFEXITED(rc)) << command;
  EXPECT_EQ(WEXITSTATUS(rc), 0) << "promtool output:\n"
                                << output << "\nexposition:\n"
                                << registry.RenderText();
  EXPECT_EQ(output, "") << "promtool reported problems";
}

}  // namespace
}  // namespace tessera
