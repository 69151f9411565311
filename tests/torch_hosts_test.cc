// HYBRID_SHARD of tessera.torch.fsdp across two hosts emulated with network namespaces (issue 44,
// tests/emulated_hosts.h): two ranks on each host, each host with a host name and a /dev/shm of
// its own, so hybrid_groups() finds the hosts by hostname, shards within each host (shared
// memory) and replicates across them (TCP over eth0). Every rank runs
// tests/torch/fsdp_hosts_rank.py, which trains fsdp_test's transformer with HYBRID_SHARD and
// _HYBRID_SHARD_ZERO2 and, in the same processes, with DDP over Gloo; the parameters after 20
// steps must agree within 1e-6 relative to each tensor's scale, and the groups must be the
// ranks of each host.
//
// The ranks meet through a file store in the test's scratch directory, which both hosts see
// (only /dev/shm is private), and are given TESSERA_SOCKET_IFNAME=eth0: with a file store the
// backend has no rendezvous host to find its route to (MASTER_ADDR or a TCPStore's host), and
// its default is the loopback, which a rank on the other host cannot reach. Without it every
// rank is refused as it joins, naming the fix; through torch's TCPStore on host 0 instead, the
// ranks need no variable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/emulated_hosts.h"
#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int kHosts = 2;
constexpr int kRanksPerHost = 2;
constexpr int kWorldSize = kHosts * kRanksPerHost;
// Each group's timeout in the ranks: a rank whose peer died fails within it.
constexpr int kGroupTimeoutS = 60;
// Bounds the whole run: the ranks take about 4 s alone on two cores (mostly importing torch).
constexpr int64_t kRunMs = 3 * kGroupTimeoutS * 1000;
constexpr double kTolerance = 1e-6;

std::string RankLog(int rank) {
  return TempPath("fsdp-hosts-rank-" + std::to_string(rank) + ".log");
}
std::string RankResult(int rank) {
  return TempPath("fsdp-hosts-rank-" + std::to_string(rank) + ".json");
}

// Every rank's log, for a failure's message.
std::string Logs() {
  std::string text;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    text += "\n--- rank " + std::to_string(rank) + " ---\n" + ReadWholeFile(RankLog(rank));
  }
  return text;
}

class TorchHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<EmulatedHosts>> hosts = EmulatedHosts::Create(kHosts);
    if (!hosts.ok()) {
      if (NamespacesRequired()) FAIL() << hosts.status();
      GTEST_SKIP() << "cannot emulate hosts with network namespaces here (needs root): "
                   << hosts.status();
    }
    hosts_ = std::move(hosts).value();
  }
  void TearDown() override { harness_.StopAll(); }

  // Starts the ranks (tests/torch/fsdp_hosts_rank.py), kRanksPerHost on each host, with `env`
  // (NAME=VALUE) added to their environment and `args` to their arguments, and waits for them;
  // the exit status of each host's ranks (0 when all of them exited 0), by host.
  std::vector<int> RunRanks(const std::vector<std::string>& env,
                            const std::vector<std::string>& args = {}) {
    const std::string python_path = BinaryPath("worker/torch") + ":" + BinaryPath("tests/torch");
    const std::string store = TempPath("fsdp-hosts-store");
    std::remove(store.c_str());
    // One shell per host starts its ranks, so that they share the host's /dev/shm; it exits
    // non-zero when one of them did. $0 is the interpreter, $1 the rank script.
    std::vector<int> shells;
    for (int host = 0; host < kHosts; ++host) {
      std::string script;
      std::string waits = "status=0; ";
      for (int local = 0; local < kRanksPerHost; ++local) {
        const int rank = host * kRanksPerHost + local;
        std::remove(RankResult(rank).c_str());
        script += "\"$0\" \"$1\" --rank " + std::to_string(rank) + " --world-size " +
                  std::to_string(kWorldSize) + " --store '" + store + "' --result '" +
                  RankResult(rank) + "' --timeout-s " + std::to_string(kGroupTimeoutS) + " >'" +
                  RankLog(rank) + "'";
        for (const std::string& arg : args) script += " '" + arg + "'";
        script += " 2>&1 & p" + std::to_string(local) + "=$!; ";
        waits += "wait $p" + std::to_string(local) + " || status=1; ";
      }
      script += waits + "exit $status";
      std::vector<std::string> argv = {
          "/usr/bin/env", "PYTHONPATH=" + python_path,
          // One thread per rank for torch's kernels: four ranks share two cores.
          "OMP_NUM_THREADS=1",
          // Gloo (DDP's group) on the host's interface to the other.
          "GLOO_SOCKET_IFNAME=eth0"};
      argv = Concat(Concat(argv, env), {"/bin/sh", "-c", script, "/usr/bin/python3",
                                        BinaryPath("tests/torch/fsdp_hosts_rank.py")});
      auto started = harness_.StartCommand(
          "host " + std::to_string(host),
          hosts_->Command(host, argv, /*private_shm=*/true, /*own_hostname=*/true));
      EXPECT_TRUE(started.ok()) << started.status();
      if (!started.ok()) return {};
      shells.push_back(*started);
    }
    const Deadline deadline = Deadline::AfterMillis(kRunMs);
    std::vector<int> statuses;
    for (int id : shells) {
      auto exit = harness_.WaitExit(id, deadline);
      EXPECT_TRUE(exit.ok()) << exit.status() << Logs();
      if (!exit.ok()) return {};
      statuses.push_back(exit->status);
    }
    return statuses;
  }

  std::unique_ptr<EmulatedHosts> hosts_;
  FleetHarness harness_;
};

