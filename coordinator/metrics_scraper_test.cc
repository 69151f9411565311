#include "coordinator/metrics_scraper.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"

namespace tessera::coordinator {
namespace {

TEST(ParseExpositionTextTest, ReadsNamesLabelsAndValues) {
  auto samples = ParseExpositionText(
      "# HELP tessera_train_loss Mean training loss.\n"
      "# TYPE tessera_train_loss gauge\n"
      "tessera_train_loss 0.25\n"
      "tessera_x_total{op=\"push\",kind=\"a \\\"b\\\" \\\\ c\\nd\",} 12 1700000000000\n"
      "  \n"
      "tessera_h_bucket{le=\"+Inf\"} 3\r\n"
      "tessera_nan NaN\n"
      "tessera_inf{a=\"1\"} -Inf");
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 5u);
  EXPECT_EQ((*samples)[0].name, "tessera_train_loss");
  EXPECT_TRUE((*samples)[0].labels.empty());
  EXPECT_EQ((*samples)[0].value, 0.25);
  EXPECT_EQ((*samples)[1].name, "tessera_x_total");
  EXPECT_EQ((*samples)[1].labels.at("op"), "push");
  EXPECT_EQ((*samples)[1].labels.at("kind"), "a \"b\" \\ c\nd");
  EXPECT_EQ((*samples)[1].value, 12);
  EXPECT_EQ((*samples)[2].labels.at("le"), "+Inf");
  EXPECT_TRUE(std::isnan((*samples)[3].value));
  EXPECT_TRUE(std::isinf((*samples)[4].value) && (*samples)[4].value < 0);
}

TEST(ParseExpositionTextTest, NamesTheMalformedLine) {
  for (const char* bad : {"x{a=\"1\" 2\n", "x{a=1} 2\n", "x\n", "x{a=\"1\"} two\n",
                          "9x 1\n", "x 1 2 3\n", "x{a=\"unterminated} 1\n"}) {
    auto samples = ParseExpositionText(std::string("ok 1\n") + bad);
    ASSERT_FALSE(samples.ok()) << bad;
    EXPECT_EQ(samples.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(samples.status().message().find("line 2"), std::string::npos)
        << samples.status();
  }
}

TEST(ParseExpositionTextTest, ReadsWhatTheRegistryRenders) {
  MetricsRegistry registry;
  auto counter = registry.RegisterCounter("tessera_c_total", "c", {"op"});
  ASSERT_TRUE(counter.ok());
  (*counter)->WithLabels({"all\"reduce"}).value()->Increment(1.5e12);
  auto histogram =
      registry.RegisterHistogram("tessera_h_seconds", "h", {"phase"}, {0.1, 1});
  ASSERT_TRUE(histogram.ok());
  (*histogram)->WithLabels({"compute"}).value()->Observe(0.05);
  (*histogram)->WithLabels({"compute"}).value()->Observe(0.5);
  auto samples = ParseExpositionText(registry.RenderText());
  ASSERT_TRUE(samples.ok()) << samples.status() << "\n" << registry.RenderText();
  EXPECT_EQ(FindSample(*samples, "tessera_c_total", {{"op", "all\"reduce"}}), 1.5e12);
  EXPECT_EQ(FindSample(*samples, "tessera_h_seconds_count", {{"phase", "compute"}}), 2);
  EXPECT_NEAR(FindSample(*samples, "tessera_h_seconds_sum", {}).value_or(0), 0.55, 1e-12);
  EXPECT_EQ(FindSample(*samples, "tessera_h_seconds_bucket", {{"le", "0.1"}}), 1);
  EXPECT_EQ(FindSample(*samples, "tessera_c_total", {{"op", "push"}}), std::nullopt);
  EXPECT_EQ(FindSample(*samples, "tessera_missing", {}), std::nullopt);
}

class HttpGetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gauge = registry_.RegisterGauge("tessera_train_step", "step");
    ASSERT_TRUE(gauge.ok());
    (*gauge)->WithLabels({}).value()->Set(42);
    auto http = MetricsHttpServer::Start(MetricsHttpOptions{}, &registry_);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
    ASSERT_TRUE(http_->AddHandler("/big", [](const HttpRequest&) {
                       HttpResponse response;
                       response.body = std::string(100000, 'x');
                       return response;
                     }).ok());
  }
  std::string Url(const std::string& path) {
    return "http://127.0.0.1:" + std::to_string(http_->port()) + path;
  }

  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> http_;
};

TEST_F(HttpGetTest, ScrapesAMetricsPage) {
  auto samples = ScrapeMetrics(http_->url(), Deadline::AfterMillis(5000));
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(FindSample(*samples, "tessera_train_step", {}), 42);

  auto localhost = HttpGet("http://localhost:" + std::to_string(http_->port()) + "/metrics",
                           Deadline::AfterMillis(5000));
  ASSERT_TRUE(localhost.ok()) << localhost.status();
  EXPECT_EQ(localhost->status, 200);
  EXPECT_NE(localhost->content_type.find("text/plain"), std::string::npos);
}

TEST_F(HttpGetTest, StatusCodesAreResultsButNotScrapes) {
  auto missing = HttpGet(Url("/nothing"), Deadline::AfterMillis(5000));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  auto scrape = ScrapeMetrics(Url("/nothing"), Deadline::AfterMillis(5000));
  ASSERT_FALSE(scrape.ok());
  EXPECT_NE(scrape.status().message().find("HTTP 404"), std::string::npos) << scrape.status();
  auto big = HttpGet(Url("/big"), Deadline::AfterMillis(5000));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->body.size(), 100000u);
}

TEST_F(HttpGetTest, CapsTheResponseSize) {
  auto big = HttpGet(Url("/big"), Deadline::AfterMillis(5000), 1000);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status();
}

TEST(HttpGetErrorsTest, RejectsOtherUrls) {
  for (const char* url : {"https://127.0.0.1:1/metrics", "127.0.0.1:1/metrics", "http://host/x",
                          "http://127.0.0.1:0/metrics"}) {
    auto result = HttpGet(url, Deadline::AfterMillis(1000));
    ASSERT_FALSE(result.ok()) << url;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status();
    EXPECT_NE(result.status().message().find(url), std::string::npos) << result.status();
  }
}

// A listening socket that accepts connections (the kernel does) but never answers.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 4);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }
  // Closes the socket: later connections are refused.
  void Close() {
    close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(HttpGetErrorsTest, ASilentPeerHitsTheDeadline) {
  SilentListener listener;
  const std::string url = "http://127.0.0.1:" + std::to_string(listener.port()) + "/metrics";
  auto start = std::chrono::steady_clock::now();
  auto result = HttpGet(url, Deadline::AfterMillis(300));
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_NE(result.status().message().find(url), std::string::npos) << result.status();
  EXPECT_LT(elapsed, std::chrono::seconds(3));
}

TEST(HttpGetErrorsTest, ARefusedConnectionIsUnavailable) {
  SilentListener listener;
  const int port = listener.port();
  listener.Close();
  auto result = HttpGet("http://127.0.0.1:" + std::to_string(port) + "/metrics",
                        Deadline::AfterMillis(2000));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable) << result.status();
  EXPECT_NE(result.status().message().find("connect"), std::string::npos) << result.status();
}

}  // namespace
}  // namespace tessera::coordinator
