#include "coordinator/dashboard.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/base/logging.h"
#include "common/metrics/metric_names.h"
#include "coordinator/service_discovery.h"

namespace tessera::coordinator {
namespace {

namespace names = metric_names;

// The page, embedded at build time from dashboard_page.html (see the genrule in BUILD).
constexpr char kPage[] =
#include "coordinator/dashboard_page.inc"
    ;

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Adds `value` to `*total`, which starts as kNoValue.
void Accumulate(double* total, double value) {
  *total = std::isnan(*total) ? value : *total + value;
}

// Rounds to 6 significant digits, so the JSON stays short; NaN and infinities become null.
nlohmann::json Number(double value) {
  if (!std::isfinite(value)) return nullptr;
  if (value == 0) return 0.0;
  double scale = std::pow(10.0, 5 - static_cast<int>(std::floor(std::log10(std::fabs(value)))));
  return std::round(value * scale) / scale;
}

// (later - earlier) / seconds, or kNoValue when either is missing, no time passed, or the
// counter went backwards (the process restarted).
double Rate(double earlier, double later, double seconds) {
  if (std::isnan(earlier) || std::isnan(later) || seconds <= 0 || later < earlier) return kNoValue;
  return (later - earlier) / seconds;
}

// Mean seconds per step of each phase between two readings; phases without new steps are
// left out.
std::map<std::string, double> PhaseMeans(const MetricsReading& earlier,
                                         const MetricsReading& later) {
  std::map<std::string, double> means;
  for (const auto& [phase, now] : later.phases) {
    auto before = earlier.phases.find(phase);
    if (before == earlier.phases.end()) continue;
    double steps = now.second - before->second.second;
    double seconds = now.first - before->second.first;
    if (steps > 0 && seconds >= 0) means[phase] = seconds / steps;
  }
  return means;
}

double SumOf(const std::map<std::string, double>& values, bool skip_engine) {
  if (values.empty()) return kNoValue;
  double total = 0;
  for (const auto& [phase, seconds] : values) {
    if (!(skip_engine && phase == "engine")) total += seconds;
  }
  return total;
}

double Median(std::vector<double> values) {
  if (values.empty()) return kNoValue;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

HttpResponse MethodNotAllowed() {
  HttpResponse response;
  response.status = 405;
  response.body = "the dashboard answers GET only\n";
  return response;
}

// The value of `key` in a query string "a=1&b=2"; empty when absent.
std::string QueryValue(const std::string& query, const std::string& key) {
  for (size_t start = 0; start <= query.size();) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    std::string pair = query.substr(start, end - start);
    if (pair.compare(0, key.size() + 1, key + "=") == 0) return pair.substr(key.size() + 1);
    start = end + 1;
  }
  return "";
}

// A label's non-negative decimal integer (as PipelineMetrics writes them), or false.
bool ParseInt(const std::string& text, int* value) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size() && *value >= 0;
}

// The pipeline panel's part of a process: totals, the last step's bubble (its idle share:
// 1 - its actions' time / its length) beside the schedule's, and the last step's actions as
// [op, stage, micro_batch, start, end] with times in seconds after the step's start, which
// starts at step_start_unix_ms (an integer, so the page can line up the ranks' steps).
nlohmann::json PipelineJson(const MetricsReading& reading) {
  using nlohmann::json;
  json busy = json::object(), sent = json::object(), actions = json::array();
  double busy_total = kNoValue, busy_last = 0;
  for (const auto& [stage, seconds] : reading.pipeline_busy_seconds) {
    busy[stage] = Number(seconds);
    Accumulate(&busy_total, seconds);
  }
  for (const auto& [kind, bytes] : reading.pipeline_sent_bytes) sent[kind] = Number(bytes);
  for (const MetricsReading::PipelineAction& action : reading.pipeline_actions) {
    actions.push_back({action.op, action.stage, action.micro_batch,
                       Number(action.start_seconds), Number(action.end_seconds)});
    busy_last += action.end_seconds - action.start_seconds;
  }
  const double step = reading.pipeline_step_seconds;
  const double start = reading.pipeline_step_start_unix_seconds;
  return {{"rank", Number(reading.pipeline_rank)},
          {"steps", Number(reading.pipeline_steps)},
          {"busy_seconds_total", std::move(busy)},
          {"idle_seconds_total", Number(reading.pipeline_idle_seconds)},
          {"sent_bytes_total", std::move(sent)},
          {"held", Number(reading.pipeline_held)},
          {"held_bound", Number(reading.pipeline_held_bound)},
          {"bubble_formula", Number(reading.pipeline_bubble_formula)},
          {"bubble_last_step",
           Number(step > 0 && !reading.pipeline_actions.empty() ? 1 - busy_last / step
                                                                 : kNoValue)},
          {"step_seconds", Number(step)},
          {"step_start_unix_ms",
           std::isfinite(start) ? json(static_cast<int64_t>(std::llround(start * 1000)))
                                : json(nullptr)},
          {"actions", std::move(actions)}};
}

// One tessera_pipeline_* sample into `reading`; the actions' start and end into `actions`.
void ReadPipelineSample(
    const MetricSample& sample, MetricsReading* reading,
    std::map<std::tuple<std::string, int, int>, std::pair<double, double>>* actions) {
  const std::string& name = sample.name;
  auto label = [&sample](const char* key) {
    auto it = sample.labels.find(key);
    return it == sample.labels.end() ? std::string() : it->second;
  };
  if (name == names::kPipelineRank.name) {
    reading->pipeline_rank = sample.value;
  } else if (name == names::kPipelineStepsTotal.name) {
    reading->pipeline_steps = sample.value;
  } else if (name == names::kPipelineIdleSecondsTotal.name) {
    reading->pipeline_idle_seconds = sample.value;
  } else if (name == names::kPipelineBusySecondsTotal.name) {
    reading->pipeline_busy_seconds[label("stage")] += sample.value;
  } else if (name == names::kPipelineSentBytesTotal.name) {
    reading->pipeline_sent_bytes[label("kind")] += sample.value;
  } else if (name == names::kPipelineMicroBatchesHeld.name) {
    reading->pipeline_held = sample.value;
  } else if (name == names::kPipelineMicroBatchesHeldBound.name) {
    reading->pipeline_held_bound = sample.value;
  } else if (name == names::kPipelineBubbleFormula.name) {
    reading->pipeline_bubble_formula = sample.value;
  } else if (name == names::kPipelineLastStepStartSeconds.name) {
    reading->pipeline_step_start_unix_seconds = sample.value;
  } else if (name == names::kPipelineLastStepSeconds.name) {
    reading->pipeline_step_seconds = sample.value;
  } else if (name == names::kPipelineActionStartSeconds.name ||
             name == names::kPipelineActionEndSeconds.name) {
    int stage = 0, micro_batch = 0;
    if (!ParseInt(label("stage"), &stage) || !ParseInt(label("micro_batch"), &micro_batch)) {
      return;  // not ours: a page the dashboard cannot draw from is left out, not guessed at
    }
    auto [it, fresh] = actions->try_emplace({label("op"), stage, micro_batch}, kNoValue,
                                            kNoValue);
    (name == names::kPipelineActionStartSeconds.name ? it->second.first : it->second.second) =
        sample.value;
  }
}

}  // namespace

