// Dashboard: the coordinator's built-in live view of its job, for a person with a browser.
//
//   GET /dashboard       a self-contained page (HTML, inline CSS and JS, nothing external)
//   GET /dashboard/data  the JSON the page polls every second (?since=UNIX_MS: only newer
//                        history points, so a poll stays small however long the page is open)
//
// Data flow:
//   - membership: the coordinator's on_fleet_change hook calls UpdateFleet() with every new
//     FleetView (who, role, rank, state, pid, addresses);
//   - heartbeats: Start()'s HeardSource (the coordinator's MillisSinceHeard()) is read once
//     per scrape, on the scraping thread;
//   - metrics: a background thread scrapes the /metrics page of every joining or alive member
//     each scrape_interval_ms (up to scrape_threads at once, each bounded by
//     scrape_timeout_ms), reads the few metrics the page shows (ReadMetrics), derives rates
//     from consecutive scrapes, and appends one point per member to a history that keeps
//     history_seconds (10 minutes by default) of them.
// A member that fails or leaves keeps its row and its history, with its state.
//
// What the page shows: fleet health (every process with role, rank, state, pid, addresses,
// seconds since its last heartbeat, whether its last scrape worked), loss and samples/s per
// worker over time, step time, bytes sent and received per process (and by peer role), the
// straggler indicator and the model state each rank holds; for torch ranks that train with
// tessera.torch.fsdp, the FSDP bytes they hold and held at most by kind, the mean time of their
// all-gathers, reduce-scatters and all-reduces, and their waits for prefetched all-gathers;
// for pipeline ranks, the last step as a timeline (rank by time, forwards and backwards
// coloured), its bubble beside the schedule's, micro-batches held and bytes sent.
// The straggler indicator compares each worker's own time per step, the data and compute
// phases of tessera_train_step_phase_seconds over the last straggler_window_ms, with the
// median over the workers: in synchronous modes everyone's total step time is the same (the
// fast ones wait in the engine phase), so the time a rank spends on its own work is what
// shows who holds the others up.
//
// Thread-safety: thread-safe. UpdateFleet() is for the coordinator's hook, the Serve*()
// functions for the HTTP server's threads; Start() and Stop() for the owner.
#ifndef TESSERA_COORDINATOR_DASHBOARD_H_
#define TESSERA_COORDINATOR_DASHBOARD_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metrics_http.h"
#include "coordinator/metrics_scraper.h"

namespace tessera::coordinator {

struct DashboardOptions {
  std::string job = "tessera";
  // The coordinator's own row of the fleet table.
  std::string coordinator_address;      // tcp://HOST:PORT
  std::string coordinator_metrics_url;  // http://HOST:PORT/metrics
  int64_t coordinator_pid = 0;
  // Shown on the page, which marks heartbeats older than half of it.
  int64_t heartbeat_timeout_ms = 4000;
  int64_t scrape_interval_ms = 1000;  // > 0
  int64_t scrape_timeout_ms = 800;    // > 0, <= scrape_interval_ms
  int64_t history_seconds = 600;      // > 0
  int64_t straggler_window_ms = 10000;  // > 0
  int scrape_threads = 8;               // >= 1
};

// Milliseconds since each member, by (role, rank), was last heard from.
using HeardSource = std::function<std::map<std::pair<Role, int>, int64_t>()>;

// A number the dashboard does not have (a metric the process does not export, a rate without
// a previous scrape); null in the JSON.
inline constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

// What the dashboard reads from one scrape of one process. kNoValue (or empty) when the
// process does not export the metric.
struct MetricsReading {
  double step = kNoValue;                      // tessera_train_step
  double loss = kNoValue;                      // tessera_train_loss
  double samples_total = kNoValue;             // tessera_train_samples_total
  double eval_accuracy = kNoValue;             // tessera_train_eval_accuracy
  // The transport's counters (every process), and a worker's by peer role.
  double bytes_sent_total = kNoValue;          // tessera_bytes_sent_total
  double bytes_received_total = kNoValue;      // tessera_bytes_received_total
  double to_servers_bytes_total = kNoValue;    // tessera_ps_client_bytes_sent_total, all ops
  double from_servers_bytes_total = kNoValue;  // tessera_ps_client_bytes_received_total, all ops
  double collective_bytes_total = kNoValue;    // tessera_collective_bytes_total, all ops
  // tessera_train_step_phase_seconds: phase -> {_sum, _count}.
  std::map<std::string, std::pair<double, double>> phases;
  // Bytes of model state by kind (parameters, gradients, optimizer_state):
  // tessera_model_state_bytes on workers, tessera_ps_parameter_bytes and
  // tessera_ps_optimizer_state_bytes on parameter servers.
  std::map<std::string, double> memory;
  // tessera.torch.fsdp's series (a torch rank training with FSDP); fsdp is false, and the
  // maps empty, when the process exports none of them.
  bool fsdp = false;
  std::map<std::string, double> fsdp_held;  // tessera_fsdp_param_bytes, by kind
  std::map<std::string, double> fsdp_peak;  // tessera_fsdp_param_peak_bytes, by kind
  // tessera_fsdp_collective_seconds: op -> {_sum, _count}.
  std::map<std::string, std::pair<double, double>> fsdp_collective;
  double fsdp_prefetch_waits = kNoValue;          // tessera_fsdp_prefetch_waits_total
  double fsdp_prefetch_wait_seconds = kNoValue;   // tessera_fsdp_prefetch_wait_seconds_total
  // A pipeline rank's series (tessera_pipeline_*, worker/pipeline/pipeline_metrics.h: native
  // or tessera.torch.pipelining); pipeline is false, and the rest empty, without them.
  bool pipeline = false;
  double pipeline_rank = kNoValue;
  double pipeline_steps = kNoValue;
  double pipeline_idle_seconds = kNoValue;                  // over every step
  std::map<std::string, double> pipeline_busy_seconds;      // over every step, by stage
  std::map<std::string, double> pipeline_sent_bytes;        // activation, gradient
  double pipeline_held = kNoValue;                          // the last step's most held
  double pipeline_held_bound = kNoValue;
  double pipeline_bubble_formula = kNoValue;
  double pipeline_step_start_unix_seconds = kNoValue;       // the last step's
  double pipeline_step_seconds = kNoValue;
  struct PipelineAction {
    std::string op;  // F, B, I, W
    int stage = 0;
    int micro_batch = 0;
    double start_seconds = 0;  // after the step's start
    double end_seconds = 0;
  };
  std::vector<PipelineAction> pipeline_actions;  // the last step's, by start
};
MetricsReading ReadMetrics(const std::vector<MetricSample>& samples);

// The page served at /dashboard.
std::string_view DashboardPageHtml();

class Dashboard {
 public:
  // InvalidArgument naming the option when one is out of range.
  static StatusOr<std::unique_ptr<Dashboard>> Create(const DashboardOptions& options);
  ~Dashboard();  // Stop()
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // The coordinator's current membership.
  void UpdateFleet(const FleetView& view);

