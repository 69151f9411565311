#include "coordinator/dashboard.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/metrics/metric_names.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"

namespace tessera::coordinator {
namespace {

namespace names = metric_names;
using nlohmann::json;

// The metrics a training worker exports, in a registry of its own, served over HTTP like a
// real process's.
class FakeProcess {
 public:
  explicit FakeProcess(bool worker) {
    auto gauge = [this](const names::MetricName& name, std::vector<std::string> labels = {}) {
      return registry_.RegisterGauge(name.name, name.help, std::move(labels)).value();
    };
    auto counter = [this](const names::MetricName& name, std::vector<std::string> labels = {}) {
      return registry_.RegisterCounter(name.name, name.help, std::move(labels)).value();
    };
    sent_ = counter(names::kBytesSentTotal)->WithLabels({}).value();
    received_ = counter(names::kBytesReceivedTotal)->WithLabels({}).value();
    if (worker) {
      step_ = gauge(names::kTrainStep)->WithLabels({}).value();
      loss_ = gauge(names::kTrainLoss)->WithLabels({}).value();
      samples_ = counter(names::kTrainSamplesTotal)->WithLabels({}).value();
      auto phases = registry_
                        .RegisterHistogram(names::kTrainStepPhaseSeconds.name,
                                           names::kTrainStepPhaseSeconds.help, {"phase"},
                                           {0.001, 0.01, 0.1, 1})
                        .value();
      for (const char* phase : {"data", "compute", "engine"}) {
        phases_[phase] = phases->WithLabels({phase}).value();
      }
      auto to_servers = counter(names::kPsClientBytesSentTotal, {"op"});
      to_servers->WithLabels({"push_pull"}).value()->Increment(1000);
      to_servers->WithLabels({"init"}).value()->Increment(24);
    } else {
      gauge(names::kPsParameterBytes)->WithLabels({}).value()->Set(4096);
      gauge(names::kPsOptimizerStateBytes)->WithLabels({}).value()->Set(8192);
    }
    http_ = MetricsHttpServer::Start(MetricsHttpOptions{}, &registry_).value();
  }

  // One training step of `compute_seconds` (plus 1 ms of data and of engine time).
  void Step(double loss, double compute_seconds) {
    step_->Set(step_->Value() + 1);
    loss_->Set(loss);
    samples_->Increment(32);
    phases_["data"]->Observe(0.001);
    phases_["compute"]->Observe(compute_seconds);
    phases_["engine"]->Observe(0.001);
    sent_->Increment(4096);
    received_->Increment(2048);
  }

  std::string url() const { return http_->url(); }

  // The series a torch rank training with tessera.torch.fsdp exports (as
  // worker/torch/fsdp_metrics.h registers them), after a few of its calls.
  void ExportFsdp() {
    auto gauges = [this](const names::MetricName& name) {
      return registry_.RegisterGauge(name.name, name.help, {"kind"}).value();
    };
    auto held = gauges(names::kFsdpParamBytes);
    auto peak = gauges(names::kFsdpParamPeakBytes);
    for (const char* kind : {"shard", "gathered", "gradient_shard", "full_gradient"}) {
      held->WithLabels({kind}).value();
      peak->WithLabels({kind}).value();
    }
    // Six significant digits, which the JSON keeps exactly.
    held->WithLabels({"shard"}).value()->Set(524288);
    peak->WithLabels({"shard"}).value()->Set(524288);
    peak->WithLabels({"gathered"}).value()->Set(262144);
    auto seconds = registry_
                       .RegisterHistogram(names::kFsdpCollectiveSeconds.name,
                                          names::kFsdpCollectiveSeconds.help, {"op"},
                                          {0.001, 0.01, 0.1, 1})
                       .value();
    seconds->WithLabels({"all_gather"}).value()->Observe(0.02);
    seconds->WithLabels({"all_gather"}).value()->Observe(0.04);
    seconds->WithLabels({"reduce_scatter"}).value()->Observe(0.05);
    seconds->WithLabels({"all_reduce"}).value();
    registry_.RegisterCounter(names::kFsdpPrefetchWaitsTotal.name,
                              names::kFsdpPrefetchWaitsTotal.help)
        .value()->WithLabels({}).value()->Increment(3);
    registry_.RegisterCounter(names::kFsdpPrefetchWaitSecondsTotal.name,
                              names::kFsdpPrefetchWaitSecondsTotal.help)
        .value()->WithLabels({}).value()->Increment(0.25);
  }