std::string_view DashboardPageHtml() { return std::string_view(kPage, sizeof(kPage) - 1); }

MetricsReading ReadMetrics(const std::vector<MetricSample>& samples) {
  const std::string phase_sum = std::string(names::kTrainStepPhaseSeconds.name) + "_sum";
  const std::string phase_count = std::string(names::kTrainStepPhaseSeconds.name) + "_count";
  const std::string fsdp_sum = std::string(names::kFsdpCollectiveSeconds.name) + "_sum";
  const std::string fsdp_count = std::string(names::kFsdpCollectiveSeconds.name) + "_count";
  MetricsReading reading;
  // The last step's actions by (op, stage, micro-batch): start and end come as two samples.
  std::map<std::tuple<std::string, int, int>, std::pair<double, double>> actions;
  for (const MetricSample& sample : samples) {
    const std::string& name = sample.name;
    auto label = [&sample](const char* key) {
      auto it = sample.labels.find(key);
      return it == sample.labels.end() ? std::string() : it->second;
    };
    if (name == names::kTrainStep.name) {
      reading.step = sample.value;
    } else if (name == names::kTrainLoss.name) {
      reading.loss = sample.value;
    } else if (name == names::kTrainSamplesTotal.name) {
      Accumulate(&reading.samples_total, sample.value);
    } else if (name == names::kTrainEvalAccuracy.name) {
      reading.eval_accuracy = sample.value;
    } else if (name == names::kBytesSentTotal.name) {
      Accumulate(&reading.bytes_sent_total, sample.value);
    } else if (name == names::kBytesReceivedTotal.name) {
      Accumulate(&reading.bytes_received_total, sample.value);
    } else if (name == names::kPsClientBytesSentTotal.name) {
      Accumulate(&reading.to_servers_bytes_total, sample.value);
    } else if (name == names::kPsClientBytesReceivedTotal.name) {
      Accumulate(&reading.from_servers_bytes_total, sample.value);
    } else if (name == names::kCollectiveBytesTotal.name) {
      Accumulate(&reading.collective_bytes_total, sample.value);
    } else if (name == phase_sum) {
      reading.phases[label("phase")].first += sample.value;
    } else if (name == phase_count) {
      reading.phases[label("phase")].second += sample.value;
    } else if (name == names::kModelStateBytes.name) {
      reading.memory[label("kind")] += sample.value;
    } else if (name == names::kPsParameterBytes.name) {
      reading.memory["parameters"] += sample.value;
    } else if (name == names::kPsOptimizerStateBytes.name) {
      reading.memory["optimizer_state"] += sample.value;
    } else if (name.rfind("tessera_fsdp_", 0) == 0) {
      reading.fsdp = true;
      if (name == names::kFsdpParamBytes.name) {
        reading.fsdp_held[label("kind")] += sample.value;
      } else if (name == names::kFsdpParamPeakBytes.name) {
        reading.fsdp_peak[label("kind")] += sample.value;
      } else if (name == fsdp_sum) {
        reading.fsdp_collective[label("op")].first += sample.value;
      } else if (name == fsdp_count) {
        reading.fsdp_collective[label("op")].second += sample.value;
      } else if (name == names::kFsdpPrefetchWaitsTotal.name) {
        Accumulate(&reading.fsdp_prefetch_waits, sample.value);
      } else if (name == names::kFsdpPrefetchWaitSecondsTotal.name) {
        Accumulate(&reading.fsdp_prefetch_wait_seconds, sample.value);
      }
    } else if (name.rfind("tessera_pipeline_", 0) == 0) {
      reading.pipeline = true;
      ReadPipelineSample(sample, &reading, &actions);
    }
  }
  for (const auto& [key, times] : actions) {
    const auto& [op, stage, micro_batch] = key;
    if (!std::isfinite(times.first) || !std::isfinite(times.second)) continue;  // not last step
    reading.pipeline_actions.push_back({op, stage, micro_batch, times.first, times.second});
  }
  std::sort(reading.pipeline_actions.begin(), reading.pipeline_actions.end(),
            [](const MetricsReading::PipelineAction& a, const MetricsReading::PipelineAction& b) {
              return a.start_seconds < b.start_seconds;
            });
  return reading;
}

