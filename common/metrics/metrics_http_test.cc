#include "common/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <atomic>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "common/base/test_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

struct Reply {
  int status = 0;
  std::string headers;  // raw header block, lines end in \r\n
  std::string body;
};

// A TCP socket connected to 127.0.0.1:port (reads time out after 10 s), or -1.
int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A blocking HTTP/1.1 client for one request: connect to 127.0.0.1:port, send, wait
// `read_delay_ms` (a slow reader), read to EOF.
Reply Fetch(int port, const std::string& method, const std::string& target,
            int read_delay_ms = 0, const std::string& extra_headers = "") {
  Reply reply;
  int fd = ConnectLoopback(port);
  if (fd < 0) return reply;
  std::string request = method + " " + target +
                        " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n" +
                        extra_headers + "Connection: close\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (read_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, n);
  close(fd);

  size_t header_end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 ", 0) != 0 || header_end == std::string::npos) return reply;
  reply.status = std::stoi(response.substr(9, 3));
  reply.headers = response.substr(0, header_end + 2);
  reply.body = response.substr(header_end + 4);
  return reply;
}

// One server for the suite: stopping one takes up to 2 s (see MetricsHttpServer).
class MetricsHttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new MetricsRegistry();
    CounterFamily* family =
        registry_->RegisterCounter("requests_total", "Requests.", {"path"}).value();
    family->WithLabels({"/x"}).value()->Increment(3);
    StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start(MetricsHttpOptions{}, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
    ASSERT_GT(server_->port(), 0);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete registry_;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  static MetricsRegistry* registry_;
  static MetricsHttpServer* server_;
};

MetricsRegistry* MetricsHttpServerTest::registry_ = nullptr;
MetricsHttpServer* MetricsHttpServerTest::server_ = nullptr;

TEST_F(MetricsHttpServerTest, ServesMetrics) {
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()) + "/metrics");
  Reply reply = Fetch(server_->port(), "GET", "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_THAT(reply.headers,
              HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_EQ(reply.body, registry_->RenderText());
  EXPECT_THAT(reply.body, HasSubstr("requests_total{path=\"/x\"} 3\n"));

  // A later update shows in the next scrape; a query string is ignored.
  registry_->RegisterCounter("requests_total", "Requests.", {"path"})
      .value()
      ->WithLabels({"/x"})
      .value()
      ->Increment();
  EXPECT_THAT(Fetch(server_->port(), "GET", "/metrics?x=1").body,
              HasSubstr("requests_total{path=\"/x\"} 4\n"));
}

// Opens `count` connections that each send the start of a request and never finish it (a slow
// client, a stuck scraper, a slowloris); returns their sockets.
std::vector<int> OpenStalledConnections(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = ConnectLoopback(port);
    if (fd < 0) break;
    const std::string partial = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    (void)send(fd, partial.data(), partial.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  return fds;
}

TEST_F(MetricsHttpServerTest, AnswersWithinASecondWhile200ConnectionsStall) {
  std::vector<int> stalled = OpenStalledConnections(server_->port(), 200);
  ASSERT_EQ(stalled.size(), 200u);
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    Reply reply = Fetch(server_->port(), "GET", "/metrics");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(reply.status, 200) << "round " << round;
    EXPECT_LT(took, std::chrono::seconds(1)) << "round " << round;
  }
  for (int fd : stalled) close(fd);
  // And after they are gone.
  EXPECT_EQ(Fetch(server_->port(), "GET", "/metrics").status, 200);
}

// The short deadline is for receiving a request, not for sending the answer: a reader that
// takes its time still gets a page far larger than the socket buffers whole.
TEST_F(MetricsHttpServerTest, ASlowReaderGetsAWholeLargePage) {
  const std::string big(32 << 20, 'x');
  ASSERT_TRUE(server_->AddHandler("/big", [big](const HttpRequest&) {
                       HttpResponse response;
                       response.body = big;
                       return response;
                     }).ok());
  Reply reply = Fetch(server_->port(), "GET", "/big", /*read_delay_ms=*/1500);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body.size(), big.size());
}

