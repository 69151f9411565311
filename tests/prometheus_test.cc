// The real Prometheus server (Debian's /usr/bin/prometheus) finds a training fleet through the
// coordinator's HTTP service discovery (/sd), scrapes every process, and answers a
// training-rate query for every worker. The coordinator's file_sd targets file lists the same
// processes, and a failed worker disappears from both lists and from Prometheus' targets.
//
// Every wait is bounded: the fleet's start (kStartMs), Prometheus' start (kPrometheusStartMs),
// its first successful scrape of every process and the rate query (kScrapeMs each), and the
// failure detection (kFailureMs). Prometheus runs under a PrometheusServer, whose destructor
// stops it (SIGTERM, then SIGKILL), so an early return or a failed ASSERT never leaves it
// running; its ProcessGroup also kills it with SIGKILL, and PR_SET_PDEATHSIG if the test dies.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/fleet_harness.h"
#include "tools/process_group.h"

namespace tessera::testing {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kJob[] = "promtest";
constexpr int64_t kStartMs = 30000;
constexpr int64_t kPrometheusStartMs = 30000;
constexpr int64_t kScrapeMs = 60000;
constexpr int64_t kFailureMs = 30000;
constexpr int64_t kHttpMs = 5000;
constexpr int64_t kRetryMs = 250;

// Fast failure detection, so the failed worker leaves the lists within seconds; loose enough
// for a loaded 2-core machine.
const std::vector<std::string> kHeartbeatFlags = {"--heartbeat-interval-ms", "500",
                                                  "--heartbeat-timeout-ms", "4000"};
// Workers that train until the test stops them (~2000 steps/s here: days of steps).
const std::vector<std::string> kTrainingFlags = {
    "--mode", "ps-sync", "--steps", "100000000", "--hidden", "32", "--input-dim", "16",
    "--classes", "4", "--train-samples", "2000", "--device", "cpu", "--log-every", "10000"};

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// A TCP port on 127.0.0.1 that was free a moment ago: bound with port 0, read back, closed.
// Another process may take it before Prometheus binds it; PrometheusServer::Start retries then.
StatusOr<int> FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    close(fd);
    return InternalError("cannot bind a free port on 127.0.0.1");
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

// Percent-encodes everything but unreserved characters (RFC 3986), for a query parameter.
std::string UrlEncode(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
        c == '~') {
      out += c;
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", static_cast<unsigned char>(c));
      out += hex;
    }
  }
  return out;
}

// "http://127.0.0.1:PORT/metrics" -> "127.0.0.1:PORT".
std::string HostPort(const std::string& metrics_url) {
  std::string rest = metrics_url.substr(metrics_url.find("://") + 3);  // http or https
  return rest.substr(0, rest.find('/'));
}

// One scrape target as "role rank HOST:PORT", the way the tests compare the lists.
using TargetSet = std::set<std::string>;

std::string Target(const std::string& role, const std::string& rank, const std::string& address) {
  return role + " " + rank + " " + address;
}

// The targets of an http_sd / file_sd document, checking the labels every group must carry.
StatusOr<TargetSet> ParseTargetGroups(const std::string& text) {
  nlohmann::json groups = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (groups.is_discarded() || !groups.is_array()) {
    return DataLossError("not a JSON array of target groups: " + text);
  }
  TargetSet targets;
  for (const nlohmann::json& group : groups) {
    const nlohmann::json& labels = group.value("labels", nlohmann::json::object());
    if (!group.contains("targets") || !group["targets"].is_array() ||
        group["targets"].size() != 1 || labels.value("tessera_job", "") != kJob ||
        labels.value("__metrics_path__", "") != "/metrics" || !labels.contains("role") ||
        !labels.contains("rank")) {
      return DataLossError("malformed target group " + group.dump() + " in " + text);
    }
    targets.insert(Target(labels["role"].get<std::string>(), labels["rank"].get<std::string>(),
                          group["targets"][0].get<std::string>()));
  }
  return targets;
}