StatusOr<std::unique_ptr<Dashboard>> Dashboard::Create(const DashboardOptions& options) {
  auto positive = [](const char* name, int64_t value) {
    return value > 0 ? OkStatus()
                     : InvalidArgumentError(std::string("dashboard: ") + name + " is " +
                                            std::to_string(value) + ", not > 0");
  };
  RETURN_IF_ERROR(positive("scrape_interval_ms", options.scrape_interval_ms));
  RETURN_IF_ERROR(positive("scrape_timeout_ms", options.scrape_timeout_ms));
  RETURN_IF_ERROR(positive("history_seconds", options.history_seconds));
  RETURN_IF_ERROR(positive("straggler_window_ms", options.straggler_window_ms));
  RETURN_IF_ERROR(positive("scrape_threads", options.scrape_threads));
  if (options.scrape_timeout_ms > options.scrape_interval_ms) {
    return InvalidArgumentError("dashboard: scrape_timeout_ms " +
                                std::to_string(options.scrape_timeout_ms) +
                                " exceeds scrape_interval_ms " +
                                std::to_string(options.scrape_interval_ms));
  }
  std::unique_ptr<Dashboard> dashboard(new Dashboard(options));
  FleetView empty;
  empty.job = options.job;
  dashboard->UpdateFleet(empty);
  return dashboard;
}

