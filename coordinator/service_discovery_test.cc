#include "coordinator/service_discovery.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera::coordinator {
namespace {

MemberInfo Member(Role role, int rank, MemberState state, const std::string& metrics_address) {
  MemberInfo info;
  info.role = role;
  info.rank = rank;
  info.state = state;
  info.metrics_address = metrics_address;
  info.host = "node7";
  return info;
}

FleetView View(std::vector<MemberInfo> members) {
  FleetView view;
  view.job = "resnet";
  view.members = std::move(members);
  return view;
}

ScrapeTarget Coordinator() {
  ScrapeTarget target;
  target.address = "127.0.0.1:9000";
  target.metrics_path = "/metrics";
  target.role = "coordinator";
  target.job = "resnet";
  return target;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// "role rank address" of each group, checking the group's shape on the way.
std::vector<std::string> Summarize(const std::string& json) {
  nlohmann::json groups = nlohmann::json::parse(json);
  std::vector<std::string> out;
  EXPECT_TRUE(groups.is_array()) << json;
  for (const nlohmann::json& group : groups) {
    EXPECT_EQ(group.size(), 2u) << group;
    EXPECT_EQ(group.at("targets").size(), 1u) << group;
    const nlohmann::json& labels = group.at("labels");
    EXPECT_EQ(labels.size(), 4u) << group;
    EXPECT_EQ(labels.at("__metrics_path__"), "/metrics") << group;
    EXPECT_EQ(labels.at("tessera_job"), "resnet") << group;
    out.push_back(labels.at("role").get<std::string>() + " " +
                  labels.at("rank").get<std::string>() + " " +
                  group.at("targets")[0].get<std::string>());
  }
  return out;
}

TEST(SplitMetricsUrlTest, GivesHostPortAndPath) {
  auto split = SplitMetricsUrl("http://127.0.0.1:9100/metrics", "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "127.0.0.1:9100");
  EXPECT_EQ(split->path, "/metrics");

  split = SplitMetricsUrl("http://node3:80", "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "node3:80");
  EXPECT_EQ(split->path, "/");

  split = SplitMetricsUrl("http://[::1]:9100/metrics", "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "[::1]:9100");
}

TEST(SplitMetricsUrlTest, TakesHttpsAndSaysSo) {
  auto split = SplitMetricsUrl("https://10.0.0.2:9100/metrics", "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->scheme, "https");
  EXPECT_EQ(split->address, "10.0.0.2:9100");
  EXPECT_EQ(SplitMetricsUrl("http://10.0.0.2:9100/metrics", "")->scheme, "http");
  ScrapeTarget target;
  target.address = "10.0.0.2:9100";
  target.metrics_path = "/metrics";
  target.scheme = "https";
  EXPECT_NE(TargetGroupsJson({target}).find("\"__scheme__\":\"https\""), std::string::npos)
      << TargetGroupsJson({target});
  target.scheme = "http";
  EXPECT_EQ(TargetGroupsJson({target}).find("__scheme__"), std::string::npos);
}

TEST(SplitMetricsUrlTest, ReplacesAnUnspecifiedHost) {
  auto split = SplitMetricsUrl("http://0.0.0.0:9100/metrics", "node7");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "node7:9100");
  split = SplitMetricsUrl("http://[::]:9100/metrics", "node7");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "node7:9100");
  // Without a fallback it stays as it is.
  split = SplitMetricsUrl("http://0.0.0.0:9100/metrics", "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->address, "0.0.0.0:9100");
}

TEST(SplitMetricsUrlTest, RejectsWhatIsNotHttpHostPort) {
  for (const char* bad : {"", "127.0.0.1:9100/metrics", "ftp://127.0.0.1:9100/metrics",
                          "tcp://127.0.0.1:9100", "http://127.0.0.1/metrics",
                          "http://127.0.0.1:0/metrics", "http://:9100/metrics"}) {
    auto split = SplitMetricsUrl(bad, "node7");
    ASSERT_FALSE(split.ok()) << bad;
    EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(split.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << split.status();
  }
}

TEST(ScrapeTargetsTest, CoordinatorFirstThenLiveMembersOnly) {
  std::vector<std::string> skipped;
  FleetView view = View({
      Member(Role::kServer, 0, MemberState::kAlive, "http://127.0.0.1:9101/metrics"),
      Member(Role::kServer, 1, MemberState::kLeft, "http://127.0.0.1:9102/metrics"),
      Member(Role::kWorker, 0, MemberState::kAlive, "http://127.0.0.1:9201/metrics"),
      Member(Role::kWorker, 1, MemberState::kFailed, "http://127.0.0.1:9202/metrics"),
      Member(Role::kWorker, 2, MemberState::kJoining, "http://0.0.0.0:9203/metrics"),
  });
  EXPECT_EQ(Summarize(TargetGroupsJson(ScrapeTargets(view, Coordinator(), &skipped))),
            (std::vector<std::string>{"coordinator 0 127.0.0.1:9000", "server 0 127.0.0.1:9101",
                                      "worker 0 127.0.0.1:9201", "worker 2 node7:9203"}));
  EXPECT_TRUE(skipped.empty());
}

TEST(ScrapeTargetsTest, LeavesOutAndNamesMembersWithoutAUsableUrl) {
  std::vector<std::string> skipped;
  FleetView view = View({
      Member(Role::kWorker, 0, MemberState::kAlive, ""),
      Member(Role::kWorker, 1, MemberState::kAlive, "http://127.0.0.1:9202/metrics"),
  });
  std::vector<ScrapeTarget> targets = ScrapeTargets(view, Coordinator(), &skipped);
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[1].role, "worker");
  EXPECT_EQ(targets[1].rank, 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("worker 0"), std::string::npos) << skipped[0];
}

TEST(TargetGroupsJsonTest, IsTheHttpSdFormat) {
  ScrapeTarget worker;
  worker.address = "10.0.0.2:9100";
  worker.metrics_path = "/metrics";
  worker.role = "worker";
  worker.rank = 3;
  worker.job = "resnet";
  EXPECT_EQ(nlohmann::json::parse(TargetGroupsJson({worker})),
            nlohmann::json::parse(R"([{"targets": ["10.0.0.2:9100"],
                                       "labels": {"__metrics_path__": "/metrics",
                                                  "role": "worker", "rank": "3",
                                                  "tessera_job": "resnet"}}])"));
  EXPECT_EQ(TargetGroupsJson({}), "[]\n");
}

ServiceDiscoveryOptions Options(const std::string& file) {
  ServiceDiscoveryOptions options;
  options.job = "resnet";
  options.coordinator_metrics_url = "http://127.0.0.1:9000/metrics";
  options.file_sd_path = file;
  return options;
}

TEST(ServiceDiscoveryTest, FileAndHttpFollowTheFleet) {
  const std::string file = TempPath("follow.json");
  auto discovery = ServiceDiscovery::Create(Options(file));
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  ServiceDiscovery& sd = **discovery;
  EXPECT_EQ(Summarize(sd.Json()), (std::vector<std::string>{"coordinator 0 127.0.0.1:9000"}));

  std::vector<MemberInfo> members = {
      Member(Role::kServer, 0, MemberState::kJoining, "http://127.0.0.1:9101/metrics"),
      Member(Role::kWorker, 0, MemberState::kJoining, "http://127.0.0.1:9201/metrics"),
      Member(Role::kWorker, 1, MemberState::kJoining, "http://127.0.0.1:9202/metrics")};
  ASSERT_TRUE(sd.Update(View(members)).ok());
  const std::vector<std::string> everyone = {"coordinator 0 127.0.0.1:9000",
                                             "server 0 127.0.0.1:9101", "worker 0 127.0.0.1:9201",
                                             "worker 1 127.0.0.1:9202"};
  EXPECT_EQ(Summarize(sd.Json()), everyone);
  EXPECT_EQ(ReadFile(file), sd.Json());

  members[2].state = MemberState::kFailed;
  ASSERT_TRUE(sd.Update(View(members)).ok());
  const std::vector<std::string> survivors(everyone.begin(), everyone.begin() + 3);
  EXPECT_EQ(Summarize(sd.Json()), survivors);
  EXPECT_EQ(Summarize(ReadFile(file)), survivors);

  members[1].state = MemberState::kLeft;
  ASSERT_TRUE(sd.Update(View(members)).ok());
  EXPECT_EQ(Summarize(ReadFile(file)),
            (std::vector<std::string>(everyone.begin(), everyone.begin() + 2)));

  HttpRequest get{"GET", "/sd", ""};
  HttpResponse response = sd.Serve(get);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.content_type, "application/json");
  EXPECT_EQ(response.body, ReadFile(file));
  HttpRequest post{"POST", "/sd", ""};
  EXPECT_EQ(sd.Serve(post).status, 405);
}

TEST(ServiceDiscoveryTest, WithoutAFileOnlyServes) {
  auto discovery = ServiceDiscovery::Create(Options(""));
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  ASSERT_TRUE((*discovery)->Update(View({Member(Role::kWorker, 0, MemberState::kAlive,
                                                "http://127.0.0.1:9201/metrics")}))
                  .ok());
  EXPECT_EQ(Summarize((*discovery)->Json()).size(), 2u);
}

TEST(ServiceDiscoveryTest, AnUnwritableFileIsAnErrorNamingIt) {
  const std::string file = TempPath("no/such/dir/targets.json");
  auto discovery = ServiceDiscovery::Create(Options(file));
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  FleetView view = View({Member(Role::kWorker, 0, MemberState::kAlive,
                                "http://127.0.0.1:9201/metrics")});
  Status updated = (*discovery)->Update(view);
  ASSERT_FALSE(updated.ok());
  EXPECT_NE(updated.message().find(file), std::string::npos) << updated;
  // /sd still answers with the new list.
  EXPECT_EQ(Summarize((*discovery)->Json()).size(), 2u);
}

TEST(ServiceDiscoveryTest, RejectsABadCoordinatorUrl) {
  ServiceDiscoveryOptions options = Options("");
  options.coordinator_metrics_url = "127.0.0.1:9000";
  auto discovery = ServiceDiscovery::Create(options);
  ASSERT_FALSE(discovery.ok());
  EXPECT_EQ(discovery.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::coordinator
