// The HTTP endpoints of a live fleet stay up under connections that never finish a request
// (issue 19's fourth finding: 200 of them starved the coordinator's /metrics for 10 s, as long
// as Prometheus' default scrape timeout). For the coordinator (/metrics, /sd, /dashboard), a
// server and a worker in the middle of training: with 200 such connections open to each,
// every page answers within 1 s, and again once they are closed. And no page changes state
// (issue 15, item 4): every method but GET and HEAD gets 405 on each of the coordinator's pages.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kStartMs = 60000;
constexpr int kStalled = 200;
constexpr auto kAnswerBound = std::chrono::seconds(1);

// "http://127.0.0.1:PORT/metrics" -> PORT.
int PortOf(const std::string& url) {
  const size_t colon = url.rfind(':');
  return std::stoi(url.substr(colon + 1, url.find('/', colon) - colon - 1));
}

// `count` connections to 127.0.0.1:port that send the start of a request and stop there.
std::vector<int> OpenStalledConnections(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      break;
    }
    const std::string partial = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    (void)send(fd, partial.data(), partial.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  return fds;
}

void ExpectPromptAnswer(const std::string& url, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  StatusOr<HttpResult> reply = HttpGet(url, 5000);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(reply.ok()) << what << " " << url << ": " << reply.status();
  EXPECT_EQ(reply->status, 200) << what << " " << url;
  EXPECT_LT(took, kAnswerBound)
      << what << " " << url << " took "
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

TEST(HttpEndpointsTest, EveryPageAnswersWithinASecondWhile200ConnectionsStall) {
  FleetHarness harness;
  auto coordinator = harness.StartCoordinator({"--num-servers", "1", "--num-workers", "1"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto server = harness.Start("server", "server/ps/tessera-server",
                              {"--coordinator", *coordinator, "--num-servers", "1",
                               "--num-workers", "1", "--rank", "0"});
  ASSERT_TRUE(server.ok()) << server.status();
  // Trains until the harness stops it.
  auto worker = harness.Start(
      "worker", "worker/tessera-worker",
      {"--mode", "ps-sync", "--coordinator", *coordinator, "--num-servers", "1", "--num-workers",
       "1", "--rank", "0", "--steps", "100000000", "--hidden", "16", "--input-dim", "8",
       "--classes", "4", "--train-samples", "256", "--batch-size", "8", "--device", "cpu",
       "--log-every", "100000"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  for (int id : {*server, *worker}) {
    ASSERT_TRUE(harness.WaitReady(id, Deadline::AfterMillis(kStartMs)).ok()) << harness.Output(id);
  }
  const std::string coordinator_metrics = harness.process(0).metrics_url;
  const std::string base = coordinator_metrics.substr(0, coordinator_metrics.rfind('/'));
  const std::vector<std::pair<std::string, std::string>> pages = {
      {"coordinator", coordinator_metrics},
      {"coordinator", base + "/sd"},
      {"coordinator", base + "/dashboard"},
      {"server", harness.process(*server).metrics_url},
      {"worker", harness.process(*worker).metrics_url}};

  std::vector<int> stalled;
  for (const std::string& url : {coordinator_metrics, harness.process(*server).metrics_url,
                                 harness.process(*worker).metrics_url}) {
    std::vector<int> fds = OpenStalledConnections(PortOf(url), kStalled);
    ASSERT_EQ(fds.size(), static_cast<size_t>(kStalled)) << url;
    stalled.insert(stalled.end(), fds.begin(), fds.end());
  }
  for (const auto& [what, url] : pages) ExpectPromptAnswer(url, what);
  for (int fd : stalled) close(fd);
  for (const auto& [what, url] : pages) ExpectPromptAnswer(url, what);
}

// One request `method path` to 127.0.0.1:port; the status code of the answer, 0 if none.
int StatusOfRequest(int port, const std::string& method, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  timeval timeout = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return 0;
  }
  const std::string request = method + " " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
                              "Connection: close\r\n\r\n{}";
  (void)send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, n);
  close(fd);
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

TEST(HttpEndpointsTest, NoPageChangesState) {
  FleetHarness harness;
  auto coordinator = harness.StartCoordinator(
      {"--num-servers", "0", "--num-workers", "1", "--rendezvous-timeout-ms", "600000"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = PortOf(harness.process(0).metrics_url);
  for (const char* path : {"/metrics", "/sd", "/dashboard", "/dashboard/", "/dashboard/data"}) {
    for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
      EXPECT_EQ(StatusOfRequest(port, method, path), 405) << method << " " << path;
    }
    EXPECT_EQ(StatusOfRequest(port, "GET", path), 200) << path;
    EXPECT_EQ(StatusOfRequest(port, "HEAD", path), 200) << path;
  }
}

}  // namespace
}  // namespace tessera::testing
