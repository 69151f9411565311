// tools/dashboard/grafana.json is an importable Grafana dashboard for the metrics Tessera
// exports: its structure is what Grafana's importer expects (schema version, the
// ${DS_PROMETHEUS} input, panels on the 24-column grid without overlaps, every query panel with
// PromQL targets whose datasource resolves), every variable a query uses is defined, every
// metric it names exists in common/metrics/metric_names.h, the key training metrics are all charted,
// and Prometheus' own parser (promtool check rules) accepts every expression.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/metrics/metric_names.h"

namespace tessera::tools {
namespace {

namespace names = metric_names;
using nlohmann::json;

constexpr char kPromtool[] = "/usr/bin/promtool";
constexpr int kGridColumns = 24;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

json LoadDashboard() {
  const std::string path = EnvOr("TEST_SRCDIR", ".") + "/" + EnvOr("TEST_WORKSPACE", "tessera") +
                           "/tools/dashboard/grafana.json";
  const std::string text = ReadFile(path);
  EXPECT_FALSE(text.empty()) << path << " is missing or empty";
  json dashboard = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(dashboard.is_discarded()) << path << " is not valid JSON";
  return dashboard;
}

// Every panel, rows' nested panels (collapsed rows keep theirs inside) included.
std::vector<json> AllPanels(const json& dashboard) {
  std::vector<json> out;
  for (const json& panel : dashboard.value("panels", json::array())) {
    out.push_back(panel);
    for (const json& nested : panel.value("panels", json::array())) out.push_back(nested);
  }
  return out;
}

std::string PanelName(const json& panel) {
  return "panel " + std::to_string(panel.value("id", -1)) + " '" + panel.value("title", "") + "'";
}

// Every metric Tessera exports (common/metrics/metric_names.h).
std::set<std::string> KnownMetrics() {
  std::set<std::string> known;
  for (const names::MetricName& metric :
       {names::kBadMessagesTotal, names::kMessagesReceivedTotal, names::kMessagesSentTotal,
        names::kBytesReceivedTotal, names::kBytesSentTotal, names::kSendFailuresTotal,
        names::kRpcLatencySeconds, names::kProcessStartTimeSeconds, names::kBuildInfo,
        names::kFleetMembers, names::kHeartbeatsReceivedTotal, names::kFailuresDetectedTotal,
        names::kBarrierWaitSeconds, names::kPsParameterBytes,
        names::kPsOptimizerStateBytes, names::kPsUpdatesTotal, names::kPsGradientBytesTotal,
        names::kPsStaleness, names::kPsMaxReleasedStaleness, names::kPsWaitingRequests,
        names::kPsClientLatencySeconds, names::kPsClientBytesSentTotal,
        names::kPsClientBytesReceivedTotal, names::kCollectiveSeconds,
        names::kCollectiveBytesTotal, names::kDdpBucketsInFlight, names::kDdpOverlapRatio,
        names::kModelStateBytes, names::kDdpWaitSeconds, names::kTrainStep, names::kTrainLoss,
        names::kTrainSamplesTotal, names::kTrainStepPhaseSeconds, names::kTrainEvalAccuracy}) {
    known.insert(std::string(metric.name));
  }
  return known;
}

// The tessera_* metric names an expression reads, histogram suffixes removed.
std::set<std::string> MetricsIn(const std::string& expr, const std::set<std::string>& known) {
  std::set<std::string> found;
  for (size_t at = expr.find("tessera_"); at != std::string::npos;
       at = expr.find("tessera_", at + 1)) {
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(expr[at - 1])) || expr[at - 1] == '_')) {
      continue;
    }
    size_t end = at;
    while (end < expr.size() &&
           (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
      ++end;
    }
    std::string name = expr.substr(at, end - at);
    if (name == "tessera_job") continue;  // the label /sd attaches
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          known.count(name.substr(0, name.size() - s.size()))) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    found.insert(name);
    at = end - 1;
  }
  return found;
}

// The variables ($name, ${name}, ${name:format}) a string uses.
std::set<std::string> VariablesIn(const std::string& text) {
  std::set<std::string> found;
  for (size_t at = text.find('$'); at != std::string::npos; at = text.find('$', at + 1)) {
    size_t start = at + 1;
    bool braced = start < text.size() && text[start] == '{';
    if (braced) ++start;
    size_t end = start;
    while (end < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
      ++end;
    }
    if (end > start) found.insert(text.substr(start, end - start));
  }
  return found;
}

// Grafana's built-in variables a query may use.
const std::set<std::string> kBuiltinVariables = {"__rate_interval", "__interval", "__interval_ms",
                                                 "__range", "__range_s", "__range_ms"};

