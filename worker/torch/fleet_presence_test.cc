#include "worker/torch/fleet_presence.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "worker/torch/fsdp_metrics.h"

namespace tessera::worker {
namespace {

TEST(FleetPresenceTest, RecordsEveryOpInTheProcessRegistry) {
  FleetPresenceOptions options;
  auto presence = FleetPresence::Start(options);
  ASSERT_TRUE(presence.ok()) << presence.status();
  EXPECT_EQ((*presence)->metrics_url(), "");
  (*presence)->backend_metrics()->Record(TorchOp::kAllReduce, 4096, 0.001, true);
  (*presence)->backend_metrics()->Record(TorchOp::kReduceScatter, 2 << 20, 0.01, false);
  const std::string text = (*presence)->metrics()->RenderText();
  EXPECT_NE(text.find("tessera_collective_seconds_count{op=\"allreduce\",size_class=\"<64KiB\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tessera_collective_bytes_total{op=\"reduce_scatter\"} 2097152"),
            std::string::npos);
  EXPECT_NE(text.find("tessera_collective_errors_total{op=\"reduce_scatter\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("tessera_collective_errors_total{op=\"allreduce\"} 0"), std::string::npos);
  EXPECT_NE(text.find("tessera_build_info{role=\"worker\""), std::string::npos);
}

// The extension module makes the process's registry first (FSDP's instruments may be fed
// before, or without, any tessera group); the presence serves it, with FSDP's series.
TEST(FleetPresenceTest, ServesTheRegistryItIsGiven) {
  MetricsRegistry registry;
  auto fsdp = FsdpMetrics::Register(&registry);
  ASSERT_TRUE(fsdp.ok()) << fsdp.status();
  (*fsdp)->AddParamBytes(FsdpParamKind::kShard, 4096);
  FleetPresenceOptions options;
  options.registry = &registry;
  auto presence = FleetPresence::Start(options);
  ASSERT_TRUE(presence.ok()) << presence.status();
  EXPECT_EQ((*presence)->metrics(), &registry);
  (*presence)->backend_metrics()->Record(TorchOp::kAllGather, 64, 0.001, true);
  const std::string text = registry.RenderText();
  EXPECT_NE(text.find("tessera_fsdp_param_bytes{kind=\"shard\"} 4096"), std::string::npos)
      << text;
  EXPECT_NE(text.find("tessera_collective_bytes_total{op=\"allgather\"} 64"),
            std::string::npos);
  EXPECT_NE(text.find("tessera_build_info{role=\"worker\""), std::string::npos);
}

TEST(FleetPresenceTest, ServesMetricsOnAPortTheOsPicks) {
  FleetPresenceOptions options;
  options.metrics = MetricsHttpSettings();
  auto presence = FleetPresence::Start(options);
  ASSERT_TRUE(presence.ok()) << presence.status();
  EXPECT_EQ((*presence)->metrics_url().rfind("http://127.0.0.1:", 0), 0u)
      << (*presence)->metrics_url();
}

// A port nobody listens on: bound, then closed.
int ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(FleetPresenceTest, AnAbsentCoordinatorFailsNamingItWithinTheTimeout) {
  FleetPresenceOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.metrics = MetricsHttpSettings();
  options.coordinator = "127.0.0.1:" + std::to_string(ClosedPort());
  options.timeout_ms = 500;
  const auto start = std::chrono::steady_clock::now();
  auto presence = FleetPresence::Start(options);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(presence.ok());
  EXPECT_NE(presence.status().message().find("rank 1"), std::string::npos) << presence.status();
  EXPECT_NE(presence.status().message().find(options.coordinator), std::string::npos)
      << presence.status();
  // The rendezvous client gives an absent coordinator 5 s beyond the timeout to explain itself.
  EXPECT_LT(took, std::chrono::milliseconds(500 + 5000 + 2000));
}

}  // namespace
}  // namespace tessera::worker
