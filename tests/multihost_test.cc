// Jobs across emulated hosts (issue 20, item 1): two network namespaces joined by a bridge,
// each with its own /dev/shm. Every mode trains across them with the commands of
// docs/clusters.md and no --bind-host, to bitwise the parameters of the same job on one host;
// a member advertising a loopback address from another host is refused naming the fix; an
// interface name and 0.0.0.0 work; /sd and every /metrics are reachable from the other host.
#include <signal.h>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/emulated_hosts.h"
#include "tests/fleet_harness.h"
#include "worker/params_file.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 90000;

const std::vector<std::string> kJob = {"--batch-size", "8",       "--hidden",  "16",
                                       "--input-dim",  "8",       "--classes", "4",
                                       "--train-samples", "256", "--device",  "cpu",
                                       "--seed",       "5",       "--steps",   "6"};

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<EmulatedHosts>> hosts = EmulatedHosts::Create(2);
    if (!hosts.ok()) {
      if (NamespacesRequired()) FAIL() << hosts.status();
      GTEST_SKIP() << "cannot emulate hosts with network namespaces here (needs root): "
                   << hosts.status();
    }
    hosts_ = std::move(hosts).value();
  }
  void TearDown() override { harness_.StopAll(); }

  // `binary` with `args` on host `host`, with `env` (NAME=VALUE) added to its environment.
  StatusOr<int> StartOn(int host, const std::string& label, const std::string& binary,
                        const std::vector<std::string>& args,
                        const std::vector<std::string>& env = {}, bool own_hostname = false) {
    // HTTP on the transport's address, not the default loopback: /sd lists every /metrics
    // for a Prometheus on the other host (the variable reaches tessera-launch's children too).
    std::vector<std::string> argv =
        Concat({"/usr/bin/env", "TESSERA_METRICS_BIND_HOST=auto"}, env);
    argv.push_back(BinaryPath(binary));
    return harness_.StartCommand(
        label, hosts_->Command(host, Concat(argv, args), /*private_shm=*/true, own_hostname));
  }

  // tessera-launch --nnodes 2 --nproc-per-node 2 --mode `mode` on each host, node 0's
  // hosting the coordinator, with `job` after "--"; both must exit 0 within kRunMs. Their
  // process ids in *node0 and *node1 (for harness_.Output).
  void RunTwoNodes(const std::string& mode, const std::vector<std::string>& job, int* node0,
                   int* node1) {
    auto launcher = [&](int node, const std::string& coordinator) {
      return StartOn(node, "node " + std::to_string(node), "tools/tessera-launch",
                     Concat({"--nnodes", "2", "--node-rank", std::to_string(node),
                             "--nproc-per-node", "2", "--coordinator", coordinator, "--mode",
                             mode, "--log-level", "info", "--"},
                            job));
    };
    auto first = launcher(0, EmulatedHosts::Address(0) + ":0");
    ASSERT_TRUE(first.ok()) << first.status();
    *node0 = *first;
    const std::string announced = "[launch] coordinator address tcp://";
    ASSERT_TRUE(harness_.WaitForLine(*node0, announced, Deadline::AfterMillis(30000)).ok())
        << harness_.Output(*node0);
    const std::string out0 = harness_.Output(*node0);
    const size_t at = out0.find(announced) + announced.size();
    auto second = launcher(1, out0.substr(at, out0.find(' ', at) - at));
    ASSERT_TRUE(second.ok()) << second.status();
    *node1 = *second;
    for (int id : {*node1, *node0}) {
      auto exit = harness_.WaitExit(id, Deadline::AfterMillis(kRunMs));
      ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << harness_.Output(id);
      EXPECT_EQ(exit->status, 0) << harness_.Output(id);
    }
  }

  // A coordinator on host 0 (at its address, port 0), `servers` servers on hosts 0, 1, 0, ...
  // and worker r on host r, with `server_flags[s]` and `worker_flags[r]` appended and worker 1
  // given `worker1_env`.
  StatusOr<TwoWorkerJob> StartAcrossHosts(const std::string& mode, int servers,
                                          const std::vector<std::vector<std::string>>& server_flags,
                                          const std::vector<std::vector<std::string>>& worker_flags,
                                          const std::vector<std::string>& worker1_env = {}) {
    TwoWorkerJob job;
    const std::string n = std::to_string(servers);
    ASSIGN_OR_RETURN(job.coordinator,
                     StartOn(0, "coordinator", "coordinator/tessera-coordinator",
                             {"--coordinator", EmulatedHosts::Address(0) + ":0", "--num-servers",
                              n, "--num-workers", "2"}));
    RETURN_IF_ERROR(harness_.WaitReady(job.coordinator, Deadline::AfterMillis(30000)));
    job.address = harness_.process(job.coordinator).address.substr(std::string("tcp://").size());
    for (int s = 0; s < servers; ++s) {
      ASSIGN_OR_RETURN(int id, StartOn(s % 2, "server " + std::to_string(s),
                                       "server/ps/tessera-server",
                                       Concat({"--coordinator", job.address, "--num-servers", n,
                                               "--num-workers", "2", "--rank", std::to_string(s)},
                                              server_flags.empty() ? std::vector<std::string>{}
                                                                   : server_flags[s])));
      job.servers.push_back(id);
    }
    for (int r = 0; r < 2; ++r) {
      ASSIGN_OR_RETURN(int id, StartOn(r, "worker " + std::to_string(r), "worker/tessera-worker",
                                       Concat({"--mode", mode, "--coordinator", job.address,
                                               "--num-servers", n, "--num-workers", "2", "--rank",
                                               std::to_string(r)},
                                              worker_flags[r]),
                                       r == 1 ? worker1_env : std::vector<std::string>{}));
      job.workers.push_back(id);
    }
    return job;
  }

  // Waits for both workers; EXPECTs each exits 0.
  void ExpectWorkersSucceed(const TwoWorkerJob& job) {
    for (int id : job.workers) {
      auto exit = harness_.WaitExit(id, Deadline::AfterMillis(kRunMs));
      ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << harness_.Output(id);
      EXPECT_EQ(exit->status, 0) << harness_.Output(id);
    }
  }

  std::unique_ptr<EmulatedHosts> hosts_;
  FleetHarness harness_;
};