// What a datasource reference may be: the __inputs placeholder, or a datasource variable.
std::set<std::string> DatasourceUids(const json& dashboard) {
  std::set<std::string> uids;
  for (const json& input : dashboard.value("__inputs", json::array())) {
    if (input.value("type", "") == "datasource" && input.value("pluginId", "") == "prometheus") {
      uids.insert("${" + input.value("name", "") + "}");
    }
  }
  for (const json& variable : dashboard["templating"].value("list", json::array())) {
    if (variable.value("type", "") == "datasource") {
      uids.insert("${" + variable.value("name", "") + "}");
      uids.insert("$" + variable.value("name", ""));
    }
  }
  return uids;
}

void ExpectPrometheusDatasource(const json& datasource, const std::set<std::string>& uids,
                                const std::string& where) {
  ASSERT_TRUE(datasource.is_object()) << where << ": no datasource";
  EXPECT_EQ(datasource.value("type", ""), "prometheus") << where;
  EXPECT_TRUE(uids.count(datasource.value("uid", ""))) << where << ": datasource uid "
                                                        << datasource.value("uid", "")
                                                        << " resolves to nothing";
}

TEST(GrafanaDashboardTest, IsImportable) {
  json dashboard = LoadDashboard();
  ASSERT_TRUE(dashboard.is_object());
  EXPECT_FALSE(dashboard.value("title", "").empty());
  const std::string uid = dashboard.value("uid", "");
  EXPECT_FALSE(uid.empty());
  EXPECT_LE(uid.size(), 40u) << "Grafana uids are at most 40 characters";
  EXPECT_GE(dashboard.value("schemaVersion", 0), 36);
  EXPECT_TRUE(dashboard.contains("id") && dashboard["id"].is_null())
      << "an exported dashboard has id null, so importing creates a new one";
  EXPECT_TRUE(dashboard["time"].contains("from") && dashboard["time"].contains("to"));

  // The datasource input the importer asks for.
  bool has_input = false;
  for (const json& input : dashboard.value("__inputs", json::array())) {
    has_input = has_input || (input.value("name", "") == "DS_PROMETHEUS" &&
                              input.value("type", "") == "datasource" &&
                              input.value("pluginId", "") == "prometheus");
  }
  EXPECT_TRUE(has_input) << "__inputs must declare DS_PROMETHEUS (a prometheus datasource)";
  std::set<std::string> required_panels;
  for (const json& requirement : dashboard.value("__requires", json::array())) {
    if (requirement.value("type", "") == "panel") required_panels.insert(requirement["id"]);
  }

  const std::set<std::string> uids = DatasourceUids(dashboard);
  std::set<std::string> variables = kBuiltinVariables;
  for (const json& variable : dashboard["templating"].value("list", json::array())) {
    const std::string name = variable.value("name", "");
    ASSERT_FALSE(name.empty()) << variable;
    EXPECT_TRUE(variables.insert(name).second) << "variable " << name << " defined twice";
    if (variable.value("type", "") == "query") {
      ExpectPrometheusDatasource(variable["datasource"], uids, "variable " + name);
      const json& query = variable["query"];
      std::string text = query.is_object() ? query.value("query", "") : query.get<std::string>();
      EXPECT_FALSE(text.empty()) << "variable " << name;
    }
  }

  std::set<int> ids;
  std::vector<json> panels = AllPanels(dashboard);
  ASSERT_GE(panels.size(), 10u);
  struct Box {
    int x, y, w, h;
    std::string name;
  };
  std::vector<Box> boxes;
  for (const json& panel : panels) {
    const std::string name = PanelName(panel);
    ASSERT_TRUE(panel["id"].is_number_integer()) << name;
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << name << ": duplicate id";
    EXPECT_FALSE(panel.value("title", "").empty()) << name;
    const json& grid = panel["gridPos"];
    ASSERT_TRUE(grid.is_object()) << name;
    Box box{grid.value("x", -1), grid.value("y", -1), grid.value("w", 0), grid.value("h", 0), name};
    EXPECT_GE(box.x, 0) << name;
    EXPECT_GE(box.y, 0) << name;
    EXPECT_GE(box.w, 1) << name;
    EXPECT_GE(box.h, 1) << name;
    EXPECT_LE(box.x + box.w, kGridColumns) << name;
    for (const Box& other : boxes) {
      bool overlap = box.x < other.x + other.w && other.x < box.x + box.w &&
                     box.y < other.y + other.h && other.y < box.y + box.h;
      EXPECT_FALSE(overlap) << name << " overlaps " << other.name;
    }
    boxes.push_back(box);

    const std::string type = panel.value("type", "");
    if (type == "row") continue;
    EXPECT_TRUE(required_panels.count(type)) << name << ": panel type " << type
                                             << " is not in __requires";
    ExpectPrometheusDatasource(panel["datasource"], uids, name);
    const json& targets = panel["targets"];
    ASSERT_TRUE(targets.is_array() && !targets.empty()) << name << ": no targets";
    std::set<std::string> ref_ids;
    for (const json& target : targets) {
      EXPECT_TRUE(ref_ids.insert(target.value("refId", "")).second)
          << name << ": refIds must be unique and present";
      const std::string expr = target.value("expr", "");
      EXPECT_FALSE(expr.empty()) << name << " target " << target.value("refId", "");
      ExpectPrometheusDatasource(target["datasource"], uids, name);
      for (const std::string& variable : VariablesIn(expr)) {
        EXPECT_TRUE(variables.count(variable))
            << name << " uses $" << variable << ", which is not defined: " << expr;
      }
    }
  }
}

