// The coordinator's /dashboard in a real browser: headless Chromium (Debian's chromium) opens
// the page of a running training fleet (coordinator, 1 server, 2 ps-sync workers), runs its
// JavaScript, and the DOM it leaves must list every process of the fleet by role and rank and
// hold loss and throughput charts with data points for both workers. A screenshot goes to the
// test's undeclared outputs (bazel-testlogs/tests/dashboard_test/test.outputs/dashboard.png),
// with the DOM beside it (dashboard.html).
//
// Every wait is bounded: the fleet's start (kStartMs), the coordinator's first scrapes
// (kScrapeMs) and each Chromium run (kBrowserMs). Chromium runs in a ProcessGroup: a run that
// overstays is killed with its whole process group (SIGTERM, then SIGKILL), and the group's
// destructor kills whatever is left when the test returns early, as does PR_SET_PDEATHSIG if
// the test dies.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
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

constexpr char kChromium[] = "/usr/bin/chromium";
constexpr char kJob[] = "dashtest";
constexpr int64_t kStartMs = 30000;
constexpr int64_t kScrapeMs = 60000;
constexpr int64_t kBrowserMs = 90000;
constexpr int64_t kHttpMs = 5000;
constexpr int64_t kRetryMs = 250;
// History points per worker the coordinator must have before the browser looks.
constexpr size_t kMinPoints = 3;
// How much page time Chromium gives the JavaScript (its first fetch draws everything; a few
// more polls run in this time too).
constexpr char kVirtualTimeBudgetMs[] = "5000";

// Workers that train until the test stops them.
const std::vector<std::string> kTrainingFlags = {
    "--mode", "ps-sync", "--steps", "100000000", "--hidden", "32", "--input-dim", "16",
    "--classes", "4", "--train-samples", "2000", "--device", "cpu", "--log-every", "10000"};

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// Where Bazel keeps files a test leaves for people (test.outputs/).
std::string OutputPath(const std::string& name) {
  return EnvOr("TEST_UNDECLARED_OUTPUTS_DIR", EnvOr("TEST_TMPDIR", "/tmp")) + "/" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// "http://127.0.0.1:PORT/metrics" -> "127.0.0.1:PORT".
std::string HostPort(const std::string& metrics_url) {
  std::string rest = metrics_url.substr(std::string("http://").size());
  return rest.substr(0, rest.find('/'));
}

void Progress(SteadyClock::time_point start, const std::string& what) {
  std::printf("[dashboard_test +%lld ms] %s\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         SteadyClock::now() - start)
                                         .count()),
              what.c_str());
  std::fflush(stdout);
}

std::string Describe(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return "{" + out + "}";
}

// The attributes of every start tag in `html` that has attribute `name`, in document order.
// Enough for the serialised DOM Chromium prints: double-quoted values without '>' in the
// attributes we look for.
std::vector<std::map<std::string, std::string>> TagsWith(const std::string& html,
                                                         const std::string& name) {
  std::vector<std::map<std::string, std::string>> tags;
  const std::string needle = " " + name + "=\"";
  for (size_t at = html.find(needle); at != std::string::npos; at = html.find(needle, at + 1)) {
    size_t open = html.rfind('<', at);
    size_t close = html.find('>', at);
    if (open == std::string::npos || close == std::string::npos) break;
    std::map<std::string, std::string> attributes;
    for (size_t i = html.find(' ', open); i != std::string::npos && i < close;) {
      size_t eq = html.find("=\"", i);
      if (eq == std::string::npos || eq > close) break;
      size_t end = html.find('"', eq + 2);
      if (end == std::string::npos || end > close) break;
      size_t key_start = html.find_last_of(' ', eq) + 1;
      attributes[html.substr(key_start, eq - key_start)] = html.substr(eq + 2, end - eq - 2);
      i = end + 1;
    }
    tags.push_back(std::move(attributes));
  }
  return tags;
}

// One headless Chromium run; what it printed on stdout and stderr, or an error naming the
// reason (it did not start, it failed, it ran past kBrowserMs).
struct BrowserRun {
  std::string out;
  std::string err;
};