// The parameters worker 0 saved after `mode` on the loopback of this machine.
std::string OneHostParameters(const std::string& mode, int servers, const std::string& name) {
  FleetHarness harness;
  const std::string path = TempPath(name + "-one-host.params");
  auto job = StartTwoWorkerJob(harness, mode, servers, {},
                               {Concat(kJob, {"--save-params", path}), kJob});
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return "";
  for (int id : job->workers) {
    auto exit = harness.WaitExit(id, Deadline::AfterMillis(kRunMs));
    EXPECT_TRUE(exit.ok() && exit->status == 0) << harness.Output(id);
  }
  harness.StopAll();
  return ReadWholeFile(path);
}

TEST_F(MultiHostTest, EveryModeTrainsAcrossHostsWithoutBindHost) {
  for (const std::string mode : {"ps-sync", "ps-async", "allreduce", "zero2", "zero3"}) {
    SCOPED_TRACE(mode);
    const int servers = mode.rfind("ps-", 0) == 0 ? 2 : 0;
    const std::string path = TempPath(mode + "-across.params");
    auto job = StartAcrossHosts(mode, servers, {},
                                {Concat(kJob, {"--save-params", path}), kJob});
    ASSERT_TRUE(job.ok()) << job.status();
    ExpectWorkersSucceed(*job);
    // Each process advertised its own host's address, not the loopback.
    EXPECT_EQ(harness_.process(job->workers[1]).address.rfind("tcp://10.77.0.2:", 0), 0u)
        << harness_.process(job->workers[1]).address;
    EXPECT_EQ(harness_.process(job->workers[1]).metrics_url.rfind("http://10.77.0.2:", 0), 0u)
        << harness_.process(job->workers[1]).metrics_url;
    if (servers > 0) {
      EXPECT_EQ(harness_.process(job->servers[1]).address.rfind("tcp://10.77.0.2:", 0), 0u);
    }
    if (mode == "ps-async") {
      // Its result depends on how the two workers' pushes interleave: it trains, that's all.
      EXPECT_FALSE(ReadWholeFile(path).empty());
    } else {
      EXPECT_EQ(ReadWholeFile(path), OneHostParameters(mode, servers, mode))
          << "the same job on one host ended with other parameters";
    }
    harness_.StopAll();
  }
}