Dashboard::Dashboard(const DashboardOptions& options)
    : options_(options), started_unix_ms_(UnixMillisNow()), heard_at_(SteadyClock::now()) {}

Dashboard::~Dashboard() { Stop(); }

void Dashboard::UpdateFleet(const FleetView& view) {
  std::lock_guard<std::mutex> lock(mu_);
  fleet_ = view;
  for (const MemberInfo& member : view.members) {
    Track& track = tracks_[{member.role, member.rank}];
    if (track.info.pid != member.pid) {
      // A new process in this role and rank: its counters start again, its history goes on.
      track.last.reset();
      track.window.clear();
      track.error.clear();
    }
    track.info = member;
  }
}

void Dashboard::Start(HeardSource heard) {
  std::lock_guard<std::mutex> lock(thread_mu_);
  stop_ = false;
  thread_ = std::thread([this, heard = std::move(heard)] { Loop(heard); });
}

void Dashboard::Stop() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  wake_.notify_all();
  if (thread.joinable()) thread.join();
}

void Dashboard::Loop(HeardSource heard) {
  const auto interval = std::chrono::milliseconds(options_.scrape_interval_ms);
  auto next = SteadyClock::now();
  while (true) {
    ScrapeOnce(heard);
    next += interval;
    auto now = SteadyClock::now();
    if (next < now) next = now;  // a slow round: start the next one at once, do not catch up
    std::unique_lock<std::mutex> lock(thread_mu_);
    if (wake_.wait_until(lock, next, [this] { return stop_; })) return;
  }
}

void Dashboard::ScrapeOnce(const HeardSource& heard) {
  std::lock_guard<std::mutex> serial(scrape_mu_);
  if (heard) {
    std::map<Key, int64_t> heard_ms = heard();
    std::lock_guard<std::mutex> lock(mu_);
    heard_ms_ = std::move(heard_ms);
    heard_at_ = SteadyClock::now();
  }

  struct Target {
    Key key;
    std::string url;
    std::optional<StatusOr<std::vector<MetricSample>>> result;
  };
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const MemberInfo& member : fleet_.members) {
      if (member.state != MemberState::kJoining && member.state != MemberState::kAlive) continue;
      Target target;
      target.key = {member.role, member.rank};
      StatusOr<MetricsUrlParts> split = SplitMetricsUrl(member.metrics_address, member.host);
      if (!split.ok()) {
        target.result = split.status();
      } else if (split->scheme != "http") {
        // The scraper speaks plain HTTP, without the members' basic-auth credentials.
        target.result = UnimplementedError(
            member.Name() + " serves /metrics over " + split->scheme +
            ", which the dashboard does not scrape; Prometheus does, through /sd");
      } else {
        target.url = "http://" + split->address + split->path;
      }
      targets.push_back(std::move(target));
    }
  }

  // Scrape concurrently, so one slow member delays the round by at most the timeout.
  const Deadline deadline = Deadline::AfterMillis(options_.scrape_timeout_ms);
  std::atomic<size_t> next{0};
  auto scrape = [&] {
    for (size_t i = next++; i < targets.size(); i = next++) {
      if (!targets[i].result) targets[i].result = ScrapeMetrics(targets[i].url, deadline);
    }
  };
  size_t num_threads = std::min<size_t>(static_cast<size_t>(options_.scrape_threads),
                                        targets.size());
  if (num_threads <= 1) {
    scrape();
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < num_threads; ++i) threads.emplace_back(scrape);
    for (std::thread& thread : threads) thread.join();
  }

  const SteadyClock::time_point at = SteadyClock::now();
  const int64_t unix_ms = UnixMillisNow();
  std::lock_guard<std::mutex> lock(mu_);
  for (Target& target : targets) {
    auto track = tracks_.find(target.key);
    if (track == tracks_.end()) continue;
    Record(track->second, at, unix_ms, std::move(*target.result));
  }
}