TEST(GrafanaDashboardTest, ChartsTesseraMetricsThatExist) {
  json dashboard = LoadDashboard();
  const std::set<std::string> known = KnownMetrics();
  std::set<std::string> used;
  for (const json& panel : AllPanels(dashboard)) {
    for (const json& target : panel.value("targets", json::array())) {
      const std::string expr = target.value("expr", "");
      for (const std::string& metric : MetricsIn(expr, known)) {
        EXPECT_TRUE(known.count(metric)) << PanelName(panel) << " reads " << metric
                                         << ", which Tessera does not export: " << expr;
        used.insert(metric);
      }
      // Per-process series are told apart by the labels /sd attaches.
      EXPECT_NE(expr.find("tessera_job=~\"$tessera_job\""), std::string::npos)
          << PanelName(panel) << " is not filtered by the job: " << expr;
    }
  }
  // What the issue asks the dashboards to show: step, loss, samples/s, step-time phases,
  // communication by peer role, stragglers (from the phases), per-rank memory, fleet health.
  for (const names::MetricName& metric :
       {names::kTrainStep, names::kTrainLoss, names::kTrainSamplesTotal,
        names::kTrainStepPhaseSeconds, names::kTrainEvalAccuracy, names::kBytesSentTotal,
        names::kBytesReceivedTotal, names::kPsClientBytesSentTotal,
        names::kPsClientBytesReceivedTotal, names::kCollectiveBytesTotal,
        names::kModelStateBytes, names::kPsParameterBytes, names::kFleetMembers,
        names::kFailuresDetectedTotal, names::kBuildInfo}) {
    EXPECT_TRUE(used.count(std::string(metric.name))) << "no panel charts " << metric.name;
  }
}

// Prometheus' parser on every expression: written as recording rules (variables replaced by
// what Grafana would send) and checked with `promtool check rules`.
TEST(GrafanaDashboardTest, PromtoolParsesEveryExpression) {
  ASSERT_EQ(access(kPromtool, X_OK), 0)
      << kPromtool << " is missing: run tools/install_deps.sh (Debian's prometheus package)";
  json dashboard = LoadDashboard();
  std::map<std::string, std::string> values = {{"__rate_interval", "1m"}, {"__interval", "15s"},
                                               {"__range", "1h"}};
  for (const json& variable : dashboard["templating"].value("list", json::array())) {
    values[variable.value("name", "")] = variable.value("allValue", ".*");
  }
  auto substitute = [&values](std::string expr) {
    // Longest names first, so $rank does not eat a prefix of a longer name.
    std::vector<std::pair<std::string, std::string>> ordered(values.begin(), values.end());
    std::sort(ordered.begin(), ordered.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (const auto& [name, value] : ordered) {
      for (const std::string& token : {"${" + name + "}", "$" + name}) {
        for (size_t at = expr.find(token); at != std::string::npos; at = expr.find(token, at)) {
          expr.replace(at, token.size(), value);
          at += value.size();
        }
      }
    }
    return expr;
  };
  std::string rules = "groups:\n  - name: grafana\n    rules:\n";
  int count = 0;
  for (const json& panel : AllPanels(dashboard)) {
    for (const json& target : panel.value("targets", json::array())) {
      // A JSON string is a valid YAML double-quoted scalar.
      rules += "      - record: grafana:panel_" + std::to_string(panel.value("id", 0)) + "_" +
               target.value("refId", "X") + "\n        expr: " +
               json(substitute(target.value("expr", ""))).dump() + "\n";
      ++count;
    }
  }
  ASSERT_GT(count, 0);
  const std::string path = EnvOr("TEST_TMPDIR", "/tmp") + "/grafana_rules.yml";
  {
    std::ofstream out(path);
    out << rules;
  }
  FILE* pipe = popen((std::string(kPromtool) + " check rules " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "promtool check rules rejected an expression:\n" << output << "\n" << rules;
  EXPECT_NE(output.find(std::to_string(count) + " rules found"), std::string::npos) << output;
}

}  // namespace
}  // namespace tessera::tools