TEST_F(MetricsHttpServerTest, UnknownPathIs404AndOtherMethodsAre405) {
  Reply missing = Fetch(server_->port(), "GET", "/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_THAT(missing.body, HasSubstr("/nope"));
  // No page changes state: a handler never sees anything but GET.
  int handler_calls = 0;
  ASSERT_TRUE(server_
                  ->AddHandler("/counted",
                               [&handler_calls](const HttpRequest& request) {
                                 ++handler_calls;
                                 EXPECT_EQ(request.method, "GET");
                                 return HttpResponse();
                               })
                  .ok());
  for (const char* path : {"/metrics", "/counted", "/nope"}) {
    for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
      Reply reply = Fetch(server_->port(), method, path);
      EXPECT_EQ(reply.status, 405) << method << " " << path;
      EXPECT_THAT(reply.headers, HasSubstr("\r\nAllow: GET, HEAD\r\n")) << method << " " << path;
    }
  }
  EXPECT_EQ(handler_calls, 0);
  // HEAD is a GET without the body.
  Reply head = Fetch(server_->port(), "HEAD", "/metrics");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_THAT(head.headers, HasSubstr("\r\nContent-Type: text/plain; version=0.0.4"));
  EXPECT_EQ(Fetch(server_->port(), "HEAD", "/counted").status, 200);
  EXPECT_EQ(handler_calls, 1);
}

TEST_F(MetricsHttpServerTest, ServesAddedHandlers) {
  ASSERT_TRUE(server_
                  ->AddHandler("/sd",
                               [](const HttpRequest& request) {
                                 HttpResponse response;
                                 response.content_type = "application/json";
                                 response.body = "{\"method\":\"" + request.method +
                                                 "\",\"path\":\"" + request.path +
                                                 "\",\"query\":\"" + request.query + "\"}";
                                 return response;
                               })
                  .ok());
  Reply reply = Fetch(server_->port(), "GET", "/sd?role=worker");
  EXPECT_EQ(reply.status, 200);
  EXPECT_THAT(reply.headers, HasSubstr("\r\nContent-Type: application/json\r\n"));
  EXPECT_EQ(reply.body, "{\"method\":\"GET\",\"path\":\"/sd\",\"query\":\"role=worker\"}");

  auto empty = [](const HttpRequest&) { return HttpResponse(); };
  EXPECT_EQ(server_->AddHandler("/sd", empty).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(server_->AddHandler("/metrics", empty).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(server_->AddHandler("sd", empty).code(), StatusCode::kInvalidArgument);
}

TEST_F(MetricsHttpServerTest, PortInUseIsAnErrorNamingHostPortAndReason) {
  MetricsHttpOptions options;
  options.port = server_->port();
  StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(options, registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("127.0.0.1:" + std::to_string(server_->port())));
  EXPECT_THAT(second.status().message(), HasSubstr("Address already in use"));
}

TEST(MetricsHttpServerStartTest, RejectsBadOptions) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.num_threads = 0;
  EXPECT_THAT(MetricsHttpServer::Start(options, &registry).status().message(),
              HasSubstr("num_threads"));
  options = MetricsHttpOptions();
  options.port = 70000;
  EXPECT_THAT(MetricsHttpServer::Start(options, &registry).status().message(),
              HasSubstr("port 70000"));
  options = MetricsHttpOptions();
  options.bind_host = "not-an-address";
  StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(options, &registry);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("not-an-address:0"));
  EXPECT_EQ(MetricsHttpServer::Start(MetricsHttpOptions(), nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MetricsHttpServerStartTest, LocalhostMeansLoopback) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.bind_host = "localhost";
  StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Fetch((*server)->port(), "GET", "/metrics").status, 200);
}

std::shared_ptr<const HttpBasicAuth> ReadAuth(const std::string& text) {
  StatusOr<HttpBasicAuth> auth =
      HttpBasicAuth::ReadFile(WriteTestFile("metrics-auth", text, 0600));
  EXPECT_TRUE(auth.ok()) << auth.status();
  return auth.ok() ? std::make_shared<const HttpBasicAuth>(std::move(auth).value()) : nullptr;
}

TEST(MetricsHttpServerAuthTest, AnswersOnlyRequestsWithAListedUsersCredentials) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.basic_auth = ReadAuth("prometheus:s3cret\n");
  ASSERT_NE(options.basic_auth, nullptr);
  StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  Reply none = Fetch(port, "GET", "/metrics");
  EXPECT_EQ(none.status, 401);
  EXPECT_THAT(none.headers, HasSubstr("\r\nWWW-Authenticate: Basic realm=\"tessera\"\r\n"));
  // base64("prometheus:wrong"), base64("prometheus:s3cret").
  Reply wrong = Fetch(port, "GET", "/metrics", 0, "Authorization: Basic cHJvbWV0aGV1czp3cm9uZw==\r\n");
  EXPECT_EQ(wrong.status, 401);
  const std::string right = "Authorization: Basic cHJvbWV0aGV1czpzM2NyZXQ=\r\n";
  Reply ok = Fetch(port, "GET", "/metrics", 0, right);
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, registry.RenderText());
  // Unauthenticated requests learn nothing, not even which paths or methods exist.
  EXPECT_EQ(Fetch(port, "GET", "/nope").status, 401);
  EXPECT_EQ(Fetch(port, "POST", "/metrics").status, 401);
  EXPECT_EQ(Fetch(port, "POST", "/metrics", 0, right).status, 405);
  EXPECT_EQ(Fetch(port, "GET", "/nope", 0, right).status, 404);
}