  // The series of a pipeline rank (as worker/pipeline/pipeline_metrics.h registers them) after
  // one step of rank 1: F0 from 0.25 s to 0.5 s, B0 from 0.5 s to 1 s of a 1 s step.
  void ExportPipeline() {
    auto gauge = [this](const names::MetricName& name, double value) {
      registry_.RegisterGauge(name.name, name.help).value()->WithLabels({}).value()->Set(value);
    };
    gauge(names::kPipelineRank, 1);
    gauge(names::kPipelineMicroBatchesHeld, 2);
    gauge(names::kPipelineMicroBatchesHeldBound, 2);
    gauge(names::kPipelineBubbleFormula, 0.25);
    gauge(names::kPipelineLastStepStartSeconds, 1800000000.25);
    gauge(names::kPipelineLastStepSeconds, 1);
    registry_.RegisterCounter(names::kPipelineSentBytesTotal.name,
                              names::kPipelineSentBytesTotal.help, {"kind"})
        .value()->WithLabels({"activation"}).value()->Increment(8192);
    const std::vector<std::string> labels = {"op", "stage", "micro_batch"};
    auto start = registry_.RegisterGauge(names::kPipelineActionStartSeconds.name,
                                         names::kPipelineActionStartSeconds.help, labels).value();
    auto end = registry_.RegisterGauge(names::kPipelineActionEndSeconds.name,
                                       names::kPipelineActionEndSeconds.help, labels).value();
    start->WithLabels({"F", "1", "0"}).value()->Set(0.25);
    end->WithLabels({"F", "1", "0"}).value()->Set(0.5);
    start->WithLabels({"B", "1", "0"}).value()->Set(0.5);
    end->WithLabels({"B", "1", "0"}).value()->Set(1);
  }

