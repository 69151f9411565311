// Security of a live job (issue 15): a foreign process without the job's key is refused at every
// port and counted, and the job trains to the same parameters as an undisturbed one; the key
// appears nowhere a user or another process can look.
#include <dirent.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "common/security/job_key.h"
#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kStartMs = 30000;
constexpr int64_t kJobMs = 120000;
constexpr char kPython[] = "/usr/bin/python3";
constexpr int kAttackedSteps = 8000;

// A small ps-sync job; with kAttackedSteps it trains for a few seconds, while the foreign
// clients work.
const std::vector<std::string> kJob = {"--batch-size", "8",  "--hidden",        "16",
                                       "--input-dim",  "8",  "--classes",       "4",
                                       "--train-samples", "256", "--device",    "cpu",
                                       "--seed",       "5"};

struct Fleet {
  int coordinator = -1;
  std::string address;  // HOST:PORT
  int server = -1;
  std::vector<int> workers;
};

// A coordinator, ready, and one server (which announces itself once the workers are there).
Fleet StartServers(FleetHarness& harness) {
  Fleet fleet;
  auto coordinator = harness.Start("coordinator", "coordinator/tessera-coordinator",
                                   {"--num-servers", "1", "--num-workers", "2"});
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  fleet.coordinator = *coordinator;
  EXPECT_TRUE(harness.WaitReady(fleet.coordinator, Deadline::AfterMillis(kStartMs)).ok());
  fleet.address = harness.process(fleet.coordinator).address.substr(6);
  auto server = harness.Start("server 0", "server/ps/tessera-server",
                              {"--coordinator", fleet.address, "--num-servers", "1",
                               "--num-workers", "2", "--rank", "0"});
  EXPECT_TRUE(server.ok()) << server.status();
  fleet.server = *server;
  return fleet;
}

void StartWorkers(FleetHarness& harness, Fleet* fleet, const std::string& params, int steps,
                  const std::vector<std::string>& extra = {}) {
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> flags = {"--mode", "ps-sync", "--coordinator", fleet->address,
                                      "--num-servers", "1", "--num-workers", "2", "--rank",
                                      std::to_string(r)};
    flags = Concat(Concat(Concat(flags, kJob), {"--steps", std::to_string(steps)}), extra);
    if (r == 0) flags = Concat(flags, {"--save-params", params});
    auto id = harness.Start("worker " + std::to_string(r), "worker/tessera-worker", flags);
    ASSERT_TRUE(id.ok()) << id.status();
    fleet->workers.push_back(*id);
  }
}

void ExpectWorkersSucceed(FleetHarness& harness, const Fleet& fleet) {
  for (int id : fleet.workers) {
    auto exit = harness.WaitExit(id, Deadline::AfterMillis(kJobMs));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->success()) << harness.Output(id);
  }
}

// The foreign client's run against `targets`: its JSON lines' attempts.
int StartForeignClient(FleetHarness& harness, const std::vector<std::string>& targets,
                       const std::string& label) {
  std::vector<std::string> argv = {kPython, BinaryPath("tests/foreign_client.py"), "--key-file",
                                   TestJobKeyFile()};
  for (const std::string& target : targets) argv = Concat(argv, {"--target", target});
  auto id = harness.StartCommand(label, argv);
  EXPECT_TRUE(id.ok()) << id.status();
  return *id;
}

// Checks every attempt the foreign client `id` made was refused; returns how many it made.
int ExpectEveryAttemptRefused(FleetHarness& harness, int id) {
  auto exit = harness.WaitExit(id, Deadline::AfterMillis(kJobMs));
  EXPECT_TRUE(exit.ok() && exit->success()) << harness.Output(id);
  int attempts = 0;
  for (const std::string& line : harness.process(id).lines) {
    if (line.empty() || line[0] != '{') continue;
    ++attempts;
    const bool original = line.find("\"replay_original\"") != std::string::npos;
    if (original) {
      // The legitimate connection whose token is then replayed: it must have been admitted,
      // or the replay below proves nothing.
      EXPECT_NE(line.find("\"handshake\": \"succeeded\""), std::string::npos)
          << line << "\n" << harness.Output(id);
      continue;
    }
    EXPECT_EQ(line.find("\"handshake\": \"succeeded\""), std::string::npos) << line;
    EXPECT_NE(line.find("\"replied\": false"), std::string::npos) << line;
  }
  return attempts;
}