void Dashboard::Record(Track& track, SteadyClock::time_point at, int64_t unix_ms,
                       StatusOr<std::vector<MetricSample>> scraped) {
  ++track.scrapes;
  if (!scraped.ok()) {
    if (track.error != scraped.status().message()) {
      TLOG(DEBUG) << "dashboard: cannot scrape " << track.info.Name() << ": " << scraped.status();
    }
    track.error = scraped.status().message();
    return;
  }
  track.error.clear();
  track.last_ok_unix_ms = unix_ms;
  TimedReading now{at, ReadMetrics(*scraped)};

  HistoryPoint point;
  point.unix_ms = unix_ms;
  point.step = now.reading.step;
  point.loss = now.reading.loss;
  if (track.last) {
    const MetricsReading& before = track.last->reading;
    double seconds = SecondsBetween(track.last->at, at);
    point.samples_per_s = Rate(before.samples_total, now.reading.samples_total, seconds);
    point.bytes_sent_per_s = Rate(before.bytes_sent_total, now.reading.bytes_sent_total, seconds);
    point.bytes_received_per_s =
        Rate(before.bytes_received_total, now.reading.bytes_received_total, seconds);
    point.step_seconds = SumOf(PhaseMeans(before, now.reading), /*skip_engine=*/false);
  }
  track.latest = point;
  track.history.push_back(point);
  const int64_t oldest = unix_ms - options_.history_seconds * 1000;
  while (!track.history.empty() && track.history.front().unix_ms < oldest) {
    track.history.pop_front();
  }

  track.window.push_back(now);
  const auto window_start = at - std::chrono::milliseconds(options_.straggler_window_ms);
  while (track.window.size() > 2 && track.window[1].at <= window_start) track.window.pop_front();
  track.last = std::move(now);
}

