// Real processes on loopback: the coordinator, servers and workers as built, talking ZeroMQ.
#include <signal.h>

#include <gtest/gtest.h>

#include <zmq.hpp>

#include "common/security/connect_token.h"
#include "common/security/job_key.h"
#include "common/training/ps_job.h"
#include "common/wire/wire_codec.h"
#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kStartMs = 30000;
constexpr int64_t kJobMs = 60000;

// A worker job that runs until killed: all-reduce rounds every 20 ms for over half an hour.
const std::vector<std::string> kLongJob = {"--rounds", "100000", "--round-interval-ms", "20"};

// Flags that keep failure detection fast in tests: heartbeats every 100 ms, failure after 1 s.
std::vector<std::string> FastFailureFlags() {
  return {"--heartbeat-interval-ms", "100", "--heartbeat-timeout-ms", "1000"};
}

struct FleetIds {
  std::string coordinator;
  std::vector<int> servers;
  std::vector<int> workers;
};

// Starts a coordinator, `servers` servers and `workers` workers with `common` flags on all and
// `worker_flags` on workers; waits for every process to be ready.
FleetIds StartFleet(FleetHarness& fleet, int servers, int workers,
                    const std::vector<std::string>& common,
                    const std::vector<std::string>& worker_flags = {}) {
  FleetIds ids;
  std::vector<std::string> sizes = {"--num-servers", std::to_string(servers), "--num-workers",
                                    std::to_string(workers)};
  auto coordinator = fleet.StartCoordinator(Concat(sizes, common));
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return ids;
  ids.coordinator = *coordinator;
  std::vector<std::string> join = Concat(Concat(sizes, common), {"--coordinator", ids.coordinator});
  for (int r = 0; r < servers; ++r) {
    auto id = fleet.Start("server " + std::to_string(r), "server/ps/tessera-server",
                          Concat(join, {"--rank", std::to_string(r)}));
    EXPECT_TRUE(id.ok()) << id.status();
    ids.servers.push_back(*id);
  }
  for (int r = 0; r < workers; ++r) {
    auto id = fleet.Start("worker " + std::to_string(r), "worker/tessera-worker",
                          Concat(Concat(join, Concat({"--mode", "smoke"}, worker_flags)),
                                 {"--rank", std::to_string(r)}));
    EXPECT_TRUE(id.ok()) << id.status();
    ids.workers.push_back(*id);
  }
  for (int id : ids.servers) EXPECT_TRUE(fleet.WaitReady(id, Deadline::AfterMillis(kStartMs)).ok());
  for (int id : ids.workers) {
    Status ready = fleet.WaitReady(id, Deadline::AfterMillis(kStartMs));
    EXPECT_TRUE(ready.ok()) << ready;
  }
  return ids;
}

TEST(FleetTest, FleetRegistersExchangesTensorsAndFinishes) {
  FleetHarness fleet;
  FleetIds ids = StartFleet(fleet, 2, 3, {});
  for (int id : ids.workers) {
    auto exit = fleet.WaitExit(id, Deadline::AfterMillis(kJobMs));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->success()) << fleet.process(id).label << " " << exit->Describe() << "\n"
                                 << fleet.Output(id);
  }
  EXPECT_NE(fleet.Output(0).find("fleet complete"), std::string::npos) << fleet.Output(0);
  fleet.StopAll();
}

TEST(FleetTest, ProcessThatNeverArrivesIsNamedByEveryone) {
  FleetHarness fleet;
  // Long enough for the three that come to register first even on a loaded machine; the test
  // checks that they did, or the coordinator would rightly name them as missing too. Under
  // ThreadSanitizer beside ps_replication_test's processes none of the three had registered
  // after 6 s.
  const std::string timeout_ms = UnderSanitizer() ? "20000" : "6000";
  auto coordinator = fleet.StartCoordinator(
      {"--num-servers", "1", "--num-workers", "3", "--rendezvous-timeout-ms", timeout_ms});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::string> join = {"--coordinator", *coordinator, "--num-servers", "1",
                                   "--num-workers", "3", "--rendezvous-timeout-ms", timeout_ms};
  std::vector<int> started;
  started.push_back(*fleet.Start("server 0", "server/ps/tessera-server", Concat(join, {"--rank", "0"})));
  for (int r : {0, 2}) {  // worker 1 never comes
    started.push_back(*fleet.Start("worker " + std::to_string(r), "worker/tessera-worker",
                                   Concat(join, {"--mode", "smoke", "--rank", std::to_string(r)})));
  }
  for (const char* member : {"server 0 registered", "worker 0 registered", "worker 2 registered"}) {
    ASSERT_TRUE(fleet.WaitForLine(0, member, Deadline::AfterMillis(kJobMs)).ok())
        << fleet.Output(0);
  }
  for (int id : started) {
    auto exit = fleet.WaitExit(id, Deadline::AfterMillis(kJobMs));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_FALSE(exit->success()) << fleet.Output(id);
    EXPECT_NE(fleet.Output(id).find("missing worker 1 "), std::string::npos) << fleet.Output(id);
  }
  auto coordinator_exit = fleet.WaitExit(0, Deadline::AfterMillis(kJobMs));
  ASSERT_TRUE(coordinator_exit.ok());
  EXPECT_FALSE(coordinator_exit->success());
  EXPECT_NE(fleet.Output(0).find("missing worker 1 "), std::string::npos) << fleet.Output(0);
}