// Two workers on each host, one tessera-launch per host (issue 20, item 4): --ring-transport
// auto, the default, uses shared memory for the hop between a host's two workers and TCP
// links for the hops between hosts, each worker says which, and the job ends with the
// parameters of the same four-worker job on one host (shared memory on every hop).
TEST_F(MultiHostTest, TwoWorkersPerHostUseSharedMemoryWithinAHostAndLinksBetween) {
  const std::string path = TempPath("per-hop-across.params");
  const std::vector<std::string> job = Concat(kJob, {"--save-params", path});
  int node0 = -1, node1 = -1;
  ASSERT_NO_FATAL_FAILURE(RunTwoNodes("allreduce", job, &node0, &node1));
  const std::string map = "chosen by auto per hop (0->1 shm, 1->2 links, 2->3 shm, 3->0 links)";
  const std::string hops[4] = {"shm to worker 1, links from worker 3, ",
                               "links to worker 2, shm from worker 0, ",
                               "shm to worker 3, links from worker 1, ",
                               "links to worker 0, shm from worker 2, "};
  for (int rank = 0; rank < 4; ++rank) {
    const std::string out = harness_.Output(rank < 2 ? node0 : node1);
    EXPECT_NE(out.find("ring channel: " + hops[rank] + map), std::string::npos)
        << "worker " << rank << ":\n" << out;
  }

  FleetHarness one_host;
  const std::string one_host_path = TempPath("per-hop-one-host.params");
  auto reference = one_host.Start("one host", "tools/tessera-launch",
                                  Concat({"--workers", "4", "--mode", "allreduce", "--log-level",
                                          "info", "--"},
                                         Concat(kJob, {"--save-params", one_host_path})));
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto exit = one_host.WaitExit(*reference, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok() && exit->status == 0) << one_host.Output(*reference);
  EXPECT_NE(one_host.Output(*reference).find("ring channel: shm ("), std::string::npos)
      << one_host.Output(*reference);
  ASSERT_FALSE(ReadWholeFile(path).empty()) << "worker 0 saved no parameters in " << path;
  EXPECT_EQ(ReadWholeFile(path), ReadWholeFile(one_host_path))
      << "the same job on one host ended with other parameters";
}

// The same job with --direct-read-min-bytes 512 (issue 45, item 2): the model's one bucket
// (848 bytes) is all-reduced hierarchically, within each host by direct reads and across the
// hosts over links, each worker says so, and the job ends with the one-host job's parameters
// within rounding (the sums are grouped by host, so not bit for bit).
TEST_F(MultiHostTest, TwoWorkersPerHostAllReduceHierarchically) {
  const std::string path = TempPath("hierarchical.params");
  int node0 = -1, node1 = -1;
  ASSERT_NO_FATAL_FAILURE(RunTwoNodes(
      "allreduce", Concat(kJob, {"--direct-read-min-bytes", "512", "--save-params", path}),
      &node0, &node1));
  for (int node : {node0, node1}) {
    const std::string out = harness_.Output(node);
    EXPECT_NE(out.find("; hierarchical all-reduce from 512 bytes: 2 ranks within each of 2 "
                       "hosts (shm"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("direct reads (cross-memory attach)"), std::string::npos) << out;
  }
  FleetHarness one_host;
  const std::string one_host_path = TempPath("hierarchical-one-host.params");
  auto reference = one_host.Start("one host", "tools/tessera-launch",
                                  Concat({"--workers", "4", "--mode", "allreduce", "--"},
                                         Concat(kJob, {"--save-params", one_host_path})));
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto exit = one_host.WaitExit(*reference, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok() && exit->status == 0) << one_host.Output(*reference);
  auto got = worker::LoadParams(path);
  auto want = worker::LoadParams(one_host_path);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->values.size(), want->values.size());
  for (size_t i = 0; i < got->values.size(); ++i) {
    EXPECT_NEAR(got->values[i], want->values[i], 1e-5 * (1 + std::fabs(want->values[i])))
        << "parameter element " << i;
  }
}