StatusOr<BrowserRun> RunChromium(const std::vector<std::string>& args, const std::string& profile) {
  tools::ProcessGroup::Options options;
  options.max_line_bytes = size_t{64} << 20;  // --dump-dom prints the body as one long line
  tools::ProcessGroup group(options);  // kills Chromium and its helpers on every return path
  std::vector<std::string> argv = {kChromium, "--headless", "--no-sandbox", "--disable-gpu",
                                   "--disable-dev-shm-usage", "--no-first-run",
                                   "--user-data-dir=" + profile,
                                   std::string("--virtual-time-budget=") + kVirtualTimeBudgetMs};
  argv.insert(argv.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(int id, group.Spawn("chromium", argv));
  BrowserRun run;
  std::optional<tools::ChildExit> exit;
  auto take = [&](const tools::ChildEvent& event) {
    if (event.kind == tools::ChildEvent::Kind::kExit) {
      exit = event.exit;
    } else {
      (event.stream == tools::ChildStream::kStdout ? run.out : run.err) += event.line + "\n";
    }
  };
  for (Deadline deadline = Deadline::AfterMillis(kBrowserMs); !exit;) {
    if (deadline.Expired()) {
      group.Stop({id}, std::chrono::seconds(5), take);
      return DeadlineExceededError("chromium did not finish within " +
                                   std::to_string(kBrowserMs) + " ms; stderr:\n" + run.err);
    }
    for (const tools::ChildEvent& event : group.Poll(deadline)) take(event);
  }
  if (!exit->success()) {
    return InternalError("chromium " + exit->Describe() + "; stderr:\n" + run.err);
  }
  return run;
}

// Reads /dashboard/data until every process is alive, both workers have kMinPoints points of
// loss and throughput and both are in the straggler table; the last document, or an error
// saying what was missing.
StatusOr<nlohmann::json> WaitForData(const std::string& data_url) {
  std::string missing = "no answer yet";
  for (Deadline deadline = Deadline::AfterMillis(kScrapeMs); !deadline.Expired();
       usleep(kRetryMs * 1000)) {
    StatusOr<HttpResult> result = HttpGet(data_url, kHttpMs);
    if (!result.ok() || result->status != 200) {
      missing = result.ok() ? "HTTP " + std::to_string(result->status) : result.status().message();
      continue;
    }
    nlohmann::json doc = nlohmann::json::parse(result->body, nullptr, false);
    if (doc.is_discarded()) return DataLossError(data_url + " is not JSON: " + result->body);
    missing.clear();
    std::set<std::string> alive;
    for (const nlohmann::json& process : doc.value("processes", nlohmann::json::array())) {
      if (process.value("state", "") == "alive") alive.insert(process.value("name", "?"));
    }
    if (alive.size() != 4) missing += "alive: " + Describe(alive) + "; ";
    for (const char* worker : {"worker 0", "worker 1"}) {
      const nlohmann::json& series = doc["series"][worker];
      for (const char* column : {"loss", "samples_per_s"}) {
        size_t points = 0;
        for (const nlohmann::json& value : series.value(column, nlohmann::json::array())) {
          points += value.is_number() ? 1 : 0;
        }
        if (points < kMinPoints) {
          missing += std::string(worker) + " has " + std::to_string(points) + " " + column +
                     " points; ";
        }
      }
    }
    // The straggler table needs two scrapes of each worker's step-phase histogram.
    const size_t stragglers = doc["straggler"].value("workers", nlohmann::json::array()).size();
    if (stragglers != 2) missing += std::to_string(stragglers) + " workers in the straggler table; ";
    if (missing.empty()) return doc;
  }
  return DeadlineExceededError(data_url + " was not complete within " +
                               std::to_string(kScrapeMs) + " ms: " + missing);
}

TEST(DashboardTest, ChromiumShowsEveryProcessAndChartsWithData) {
  ASSERT_EQ(access(kChromium, X_OK), 0)
      << kChromium << " is missing: run tools/install_deps.sh (it installs Debian's chromium "
      << "package); this test needs a real browser";
  const SteadyClock::time_point start = SteadyClock::now();
  FleetHarness fleet;
  const std::vector<std::string> sizes = {"--num-servers", "1", "--num-workers", "2", "--job",
                                          kJob};

  auto coordinator = fleet.StartCoordinator(sizes);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<int> ids = {0};
  const std::string base = "http://" + HostPort(fleet.process(0).metrics_url);
  const std::vector<std::string> join = Concat(sizes, {"--coordinator", *coordinator});
  auto server = fleet.Start("server 0", "server/ps/tessera-server", Concat(join, {"--rank", "0"}));
  ASSERT_TRUE(server.ok()) << server.status();
  ids.push_back(*server);
  for (int rank : {0, 1}) {
    auto worker = fleet.Start("worker " + std::to_string(rank), "worker/tessera-worker",
                              Concat(Concat(join, kTrainingFlags), {"--rank", std::to_string(rank)}));
    ASSERT_TRUE(worker.ok()) << worker.status();
    ids.push_back(*worker);
  }
  for (int id : ids) {
    Status ready = fleet.WaitReady(id, Deadline::AfterMillis(kStartMs));
    ASSERT_TRUE(ready.ok()) << ready;
  }
  std::map<std::string, int> pids;  // "role rank" -> pid, from the coordinator's view below
  Progress(start, "fleet ready; dashboard at " + base + "/dashboard");

  // The coordinator has scraped the workers a few times, so the page has lines to draw.
  StatusOr<nlohmann::json> data = WaitForData(base + "/dashboard/data");
  ASSERT_TRUE(data.ok()) << data.status();
  for (const nlohmann::json& process : (*data)["processes"]) {
    pids[process.value("role", "?") + " " + std::to_string(process.value("rank", -1))] =
        process.value("pid", 0);
  }
  Progress(start, "/dashboard/data has every process and " + std::to_string(kMinPoints) +
                      "+ points per worker");

  // The DOM after the page's JavaScript ran.
  StatusOr<BrowserRun> dom_run =
      RunChromium({"--dump-dom", base + "/dashboard"}, TempPath("chromium-profile-dom"));
  ASSERT_TRUE(dom_run.ok()) << dom_run.status();
  const std::string& dom = dom_run->out;
  WriteFile(OutputPath("dashboard.html"), dom);
  Progress(start, "chromium --dump-dom: " + std::to_string(dom.size()) + " bytes (saved as " +
                      OutputPath("dashboard.html") + ")");
  ASSERT_NE(dom.find("data-updated="), std::string::npos)
      << "the page never drew data (no data-updated on <body>); DOM:\n"
      << dom.substr(0, 4000) << "\nchromium stderr:\n" << dom_run->err;

  // Every process of the fleet has its row, alive, with the pid the coordinator knows.
  std::set<std::string> expected = {"coordinator 0", "server 0", "worker 0", "worker 1"};
  std::set<std::string> listed;
  for (const auto& row : TagsWith(dom, "data-role")) {
    std::string name = row.at("data-role") + " " + row.at("data-rank");
    listed.insert(name);
    EXPECT_EQ(row.at("data-state"), "alive") << name;
  }
  EXPECT_EQ(listed, expected) << "rows: " << Describe(listed);
  for (const auto& [name, pid] : pids) {
    EXPECT_NE(dom.find(">" + std::to_string(pid) + "<"), std::string::npos)
        << name << "'s pid " << pid << " is not on the page";
  }

  // Loss and throughput lines with points, for both workers.
  std::map<std::string, int> points;  // "chart/series" -> data-points
  for (const auto& line : TagsWith(dom, "data-series")) {
    points[line.at("data-chart") + "/" + line.at("data-series")] =
        std::atoi(line.at("data-points").c_str());
  }
  for (const char* chart : {"loss", "throughput"}) {
    for (const char* worker : {"worker 0", "worker 1"}) {
      std::string key = std::string(chart) + "/" + worker;
      ASSERT_TRUE(points.count(key)) << "no line for " << key;
      EXPECT_GT(points[key], 0) << key;
    }
  }
  // The other sections drew too: step time, traffic, the straggler table.
  EXPECT_GT(points["step-time/worker 0"], 0);
  EXPECT_GT(points["bytes-sent/server 0"], 0);
  EXPECT_EQ(TagsWith(dom, "data-worker").size(), 2u) << "straggler rows";
  // The key ranges: the one server's, answered by it.
  const auto ranges = TagsWith(dom, "data-range");
  ASSERT_EQ(ranges.size(), 1u) << "key range rows";
  EXPECT_EQ(ranges[0].at("data-primary"), "0");
  Progress(start, "DOM lists " + Describe(listed) + "; loss points worker 0/1: " +
                      std::to_string(points["loss/worker 0"]) + "/" +
                      std::to_string(points["loss/worker 1"]) + ", throughput points: " +
                      std::to_string(points["throughput/worker 0"]) + "/" +
                      std::to_string(points["throughput/worker 1"]));

  // A screenshot for people, under the test's outputs.
  const std::string screenshot = OutputPath("dashboard.png");
  std::remove(screenshot.c_str());
  StatusOr<BrowserRun> shot_run =
      RunChromium({"--screenshot=" + screenshot, "--window-size=1400,1000",
                   "--hide-scrollbars", base + "/dashboard"},
                  TempPath("chromium-profile-screenshot"));
  ASSERT_TRUE(shot_run.ok()) << shot_run.status();
  const std::string png = ReadWholeFile(screenshot);
  ASSERT_GE(png.size(), 24u) << screenshot << " is missing or empty; chromium stderr:\n"
                             << shot_run->err;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&png](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(png[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(png[at + 3]));
  };
  EXPECT_EQ(be32(16), 1400u) << "PNG width";  // IHDR
  EXPECT_EQ(be32(20), 1000u) << "PNG height";
  // A blank or error page of this size compresses to a few KiB; the dashboard's text,
  // tables and charts take far more.
  EXPECT_GT(png.size(), 40000u) << screenshot << " looks empty";
  Progress(start, "screenshot " + screenshot + ": " + std::to_string(png.size()) + " bytes");

  fleet.StopAll();
  Progress(start, "stopped the fleet");
}

}  // namespace
}  // namespace tessera::testing