// What the ranks wrote: the groups by host, every error within kTolerance.
void ExpectHybridShardEqualsDdp() {
  double worst = 0;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const int host = rank / kRanksPerHost;
    const nlohmann::json result =
        nlohmann::json::parse(ReadWholeFile(RankResult(rank)), nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(result.is_object()) << Logs();
    EXPECT_EQ(result.value("hostname", ""), EmulatedHosts::HostName(host));
    // Sharded among the ranks of its host, replicated with the same place on the other host.
    std::vector<int> shard, replicate;
    for (int local = 0; local < kRanksPerHost; ++local) {
      shard.push_back(host * kRanksPerHost + local);
    }
    for (int h = 0; h < kHosts; ++h) {
      replicate.push_back(h * kRanksPerHost + rank % kRanksPerHost);
    }
    EXPECT_EQ(result.value("shard group", std::vector<int>{}), shard);
    EXPECT_EQ(result.value("replicate group", std::vector<int>{}), replicate);
    for (const std::string strategy : {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"}) {
      const std::string key = "transformer " + strategy;
      ASSERT_TRUE(result.contains(key) && result[key].is_number()) << result.dump();
      const double error = result[key].get<double>();
      EXPECT_LE(error, kTolerance) << key;
      worst = std::max(worst, error);
    }
  }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("worst relative error against DDP: %.3g\n", worst);
}

TEST_F(TorchHostsTest, HybridShardAcrossHostsEqualsDdp) {
  // The tessera backend on the host's interface to the other too.
  const std::vector<int> statuses = RunRanks({"TESSERA_SOCKET_IFNAME=eth0"});
  ASSERT_EQ(statuses, std::vector<int>(kHosts, 0)) << Logs();
  ExpectHybridShardEqualsDdp();
}

// Through torch's TCPStore on host 0 (as a tcp:// init method, which sets no MASTER_ADDR) and
// with no address given: each rank binds the local end of its route to the store's host.
TEST_F(TorchHostsTest, OverATcpStoreEachRankBindsTheRouteToItsHost) {
  const std::vector<int> statuses = RunRanks({}, {"--tcp-store-host", EmulatedHosts::Address(0)});
  ASSERT_EQ(statuses, std::vector<int>(kHosts, 0)) << Logs();
  ExpectHybridShardEqualsDdp();
}

// Without an address to bind (no TESSERA_SOCKET_IFNAME, TESSERA_BIND_HOST or MASTER_ADDR: a
// file store), every rank binds the loopback, which the other host cannot reach: each rank
// fails as it joins, at once rather than at the group's timeout, naming a rank on the other
// host and the variables that fix it.
TEST_F(TorchHostsTest, LoopbackAddressesAcrossHostsAreRefusedNamingTheFix) {
  const SteadyClock::time_point started = SteadyClock::now();
  const std::vector<int> statuses = RunRanks({});
  const int64_t took_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - started).count();
  ASSERT_EQ(statuses.size(), static_cast<size_t>(kHosts)) << Logs();
  for (int status : statuses) EXPECT_NE(status, 0) << Logs();
  EXPECT_LT(took_ms, kGroupTimeoutS * 1000 / 2) << Logs();
  for (int rank = 0; rank < kWorldSize; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string log = ReadWholeFile(RankLog(rank));
    const std::string other = EmulatedHosts::HostName(1 - rank / kRanksPerHost);
    EXPECT_NE(log.find("advertises tcp://127.0.0.1:"), std::string::npos) << log;
    EXPECT_NE(log.find("(on " + other + ", boot "), std::string::npos) << log;
    EXPECT_NE(log.find("TESSERA_SOCKET_IFNAME="), std::string::npos) << log;
    EXPECT_TRUE(ReadWholeFile(RankResult(rank)).empty());
  }
}

}  // namespace
}  // namespace tessera::testing