// --mode hsdp (issue 44, item 4) on two workers per host without --shard-group-size: each
// host's two workers are a shard group and the workers with the same index on the two hosts a
// replicate group; the job ends with the parameters of the same job on one host with
// --shard-group-size 2 (the same groups, the same arithmetic).
TEST_F(MultiHostTest, HsdpShardsWithinEachHostAndReplicatesAcross) {
  const std::string path = TempPath("hsdp-across.params");
  const std::vector<std::string> job = Concat(kJob, {"--save-params", path});
  int node0 = -1, node1 = -1;
  ASSERT_NO_FATAL_FAILURE(RunTwoNodes("hsdp", job, &node0, &node1));
  EXPECT_NE(harness_.Output(node0).find("(world ranks 0, 1)"), std::string::npos)
      << harness_.Output(node0);
  EXPECT_NE(harness_.Output(node1).find("(world ranks 2, 3)"), std::string::npos)
      << harness_.Output(node1);
  EXPECT_NE(harness_.Output(node0).find("replicate group"), std::string::npos);

  FleetHarness one_host;
  const std::string one_host_path = TempPath("hsdp-one-host.params");
  auto reference = one_host.Start(
      "one host", "tools/tessera-launch",
      Concat({"--workers", "4", "--mode", "hsdp", "--"},
             Concat(kJob, {"--shard-group-size", "2", "--save-params", one_host_path})));
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto exit = one_host.WaitExit(*reference, Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok() && exit->status == 0) << one_host.Output(*reference);
  ASSERT_FALSE(ReadWholeFile(path).empty()) << "worker 0 saved no parameters in " << path;
  EXPECT_EQ(ReadWholeFile(path), ReadWholeFile(one_host_path))
      << "the same job on one host ended with other parameters";
}