// The test-only certificate and key (testdata/README.md).
std::string TestData(const std::string& name) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") +
         "/common/metrics/testdata/" + name;
}

struct CurlResult {
  int exit_code = -1;
  std::string output;  // the body, then the status code on a line of its own
};

// Runs curl (Debian's, OpenSSL flavour) with `args`.
CurlResult Curl(const std::string& args) {
  CurlResult result;
  std::string command = "curl --silent --show-error --max-time 10 -w '\n%{http_code}' " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(MetricsHttpServerTlsTest, ServesHttpsWithBasicAuthToARealClient) {
  if (access("/usr/bin/curl", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/curl";
  MetricsRegistry registry;
  registry.RegisterCounter("scrapes_total", "Scrapes.").value()->WithLabels({}).value()->Increment(7);
  MetricsHttpOptions options;
  options.tls_cert_file = TestData("test_cert.pem");
  options.tls_key_file = TestData("test_key.pem");
  options.basic_auth = ReadAuth("prometheus:s3cret\n");
  StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = (*server)->url();
  EXPECT_EQ(url, "https://127.0.0.1:" + std::to_string((*server)->port()) + "/metrics");

  // Verified against the test certificate, then with -k.
  CurlResult verified = Curl("--cacert " + options.tls_cert_file + " -u prometheus:s3cret " + url);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("scrapes_total 7\n"));
  EXPECT_THAT(verified.output, ::testing::EndsWith("\n200"));
  CurlResult insecure = Curl("-k -u prometheus:s3cret " + url);
  EXPECT_THAT(insecure.output, ::testing::EndsWith("\n200"));
  EXPECT_THAT(Curl("-k " + url).output, ::testing::EndsWith("\n401"));
  EXPECT_THAT(Curl("-k -u prometheus:nope " + url).output, ::testing::EndsWith("\n401"));
  EXPECT_THAT(Curl("-k -X POST -u prometheus:s3cret " + url).output,
              ::testing::EndsWith("\n405"));
  // A large page arrives whole through the relay.
  const std::string big(8 << 20, 'x');
  ASSERT_TRUE((*server)->AddHandler("/big", [big](const HttpRequest&) {
                       HttpResponse response;
                       response.body = big;
                       return response;
                     }).ok());
  CurlResult large = Curl("-k -u prometheus:s3cret -o /dev/null -w '%{size_download}' " +
                          url.substr(0, url.rfind('/')) + "/big");
  EXPECT_THAT(large.output, HasSubstr(std::to_string(big.size())));
  // Plain HTTP to the TLS port gets no page.
  Reply plain = Fetch((*server)->port(), "GET", "/metrics");
  EXPECT_EQ(plain.status, 0);
  // Many requests in a row, and some at once.
  for (int i = 0; i < 20; ++i) {
    EXPECT_THAT(Curl("-k -u prometheus:s3cret " + url).output, ::testing::EndsWith("\n200")) << i;
  }
  std::vector<std::thread> clients;
  std::vector<CurlResult> at_once(8);
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] { at_once[i] = Curl("-k -u prometheus:s3cret " + url); });
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_THAT(at_once[i].output, ::testing::EndsWith("\n200")) << "client " << i << " of 8";
  }
}

TEST(MetricsHttpServerTlsTest, RefusesAMissingOrMismatchedKey) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.tls_cert_file = TestData("test_cert.pem");
  EXPECT_THAT(MetricsHttpServer::Start(options, &registry).status().message(),
              HasSubstr("both a certificate file and a key file"));
  options.tls_key_file = TestData("test_cert.pem");  // not a key
  StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(options, &registry);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("TLS key " + options.tls_key_file));
  options.tls_key_file = "/nonexistent/key.pem";
  EXPECT_THAT(MetricsHttpServer::Start(options, &registry).status().message(),
              HasSubstr("/nonexistent/key.pem"));
}

}  // namespace
}  // namespace tessera