 private:
  MetricsRegistry registry_;
  Gauge* step_ = nullptr;
  Gauge* loss_ = nullptr;
  Counter* samples_ = nullptr;
  Counter* sent_ = nullptr;
  Counter* received_ = nullptr;
  std::map<std::string, Histogram*> phases_;
  std::unique_ptr<MetricsHttpServer> http_;
};

MemberInfo Member(Role role, int rank, MemberState state, const std::string& metrics, int pid) {
  MemberInfo info;
  info.role = role;
  info.rank = rank;
  info.state = state;
  info.metrics_address = metrics;
  info.address = "tcp://127.0.0.1:" + std::to_string(7000 + rank);
  info.host = "localhost";
  info.pid = pid;
  return info;
}

DashboardOptions Options() {
  DashboardOptions options;
  options.job = "dashjob";
  options.coordinator_address = "tcp://127.0.0.1:29500";
  options.coordinator_metrics_url = "http://127.0.0.1:29501/metrics";
  options.coordinator_pid = 4242;
  return options;
}

const json* FindProcess(const json& doc, const std::string& name) {
  for (const json& process : doc.at("processes")) {
    if (process.at("name") == name) return &process;
  }
  return nullptr;
}

TEST(ReadMetricsTest, ReadsWhatTheDashboardShows) {
  auto samples = ParseExpositionText(
      "tessera_train_step 7\n"
      "tessera_train_loss 0.5\n"
      "tessera_train_samples_total 224\n"
      "tessera_train_eval_accuracy 0.9\n"
      "tessera_bytes_sent_total 100\n"
      "tessera_bytes_received_total 50\n"
      "tessera_ps_client_bytes_sent_total{op=\"push_pull\"} 30\n"
      "tessera_ps_client_bytes_sent_total{op=\"init\"} 10\n"
      "tessera_ps_client_bytes_received_total{op=\"push_pull\"} 20\n"
      "tessera_collective_bytes_total{op=\"allreduce\"} 64\n"
      "tessera_collective_bytes_total{op=\"allgather\"} 16\n"
      "tessera_train_step_phase_seconds_bucket{phase=\"compute\",le=\"+Inf\"} 7\n"
      "tessera_train_step_phase_seconds_sum{phase=\"compute\"} 0.7\n"
      "tessera_train_step_phase_seconds_count{phase=\"compute\"} 7\n"
      "tessera_model_state_bytes{kind=\"parameters\"} 400\n"
      "tessera_model_state_bytes{kind=\"optimizer_state\"} 800\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  MetricsReading reading = ReadMetrics(*samples);
  EXPECT_EQ(reading.step, 7);
  EXPECT_EQ(reading.loss, 0.5);
  EXPECT_EQ(reading.samples_total, 224);
  EXPECT_EQ(reading.eval_accuracy, 0.9);
  EXPECT_EQ(reading.bytes_sent_total, 100);
  EXPECT_EQ(reading.bytes_received_total, 50);
  EXPECT_EQ(reading.to_servers_bytes_total, 40);
  EXPECT_EQ(reading.from_servers_bytes_total, 20);
  EXPECT_EQ(reading.collective_bytes_total, 80);
  ASSERT_EQ(reading.phases.size(), 1u);
  EXPECT_DOUBLE_EQ(reading.phases["compute"].first, 0.7);
  EXPECT_EQ(reading.phases["compute"].second, 7);
  EXPECT_EQ(reading.memory, (std::map<std::string, double>{{"parameters", 400},
                                                           {"optimizer_state", 800}}));

  MetricsReading empty = ReadMetrics({});
  EXPECT_TRUE(std::isnan(empty.step) && std::isnan(empty.samples_total));
  EXPECT_TRUE(empty.phases.empty() && empty.memory.empty());
}

TEST(DashboardTest, RejectsBadOptions) {
  DashboardOptions options = Options();
  options.scrape_interval_ms = 0;
  EXPECT_EQ(Dashboard::Create(options).status().code(), StatusCode::kInvalidArgument);
  options = Options();
  options.scrape_timeout_ms = options.scrape_interval_ms + 1;
  auto created = Dashboard::Create(options);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("scrape_timeout_ms"), std::string::npos);
  options = Options();
  options.scrape_threads = 0;
  EXPECT_EQ(Dashboard::Create(options).status().code(), StatusCode::kInvalidArgument);
}

TEST(DashboardTest, ThePageIsSelfContained) {
  std::string_view page = DashboardPageHtml();
  EXPECT_EQ(page.find("<!doctype html>"), 0u);
  EXPECT_NE(page.find("</html>"), std::string_view::npos);
  for (const char* external : {"src=\"http", "src='http", "href=\"http", "@import", "url(http",
                               "<script src", "cdn."}) {
    EXPECT_EQ(page.find(external), std::string_view::npos) << external;
  }
  auto dashboard = Dashboard::Create(Options()).value();
  HttpRequest get{"GET", "/dashboard", ""};
  HttpResponse response = dashboard->ServePage(get);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(response.body, std::string(page));
  EXPECT_EQ(dashboard->ServePage({"POST", "/dashboard", ""}).status, 405);
  EXPECT_EQ(dashboard->ServeData({"GET", "/dashboard/data", "since=abc"}).status, 400);
  EXPECT_EQ(dashboard->ServeData({"DELETE", "/dashboard/data", ""}).status, 405);

  // Before any member registers: the coordinator alone, and the expected sizes.
  HttpResponse data = dashboard->ServeData({"GET", "/dashboard/data", ""});
  EXPECT_EQ(data.status, 200);
  EXPECT_EQ(data.content_type, "application/json");
  json doc = json::parse(data.body);
  EXPECT_EQ(doc.at("job"), "dashjob");
  ASSERT_EQ(doc.at("processes").size(), 1u);
  EXPECT_EQ(doc["processes"][0].at("role"), "coordinator");
  EXPECT_EQ(doc["processes"][0].at("pid"), 4242);
  EXPECT_TRUE(doc.at("series").empty());
  EXPECT_TRUE(doc.at("straggler").at("slowest").is_null());
}

// --replicas 2 over 3 servers, server 1 failed: range 0 (servers 0, 1) and range 2 (2, 0) keep
// their primaries, range 1 (servers 1, 2) is answered by server 2; with server 2 failed too,
// range 1 is lost.
TEST(DashboardTest, ShowsEachKeyRangesCopiesAndPrimary) {
  auto dashboard = Dashboard::Create(Options()).value();
  FleetView view;
  view.job = "dashjob";
  view.num_servers = 3;
  view.num_workers = 1;
  view.key_space = 30;
  view.replicas = 2;
  view.members = {Member(Role::kServer, 0, MemberState::kAlive, "http://127.0.0.1:1/m", 100),
                  Member(Role::kServer, 1, MemberState::kFailed, "http://127.0.0.1:1/m", 101),
                  Member(Role::kServer, 2, MemberState::kAlive, "http://127.0.0.1:1/m", 102)};
  dashboard->UpdateFleet(view);
  json doc = json::parse(dashboard->ServeData({"GET", "/dashboard/data", ""}).body);
  EXPECT_EQ(doc.at("replicas"), 2);
  const json& ranges = doc.at("ranges");
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].at("primary"), 0);
  EXPECT_EQ(ranges[1].at("primary"), 2);
  EXPECT_EQ(ranges[2].at("primary"), 2);
  EXPECT_EQ(ranges[1].at("key_begin"), 10);
  EXPECT_EQ(ranges[1].at("key_end"), 20);
  EXPECT_EQ(ranges[1].at("copies"),
            json::parse(R"([{"server": 1, "state": "failed"}, {"server": 2, "state": "alive"}])"));
  view.members[2].state = MemberState::kFailed;
  dashboard->UpdateFleet(view);
  doc = json::parse(dashboard->ServeData({"GET", "/dashboard/data", ""}).body);
  EXPECT_EQ(doc.at("ranges")[1].at("primary"), -1);
  EXPECT_EQ(doc.at("ranges")[2].at("primary"), 0);
}