// A progress line in the test log, with the time since the test started.
void Progress(SteadyClock::time_point start, const std::string& what) {
  std::printf("[prometheus_test +%lld ms] %s\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         SteadyClock::now() - start)
                                         .count()),
              what.c_str());
  std::fflush(stdout);
}

std::string Describe(const TargetSet& targets) {
  std::string out;
  for (const std::string& target : targets) out += (out.empty() ? "" : ", ") + target;
  return "{" + out + "}";
}

// The real Prometheus server on 127.0.0.1, as a child process that never outlives this object.
class PrometheusServer {
 public:
  PrometheusServer() = default;
  ~PrometheusServer() { Stop(); }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  // Starts it with `config` (YAML) and waits until /-/ready answers 200. The port is picked
  // as in FreeLoopbackPort; if another process took it meanwhile, tries again with a new one.
  Status Start(const std::string& config, Deadline deadline) {
    const std::string config_path = TempPath("prometheus.yml");
    WriteFile(config_path, config);
    for (int attempt = 1;; ++attempt) {
      ASSIGN_OR_RETURN(port_, FreeLoopbackPort());
      ASSIGN_OR_RETURN(id_, group_.Spawn("prometheus",
                                         {kPrometheus, "--config.file=" + config_path,
                                          "--storage.tsdb.path=" +
                                              TempPath("prometheus-data-" + std::to_string(attempt)),
                                          "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                          "--log.level=info"}));
      exited_ = false;
      Status ready = WaitReady(deadline);
      if (ready.ok()) return ready;
      if (exited_ && Output().find("address already in use") != std::string::npos &&
          attempt < 3) {
        continue;
      }
      return ready;
    }
  }

  // SIGTERM, then SIGKILL after 5 s; a no-op when it is not running. Every wait is bounded.
  void Stop() {
    group_.StopAll(std::chrono::seconds(5), [this](const tools::ChildEvent& event) { Take(event); });
  }
  bool Running() const { return id_ >= 0 && group_.Running(id_); }

  // Reads its output for up to `ms` (so it never blocks on a full pipe); FailedPrecondition
  // with its output if it has exited.
  Status Pause(int64_t ms) {
    Deadline deadline = Deadline::AfterMillis(ms);
    while (!deadline.Expired() && !exited_) {
      for (const tools::ChildEvent& event : group_.Poll(deadline)) Take(event);
    }
    if (exited_) {
      return FailedPreconditionError("prometheus " + exit_.Describe() + "; output:\n" + Output());
    }
    return OkStatus();
  }

  // GET /api/v1/... : the "data" member of a successful answer.
  StatusOr<nlohmann::json> Api(const std::string& path_and_query) {
    const std::string url = "http://127.0.0.1:" + std::to_string(port_) + path_and_query;
    ASSIGN_OR_RETURN(HttpResult result, HttpGet(url, kHttpMs));
    nlohmann::json reply = nlohmann::json::parse(result.body, nullptr, false);
    if (result.status != 200 || reply.is_discarded() || reply.value("status", "") != "success" ||
        !reply.contains("data")) {
      return UnavailableError("GET " + url + ": HTTP " + std::to_string(result.status) + ": " +
                              result.body);
    }
    return reply["data"];
  }

  std::string Output() const {
    std::string out;
    for (const std::string& line : lines_) out += line + "\n";
    return out;
  }

 private:
  void Take(const tools::ChildEvent& event) {
    if (event.kind == tools::ChildEvent::Kind::kLine) {
      lines_.push_back(event.line);
    } else {
      exited_ = true;
      exit_ = event.exit;
    }
  }

  Status WaitReady(Deadline deadline) {
    const std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/-/ready";
    while (true) {
      StatusOr<HttpResult> ready = HttpGet(url, kHttpMs);
      if (ready.ok() && ready->status == 200) return OkStatus();
      RETURN_IF_ERROR(Pause(kRetryMs));
      if (deadline.Expired()) {
        return DeadlineExceededError("prometheus was not ready at " + url + "; output:\n" +
                                     Output());
      }
    }
  }

  tools::ProcessGroup group_;
  int id_ = -1;
  int port_ = 0;
  bool exited_ = false;
  tools::ChildExit exit_;
  std::vector<std::string> lines_;
};

// Prometheus' active targets of the tessera scrape job: "role rank instance" -> health, or
// the scrape's last error when it is not up.
StatusOr<std::map<std::string, std::string>> ActiveTargets(PrometheusServer& prometheus) {
  ASSIGN_OR_RETURN(nlohmann::json data, prometheus.Api("/api/v1/targets?state=active"));
  std::map<std::string, std::string> targets;
  for (const nlohmann::json& target : data.value("activeTargets", nlohmann::json::array())) {
    const nlohmann::json& labels = target.value("labels", nlohmann::json::object());
    std::string health = target.value("health", "");
    if (health != "up") health += " (" + target.value("lastError", "") + ")";
    targets[Target(labels.value("role", "?"), labels.value("rank", "?"),
                   labels.value("instance", "?"))] = health;
  }
  return targets;
}

std::string Describe(const std::map<std::string, std::string>& targets) {
  std::string out;
  for (const auto& [target, health] : targets) {
    out += (out.empty() ? "" : ", ") + target + ": " + health;
  }
  return "{" + out + "}";
}

// The tail of every fleet process's output, for failure messages.
std::string FleetOutput(FleetHarness& fleet, const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) {
    // Reads what arrived meanwhile (the line is never printed).
    (void)fleet.WaitForLine(id, "\x01", Deadline::AfterMillis(10));
    std::string text = fleet.Output(id);
    if (text.size() > 3000) text = "..." + text.substr(text.size() - 3000);
    out += "--- " + fleet.process(id).label + ":\n" + text;
  }
  return out;
}

TEST(PrometheusTest, ScrapesEveryProcessFoundThroughServiceDiscovery) {
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << kPrometheus << " is missing: install Debian's prometheus package (tools/install_deps.sh "
      << "does); this test needs the real server";
  const SteadyClock::time_point start = SteadyClock::now();
  FleetHarness fleet;
  const std::string file_sd = TempPath("targets.json");
  const std::vector<std::string> sizes = Concat({"--num-servers", "1", "--num-workers", "2",
                                                 "--job", kJob},
                                                kHeartbeatFlags);

  // The fleet: coordinator (with the file_sd file), one server, two training workers.
  auto coordinator = fleet.StartCoordinator(Concat(sizes, {"--file-sd", file_sd}));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int coordinator_id = 0;
  const std::string coordinator_metrics = fleet.process(coordinator_id).metrics_url;
  const std::string sd_url = "http://" + HostPort(coordinator_metrics) + "/sd";
  const std::vector<std::string> join = Concat(sizes, {"--coordinator", *coordinator});
  std::vector<int> ids = {coordinator_id};
  auto server = fleet.Start("server 0", "server/ps/tessera-server", Concat(join, {"--rank", "0"}));
  ASSERT_TRUE(server.ok()) << server.status();
  ids.push_back(*server);
  std::vector<int> workers;
  for (int rank : {0, 1}) {
    auto worker = fleet.Start("worker " + std::to_string(rank), "worker/tessera-worker",
                              Concat(Concat(join, kTrainingFlags),
                                     {"--rank", std::to_string(rank)}));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*worker);
    ids.push_back(*worker);
  }
  for (int id : ids) {
    Status ready = fleet.WaitReady(id, Deadline::AfterMillis(kStartMs));
    ASSERT_TRUE(ready.ok()) << ready;
  }

  // What every list must show: each process at the metrics address it announced.
  TargetSet expected;
  for (int id : ids) {
    const FleetHarness::Process& process = fleet.process(id);
    const std::string role = process.label.substr(0, process.label.find(' '));
    expected.insert(Target(role, std::to_string(process.rank), HostPort(process.metrics_url)));
  }
  ASSERT_EQ(expected.size(), 4u) << Describe(expected);
  Progress(start, "fleet ready: " + Describe(expected));

  // /sd and the file_sd file list all four once they have registered (bounded wait).
  TargetSet from_sd, from_file;
  for (Deadline deadline = Deadline::AfterMillis(kStartMs);;) {
    StatusOr<HttpResult> sd = HttpGet(sd_url, kHttpMs);
    ASSERT_TRUE(sd.ok()) << sd.status();
    ASSERT_EQ(sd->status, 200) << sd->body;
    auto sd_targets = ParseTargetGroups(sd->body);
    ASSERT_TRUE(sd_targets.ok()) << sd_targets.status();
    from_sd = *sd_targets;
    auto file_targets = ParseTargetGroups(ReadWholeFile(file_sd));
    ASSERT_TRUE(file_targets.ok()) << file_targets.status();
    from_file = *file_targets;
    if ((from_sd == expected && from_file == expected) || deadline.Expired()) break;
    usleep(kRetryMs * 1000);
  }
  EXPECT_EQ(from_sd, expected) << "/sd: " << Describe(from_sd) << "\nexpected "
                               << Describe(expected);
  EXPECT_EQ(from_file, expected) << file_sd << ": " << Describe(from_file) << "\nexpected "
                                 << Describe(expected);
  Progress(start, "/sd and " + file_sd + " list every process");

  // The real Prometheus, configured with nothing but the coordinator's /sd URL.
  PrometheusServer prometheus;  // stops Prometheus whenever the test leaves this scope
  const std::string config =
      "global:\n"
      "  scrape_interval: 1s\n"
      "  scrape_timeout: 1s\n"
      "  evaluation_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: tessera\n"
      "    http_sd_configs:\n"
      "      - url: " + sd_url + "\n"
      "        refresh_interval: 1s\n";
  Status started = prometheus.Start(config, Deadline::AfterMillis(kPrometheusStartMs));
  ASSERT_TRUE(started.ok()) << started;
  Progress(start, "prometheus ready");

  // Wait until Prometheus has scraped every process successfully.
  std::map<std::string, std::string> targets;
  std::string last_error;
  for (Deadline deadline = Deadline::AfterMillis(kScrapeMs);;) {
    auto active = ActiveTargets(prometheus);
    if (active.ok()) {
      targets = *active;
      bool all_up = targets.size() == expected.size();
      for (const std::string& target : expected) {
        all_up = all_up && targets.count(target) && targets[target] == "up";
      }
      if (all_up) {
        Progress(start, "prometheus scraped every process: " + Describe(targets));
        break;
      }
    } else {
      last_error = active.status().message();
    }
    ASSERT_FALSE(deadline.Expired())
        << "Prometheus did not scrape every process within " << kScrapeMs << " ms; targets "
        << Describe(targets) << "; expected " << Describe(expected) << " up; " << last_error
        << "\n--- prometheus:\n" << prometheus.Output() << FleetOutput(fleet, ids);
    Status paused = prometheus.Pause(kRetryMs);
    ASSERT_TRUE(paused.ok()) << paused;
  }

  // A training-rate query answers for every worker rank, through Prometheus' query API.
  const std::string query = "rate(tessera_train_samples_total{tessera_job=\"" +
                            std::string(kJob) + "\",role=\"worker\"}[5s])";
  std::map<std::string, double> rates;
  for (Deadline deadline = Deadline::AfterMillis(kScrapeMs);;) {
    auto data = prometheus.Api("/api/v1/query?query=" + UrlEncode(query));
    if (data.ok()) {
      rates.clear();
      for (const nlohmann::json& series : data->value("result", nlohmann::json::array())) {
        const nlohmann::json& metric = series.value("metric", nlohmann::json::object());
        rates[metric.value("rank", "?")] = std::stod(series["value"][1].get<std::string>());
      }
      if (rates.size() == 2 && rates["0"] > 0 && rates["1"] > 0) {
        Progress(start, query + ": worker 0 " + std::to_string(rates["0"]) + " samples/s, worker 1 " +
                            std::to_string(rates["1"]) + " samples/s");
        break;
      }
    } else {
      last_error = data.status().message();
    }
    std::string got;
    for (const auto& [rank, rate] : rates) got += " rank " + rank + "=" + std::to_string(rate);
    ASSERT_FALSE(deadline.Expired())
        << query << " did not return a positive rate for worker ranks 0 and 1 within "
        << kScrapeMs << " ms; got" << got << "; " << last_error << FleetOutput(fleet, ids);
    Status paused = prometheus.Pause(kRetryMs);
    ASSERT_TRUE(paused.ok()) << paused;
  }
  for (const auto& [rank, rate] : rates) {
    EXPECT_TRUE(std::isfinite(rate) && rate > 0) << "worker " << rank << ": " << rate;
  }

  // A failed worker leaves /sd, the file and Prometheus' targets; the coordinator stays.
  ASSERT_TRUE(fleet.Signal(workers[1], SIGKILL).ok());
  const std::string killed = Target("worker", "1", HostPort(fleet.process(workers[1]).metrics_url));
  const std::string kept = Target("coordinator", "0", HostPort(coordinator_metrics));
  for (Deadline deadline = Deadline::AfterMillis(kFailureMs);;) {
    StatusOr<HttpResult> sd = HttpGet(sd_url, kHttpMs);
    ASSERT_TRUE(sd.ok()) << sd.status();
    auto sd_targets = ParseTargetGroups(sd->body);
    auto file_targets = ParseTargetGroups(ReadWholeFile(file_sd));
    auto active = ActiveTargets(prometheus);
    ASSERT_TRUE(sd_targets.ok() && file_targets.ok()) << sd->body;
    if (active.ok()) targets = *active;
    bool gone = !sd_targets->count(killed) && !file_targets->count(killed) &&
                active.ok() && !targets.count(killed);
    if (gone) {
      EXPECT_TRUE(sd_targets->count(kept)) << Describe(*sd_targets);
      EXPECT_TRUE(file_targets->count(kept)) << Describe(*file_targets);
      Progress(start, "killed " + killed + " left /sd, the file and prometheus' targets");
      break;
    }
    ASSERT_FALSE(deadline.Expired())
        << killed << " was still listed " << kFailureMs << " ms after SIGKILL: /sd "
        << Describe(*sd_targets) << "; file " << Describe(*file_targets) << "; prometheus "
        << Describe(targets) << FleetOutput(fleet, ids);
    Status paused = prometheus.Pause(kRetryMs);
    ASSERT_TRUE(paused.ok()) << paused;
  }

  prometheus.Stop();
  EXPECT_FALSE(prometheus.Running());
  fleet.StopAll();
  Progress(start, "stopped prometheus and the fleet");
}

// Over HTTPS with basic auth (issue 15, item 4): a server serves /metrics with a certificate
// and a user file, and the real Prometheus scrapes it with the scrape configuration
// docs/security-http.md shows (scheme https, tls_config, basic_auth). Through a static target:
// the coordinator's /sd does not take https:// metrics URLs yet (coordinator/
// service_discovery.cc), so this fleet's coordinator serves plain HTTP on the loopback.
TEST(PrometheusTest, ScrapesOverTlsWithBasicAuth) {
  ASSERT_EQ(access(kPrometheus, X_OK), 0) << kPrometheus << " is missing";
  if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/openssl";
  const std::string cert = TempPath("tls-cert.pem");
  const std::string key = TempPath("tls-key.pem");
  const std::string make_cert =
      "/usr/bin/openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 -keyout " + key +
      " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(make_cert.c_str()), 0) << make_cert;
  const std::string users = TempPath("metrics-users");
  WriteFile(users, "prometheus:correct horse battery staple\n");
  ASSERT_EQ(chmod(users.c_str(), 0600), 0);

  FleetHarness fleet;
  // A coordinator and a server waiting for a worker that never comes: they serve until the
  // test ends. The server is ready (and announces its URL) only once the fleet is whole, but
  // its HTTP serves from the start: on a port chosen here.
  StatusOr<int> port = FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::vector<std::string> sizes = {"--num-servers", "1", "--num-workers", "1", "--job",
                                          kJob, "--rendezvous-timeout-ms", "600000"};
  auto coordinator = fleet.StartCoordinator(sizes);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto server = fleet.Start("server 0", "server/ps/tessera-server",
                            Concat(sizes, {"--coordinator", *coordinator, "--rank", "0",
                                           "--metrics-port", std::to_string(*port),
                                           "--metrics-tls-cert", cert, "--metrics-tls-key", key,
                                           "--metrics-auth-file", users}));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string metrics_url = "https://127.0.0.1:" + std::to_string(*port) + "/metrics";
  Status registering =
      fleet.WaitForLine(*server, "registering as server 0", Deadline::AfterMillis(kStartMs));
  ASSERT_TRUE(registering.ok()) << registering << fleet.Output(*server);
  // Over plain HTTP nothing is served.
  StatusOr<HttpResult> plain = HttpGet("http://" + HostPort(metrics_url) + "/metrics", kHttpMs);
  EXPECT_FALSE(plain.ok() && plain->status == 200);

  const std::string tls_and_auth =
      "tls_config:\n"
      "      ca_file: " + cert + "\n"
      "    basic_auth:\n"
      "      username: prometheus\n"
      "      password: correct horse battery staple\n";
  PrometheusServer prometheus;
  const std::string config =
      "global:\n"
      "  scrape_interval: 1s\n"
      "  scrape_timeout: 1s\n"
      "scrape_configs:\n"
      "  - job_name: tessera\n"
      "    scheme: https\n"
      "    " + tls_and_auth +
      "    static_configs:\n"
      "      - targets: ['" + HostPort(metrics_url) + "']\n"
      "        labels: {role: server, rank: '0'}\n";
  Status started = prometheus.Start(config, Deadline::AfterMillis(kPrometheusStartMs));
  ASSERT_TRUE(started.ok()) << started;

  const std::string expected = Target("server", "0", HostPort(metrics_url));
  std::map<std::string, std::string> targets;
  std::string last_error;
  for (Deadline deadline = Deadline::AfterMillis(kScrapeMs);;) {
    auto active = ActiveTargets(prometheus);
    if (active.ok()) {
      targets = *active;
      if (targets.count(expected) && targets[expected] == "up") break;
    } else {
      last_error = active.status().message();
    }
    ASSERT_FALSE(deadline.Expired())
        << "Prometheus did not scrape " << expected << " over TLS within " << kScrapeMs
        << " ms; targets " << Describe(targets) << "; " << last_error << "\n--- prometheus:\n"
        << prometheus.Output() << FleetOutput(fleet, {0, *server});
    Status paused = prometheus.Pause(kRetryMs);
    ASSERT_TRUE(paused.ok()) << paused;
  }
  auto up = prometheus.Api("/api/v1/query?query=" +
                           UrlEncode("tessera_build_info{instance=\"" + HostPort(metrics_url) +
                                     "\"}"));
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->value("result", nlohmann::json::array()).size(), 1u) << up->dump();
  prometheus.Stop();
  fleet.StopAll();
}

}  // namespace
}  // namespace tessera::testing