  // Starts the scraping thread, which calls `heard` (may be empty) once per scrape.
  // REQUIRES: not started. `heard` must stay callable until Stop() returns.
  void Start(HeardSource heard);
  // Stops and joins the scraping thread (within scrape_timeout_ms); no-op when not running.
  // The pages keep serving what was gathered.
  void Stop();

  // One round of what the thread does every interval: scrapes every joining or alive member
  // once and records the results. Blocks for up to scrape_timeout_ms. For tests and tools;
  // concurrent calls run one after the other.
  void ScrapeOnce(const HeardSource& heard = nullptr);

  // The /dashboard/data document; history points newer than `since_unix_ms` only (0: all).
  std::string DataJson(int64_t since_unix_ms) const;

  HttpResponse ServePage(const HttpRequest& request) const;
  HttpResponse ServeData(const HttpRequest& request) const;

 private:
  // One point of a member's history: what it reported at unix_ms, with rates over the time
  // since its previous scrape.
  struct HistoryPoint {
    int64_t unix_ms = 0;
    double step = kNoValue;
    double loss = kNoValue;
    double samples_per_s = kNoValue;
    double step_seconds = kNoValue;  // mean step time, all phases
    double bytes_sent_per_s = kNoValue;
    double bytes_received_per_s = kNoValue;
  };
  struct TimedReading {
    SteadyClock::time_point at;
    MetricsReading reading;
  };
  struct Track {
    MemberInfo info;
    std::optional<TimedReading> last;  // the last successful scrape
    int64_t last_ok_unix_ms = 0;
    std::string error;  // the last scrape's error; empty after a success
    int64_t scrapes = 0;
    std::optional<HistoryPoint> latest;
    std::deque<HistoryPoint> history;
    // Successful scrapes of the last straggler_window_ms (and one before), for step times.
    std::deque<TimedReading> window;
  };
  using Key = std::pair<Role, int>;

  explicit Dashboard(const DashboardOptions& options);
  void Loop(HeardSource heard);
  // REQUIRES: mu_ held.
  void Record(Track& track, SteadyClock::time_point at, int64_t unix_ms,
              StatusOr<std::vector<MetricSample>> scraped);

  const DashboardOptions options_;
  const int64_t started_unix_ms_;

  std::mutex scrape_mu_;  // serialises ScrapeOnce()

  mutable std::mutex mu_;
  FleetView fleet_;                       // guarded by mu_
  std::map<Key, Track> tracks_;           // guarded by mu_
  std::map<Key, int64_t> heard_ms_;       // guarded by mu_
  SteadyClock::time_point heard_at_;      // guarded by mu_; when heard_ms_ was read

  std::mutex thread_mu_;  // guards the fields below
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Serves `dashboard` at /dashboard (and /dashboard/) and /dashboard/data on `http`.
Status AddDashboardHandlers(std::shared_ptr<Dashboard> dashboard, MetricsHttpServer* http);

}  // namespace tessera::coordinator

#endif  // TESSERA_COORDINATOR_DASHBOARD_H_
