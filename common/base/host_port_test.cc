#include "common/base/host_port.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(HostPortTest, Parses) {
  auto parsed = ParseHostPort("10.0.0.1:29500");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->first, "10.0.0.1");
  EXPECT_EQ(parsed->second, 29500);
  parsed = ParseHostPort("[::1]:0");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->first, "::1");
  EXPECT_EQ(parsed->second, 0);
  parsed = ParseHostPort("node-7.cluster:65535");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->first, "node-7.cluster");
}

TEST(HostPortTest, ErrorsSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"host", "missing :PORT"},
      {"host:", "missing port"},
      {":80", "empty host"},
      {"host:http", "port \"http\" is not a number"},
      {"host:-1", "is not a number"},
      {"host:65536", "port 65536 is out of range 0..65535"},
      {"host:12345678901234567890", "out of range"},
      {"::1:80", "IPv6 address needs brackets"},
      {"[::1", "missing ']'"},
      {"[::1]", "missing :PORT"},
      {"[::1]80", "expected ':' after ']'"},
      {"[[f0]:2", "stray '[' or ']' in the host"},
      {"host]:2", "stray '[' or ']' in the host"},
      {"[]:80", "empty host"},
      {"tcp://host:80", "scheme"},
      {"host :80", "whitespace"},
  };
  for (const auto& [text, why] : cases) {
    auto parsed = ParseHostPort(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("\"" + text + "\" is not HOST:PORT"));
    EXPECT_THAT(parsed.status().message(), HasSubstr(why)) << text;
  }
}

TEST(HostPortTest, JoinBracketsIpv6) {
  EXPECT_EQ(JoinHostPort("h", 1), "h:1");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  auto round_trip = ParseHostPort(JoinHostPort("fe80::1", 5));
  ASSERT_TRUE(round_trip.ok());
  EXPECT_EQ(round_trip->first, "fe80::1");
}

TEST(IsLoopbackHostTest, Classifies) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "127.255.255.255", "localhost", "LocalHost",
                           "localhost.", "::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"", "0.0.0.0", "*", "10.0.0.1", "128.0.0.1", "127.0.0", "127.0.0.1.5",
                           "127.0.0.256", "127..0.1", "localhost.example.com", "::", "::2",
                           "127.0.0.1:80", "1127.0.0.1", "node1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(UnbracketedTest, StripsOnlyAPairOfBrackets) {
  EXPECT_EQ(Unbracketed("[::1]"), "::1");
  EXPECT_EQ(Unbracketed("::1"), "::1");
  EXPECT_EQ(Unbracketed("10.0.0.1"), "10.0.0.1");
  EXPECT_EQ(Unbracketed("[::1"), "[::1");
  EXPECT_EQ(Unbracketed("[]"), "");
}

TEST(IsUnspecifiedHostTest, Classifies) {
  for (const char* host : {"0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0", "*"}) {
    EXPECT_TRUE(IsUnspecifiedHost(host)) << host;
  }
  for (const char* host : {"", "127.0.0.1", "10.0.0.1", "::1", "0.0.0.1", "node1", "[::1]"}) {
    EXPECT_FALSE(IsUnspecifiedHost(host)) << host;
  }
}

}  // namespace
}  // namespace tessera
