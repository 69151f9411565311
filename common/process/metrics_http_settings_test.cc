#include "common/process/metrics_http_settings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/base/test_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

const BindAddress kLoopbackTransport{"127.0.0.1", "127.0.0.1", "test"};

TEST(MetricsHttpSettingsTest, NamesFlagsOrVariablesAsTheUserGaveThem) {
  MetricsHttpSettings flags;
  EXPECT_EQ(flags.Name("bind-host"), "--metrics-bind-host");
  MetricsHttpSettings env = MetricsHttpSettings::FromEnvironment(0, {});
  EXPECT_EQ(env.Name("bind-host"), "TESSERA_METRICS_BIND_HOST");
  EXPECT_EQ(env.Name("tls-cert"), "TESSERA_METRICS_TLS_CERT");
}

TEST(MetricsHttpSettingsTest, TheEnvironmentGivesEverySettingAndEmptyMeansTheDefault) {
  MetricsHttpSettings settings = MetricsHttpSettings::FromEnvironment(
      9100, {{"TESSERA_METRICS_BIND_HOST", ""},
             {"TESSERA_METRICS_TLS_CERT", "/c.pem"},
             {"TESSERA_METRICS_TLS_KEY", "/k.pem"},
             {"TESSERA_METRICS_AUTH_FILE", "/users"}});
  EXPECT_EQ(settings.port, 9100);
  EXPECT_EQ(settings.bind_host, "loopback");
  EXPECT_EQ(settings.tls_cert_file, "/c.pem");
  EXPECT_EQ(settings.tls_key_file, "/k.pem");
  EXPECT_EQ(settings.auth_file, "/users");
}

TEST(MetricsHttpSettingsTest, LoopbackByDefaultAndAutoFollowsTheTransport) {
  MetricsHttpSettings settings;
  StatusOr<MetricsHttpOptions> loopback =
      ResolveMetricsHttpOptions(settings, {"0.0.0.0", "10.1.2.3", "test"}, "");
  ASSERT_TRUE(loopback.ok()) << loopback.status();
  EXPECT_EQ(loopback->bind_host, "127.0.0.1");
  settings.bind_host = "auto";
  StatusOr<MetricsHttpOptions> automatic =
      ResolveMetricsHttpOptions(settings, {"0.0.0.0", "10.1.2.3", "test"}, "");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->bind_host, "0.0.0.0");
  EXPECT_EQ(automatic->advertise_host, "10.1.2.3");
  settings.bind_host = "127.0.0.2";
  StatusOr<MetricsHttpOptions> given = ResolveMetricsHttpOptions(settings, kLoopbackTransport, "");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->bind_host, "127.0.0.2");
}

TEST(MetricsHttpSettingsTest, ErrorsNameTheSettingAsGiven) {
  MetricsHttpSettings settings = MetricsHttpSettings::FromEnvironment(0, {});
  settings.bind_host = "nosuch0";
  StatusOr<MetricsHttpOptions> host = ResolveMetricsHttpOptions(settings, kLoopbackTransport, "");
  ASSERT_FALSE(host.ok());
  EXPECT_THAT(host.status().message(), HasSubstr("TESSERA_METRICS_BIND_HOST"));

  settings.bind_host = "loopback";
  settings.auth_file = WriteTestFile("users", "prometheus:s3cret\n", 0644);
  StatusOr<MetricsHttpOptions> readable =
      ResolveMetricsHttpOptions(settings, kLoopbackTransport, "");
  ASSERT_FALSE(readable.ok());
  EXPECT_THAT(readable.status().message(), HasSubstr("TESSERA_METRICS_AUTH_FILE"));
  EXPECT_THAT(readable.status().message(), HasSubstr(settings.auth_file));

  settings.from_environment = false;
  settings.auth_file = WriteTestFile("users", "prometheus:s3cret\n", 0600);
  StatusOr<MetricsHttpOptions> read = ResolveMetricsHttpOptions(settings, kLoopbackTransport, "");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_NE(read->basic_auth, nullptr);
  settings.auth_file += ".missing";
  StatusOr<MetricsHttpOptions> missing =
      ResolveMetricsHttpOptions(settings, kLoopbackTransport, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--metrics-auth-file"));
}

}  // namespace
}  // namespace tessera