std::string Dashboard::DataJson(int64_t since_unix_ms) const {
  using nlohmann::json;
  std::lock_guard<std::mutex> lock(mu_);
  const SteadyClock::time_point now = SteadyClock::now();
  const int64_t now_unix_ms = UnixMillisNow();
  const int64_t heard_offset_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - heard_at_).count();

  json doc;
  doc["job"] = fleet_.job.empty() ? options_.job : fleet_.job;
  doc["epoch"] = fleet_.epoch;
  doc["started_unix_ms"] = started_unix_ms_;
  doc["now_unix_ms"] = now_unix_ms;
  doc["scrape_interval_ms"] = options_.scrape_interval_ms;
  doc["history_seconds"] = options_.history_seconds;
  doc["heartbeat_timeout_ms"] = options_.heartbeat_timeout_ms;
  doc["straggler_window_s"] = options_.straggler_window_ms / 1000.0;
  doc["expected"] = {{"server", fleet_.num_servers}, {"worker", fleet_.num_workers}};
  // Parameter-server key ranges: range r on servers r .. r + replicas - 1 (FleetView), each
  // copy's state, and the primary (the first live copy; -1: the range is lost).
  doc["replicas"] = fleet_.replicas;
  json ranges = json::array();
  for (int range = 0; range < fleet_.num_servers; ++range) {
    const auto [begin, end] = ServerKeyRange(fleet_.key_space, fleet_.num_servers, range);
    json copies = json::array();
    int primary = -1;
    for (int k = 0; k < fleet_.replicas; ++k) {
      const int server = RangeReplicaServer(range, k, fleet_.num_servers);
      const MemberInfo* member = fleet_.Find(Role::kServer, server);
      const MemberState state = member != nullptr ? member->state : MemberState::kJoining;
      if (primary < 0 && state == MemberState::kAlive) primary = server;
      copies.push_back({{"server", server}, {"state", std::string(MemberStateName(state))}});
    }
    ranges.push_back({{"range", range},
                      {"key_begin", begin},
                      {"key_end", end},
                      {"copies", copies},
                      {"primary", primary}});
  }
  doc["ranges"] = ranges;

  json processes = json::array();
  processes.push_back({{"name", "coordinator"},
                       {"role", "coordinator"},
                       {"rank", 0},
                       {"state", "alive"},
                       {"pid", options_.coordinator_pid},
                       {"address", options_.coordinator_address},
                       {"metrics_url", options_.coordinator_metrics_url},
                       {"heartbeat_age_s", nullptr},
                       {"scrape", nullptr}});
  json series = json::object();
  struct StepTimes {
    std::string name;
    int rank;
    std::map<std::string, double> phases;
  };
  std::vector<StepTimes> step_times;
  for (const auto& [key, track] : tracks_) {
    const MemberInfo& info = track.info;
    json process = {{"name", info.Name()},
                    {"role", std::string(RoleName(info.role))},
                    {"rank", info.rank},
                    {"state", std::string(MemberStateName(info.state))},
                    {"pid", info.pid},
                    {"host", info.host},
                    {"address", info.address},
                    {"metrics_url", info.metrics_address}};
    auto heard = heard_ms_.find(key);
    process["heartbeat_age_s"] =
        heard == heard_ms_.end() ? json(nullptr) : Number((heard->second + heard_offset_ms) / 1000.0);
    process["scrape"] = {
        {"ok", track.scrapes > 0 && track.error.empty()},
        {"error", track.error},
        {"age_s", track.last_ok_unix_ms == 0
                      ? json(nullptr)
                      : Number((now_unix_ms - track.last_ok_unix_ms) / 1000.0)}};
    // The last values read stay on show (the step a failed worker reached); rates only while
    // they are current.
    const MetricsReading* reading = track.last ? &track.last->reading : nullptr;
    const bool current = track.error.empty() && (info.state == MemberState::kAlive ||
                                                 info.state == MemberState::kJoining);
    const HistoryPoint* latest = current && track.latest ? &*track.latest : nullptr;
    process["step"] = Number(reading ? reading->step : kNoValue);
    process["loss"] = Number(reading ? reading->loss : kNoValue);
    process["accuracy"] = Number(reading ? reading->eval_accuracy : kNoValue);
    process["samples_per_s"] = Number(latest ? latest->samples_per_s : kNoValue);
    process["step_seconds"] = Number(latest ? latest->step_seconds : kNoValue);
    process["bytes_sent_per_s"] = Number(latest ? latest->bytes_sent_per_s : kNoValue);
    process["bytes_received_per_s"] = Number(latest ? latest->bytes_received_per_s : kNoValue);
    process["bytes_sent_total"] = Number(reading ? reading->bytes_sent_total : kNoValue);
    process["bytes_received_total"] = Number(reading ? reading->bytes_received_total : kNoValue);
    process["to_servers_bytes_total"] =
        Number(reading ? reading->to_servers_bytes_total : kNoValue);
    process["from_servers_bytes_total"] =
        Number(reading ? reading->from_servers_bytes_total : kNoValue);
    process["collective_bytes_total"] =
        Number(reading ? reading->collective_bytes_total : kNoValue);
    json memory = json::object();
    if (reading) {
      for (const auto& [kind, bytes] : reading->memory) memory[kind] = Number(bytes);
    }
    process["memory"] = memory;
    // FSDP's panel, for the members that export its series: null for the others.
    if (reading && reading->fsdp) {
      json held = json::object(), peak = json::object(), collectives = json::object();
      for (const auto& [kind, bytes] : reading->fsdp_held) held[kind] = Number(bytes);
      for (const auto& [kind, bytes] : reading->fsdp_peak) peak[kind] = Number(bytes);
      for (const auto& [op, sum_count] : reading->fsdp_collective) {
        const auto& [sum, count] = sum_count;
        collectives[op] = {{"seconds_total", Number(sum)},
                           {"count", Number(count)},
                           {"mean_seconds", Number(count > 0 ? sum / count : kNoValue)}};
      }
      process["fsdp"] = {{"held", std::move(held)},
                         {"peak", std::move(peak)},
                         {"collectives", std::move(collectives)},
                         {"prefetch_waits", Number(reading->fsdp_prefetch_waits)},
                         {"prefetch_wait_seconds", Number(reading->fsdp_prefetch_wait_seconds)}};
    } else {
      process["fsdp"] = nullptr;
    }
    process["pipeline"] = reading && reading->pipeline ? PipelineJson(*reading) : json(nullptr);
    processes.push_back(std::move(process));

    json points = {{"role", std::string(RoleName(info.role))}, {"rank", info.rank}};
    json t = json::array(), step = json::array(), loss = json::array(),
         samples = json::array(), step_seconds = json::array(), sent = json::array(),
         received = json::array();
    for (const HistoryPoint& point : track.history) {
      if (point.unix_ms <= since_unix_ms) continue;
      t.push_back(point.unix_ms);
      step.push_back(Number(point.step));
      loss.push_back(Number(point.loss));
      samples.push_back(Number(point.samples_per_s));
      step_seconds.push_back(Number(point.step_seconds));
      sent.push_back(Number(point.bytes_sent_per_s));
      received.push_back(Number(point.bytes_received_per_s));
    }
    points["t"] = std::move(t);
    points["step"] = std::move(step);
    points["loss"] = std::move(loss);
    points["samples_per_s"] = std::move(samples);
    points["step_seconds"] = std::move(step_seconds);
    points["bytes_sent_per_s"] = std::move(sent);
    points["bytes_received_per_s"] = std::move(received);
    series[info.Name()] = std::move(points);

    if (info.role == Role::kWorker && info.state == MemberState::kAlive &&
        track.window.size() >= 2) {
      std::map<std::string, double> phases =
          PhaseMeans(track.window.front().reading, track.window.back().reading);
      if (!phases.empty()) step_times.push_back({info.Name(), info.rank, std::move(phases)});
    }
  }
  doc["processes"] = std::move(processes);
  doc["series"] = std::move(series);

  // The straggler indicator: own time per step (every phase but the engine's) vs the median.
  std::vector<double> own;
  for (const StepTimes& times : step_times) own.push_back(SumOf(times.phases, true));
  const double median = Median(own);
  json workers = json::array();
  json slowest = nullptr, ratio = nullptr;
  double slowest_own = -1;
  for (size_t i = 0; i < step_times.size(); ++i) {
    json phases = json::object();
    for (const auto& [phase, seconds] : step_times[i].phases) phases[phase] = Number(seconds);
    double worker_ratio = median > 0 ? own[i] / median : kNoValue;
    workers.push_back({{"name", step_times[i].name},
                       {"rank", step_times[i].rank},
                       {"phases", phases},
                       {"step_seconds", Number(SumOf(step_times[i].phases, false))},
                       {"own_seconds", Number(own[i])},
                       {"ratio", Number(worker_ratio)}});
    if (own[i] > slowest_own) {
      slowest_own = own[i];
      slowest = step_times[i].name;
      ratio = Number(worker_ratio);
    }
  }
  doc["straggler"] = {{"basis", "data + compute seconds per step (every phase but engine)"},
                      {"median_own_seconds", Number(median)},
                      {"slowest", slowest},
                      {"ratio", ratio},
                      {"workers", workers}};
  return doc.dump();
}