// The same four workers placed round-robin (workers 0 and 2 on host 0, 1 and 3 on host 1, as
// mpirun --map-by node or srun --distribution=cyclic place them): the ring visits each host's
// workers together (order 0, 2, 1, 3), so that two of its four hops still use shared memory.
TEST_F(MultiHostTest, RoundRobinPlacementIsRingedHostByHost) {
  auto coordinator = StartOn(0, "coordinator", "coordinator/tessera-coordinator",
                             {"--coordinator", EmulatedHosts::Address(0) + ":0",
                              "--num-servers", "0", "--num-workers", "4"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(harness_.WaitReady(*coordinator, Deadline::AfterMillis(30000)).ok());
  const std::string address =
      harness_.process(*coordinator).address.substr(std::string("tcp://").size());
  // A host's two workers from one shell, so that they share the host's /dev/shm; it exits 0
  // when both did.
  std::vector<int> hosts;
  for (int host = 0; host < 2; ++host) {
    std::string script;
    for (int rank = host; rank < 4; rank += 2) {
      script += "\"$0\" --mode allreduce --coordinator " + address +
                " --num-servers 0 --num-workers 4 --log-level info --rank " +
                std::to_string(rank);
      for (const std::string& flag : kJob) script += " " + flag;
      script += " & p" + std::to_string(rank) + "=$!; ";
    }
    script += "wait $p" + std::to_string(host) + " && wait $p" + std::to_string(host + 2);
    auto started = harness_.StartCommand(
        "host " + std::to_string(host),
        hosts_->Command(host, {"/bin/sh", "-c", script, BinaryPath("worker/tessera-worker")}));
    ASSERT_TRUE(started.ok()) << started.status();
    hosts.push_back(*started);
  }
  for (int id : hosts) {
    auto exit = harness_.WaitExit(id, Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(exit->status, 0) << harness_.Output(id);
  }
  const std::string hops = "chosen by auto per hop (0->2 shm, 2->1 links, 1->3 shm, 3->0 links)";
  const std::string order = "; ring order 0, 2, 1, 3 (each host's ranks next to each other)";
  for (int rank = 0; rank < 4; ++rank) {
    const std::string out = harness_.Output(hosts[rank % 2]);
    const size_t line = out.find("worker " + std::to_string(rank) + " | ring channel: ");
    ASSERT_NE(line, std::string::npos) << out;
    const std::string text = out.substr(line, out.find('\n', line) - line);
    EXPECT_NE(text.find(hops), std::string::npos) << text;
    EXPECT_NE(text.find(order), std::string::npos) << text;
  }
}

TEST_F(MultiHostTest, ALoopbackAddressFromAnotherHostIsRefusedNamingTheFix) {
  auto job = StartAcrossHosts("allreduce", 0, {},
                              {kJob, Concat(kJob, {"--bind-host", "127.0.0.1"})});
  ASSERT_TRUE(job.ok()) << job.status();
  auto exit = harness_.WaitExit(job->workers[1], Deadline::AfterMillis(kRunMs));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_NE(exit->status, 0);
  const std::string out = harness_.Output(job->workers[1]);
  EXPECT_NE(out.find("connected from 10.77.0.2 advertising tcp://127.0.0.1:"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--bind-host auto"), std::string::npos) << out;
  EXPECT_NE(out.find("--bind-host 10.77.0.2"), std::string::npos) << out;
  EXPECT_NE(harness_.Output(job->coordinator).find("advertising tcp://127.0.0.1:"),
            std::string::npos);
}

TEST_F(MultiHostTest, AnInterfaceNameOrEveryInterfaceAdvertisesTheHostsAddress) {
  const std::string path = TempPath("ifname-across.params");
  auto job = StartAcrossHosts("ps-sync", 2, {{"--bind-host", "0.0.0.0"}, {"--bind-host", "eth0"}},
                              {Concat(kJob, {"--save-params", path}), kJob},
                              {"TESSERA_SOCKET_IFNAME=eth0"});
  ASSERT_TRUE(job.ok()) << job.status();
  ExpectWorkersSucceed(*job);
  EXPECT_EQ(harness_.process(job->servers[0]).address.rfind("tcp://10.77.0.1:", 0), 0u)
      << harness_.process(job->servers[0]).address;
  EXPECT_EQ(harness_.process(job->servers[0]).metrics_url.rfind("http://10.77.0.1:", 0), 0u)
      << harness_.process(job->servers[0]).metrics_url;
  EXPECT_EQ(harness_.process(job->servers[1]).address.rfind("tcp://10.77.0.2:", 0), 0u)
      << harness_.process(job->servers[1]).address;
  EXPECT_NE(harness_.Output(job->workers[1]).find("--bind-host eth0: listening on 10.77.0.2"),
            std::string::npos)
      << harness_.Output(job->workers[1]);
  EXPECT_EQ(ReadWholeFile(path), OneHostParameters("ps-sync", 2, "ifname"));
}

TEST_F(MultiHostTest, ServiceDiscoveryAndMetricsAreReachableFromTheOtherHost) {
  // Workers linger after training, so that every process still serves /metrics.
  auto job = StartAcrossHosts("ps-sync", 2, {},
                              {Concat(kJob, {"--linger", "60"}), Concat(kJob, {"--linger", "60"})});
  ASSERT_TRUE(job.ok()) << job.status();
  for (int id : job->workers) {
    ASSERT_TRUE(harness_.WaitForLine(id, "trained", Deadline::AfterMillis(kRunMs)).ok())
        << harness_.Output(id);
  }
  const std::string metrics = harness_.process(job->coordinator).metrics_url;
  ASSERT_EQ(metrics.rfind("http://10.77.0.1:", 0), 0u) << metrics;
  const std::string sd = metrics.substr(0, metrics.rfind('/')) + "/sd";
  std::vector<std::string> targets;
  ASSERT_TRUE(hosts_
                  ->RunInHost(1, [&] {
                    StatusOr<HttpResult> listed = HttpGet(sd, 5000);
                    ASSERT_TRUE(listed.ok()) << listed.status();
                    ASSERT_EQ(listed->status, 200) << listed->body;
                    nlohmann::json groups = nlohmann::json::parse(listed->body, nullptr, false);
                    for (const nlohmann::json& group : groups) {
                      for (const nlohmann::json& target : group.value("targets", nlohmann::json::array())) {
                        targets.push_back(target.get<std::string>());
                      }
                    }
                    for (const std::string& target : targets) {
                      StatusOr<HttpResult> page = HttpGet("http://" + target + "/metrics", 5000);
                      ASSERT_TRUE(page.ok()) << target << ": " << page.status();
                      EXPECT_EQ(page->status, 200) << target;
                      EXPECT_NE(page->body.find("tessera_build_info"), std::string::npos);
                    }
                  })
                  .ok());
  EXPECT_EQ(targets.size(), 5u) << "the coordinator, 2 servers and 2 workers";
}

// A server that dies on another host (issue 16): the coordinator checks the pids of its own
// host only and the heartbeat limit is 60 s here, so only the dead process's closed connection
// can tell (its kernel closes it, and its port then refuses the coordinator's reconnection:
// Transport::Watch). Host 1 has a host name of its own. ps-sync, --replicas 2: the job goes on
// with the other copies at once and ends with the parameters of the same job undisturbed.
TEST_F(MultiHostTest, AServerDyingOnAnotherHostIsSeenByItsClosedConnectionAtOnce) {
  const std::vector<std::string> training = {
      "--optimizer", "momentum", "--lr", "0.1", "--device", "cpu", "--train-samples", "1280",
      "--batch-size", "16", "--ps-chunk-elements", "100", "--seed", "3", "--log-every", "10",
      "--steps", "300", "--hidden", "32,16", "--input-dim", "16", "--classes", "4"};
  const std::vector<std::string> slow_heartbeats = {"--heartbeat-timeout-ms", "60000"};
  const std::string path = TempPath("server-killed-across.params");
  auto coordinator = StartOn(0, "coordinator", "coordinator/tessera-coordinator",
                             Concat({"--coordinator", EmulatedHosts::Address(0) + ":0",
                                     "--num-servers", "3", "--num-workers", "2", "--replicas",
                                     "2"},
                                    slow_heartbeats));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(harness_.WaitReady(*coordinator, Deadline::AfterMillis(30000)).ok())
      << harness_.Output(*coordinator);
  const std::string address =
      harness_.process(*coordinator).address.substr(std::string("tcp://").size());
  std::vector<int> servers, workers;
  for (int s = 0; s < 3; ++s) {
    const int host = s == 1 ? 1 : 0;
    auto server = StartOn(host, "server " + std::to_string(s), "server/ps/tessera-server",
                          Concat({"--coordinator", address, "--num-servers", "3",
                                  "--num-workers", "2", "--rank", std::to_string(s)},
                                 slow_heartbeats),
                          {}, /*own_hostname=*/host == 1);
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(*server);
  }
  for (int r = 0; r < 2; ++r) {
    auto worker = StartOn(r, "worker " + std::to_string(r), "worker/tessera-worker",
                          Concat(Concat({"--mode", "ps-sync", "--coordinator", address,
                                         "--num-servers", "3", "--num-workers", "2", "--rank",
                                         std::to_string(r)},
                                        Concat(training, slow_heartbeats)),
                                 r == 0 ? std::vector<std::string>{"--save-params", path}
                                        : std::vector<std::string>{}),
                          {}, /*own_hostname=*/r == 1);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*worker);
  }
  ASSERT_TRUE(harness_.WaitForLine(workers[0], "step 100/", Deadline::AfterMillis(kRunMs)).ok())
      << harness_.Output(workers[0]);
  const int64_t pid = harness_.process(servers[1]).pid;
  ASSERT_GT(pid, 0);
  const SteadyClock::time_point killed = SteadyClock::now();
  ASSERT_EQ(kill(static_cast<pid_t>(pid), SIGKILL), 0);
  ExpectWorkersSucceed(TwoWorkerJob{*coordinator, "", servers, workers});
  const std::string seen = "server 1 (" + harness_.process(servers[1]).address +
                           ", pid " + std::to_string(pid) + ") failed: its connection closed and " +
                           harness_.process(servers[1]).address +
                           " refuses connections (on " + EmulatedHosts::HostName(1) + ")";
  StatusOr<SteadyClock::time_point> told = harness_.LineTime(*coordinator, seen);
  ASSERT_TRUE(told.ok()) << told.status() << "\n" << harness_.Output(*coordinator);
  // At once: a reconnection is refused within a round trip (the heartbeats would take 60 s).
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(*told - killed).count(), 5000);
  for (int id : workers) {
    EXPECT_NE(harness_.Output(id).find("server 1 failed (its connection closed"),
              std::string::npos)
        << harness_.Output(id);
  }
  // The same job on one host, undisturbed and with one copy of each range.
  FleetHarness undisturbed;
  const std::string reference = TempPath("server-killed-reference.params");
  auto job = StartTwoWorkerJob(undisturbed, "ps-sync", 3, {},
                               {Concat(training, {"--save-params", reference}), training});
  ASSERT_TRUE(job.ok()) << job.status();
  for (int id : job->workers) {
    auto exit = undisturbed.WaitExit(id, Deadline::AfterMillis(kRunMs));
    ASSERT_TRUE(exit.ok() && exit->status == 0) << undisturbed.Output(id);
  }
  undisturbed.StopAll();
  const std::string params = ReadWholeFile(path);
  EXPECT_FALSE(params.empty());
  EXPECT_TRUE(params == ReadWholeFile(reference))
      << "the job that lost server 1 ended with other parameters than the undisturbed one";
}

}  // namespace
}  // namespace tessera::testing
