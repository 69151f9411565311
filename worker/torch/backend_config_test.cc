#include "worker/torch/backend_config.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

// Every environment below also says how the ranks authenticate (without a key file, which
// CredentialsTest covers): the backend refuses to start without either.
Environment Insecure(Environment env) {
  env.emplace("TESSERA_INSECURE", "1");
  return env;
}

TEST(BackendConfigTest, DefaultsWithAnEmptyEnvironment) {
  StatusOr<BackendConfig> config = BackendConfigFrom(Insecure({}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->member.bind_host, "127.0.0.1");
  EXPECT_EQ(config->member.ring_transport, "auto");
  EXPECT_EQ(config->member.direct_read_min_bytes, kDefaultDirectReadMinBytes);
  EXPECT_EQ(config->member.one_shot_max_bytes, kDefaultOneShotMaxBytes);
  EXPECT_EQ(config->member.comm_spin_us, kDefaultCommSpinUs);
  EXPECT_EQ(config->member.timeout_ms, 5 * 60 * 1000);
  EXPECT_FALSE(config->metrics.has_value());
  EXPECT_TRUE(config->coordinator.empty());
}

TEST(BackendConfigTest, ReadsEveryVariable) {
  StatusOr<BackendConfig> config = BackendConfigFrom(Insecure({{"TESSERA_BIND_HOST", "10.0.0.7"},
                                                      {"TESSERA_RING_TRANSPORT", "links"},
                                                      {"TESSERA_DIRECT_READ_MIN_BYTES", "0"},
                                                      {"TESSERA_ONE_SHOT_MAX_BYTES", "4096"},
                                                      {"TESSERA_COMM_SPIN_US", "50"},
                                                      {"TESSERA_TIMEOUT_MS", "2500"},
                                                      {"TESSERA_METRICS_PORT", "9100"},
                                                      {"TESSERA_METRICS_BIND_HOST", "auto"},
                                                      {"TESSERA_METRICS_TLS_CERT", "/c.pem"},
                                                      {"TESSERA_METRICS_TLS_KEY", "/k.pem"},
                                                      {"TESSERA_METRICS_AUTH_FILE", "/users"},
                                                      {"TESSERA_COORDINATOR", "10.0.0.1:29500"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->member.bind_host, "10.0.0.7");
  EXPECT_EQ(config->member.ring_transport, "links");
  EXPECT_EQ(config->member.direct_read_min_bytes, 0u);
  EXPECT_EQ(config->member.one_shot_max_bytes, 4096u);
  EXPECT_EQ(config->member.comm_spin_us, 50);
  EXPECT_EQ(config->member.timeout_ms, 2500);
  ASSERT_TRUE(config->metrics.has_value());
  EXPECT_EQ(config->metrics->port, 9100);
  EXPECT_EQ(config->metrics->bind_host, "auto");
  EXPECT_EQ(config->metrics->tls_cert_file, "/c.pem");
  EXPECT_EQ(config->metrics->tls_key_file, "/k.pem");
  EXPECT_EQ(config->metrics->auth_file, "/users");
  EXPECT_EQ(config->metrics->Name("auth-file"), "TESSERA_METRICS_AUTH_FILE");
  EXPECT_EQ(config->coordinator, "10.0.0.1:29500");
}

// A tcp:// init method sets no MASTER_ADDR: auto aims at its TCPStore's host then.
TEST(BackendConfigTest, WithoutMasterAddrTheBindHostFollowsTheRouteToTheStoresHost) {
  StatusOr<BackendConfig> local = BackendConfigFrom(Insecure({}), "localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->member.bind_host, "127.0.0.1");
  Status unresolved = BackendConfigFrom(Insecure({}), "no-such-host.invalid").status();
  EXPECT_NE(unresolved.message().find("the host of torch's TCPStore, \"no-such-host.invalid\""),
            std::string::npos)
      << unresolved;
  StatusOr<BackendConfig> master =
      BackendConfigFrom(Insecure({{"MASTER_ADDR", "localhost"}}), "no-such-host.invalid");
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(master->member.bind_host, "127.0.0.1");
}

TEST(BackendConfigTest, TheBindHostFollowsTheRouteToMasterAddrOrAnInterface) {
  StatusOr<BackendConfig> local = BackendConfigFrom(Insecure({{"MASTER_ADDR", "localhost"}}));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->member.bind_host, "127.0.0.1");
  StatusOr<BackendConfig> named = BackendConfigFrom(Insecure({{"TESSERA_SOCKET_IFNAME", "lo"}}));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->member.bind_host, "127.0.0.1");
  // Every interface: the ranks bind and advertise what auto picks, never 0.0.0.0.
  StatusOr<BackendConfig> every =
      BackendConfigFrom(Insecure({{"TESSERA_BIND_HOST", "0.0.0.0"}, {"MASTER_ADDR", "127.0.0.1"}}));
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_EQ(every->member.bind_host, "127.0.0.1");
  StatusOr<BackendConfig> unknown = BackendConfigFrom(Insecure({{"TESSERA_SOCKET_IFNAME", "nosuch0"}}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("TESSERA_SOCKET_IFNAME=\"nosuch0\""),
            std::string::npos)
      << unknown.status();
}

TEST(BackendConfigTest, ACoordinatorGetsMetricsOnAPortTheOsPicks) {
  StatusOr<BackendConfig> config = BackendConfigFrom(Insecure({{"TESSERA_COORDINATOR", "host:1"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->metrics.has_value());
  EXPECT_EQ(config->metrics->port, 0);
  EXPECT_EQ(config->metrics->bind_host, "loopback");
}

// The spin bounds: 0 and the largest accepted pass; past them the error says the range.
TEST(BackendConfigTest, CommSpinUsTakesZeroToOneSecond) {
  StatusOr<BackendConfig> zero = BackendConfigFrom(Insecure({{"TESSERA_COMM_SPIN_US", "0"}}));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->member.comm_spin_us, 0);
  StatusOr<BackendConfig> most = BackendConfigFrom(
      Insecure({{"TESSERA_COMM_SPIN_US", std::to_string(kMaxCommSpinUs)}}));
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(most->member.comm_spin_us, kMaxCommSpinUs);
  Status absurd = BackendConfigFrom(Insecure({{"TESSERA_COMM_SPIN_US", "5000000"}})).status();
  EXPECT_NE(absurd.message().find("TESSERA_COMM_SPIN_US=\"5000000\" is not a number of "
                                  "microseconds from 0 (never spin) to 1000000"),
            std::string::npos)
      << absurd;
}

TEST(BackendConfigTest, TorchsDefaultTimeoutMeansNoneWasGiven) {
  StatusOr<BackendConfig> config = BackendConfigFrom(Insecure({{"TESSERA_TIMEOUT_MS", "7000"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(EffectiveTimeoutMs(*config, kTorchDefaultTimeoutMs), 7000);
  EXPECT_EQ(EffectiveTimeoutMs(*config, 12000), 12000);
}

TEST(BackendConfigTest, BadValuesNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"TESSERA_BIND_HOST", "nosuch0"},      {"TESSERA_BIND_HOST", ""},
      {"TESSERA_RING_TRANSPORT", "tcp"},     {"TESSERA_TIMEOUT_MS", "0"},
      {"TESSERA_DIRECT_READ_MIN_BYTES", "-1"}, {"TESSERA_DIRECT_READ_MIN_BYTES", "3M"},
      {"TESSERA_ONE_SHOT_MAX_BYTES", "-1"},    {"TESSERA_ONE_SHOT_MAX_BYTES", "64K"},
      {"TESSERA_TIMEOUT_MS", "5s"},          {"TESSERA_METRICS_PORT", "70000"},
      {"TESSERA_METRICS_PORT", "-1"},        {"TESSERA_COORDINATOR", "host"},
      {"TESSERA_COORDINATOR", "host:0"},     {"TESSERA_COMM_SPIN_US", "-1"},
      {"TESSERA_COMM_SPIN_US", "20us"},      {"TESSERA_COMM_SPIN_US", ""},
      {"TESSERA_COMM_SPIN_US", "1000001"},   {"TESSERA_COMM_SPIN_US", "99999999999999999999"},
  };
  for (const auto& [name, value] : bad) {
    StatusOr<BackendConfig> config = BackendConfigFrom(Insecure({{name, value}}));
    ASSERT_FALSE(config.ok()) << name << "=" << value;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(name), std::string::npos) << config.status();
  }
}

}  // namespace
}  // namespace tessera::worker

namespace tessera::worker {
namespace {

TEST(BackendConfigTest, NoKeyAndNoInsecureIsRefusedSayingWhatToDo) {
  StatusOr<BackendConfig> config = BackendConfigFrom({});
  EXPECT_EQ(config.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(config.status().message().find("TESSERA_AUTH_KEY_FILE"), std::string::npos)
      << config.status();
  EXPECT_NE(BackendConfigFrom({{"TESSERA_INSECURE", "yes"}}).status().message().find(
                "TESSERA_INSECURE=\"yes\" is not 0 or 1"),
            std::string::npos);
}

TEST(BackendConfigTest, NoKeySaysWhichWayOfStartingRanksBringsOne) {
  // A rank a launcher started: the launcher's variable is named, and a shared key file asked for.
  Status torchrun = BackendConfigFrom({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).status();
  EXPECT_EQ(torchrun.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(torchrun.message().find("started by a launcher (RANK is set)"), std::string::npos)
      << torchrun;
  EXPECT_NE(torchrun.message().find("--make-key-file"), std::string::npos) << torchrun;
  Status srun = BackendConfigFrom({{"SLURM_PROCID", "0"}}).status();
  EXPECT_NE(srun.message().find("(SLURM_PROCID is set)"), std::string::npos) << srun;
  // A process no launcher started: spawned ranks inherit their parent's key.
  Status plain = BackendConfigFrom({}).status();
  EXPECT_NE(plain.message().find("torch.multiprocessing.spawn"), std::string::npos) << plain;
  EXPECT_NE(plain.message().find("was not started that way"), std::string::npos) << plain;
}

}  // namespace
}  // namespace tessera::worker