HttpResponse Dashboard::ServePage(const HttpRequest& request) const {
  if (request.method != "GET" && request.method != "HEAD") return MethodNotAllowed();
  HttpResponse response;
  response.content_type = "text/html; charset=utf-8";
  response.body = std::string(DashboardPageHtml());
  return response;
}

HttpResponse Dashboard::ServeData(const HttpRequest& request) const {
  if (request.method != "GET" && request.method != "HEAD") return MethodNotAllowed();
  int64_t since = 0;
  std::string text = QueryValue(request.query, "since");
  if (!text.empty()) {
    char* end = nullptr;
    since = std::strtoll(text.c_str(), &end, 10);
    if (end != text.c_str() + text.size() || since < 0) {
      HttpResponse response;
      response.status = 400;
      response.body = "since must be unix milliseconds, not '" + text + "'\n";
      return response;
    }
  }
  HttpResponse response;
  response.content_type = "application/json";
  response.body = DataJson(since);
  return response;
}

Status AddDashboardHandlers(std::shared_ptr<Dashboard> dashboard, MetricsHttpServer* http) {
  auto page = [dashboard](const HttpRequest& request) { return dashboard->ServePage(request); };
  RETURN_IF_ERROR(http->AddHandler("/dashboard", page));
  RETURN_IF_ERROR(http->AddHandler("/dashboard/", page));
  return http->AddHandler("/dashboard/data", [dashboard](const HttpRequest& request) {
    return dashboard->ServeData(request);
  });
}

}  // namespace tessera::coordinator