TEST(FleetTest, KilledWorkerIsReportedToEveryOtherProcessByRoleAndRank) {
  FleetHarness fleet;
  FleetIds ids = StartFleet(fleet, 1, 3, FastFailureFlags(), kLongJob);
  ASSERT_EQ(ids.workers.size(), 3u);
  // Kill it in the middle of the job, between all-reduce rounds.
  for (int id : ids.workers) {
    ASSERT_TRUE(fleet.WaitForLine(id, "all-reduce round 10 of", Deadline::AfterMillis(kJobMs)).ok())
        << fleet.Output(id);
  }
  ASSERT_TRUE(fleet.Signal(ids.workers[1], SIGKILL).ok());
  auto killed_at = SteadyClock::now();
  for (int id : {ids.workers[0], ids.workers[2]}) {
    // Survivors fail within twice the heartbeat timeout (+ scheduling slack), naming it.
    auto exit = fleet.WaitExit(id, Deadline::AfterMillis(2 * 1000 + 3000));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_FALSE(exit->success());
    EXPECT_NE(fleet.Output(id).find("worker 1"), std::string::npos) << fleet.Output(id);
    EXPECT_NE(fleet.Output(id).find("failed"), std::string::npos) << fleet.Output(id);
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - killed_at);
  EXPECT_LT(waited.count(), 5000);
  // The server stays up (it outlives jobs) but was told too.
  ASSERT_TRUE(fleet.WaitForLine(ids.servers[0], "worker 1", Deadline::AfterMillis(5000)).ok())
      << fleet.Output(ids.servers[0]);
  EXPECT_NE(fleet.Output(0).find("worker 1"), std::string::npos);
  fleet.StopAll();
}

TEST(FleetTest, KilledServerIsReportedToWorkers) {
  FleetHarness fleet;
  FleetIds ids = StartFleet(fleet, 2, 2, FastFailureFlags(), kLongJob);
  for (int id : ids.workers) {
    ASSERT_TRUE(fleet.WaitForLine(id, "all-reduce round 10 of", Deadline::AfterMillis(kJobMs)).ok())
        << fleet.Output(id);
  }
  ASSERT_TRUE(fleet.Signal(ids.servers[1], SIGKILL).ok());
  for (int id : ids.workers) {
    auto exit = fleet.WaitExit(id, Deadline::AfterMillis(2 * 1000 + 3000));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_FALSE(exit->success());
    EXPECT_NE(fleet.Output(id).find("server 1"), std::string::npos) << fleet.Output(id);
  }
  fleet.StopAll();
}

TEST(FleetTest, EveryMetricsEndpointPassesPromtool) {
  FleetHarness fleet;
  FleetIds ids = StartFleet(fleet, 1, 1, {}, {"--linger", "60"});
  ASSERT_TRUE(fleet.WaitForLine(ids.workers[0], "lingering", Deadline::AfterMillis(kJobMs)).ok());
  for (int id : {0, ids.servers[0], ids.workers[0]}) {
    const std::string& url = fleet.process(id).metrics_url;
    auto response = HttpGet(url, 10000);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200);
    EXPECT_NE(response->body.find("tessera_build_info"), std::string::npos);
    auto check = RunWithInput("/usr/bin/promtool check metrics", response->body);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_EQ(check->first, 0) << url << ": " << check->second;
    EXPECT_EQ(check->second, "") << url;
  }
  auto coordinator_metrics = HttpGet(fleet.process(0).metrics_url, 10000);
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_NE(coordinator_metrics->body.find("tessera_fleet_members{role=\"worker\",state=\"alive\"} 1"),
            std::string::npos)
      << coordinator_metrics->body;
  fleet.StopAll();
}