double Counter(const std::string& metrics_url, const std::string& sample) {
  auto page = HttpGet(metrics_url, 5000);
  if (!page.ok()) return -1;
  size_t at = page->body.find(sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(page->body.substr(at + sample.size() + 1));
}

TEST(SecurityTest, AForeignClientIsRefusedEverywhereAndTheJobTrainsAsUndisturbed) {
  const std::string undisturbed = TempPath("undisturbed.params");
  {
    FleetHarness harness;
    Fleet fleet = StartServers(harness);
    StartWorkers(harness, &fleet, undisturbed, kAttackedSteps);
    ExpectWorkersSucceed(harness, fleet);
  }
  const std::string attacked = TempPath("attacked.params");
  FleetHarness harness;
  Fleet fleet = StartServers(harness);
  // During the rendezvous (a foreign worker would take a rank)...
  int before = StartForeignClient(harness, {"tcp://" + fleet.address}, "foreign client (rendezvous)");
  EXPECT_EQ(ExpectEveryAttemptRefused(harness, before), 7);
  // ...and during training, against the server, the workers and the coordinator. The workers
  // linger after training (still members, still listening) until the clients are done: a job
  // that finishes first, as it may on a busy machine, would leave them nothing to reach.
  StartWorkers(harness, &fleet, attacked, kAttackedSteps, {"--linger", "120"});
  for (int id : {fleet.server, fleet.workers[0], fleet.workers[1]}) {
    ASSERT_TRUE(harness.WaitReady(id, Deadline::AfterMillis(kStartMs)).ok());
  }
  // One client per process, at once, so that all of them work while the job trains.
  std::vector<int> training;
  for (int id : {fleet.server, fleet.workers[0], fleet.workers[1], fleet.coordinator}) {
    training.push_back(StartForeignClient(harness, {harness.process(id).address},
                                          "foreign client at " + harness.process(id).label));
  }
  for (int client : training) {
    EXPECT_EQ(ExpectEveryAttemptRefused(harness, client), 7);
    // Every attempt reached a live process.
    EXPECT_EQ(harness.Output(client).find("unreachable"), std::string::npos)
        << "a process had exited before the foreign client was done";
  }
  // Once they have trained (slowly, under the sanitizers), the lingering workers may go.
  for (int worker : fleet.workers) {
    ASSERT_TRUE(harness.WaitForLine(worker, "finished; lingering", Deadline::AfterMillis(kJobMs))
                    .ok())
        << harness.Output(worker);
    ASSERT_TRUE(harness.Signal(worker, SIGTERM).ok());
  }
  ExpectWorkersSucceed(harness, fleet);

  EXPECT_EQ(ReadWholeFile(attacked), ReadWholeFile(undisturbed))
      << "the foreign client changed the job's parameters";
  ASSERT_FALSE(ReadWholeFile(attacked).empty());
  // Every kind of refusal was counted where it happened.
  for (int id : {fleet.coordinator, fleet.server}) {
    const std::string& url = harness.process(id).metrics_url;
    for (const char* reason : {"wrong_key", "malformed", "replayed", "protocol"}) {
      EXPECT_GE(Counter(url, std::string("tessera_auth_failures_total{reason=\"") + reason + "\"}"),
                1)
          << harness.process(id).label << " " << reason;
    }
  }
}

// Every process's command line, as `ps` shows them.
std::string CommandLines() {
  std::string all;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return all;
  while (dirent* entry = readdir(proc)) {
    std::ifstream in(std::string("/proc/") + entry->d_name + "/cmdline", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    all += text.str() + "\n";
  }
  closedir(proc);
  return all;
}

TEST(SecurityTest, TheKeyAppearsNowhereALookCanReach) {
  StatusOr<JobKey> key = ReadKeyFile(TestJobKeyFile());
  ASSERT_TRUE(key.ok()) << key.status();
  const std::string text = key->Serialize();
  const std::string hex = text.substr(text.find(' ') + 1, 64);
  const std::string raw(reinterpret_cast<const char*>(key->bytes().data()), key->bytes().size());
  auto expect_absent = [&](const std::string& where, const std::string& what) {
    EXPECT_EQ(what.find(hex), std::string::npos) << "the key's hex digits in " << where;
    EXPECT_EQ(what.find(hex.substr(0, 16)), std::string::npos) << "part of the key in " << where;
    EXPECT_EQ(what.find(raw), std::string::npos) << "the key's bytes in " << where;
  };

  FleetHarness harness;
  Fleet fleet = StartServers(harness);
  // The workers linger after training, so that every page can be fetched.
  StartWorkers(harness, &fleet, TempPath("nowhere.params"), 20, {"--linger", "60"});
  for (int id : fleet.workers) {
    ASSERT_TRUE(harness.WaitForLine(id, "lingering", Deadline::AfterMillis(kJobMs)).ok())
        << harness.Output(id);
  }
  expect_absent("the processes' command lines", CommandLines());
  const std::string& metrics = harness.process(fleet.coordinator).metrics_url;
  const std::string base = metrics.substr(0, metrics.rfind("/metrics"));
  for (const char* path : {"/metrics", "/sd", "/dashboard", "/dashboard/data"}) {
    auto page = HttpGet(base + path, 5000);
    ASSERT_TRUE(page.ok()) << path << ": " << page.status();
    expect_absent(std::string("the coordinator's ") + path, page->body);
  }
  for (int id : {fleet.server, fleet.workers[0], fleet.workers[1]}) {
    auto page = HttpGet(harness.process(id).metrics_url, 5000);
    ASSERT_TRUE(page.ok()) << page.status();
    expect_absent(harness.process(id).label + "'s /metrics", page->body);
  }
  for (int id : fleet.workers) {
    ASSERT_TRUE(harness.Signal(id, SIGTERM).ok());
    ASSERT_TRUE(harness.WaitExit(id, Deadline::AfterMillis(kJobMs)).ok());
  }
  for (int id : {fleet.coordinator, fleet.server, fleet.workers[0], fleet.workers[1]}) {
    expect_absent(harness.process(id).label + "'s output", harness.Output(id));
  }
}

// Two launchers, as on two nodes, listening on the loopback's other addresses: with --encrypt on
// every connection (ZeroMQ and ring links) is encrypted, and the job trains to bitwise the
// parameters of the same job unencrypted.
std::string TwoNodeJob(const std::string& mode, const std::string& encrypt) {
  FleetHarness harness;
  const std::string params = TempPath("two-nodes-" + mode + "-" + encrypt + ".params");
  const std::vector<std::string> job = {"--steps", "20", "--batch-size", "16", "--hidden", "32",
                                        "--input-dim", "16", "--classes", "4", "--device",
                                        "cpu", "--train-samples", "1280", "--seed", "3",
                                        "--ring-transport", "links"};
  const std::vector<std::string> node = {"--nnodes", "2", "--nproc-per-node", "2", "--mode",
                                         mode, "--encrypt", encrypt};
  auto node0 = harness.Start(
      "node 0", "tools/tessera-launch",
      Concat(Concat(node, {"--node-rank", "0", "--coordinator", "127.0.0.2:0", "--bind-host",
                           "127.0.0.2", "--servers", mode == "ps-sync" ? "2" : "0", "--"}),
             Concat(job, {"--save-params", params})));
  EXPECT_TRUE(node0.ok()) << node0.status();
  if (!node0.ok()) return "";
  EXPECT_TRUE(harness
                  .WaitForLine(*node0, "[launch] coordinator address",
                               Deadline::AfterMillis(kStartMs))
                  .ok())
      << harness.Output(*node0);
  std::smatch match;
  const std::string out0 = harness.Output(*node0);
  if (!std::regex_search(out0, match, std::regex(R"(coordinator address tcp://(\S+))"))) return "";
  auto node1 = harness.Start("node 1", "tools/tessera-launch",
                             Concat(Concat(node, {"--node-rank", "1", "--coordinator",
                                                  std::string(match[1]), "--bind-host",
                                                  "127.0.0.3", "--"}),
                                    job));
  EXPECT_TRUE(node1.ok()) << node1.status();
  for (int id : {*node1, *node0}) {
    auto exit = harness.WaitExit(id, Deadline::AfterMillis(kJobMs));
    EXPECT_TRUE(exit.ok() && exit->success()) << harness.Output(id);
  }
  const bool encrypted = encrypt == "on";
  for (int id : {*node0, *node1}) {
    const std::string out = harness.Output(id);
    // Every process says it encrypts, and what listens off the loopback is not warned about.
    EXPECT_EQ(out.find("and encrypted") != std::string::npos, encrypted) << out;
  }
  return ReadWholeFile(params);
}

TEST(SecurityTest, TwoNodesOnOtherLoopbackAddressesEncryptAndTrainAsUnencrypted) {
  for (const std::string mode : {"allreduce", "ps-sync"}) {
    const std::string plain = TwoNodeJob(mode, "off");
    ASSERT_FALSE(plain.empty()) << mode;
    EXPECT_TRUE(TwoNodeJob(mode, "on") == plain)
        << mode << ": the encrypted job's parameters differ from the unencrypted one's";
  }
}

}  // namespace
}  // namespace tessera::testing