TEST(ReadMetricsTest, ReadsFsdpSeries) {
  auto samples = ParseExpositionText(
      "tessera_fsdp_param_bytes{kind=\"shard\"} 1024\n"
      "tessera_fsdp_param_bytes{kind=\"gathered\"} 0\n"
      "tessera_fsdp_param_peak_bytes{kind=\"gathered\"} 4096\n"
      "tessera_fsdp_collective_seconds_bucket{op=\"all_gather\",le=\"+Inf\"} 2\n"
      "tessera_fsdp_collective_seconds_sum{op=\"all_gather\"} 0.5\n"
      "tessera_fsdp_collective_seconds_count{op=\"all_gather\"} 2\n"
      "tessera_fsdp_collective_bytes_total{op=\"all_gather\"} 8192\n"
      "tessera_fsdp_prefetch_waits_total 3\n"
      "tessera_fsdp_prefetch_wait_seconds_total 0.125\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  MetricsReading reading = ReadMetrics(*samples);
  EXPECT_TRUE(reading.fsdp);
  EXPECT_EQ(reading.fsdp_held, (std::map<std::string, double>{{"shard", 1024}, {"gathered", 0}}));
  EXPECT_EQ(reading.fsdp_peak, (std::map<std::string, double>{{"gathered", 4096}}));
  ASSERT_EQ(reading.fsdp_collective.size(), 1u);
  EXPECT_EQ(reading.fsdp_collective["all_gather"], std::make_pair(0.5, 2.0));
  EXPECT_EQ(reading.fsdp_prefetch_waits, 3);
  EXPECT_EQ(reading.fsdp_prefetch_wait_seconds, 0.125);
  // The FSDP series are not model state: the memory panel stays as it was.
  EXPECT_TRUE(reading.memory.empty());

  MetricsReading none = ReadMetrics(*ParseExpositionText("tessera_train_step 1\n"));
  EXPECT_FALSE(none.fsdp);
  EXPECT_TRUE(std::isnan(none.fsdp_prefetch_waits));
}

TEST(ReadMetricsTest, ReadsPipelineSeriesAndLeavesOutActionsNotInTheLastStep) {
  auto samples = ParseExpositionText(
      "tessera_pipeline_rank 1\n"
      "tessera_pipeline_steps_total 3\n"
      "tessera_pipeline_busy_seconds_total{stage=\"1\"} 0.5\n"
      "tessera_pipeline_busy_seconds_total{stage=\"3\"} 0.25\n"
      "tessera_pipeline_idle_seconds_total 0.25\n"
      "tessera_pipeline_sent_bytes_total{kind=\"activation\"} 4096\n"
      "tessera_pipeline_sent_bytes_total{kind=\"gradient\"} 2048\n"
      "tessera_pipeline_micro_batches_held 2\n"
      "tessera_pipeline_micro_batches_held_bound 3\n"
      "tessera_pipeline_bubble_formula 0.2\n"
      "tessera_pipeline_last_step_start_seconds 1.8e+09\n"
      "tessera_pipeline_last_step_seconds 0.5\n"
      "tessera_pipeline_action_start_seconds{op=\"B\",stage=\"1\",micro_batch=\"0\"} 0.25\n"
      "tessera_pipeline_action_end_seconds{op=\"B\",stage=\"1\",micro_batch=\"0\"} 0.5\n"
      "tessera_pipeline_action_start_seconds{op=\"F\",stage=\"1\",micro_batch=\"0\"} 0\n"
      "tessera_pipeline_action_end_seconds{op=\"F\",stage=\"1\",micro_batch=\"0\"} 0.125\n"
      "tessera_pipeline_action_start_seconds{op=\"W\",stage=\"1\",micro_batch=\"0\"} NaN\n"
      "tessera_pipeline_action_end_seconds{op=\"W\",stage=\"1\",micro_batch=\"0\"} NaN\n"
      "tessera_pipeline_action_start_seconds{op=\"F\",stage=\"x\",micro_batch=\"0\"} 0\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  MetricsReading reading = ReadMetrics(*samples);
  EXPECT_TRUE(reading.pipeline);
  EXPECT_FALSE(reading.fsdp);
  EXPECT_EQ(reading.pipeline_rank, 1);
  EXPECT_EQ(reading.pipeline_steps, 3);
  EXPECT_EQ(reading.pipeline_busy_seconds,
            (std::map<std::string, double>{{"1", 0.5}, {"3", 0.25}}));
  EXPECT_EQ(reading.pipeline_idle_seconds, 0.25);
  EXPECT_EQ(reading.pipeline_sent_bytes,
            (std::map<std::string, double>{{"activation", 4096}, {"gradient", 2048}}));
  EXPECT_EQ(reading.pipeline_held, 2);
  EXPECT_EQ(reading.pipeline_held_bound, 3);
  EXPECT_EQ(reading.pipeline_bubble_formula, 0.2);
  EXPECT_EQ(reading.pipeline_step_start_unix_seconds, 1.8e9);
  EXPECT_EQ(reading.pipeline_step_seconds, 0.5);
  // By start; W (NaN: not in the last step) and the unparsable stage left out.
  ASSERT_EQ(reading.pipeline_actions.size(), 2u);
  EXPECT_EQ(reading.pipeline_actions[0].op, "F");
  EXPECT_EQ(reading.pipeline_actions[0].end_seconds, 0.125);
  EXPECT_EQ(reading.pipeline_actions[1].op, "B");
  EXPECT_EQ(reading.pipeline_actions[1].stage, 1);
  EXPECT_EQ(reading.pipeline_actions[1].start_seconds, 0.25);

  MetricsReading none = ReadMetrics(*ParseExpositionText("tessera_train_step 1\n"));
  EXPECT_FALSE(none.pipeline);
  EXPECT_TRUE(none.pipeline_actions.empty());
}

// A pipeline rank gets the pipeline panel's data, with its last step's bubble; the others
// null, which hides the panel.
TEST(DashboardTest, ShowsThePipelineTimelineForTheMembersThatExportIt) {
  FakeProcess worker0(true), worker1(true);
  worker1.ExportPipeline();
  auto dashboard = Dashboard::Create(Options()).value();
  FleetView view;
  view.job = "dashjob";
  view.num_workers = 2;
  view.members = {Member(Role::kWorker, 0, MemberState::kAlive, worker0.url(), 101),
                  Member(Role::kWorker, 1, MemberState::kAlive, worker1.url(), 102)};
  dashboard->UpdateFleet(view);
  dashboard->ScrapeOnce();
  json doc = json::parse(dashboard->DataJson(0));
  const json* w0 = FindProcess(doc, "worker 0");
  const json* w1 = FindProcess(doc, "worker 1");
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  EXPECT_TRUE(w0->at("pipeline").is_null()) << *w0;
  const json& pipeline = w1->at("pipeline");
  EXPECT_EQ(pipeline.at("rank"), 1) << pipeline;
  EXPECT_EQ(pipeline.at("held"), 2);
  EXPECT_EQ(pipeline.at("held_bound"), 2);
  EXPECT_EQ(pipeline.at("bubble_formula"), 0.25);
  // 1 - (0.25 + 0.5) / 1 s.
  EXPECT_EQ(pipeline.at("bubble_last_step"), 0.25);
  EXPECT_EQ(pipeline.at("step_start_unix_ms"), int64_t{1800000000250});
  EXPECT_EQ(pipeline.at("actions"), json::parse(R"([["F", 1, 0, 0.25, 0.5],
                                                     ["B", 1, 0, 0.5, 1]])"));
  EXPECT_EQ(pipeline.at("sent_bytes_total").at("activation"), 8192);
}

// A torch rank that trains with tessera.torch.fsdp gets the FSDP panel's data; the others
// null, which hides the panel when no member has it.
TEST(DashboardTest, ShowsFsdpForTheMembersThatExportIt) {
  FakeProcess worker0(true), worker1(true);
  worker1.ExportFsdp();
  auto dashboard = Dashboard::Create(Options()).value();
  FleetView view;
  view.job = "dashjob";
  view.num_workers = 2;
  view.members = {Member(Role::kWorker, 0, MemberState::kAlive, worker0.url(), 101),
                  Member(Role::kWorker, 1, MemberState::kAlive, worker1.url(), 102)};
  dashboard->UpdateFleet(view);
  dashboard->ScrapeOnce();
  json doc = json::parse(dashboard->DataJson(0));
  const json* w0 = FindProcess(doc, "worker 0");
  const json* w1 = FindProcess(doc, "worker 1");
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  EXPECT_TRUE(w0->at("fsdp").is_null()) << *w0;
  const json& fsdp = w1->at("fsdp");
  EXPECT_EQ(fsdp.at("held"), json({{"shard", 524288}, {"gathered", 0}, {"gradient_shard", 0},
                                   {"full_gradient", 0}}))
      << fsdp;
  EXPECT_EQ(fsdp.at("peak").at("gathered"), 262144);
  EXPECT_EQ(fsdp.at("collectives").at("all_gather").at("count"), 2);
  EXPECT_NEAR(fsdp.at("collectives").at("all_gather").at("mean_seconds").get<double>(), 0.03,
              1e-9);
  EXPECT_EQ(fsdp.at("collectives").at("all_reduce").at("count"), 0);
  EXPECT_TRUE(fsdp.at("collectives").at("all_reduce").at("mean_seconds").is_null());
  EXPECT_EQ(fsdp.at("prefetch_waits"), 3);
  EXPECT_EQ(fsdp.at("prefetch_wait_seconds"), 0.25);
}

TEST(DashboardTest, ScrapesMembersIntoHistoryRatesAndStragglers) {
  FakeProcess worker0(true), worker1(true), server0(false);
  auto dashboard = Dashboard::Create(Options()).value();
  FleetView view;
  view.job = "dashjob";
  view.epoch = 3;
  view.num_servers = 1;
  view.num_workers = 3;
  view.members = {Member(Role::kServer, 0, MemberState::kAlive, server0.url(), 100),
                  Member(Role::kWorker, 0, MemberState::kAlive, worker0.url(), 101),
                  Member(Role::kWorker, 1, MemberState::kAlive, worker1.url(), 102),
                  // Never scraped: it failed.
                  Member(Role::kWorker, 2, MemberState::kFailed, "http://127.0.0.1:1/metrics", 103)};
  dashboard->UpdateFleet(view);
  HeardSource heard = [] {
    return std::map<std::pair<Role, int>, int64_t>{{{Role::kServer, 0}, 300},
                                                   {{Role::kWorker, 0}, 200},
                                                   {{Role::kWorker, 1}, 100},
                                                   {{Role::kWorker, 2}, 12000}};
  };

  // Three scrapes, with training between them: worker 1 computes 4x as long per step.
  dashboard->ScrapeOnce(heard);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 5; ++i) {
      worker0.Step(1.0 - 0.1 * i, 0.002);
      worker1.Step(1.1 - 0.1 * i, 0.008);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    dashboard->ScrapeOnce(heard);
  }

  json doc = json::parse(dashboard->DataJson(0));
  EXPECT_EQ(doc.at("epoch"), 3);
  EXPECT_EQ(doc.at("expected").at("worker"), 3);
  std::vector<std::string> listed;
  for (const json& process : doc.at("processes")) listed.push_back(process.at("name"));
  EXPECT_EQ(listed, (std::vector<std::string>{"coordinator", "server 0", "worker 0", "worker 1",
                                              "worker 2"}));

  const json* w1 = FindProcess(doc, "worker 1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->at("state"), "alive");
  EXPECT_EQ(w1->at("pid"), 102);
  EXPECT_EQ(w1->at("role"), "worker");
  EXPECT_EQ(w1->at("rank"), 1);
  EXPECT_GE(w1->at("heartbeat_age_s").get<double>(), 0.1);
  EXPECT_LT(w1->at("heartbeat_age_s").get<double>(), 5);
  EXPECT_TRUE(w1->at("scrape").at("ok").get<bool>()) << *w1;
  EXPECT_EQ(w1->at("step"), 10);
  EXPECT_NEAR(w1->at("loss").get<double>(), 0.7, 1e-9);
  EXPECT_GT(w1->at("samples_per_s").get<double>(), 0);
  EXPECT_EQ(w1->at("bytes_sent_total"), 10 * 4096);
  EXPECT_EQ(w1->at("to_servers_bytes_total"), 1024);
  EXPECT_TRUE(w1->at("collective_bytes_total").is_null());

  const json* s0 = FindProcess(doc, "server 0");
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(s0->at("memory"), json({{"optimizer_state", 8192}, {"parameters", 4096}}));
  EXPECT_TRUE(s0->at("loss").is_null());

  const json* w2 = FindProcess(doc, "worker 2");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->at("state"), "failed");
  EXPECT_GE(w2->at("heartbeat_age_s").get<double>(), 12);
  EXPECT_FALSE(w2->at("scrape").at("ok").get<bool>());

  // History: one point per scrape; rates from the second on.
  const json& series = doc.at("series").at("worker 0");
  ASSERT_EQ(series.at("t").size(), 3u) << series;
  EXPECT_TRUE(series.at("samples_per_s")[0].is_null());
  EXPECT_GT(series.at("samples_per_s")[1].get<double>(), 0);
  EXPECT_GT(series.at("bytes_sent_per_s")[2].get<double>(), 0);
  EXPECT_NEAR(series.at("step_seconds")[2].get<double>(), 0.004, 1e-9);
  EXPECT_EQ(series.at("loss")[2], 0.6);
  EXPECT_EQ(doc.at("series").at("worker 2").at("t").size(), 0u);

  // ?since= leaves out the points the page has.
  int64_t second = series.at("t")[1];
  json newer = json::parse(dashboard->DataJson(second));
  EXPECT_EQ(newer.at("series").at("worker 0").at("t").size(), 1u);
  EXPECT_EQ(newer.at("processes").size(), 5u);

  // The straggler: worker 1's own time (data + compute: 9 ms) vs the median (6 ms).
  const json& straggler = doc.at("straggler");
  EXPECT_EQ(straggler.at("slowest"), "worker 1") << straggler;
  EXPECT_NEAR(straggler.at("ratio").get<double>(), 1.5, 1e-3) << straggler;
  EXPECT_NEAR(straggler.at("median_own_seconds").get<double>(), 0.006, 1e-6);
  ASSERT_EQ(straggler.at("workers").size(), 2u);
  EXPECT_NEAR(straggler["workers"][1].at("phases").at("compute").get<double>(), 0.008, 1e-9);
  EXPECT_NEAR(straggler["workers"][1].at("step_seconds").get<double>(), 0.010, 1e-9);

  // A member that cannot be scraped says why; it keeps its earlier history.
  view.members[1].metrics_address = "http://127.0.0.1:1/metrics";
  dashboard->UpdateFleet(view);
  dashboard->ScrapeOnce(heard);
  doc = json::parse(dashboard->DataJson(0));
  const json* w0 = FindProcess(doc, "worker 0");
  ASSERT_NE(w0, nullptr);
  EXPECT_FALSE(w0->at("scrape").at("ok").get<bool>());
  EXPECT_NE(w0->at("scrape").at("error").get<std::string>().find("127.0.0.1:1"),
            std::string::npos)
      << *w0;
  EXPECT_EQ(doc.at("series").at("worker 0").at("t").size(), 3u);
  EXPECT_EQ(w0->at("step"), 10) << "the last step read stays";
  EXPECT_TRUE(w0->at("samples_per_s").is_null()) << "a rate that is no longer current";
}

TEST(DashboardTest, TheThreadScrapesEveryIntervalAndStops) {
  FakeProcess worker0(true);
  DashboardOptions options = Options();
  options.scrape_interval_ms = 50;
  options.scrape_timeout_ms = 40;
  auto dashboard = Dashboard::Create(options).value();
  FleetView view;
  view.job = "dashjob";
  view.num_workers = 1;
  view.members = {Member(Role::kWorker, 0, MemberState::kAlive, worker0.url(), getpid())};
  dashboard->UpdateFleet(view);
  int calls = 0;  // read on the scraping thread only until Stop() returns
  dashboard->Start([&calls] {
    ++calls;
    return std::map<std::pair<Role, int>, int64_t>{{{Role::kWorker, 0}, 5}};
  });
  size_t points = 0;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       points < 4 && std::chrono::steady_clock::now() < deadline;) {
    worker0.Step(0.5, 0.001);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    points = json::parse(dashboard->DataJson(0))["series"]["worker 0"]["t"].size();
  }
  EXPECT_GE(points, 4u);
  auto start = std::chrono::steady_clock::now();
  dashboard->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_GE(calls, 4);
  size_t after_stop = json::parse(dashboard->DataJson(0))["series"]["worker 0"]["t"].size();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(json::parse(dashboard->DataJson(0))["series"]["worker 0"]["t"].size(), after_stop);
  dashboard->Stop();  // a second Stop is a no-op
}

}  // namespace
}  // namespace tessera::coordinator