// What a confused or hostile client sees from a real server process.
TEST(FleetTest, ServerAnswersGarbageWithErrorsAndKeepsServing) {
  FleetHarness fleet;
  FleetIds ids = StartFleet(fleet, 1, 1, {}, {"--linger", "60"});
  ASSERT_TRUE(fleet.WaitForLine(ids.workers[0], "lingering", Deadline::AfterMillis(kJobMs)).ok());
  const std::string& server = fleet.process(ids.servers[0]).address;

  // A member of the job (it holds the key) that sends garbage once admitted.
  StatusOr<JobKey> key = ReadKeyFile(TestJobKeyFile());
  ASSERT_TRUE(key.ok()) << key.status();
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 10000);
  socket.set(zmq::sockopt::plain_username, "tessera");
  socket.set(zmq::sockopt::plain_password, MakeConnectToken(*key, WallClockMs()));
  socket.connect(server);
  auto send = [&](const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m(frames[i].data(), frames[i].size());
      socket.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  };
  auto send_message = [&](const MessageHeader& header, MessageBody body) {
    Message message = EncodeMessage(header, std::move(body));
    std::vector<std::string> frames = {
        std::string(reinterpret_cast<const char*>(message.header.data()), message.header.size())};
    for (const Payload& p : message.payloads) {
      frames.emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
    }
    send(frames);
  };
  auto receive = [&]() -> StatusOr<DecodedMessage> {
    Message message;
    bool more = true, first = true;
    while (more) {
      zmq::message_t m;
      if (!socket.recv(m)) return DeadlineExceededError("no reply from the server in 10 s");
      more = m.more();
      Payload p = Payload::Copy(m.data(), m.size());  // copies: aligned for DecodeMessage
      if (first) message.header = p; else message.payloads.push_back(p);
      first = false;
    }
    DecodeResult decoded = DecodeMessage(message, 1 << 30);
    if (!decoded.status.ok()) return decoded.status;
    return std::move(decoded.message).value();
  };
  auto error_of = [](const DecodedMessage& reply) {
    const auto* error = std::get_if<ErrorReply>(&reply.body);
    return error == nullptr ? OkStatus() : StatusOf(*error);
  };

  for (std::string garbage : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string(3, '\0'),
                              std::string(1000, '\xff')}) {
    send({garbage});
    auto reply = receive();
    ASSERT_TRUE(reply.ok()) << reply.status();
    Status error = error_of(*reply);
    EXPECT_EQ(error.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(error.message().find("not a valid tessera.proto.Header"), std::string::npos) << error;
  }

  // A correct request on the same connection: pull the probe worker 0 pushed (chunk 0 of the
  // smoke job's ps-async probe job, key 0 on server 0; the job token names the job's workers:
  // rank, pid and address).
  FleetView view;
  view.members.push_back({Role::kWorker, 0, fleet.process(ids.workers[0]).address, "", "",
                          fleet.process(ids.workers[0]).pid});
  PsPushPullRequest pull{{}, false, PsJobToken(view), {}};
  pull.tensors.push_back(TensorData{"worker0.probe", 0, DataType::kFloat32, {1024}, Payload()});
  MessageHeader header;
  header.sender_role = Role::kWorker;
  header.sender_rank = 0;
  header.request_id = 77;
  header.step = 1;
  send_message(header, std::move(pull));
  auto reply = receive();
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(error_of(*reply).ok()) << error_of(*reply);
  EXPECT_EQ(reply->header.request_id, 77u);
  const auto* values = std::get_if<PsPushPullReply>(&reply->body);
  ASSERT_NE(values, nullptr);
  ASSERT_EQ(values->tensors.size(), 1u);
  std::vector<float> probe = values->tensors[0].Read<float>();
  ASSERT_EQ(probe.size(), 1024u);
  EXPECT_EQ(probe[0], 0.0f);  // worker r's probe holds r*1000 + i
  EXPECT_EQ(probe[5], 5.0f);

  auto metrics = HttpGet(fleet.process(ids.servers[0]).metrics_url, 10000);
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("tessera_bad_messages_total{reason=\"malformed_header\"} 3"),
            std::string::npos)
      << metrics->body;
  fleet.StopAll();
}

}  // namespace
}  // namespace tessera::testing
