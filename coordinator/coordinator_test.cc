// The coordinator and RendezvousClient together, in one process over loopback ZeroMQ.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "common/messages/rendezvous_messages.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::coordinator {
namespace {

struct Fleet {
  std::unique_ptr<RpcEndpoint> coordinator_endpoint;
  std::unique_ptr<Coordinator> coordinator;
  std::thread run_thread;
  std::atomic<bool> stop{false};
  std::promise<Status> result;

  Fleet(int servers, int workers, int64_t rendezvous_ms = 10000, int64_t heartbeat_ms = 1000,
        bool exit_when_workers_leave = false, int min_workers = 0) {
    ZmqTransportOptions transport;
    transport.role = Role::kCoordinator;
    coordinator_endpoint = std::move(StartZmqEndpoint(transport, nullptr)).value();
    CoordinatorOptions options;
    options.job = "test";
    options.num_servers = servers;
    options.num_workers = workers;
    options.key_space = 100;
    options.rendezvous_timeout_ms = rendezvous_ms;
    options.heartbeat_timeout_ms = heartbeat_ms;
    options.exit_when_workers_leave = exit_when_workers_leave;
    options.min_workers = min_workers;
    options.on_membership_change = [this](const MembershipChange& change) {
      std::lock_guard<std::mutex> lock(changes_mu);
      changes.push_back(change);
    };
    coordinator = std::move(Coordinator::Create(coordinator_endpoint.get(), options, &metrics)).value();
    run_thread = std::thread([this] { result.set_value(coordinator->Run([this] { return stop.load(); })); });
  }
  ~Fleet() {
    stop = true;
    run_thread.join();
  }
  RendezvousOptions Options(Role role, int rank, int64_t heartbeat_timeout_ms = 1000) {
    RendezvousOptions options;
    options.coordinator_address = coordinator_endpoint->address();
    options.role = role;
    options.requested_rank = rank;
    options.rendezvous_timeout_ms = 10000;
    options.heartbeat_interval_ms = 100;
    options.heartbeat_timeout_ms = heartbeat_timeout_ms;
    options.request_timeout_ms = 5000;
    if (role == Role::kWorker) options.num_workers = job_workers;
    if (role == Role::kWorker) options.handlers_follow = workers_handlers_follow;
    return options;
  }
  MetricsRegistry metrics;
  std::mutex changes_mu;
  std::vector<MembershipChange> changes;  // guarded by changes_mu
  int job_workers = 0;  // what workers register as their job's size
  bool workers_handlers_follow = false;  // RendezvousOptions::handlers_follow for workers
};

struct Process {
  std::unique_ptr<RpcEndpoint> endpoint;
  std::unique_ptr<RendezvousClient> client;
};

std::unique_ptr<RpcEndpoint> NewEndpoint() {
  return std::move(StartZmqEndpoint(ZmqTransportOptions(), nullptr)).value();
}

// Joins every (role, rank) concurrently; returns the processes or fails the test.
std::vector<Process> JoinAll(Fleet& fleet, const std::vector<std::pair<Role, int>>& who) {
  std::vector<Process> processes(who.size());
  std::vector<std::thread> threads;
  std::vector<Status> statuses(who.size());
  for (size_t i = 0; i < who.size(); ++i) {
    processes[i].endpoint = NewEndpoint();
    threads.emplace_back([&, i] {
      auto client = RendezvousClient::Join(processes[i].endpoint.get(),
                                           fleet.Options(who[i].first, who[i].second), nullptr);
      statuses[i] = client.status();
      if (client.ok()) processes[i].client = std::move(client).value();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  return processes;
}

TEST(CoordinatorTest, FleetRegistersAndEveryoneGetsTheSameView) {
  Fleet fleet(2, 3);
  auto processes = JoinAll(fleet, {{Role::kWorker, -1}, {Role::kServer, 1}, {Role::kWorker, -1},
                                   {Role::kServer, 0}, {Role::kWorker, -1}});
  std::set<int> worker_ranks;
  for (auto& p : processes) {
    ASSERT_NE(p.client, nullptr);
    const FleetView& view = p.client->view();
    EXPECT_EQ(view.members.size(), 5u);
    EXPECT_EQ(view.epoch, 1u);
    if (p.client->role() == Role::kWorker) worker_ranks.insert(p.client->rank());
  }
  EXPECT_EQ(worker_ranks, (std::set<int>{0, 1, 2}));
  const FleetView& view = processes[0].client->view();
  EXPECT_EQ(view.Find(Role::kServer, 0)->key_begin, 0u);
  EXPECT_EQ(view.Find(Role::kServer, 0)->key_end, 50u);
  EXPECT_EQ(view.Find(Role::kServer, 1)->key_end, 100u);
  EXPECT_EQ(processes[1].client->rank(), 1);  // the server that asked for rank 1
  for (auto& p : processes) p.client->Leave("test done");
}

// A coordinator's transport is up a little before its handlers (and under srun every node
// starts at once, so a worker can register in between): the worker asks again until the
// coordinator serves, instead of failing with "does not serve RegisterRequest requests".
TEST(CoordinatorTest, ARegistrationBeforeTheCoordinatorServesIsAnsweredOnceItDoes) {
  ZmqTransportOptions transport;
  transport.role = Role::kCoordinator;
  auto coordinator_endpoint = std::move(StartZmqEndpoint(transport, nullptr)).value();
  RendezvousOptions options;
  options.coordinator_address = coordinator_endpoint->address();
  options.requested_rank = 0;
  options.num_workers = 1;
  options.rendezvous_timeout_ms = 10000;
  auto endpoint = NewEndpoint();
  auto joined = std::async(std::launch::async, [&] {
    return RendezvousClient::Join(endpoint.get(), options, nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it was turned away by now
  CoordinatorOptions coordinator_options;
  coordinator_options.num_workers = 1;
  coordinator_options.key_space = 10;
  MetricsRegistry metrics;
  auto coordinator =
      std::move(Coordinator::Create(coordinator_endpoint.get(), coordinator_options, &metrics))
          .value();
  std::atomic<bool> stop{false};
  std::thread run([&] { (void)coordinator->Run([&] { return stop.load(); }); });
  auto client = joined.get();
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) (*client)->Leave("test done");
  stop = true;
  run.join();
}

// An address whose process never serves registration (not a coordinator) is named, after the
// few seconds a starting coordinator could take.
TEST(CoordinatorTest, AnAddressThatNeverServesRegistrationIsNamed) {
  auto not_a_coordinator = NewEndpoint();
  RendezvousOptions options;
  options.coordinator_address = not_a_coordinator->address();
  options.requested_rank = 0;
  options.num_workers = 1;
  auto endpoint = NewEndpoint();
  auto client = RendezvousClient::Join(endpoint.get(), options, nullptr);
  EXPECT_EQ(client.status().code(), StatusCode::kUnimplemented) << client.status();
  EXPECT_NE(client.status().message().find("is " + not_a_coordinator->address() +
                                           " a Tessera coordinator? it has not served "
                                           "registration for 5000 ms"),
            std::string::npos)
      << client.status();
  EXPECT_NE(client.status().message().find("does not serve RegisterRequest requests"),
            std::string::npos)
      << client.status();
}

TEST(CoordinatorTest, BarrierReleasesOnlyWhenEveryoneArrived) {
  Fleet fleet(0, 3);
  auto processes = JoinAll(fleet, {{Role::kWorker, 0}, {Role::kWorker, 1}, {Role::kWorker, 2}});
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(processes[i].client->Barrier("b", std::nullopt, 5000).ok());
      ++released;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(released.load(), 0);
  EXPECT_TRUE(processes[2].client->Barrier("b", std::nullopt, 5000).ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), 2);
  // The same name again is a new generation.
  std::vector<std::thread> again;
  for (auto& p : processes) {
    again.emplace_back([&p] { EXPECT_TRUE(p.client->Barrier("b", std::nullopt, 5000).ok()); });
  }
  for (auto& t : again) t.join();
}

TEST(CoordinatorTest, BarrierTimeoutNamesWhoIsMissing) {
  Fleet fleet(0, 3);
  auto processes = JoinAll(fleet, {{Role::kWorker, 0}, {Role::kWorker, 1}, {Role::kWorker, 2}});
  std::thread t([&] {
    Status s = processes[0].client->Barrier("sync", Role::kWorker, 300);
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("waiting for worker 1, worker 2"), std::string::npos) << s;
  });
  t.join();
}

TEST(CoordinatorTest, RendezvousTimeoutNamesTheMissingProcesses) {
  Fleet fleet(1, 2, /*rendezvous_ms=*/500);
  auto endpoint = NewEndpoint();
  auto client = RendezvousClient::Join(endpoint.get(), fleet.Options(Role::kWorker, 0), nullptr);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded) << client.status();
  EXPECT_NE(client.status().message().find("missing server 0, worker 1"), std::string::npos)
      << client.status();
  Status run = fleet.result.get_future().get();
  EXPECT_EQ(run.code(), StatusCode::kDeadlineExceeded);
}

// The fleet view's replicas (--replicas): 1 to the number of servers, or a clear refusal.
TEST(CoordinatorTest, MoreReplicasThanServersAreRefused) {
  auto endpoint = NewEndpoint();
  MetricsRegistry metrics;
  CoordinatorOptions options;
  options.num_servers = 2;
  options.replicas = 3;
  auto refused = Coordinator::Create(endpoint.get(), options, &metrics);
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--replicas=3 must be between 1 and "
                                            "--num-servers=2"),
            std::string::npos)
      << refused.status();
  options.replicas = 2;
  EXPECT_TRUE(Coordinator::Create(endpoint.get(), options, &metrics).ok());
}

TEST(CoordinatorTest, BadRegistrationsAreRejectedClearly) {
  Fleet fleet(1, 2);
  auto endpoint = NewEndpoint();
  auto out_of_range = RendezvousClient::Join(endpoint.get(), fleet.Options(Role::kWorker, 5), nullptr);
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("worker rank 5 is out of range"), std::string::npos)
      << out_of_range.status();

  // Two processes asking for the same rank: the second is told who holds it.
  auto first = NewEndpoint();
  std::thread holder([&] {
    (void)RendezvousClient::Join(first.get(), fleet.Options(Role::kWorker, 0), nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto second = NewEndpoint();
  auto dup = RendezvousClient::Join(second.get(), fleet.Options(Role::kWorker, 0), nullptr);
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists) << dup.status();
  EXPECT_NE(dup.status().message().find("worker 0 is already registered"), std::string::npos);
  first->FailAll(CancelledError("test over"));
  holder.join();
}

TEST(CoordinatorTest, SilentMemberIsDeclaredFailedAndOthersAreTold) {
  Fleet fleet(1, 2, 10000, /*heartbeat_ms=*/500);
  auto processes = JoinAll(fleet, {{Role::kServer, 0}, {Role::kWorker, 0}, {Role::kWorker, 1}});
  std::promise<Status> told;
  processes[0].client->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  // worker 1 goes silent (as if killed): its heartbeats stop.
  processes[2].client.reset();
  processes[2].endpoint.reset();
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status s = future.get();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no heartbeat"), std::string::npos) << s;
  // worker 0's notice travels separately from the server's.
  Deadline told_too = Deadline::AfterMillis(5000);
  while (processes[1].client->health().ok() && !told_too.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(processes[1].client->health().code(), StatusCode::kAborted);
  // A barrier on a survivor now fails at once with the root cause.
  Status barrier = processes[1].client->Barrier("after", std::nullopt, 5000);
  EXPECT_NE(barrier.message().find("worker 1"), std::string::npos) << barrier;
  EXPECT_NE(fleet.metrics.RenderText().find("tessera_failures_detected_total{role=\"worker\"} 1"),
            std::string::npos);
}

// A member that stops because of an error says why as it leaves; the coordinator relays it
// to every other process at once (here within 1 s, against a 10 s heartbeat limit).
TEST(CoordinatorTest, AFailingMembersErrorReachesEveryoneAtOnce) {
  Fleet fleet(1, 2, 10000, /*heartbeat_ms=*/10000);
  auto processes = JoinAll(fleet, {{Role::kServer, 0}, {Role::kWorker, 0}, {Role::kWorker, 1}});
  std::promise<Status> told;
  processes[1].client->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  const auto start = SteadyClock::now();
  processes[2].client->LeaveWithError(NotFoundError("key 1 is not a chunk of this job"));
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  Status s = future.get();
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker 1 ("), std::string::npos) << s;
  EXPECT_NE(s.message().find("failed: it stopped with NOT_FOUND: key 1 is not a chunk of this job"),
            std::string::npos)
      << s;
  // The server hears it too (and carries on: peer failures are not fatal to its client here).
  Deadline deadline = Deadline::AfterMillis(1000);
  while (processes[0].client->health().ok() && !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_NE(processes[0].client->health().message().find("NOT_FOUND: key 1"), std::string::npos)
      << processes[0].client->health();
  EXPECT_EQ(fleet.coordinator->Snapshot().Find(Role::kWorker, 1)->state, MemberState::kFailed);
  EXPECT_NE(fleet.metrics.RenderText().find("tessera_failures_detected_total{role=\"worker\"} 1"),
            std::string::npos);
  // A member told of a failure sends no error of its own: the root cause stays the first.
  processes[1].client->LeaveWithError(AbortedError("a consequence"));
  EXPECT_EQ(fleet.coordinator->Snapshot().Find(Role::kWorker, 0)->state, MemberState::kAlive);
}

// Elastic jobs (issue 47): a worker's going is a membership epoch the others survive, told to
// every live member with its step and world size, until the job falls below --min-workers.
TEST(CoordinatorTest, ElasticJobSurvivesAWorkerUntilBelowMinWorkers) {
  Fleet fleet(1, 3, 10000, /*heartbeat_ms=*/10000, /*exit_when_workers_leave=*/false,
              /*min_workers=*/2);
  auto processes = JoinAll(fleet, {{Role::kServer, 0}, {Role::kWorker, 0}, {Role::kWorker, 1},
                                   {Role::kWorker, 2}});
  std::promise<FailureNotice> server_told;
  processes[0].client->SetMembershipHandler(
      [&](const FailureNotice& notice) { server_told.set_value(notice); });
  std::promise<Status> worker0_failed;
  processes[1].client->SetFailureCallback([&](const Status& s) { worker0_failed.set_value(s); });
  processes[3].client->SetStep(7);
  // Heartbeats go every 100 ms: within 300 ms the coordinator has heard step 7.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  processes[3].client->LeaveWithError(InternalError("disk full"));
  auto told = server_told.get_future();
  ASSERT_EQ(told.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  const FailureNotice notice = told.get();
  EXPECT_EQ(notice.rank, 2);
  EXPECT_EQ(notice.membership_epoch, 1u);
  EXPECT_EQ(notice.membership_step, 7);
  EXPECT_EQ(notice.world_size, 2);
  EXPECT_NE(notice.reason.find("membership epoch 1: worker 2 left after step 7 (error: "),
            std::string::npos)
      << notice.reason;
  EXPECT_TRUE(processes[1].client->health().ok()) << processes[1].client->health();
  EXPECT_TRUE(processes[2].client->health().ok()) << processes[2].client->health();
  EXPECT_EQ(fleet.coordinator->Snapshot().Find(Role::kWorker, 2)->state, MemberState::kLeft);
  const std::string text = fleet.metrics.RenderText();
  EXPECT_NE(text.find("tessera_membership_epoch 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_membership_changes_total{kind=\"error\"} 1"), std::string::npos);
  // Worker 1 goes too: 1 worker is below --min-workers 2, and the job stops naming why.
  processes[2].client->LeaveWithError(InternalError("out of memory"));
  auto failed = worker0_failed.get_future();
  ASSERT_EQ(failed.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  const Status stopped = failed.get();
  EXPECT_EQ(stopped.code(), StatusCode::kAborted);
  EXPECT_NE(stopped.message().find("the job has 1 worker, below --min-workers 2, since "
                                   "membership epoch 2: worker 1 left after step"),
            std::string::npos)
      << stopped;
  std::lock_guard<std::mutex> lock(fleet.changes_mu);
  ASSERT_EQ(fleet.changes.size(), 2u);
  EXPECT_EQ(fleet.changes[1].kind, MembershipKind::kError);
  EXPECT_EQ(fleet.changes[1].rank, 1);
}

TEST(CoordinatorTest, ElasticBoundsAreChecked) {
  ZmqTransportOptions transport;
  transport.role = Role::kCoordinator;
  auto endpoint = std::move(StartZmqEndpoint(transport, nullptr)).value();
  MetricsRegistry metrics;
  CoordinatorOptions options;
  options.num_workers = 2;
  options.min_workers = 3;
  auto refused = Coordinator::Create(endpoint.get(), options, &metrics);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--min-workers=3 --num-workers=2"),
            std::string::npos)
      << refused.status();
  options.min_workers = 1;
  options.num_servers = 2;
  options.replicas = 2;
  auto replicated = Coordinator::Create(endpoint.get(), options, &metrics);
  ASSERT_FALSE(replicated.ok());
  EXPECT_NE(replicated.status().message().find("with --replicas=2: not yet"), std::string::npos)
      << replicated.status();
}

// A server started with --join takes a failed server's place: it gets the view at once and is
// joining until its first heartbeat; then it is alive, and every live member gets the newer
// view (once). A join with no failed server, of a live rank, or by a worker is refused.
TEST(CoordinatorTest, AJoiningServerTakesAFailedOnesPlaceAndEveryoneGetsTheNewView) {
  Fleet fleet(2, 1, 10000, /*heartbeat_ms=*/10000);
  auto processes = JoinAll(fleet, {{Role::kServer, 0}, {Role::kServer, 1}, {Role::kWorker, 0}});
  std::mutex mu;
  std::vector<FleetView> seen;
  processes[2].client->SetPeerLossHandler([](const FailureNotice&) { return OkStatus(); });
  processes[2].client->SetFleetChangeHandler([&](const FleetView& view) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(view);
  });
  auto join = [&](Role role, int rank) {
    Process process;
    process.endpoint = NewEndpoint();
    RendezvousOptions options = fleet.Options(role, rank);
    options.join = true;
    auto client = RendezvousClient::Join(process.endpoint.get(), options, nullptr);
    if (client.ok()) process.client = std::move(client).value();
    return std::make_pair(client.status(), std::move(process));
  };
  Status none = join(Role::kServer, -1).first;
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition) << none;
  EXPECT_NE(none.message().find("none of its 2 servers has failed: a joining server takes a "
                                "failed one's place"),
            std::string::npos)
      << none;
  Status as_worker = join(Role::kWorker, -1).first;
  EXPECT_NE(as_worker.message().find("only a server joins a running fleet"), std::string::npos)
      << as_worker;

  processes[1].client->LeaveWithError(InternalError("disk on fire"));
  Deadline deadline = Deadline::AfterMillis(5000);
  while (fleet.coordinator->Snapshot().Find(Role::kServer, 1)->state != MemberState::kFailed &&
         !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Status live = join(Role::kServer, 0).first;
  EXPECT_NE(live.message().find("as server 0, which is alive; a joining server takes a failed "
                                "one's place (failed: 1)"),
            std::string::npos)
      << live;
  const uint64_t epoch_before = fleet.coordinator->Snapshot().epoch;
  auto [joined_status, joined] = join(Role::kServer, -1);
  ASSERT_TRUE(joined_status.ok()) << joined_status;
  EXPECT_EQ(joined.client->rank(), 1);
  EXPECT_EQ(joined.client->view().Find(Role::kServer, 1)->address, joined.endpoint->address());
  EXPECT_EQ(fleet.coordinator->Snapshot().Find(Role::kServer, 1)->state, MemberState::kJoining);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(seen.empty()) << "told before the joined server serves";
  }
  joined.client->StartHeartbeats();
  deadline = Deadline::AfterMillis(5000);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!seen.empty() || deadline.Expired()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_GT(seen[0].epoch, epoch_before);
  const MemberInfo* server = seen[0].Find(Role::kServer, 1);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->state, MemberState::kAlive);
  EXPECT_EQ(server->address, joined.endpoint->address());
  EXPECT_EQ(fleet.coordinator->Snapshot().Find(Role::kServer, 1)->state, MemberState::kAlive);
  processes[2].client->SetFleetChangeHandler(nullptr);
}

// A worker whose handlers come after Join (a ps-* worker building its model) is not failed by
// a server's loss in between: the notice, and the view with the server that took the failed
// one's place, wait for its handlers and reach them as they are set. A handler that then
// refuses the loss fails the worker as it would have at once.
TEST(CoordinatorTest, NoticesBeforeTheHandlersAreHeldForThem) {
  Fleet fleet(2, 2, 10000, /*heartbeat_ms=*/10000);
  fleet.workers_handlers_follow = true;
  auto processes = JoinAll(fleet, {{Role::kServer, 0}, {Role::kServer, 1}, {Role::kWorker, 0},
                                   {Role::kWorker, 1}});
  const uint64_t epoch_before = fleet.coordinator->Snapshot().epoch;
  processes[1].client->LeaveWithError(InternalError("disk on fire"));
  Process joined;
  joined.endpoint = NewEndpoint();
  RendezvousOptions options = fleet.Options(Role::kServer, -1);
  options.join = true;
  Deadline deadline = Deadline::AfterMillis(5000);
  StatusOr<std::unique_ptr<RendezvousClient>> client = UnavailableError("not joined yet");
  while (!client.ok() && !deadline.Expired()) {  // once the coordinator has seen the failure
    client = RendezvousClient::Join(joined.endpoint.get(), options, nullptr);
    if (!client.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(client.ok()) << client.status();
  joined.client = std::move(client).value();
  joined.client->StartHeartbeats();
  while (fleet.coordinator->Snapshot().Find(Role::kServer, 1)->state != MemberState::kAlive &&
         !deadline.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the notices' time to arrive
  EXPECT_TRUE(processes[2].client->health().ok()) << processes[2].client->health();
  EXPECT_TRUE(processes[3].client->health().ok()) << processes[3].client->health();

  std::vector<FailureNotice> losses;  // set on this thread: the held ones are replayed here
  processes[2].client->SetPeerLossHandler([&](const FailureNotice& notice) {
    losses.push_back(notice);
    return OkStatus();
  });
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].role, Role::kServer);
  EXPECT_EQ(losses[0].rank, 1);
  EXPECT_NE(losses[0].reason.find("disk on fire"), std::string::npos) << losses[0].reason;
  std::vector<FleetView> views;
  processes[2].client->SetFleetChangeHandler([&](const FleetView& view) { views.push_back(view); });
  ASSERT_EQ(views.size(), 1u);
  EXPECT_GT(views[0].epoch, epoch_before);
  EXPECT_EQ(views[0].Find(Role::kServer, 1)->address, joined.endpoint->address());
  EXPECT_TRUE(processes[2].client->health().ok()) << processes[2].client->health();
  processes[2].client->SetFleetChangeHandler(nullptr);
  processes[2].client->SetPeerLossHandler(nullptr);

  processes[3].client->SetPeerLossHandler(
      [](const FailureNotice&) { return FailedPreconditionError("range 1 is lost"); });
  const Status failed = processes[3].client->health();
  EXPECT_EQ(failed.code(), StatusCode::kAborted) << failed;
  EXPECT_NE(failed.message().find("server 1 ("), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("disk on fire; range 1 is lost"), std::string::npos) << failed;
  processes[3].client->SetPeerLossHandler(nullptr);
}

// A member registered from the coordinator's host whose process is gone is declared failed at
// once, not after the heartbeat timeout (10 s here).
TEST(CoordinatorTest, GoneLocalProcessIsDeclaredFailedAtOnce) {
  Fleet fleet(0, 2, 10000, /*heartbeat_ms=*/10000);
  char name[256] = {0};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::string host = name;
  // A pid that no process has any more: a child that exited and was reaped.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  // worker 1 registers by hand, with the dead pid; worker 0 as usual, from this host.
  auto raw = NewEndpoint();
  RegisterRequest request;
  request.role = Role::kWorker;
  request.requested_rank = 1;
  request.address = raw->address();
  request.host = host;
  request.pid = dead;
  auto registered = raw->CallAsync(fleet.coordinator_endpoint->address(), request, 0,
                                   Deadline::AfterMillis(10000), "registration of worker 1");
  auto endpoint = NewEndpoint();
  RendezvousOptions options = fleet.Options(Role::kWorker, 0, /*heartbeat_timeout_ms=*/10000);
  options.host = host;
  auto client = RendezvousClient::Join(endpoint.get(), options, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(registered.get().ok());
  std::promise<Status> told;
  (*client)->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  Status s = future.get();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("its process (pid " + std::to_string(dead) + " on " + host +
                             ") is gone"),
            std::string::npos)
      << s;
  endpoint->FailAll(CancelledError("test over"));
  raw->FailAll(CancelledError("test over"));
}

// A member of another host (pids mean nothing there) that dies: its kernel closes its
// sockets, so the connection the coordinator keeps to its listen address closes and its port
// refuses a reconnection; the others learn it at once, not after the heartbeat limit (60 s).
TEST(CoordinatorTest, AnotherHostsMemberWhoseConnectionClosesIsDeclaredFailedAtOnce) {
  Fleet fleet(0, 2, 10000, /*heartbeat_ms=*/60000);
  std::vector<Process> processes(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    processes[rank].endpoint = NewEndpoint();
    threads.emplace_back([&, rank] {
      RendezvousOptions options = fleet.Options(Role::kWorker, rank, 60000);
      if (rank == 1) options.host = "another-host";
      auto client = RendezvousClient::Join(processes[rank].endpoint.get(), options, nullptr);
      ASSERT_TRUE(client.ok()) << client.status();
      processes[rank].client = std::move(client).value();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_NE(processes[0].client, nullptr);
  ASSERT_NE(processes[1].client, nullptr);
  std::promise<Status> told;
  processes[0].client->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  const std::string address = processes[1].endpoint->address();
  processes[1].client.reset();  // gone without a goodbye, as if killed
  processes[1].endpoint.reset();
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status s = future.get();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("its connection closed and " + address +
                             " refuses connections (on another-host)"),
            std::string::npos)
      << s;
}

// On the coordinator's own host the pid decides: a member whose listen address closes while
// its process lives on (here, the test's own) is not declared failed for it.
TEST(CoordinatorTest, ALocalMembersClosedConnectionIsJudgedByItsPid) {
  Fleet fleet(0, 2, 10000, /*heartbeat_ms=*/60000);
  auto processes = JoinAll(fleet, {{Role::kWorker, 0}, {Role::kWorker, 1}});
  ASSERT_NE(processes[0].client, nullptr);
  std::atomic<bool> told{false};
  processes[0].client->SetFailureCallback([&](const Status&) { told = true; });
  processes[1].client.reset();
  processes[1].endpoint.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // refusals take milliseconds
  EXPECT_FALSE(told.load()) << "a member whose process lives was declared failed";
  EXPECT_TRUE(processes[0].client->health().ok()) << processes[0].client->health();
}

TEST(CoordinatorTest, LostCoordinatorIsDetectedByClients) {
  auto fleet = std::make_unique<Fleet>(0, 1);
  auto processes = JoinAll(*fleet, {{Role::kWorker, 0}});
  std::promise<Status> told;
  processes[0].client->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  fleet.reset();  // the coordinator vanishes
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status s = future.get();
  EXPECT_NE(s.message().find("lost contact with the coordinator"), std::string::npos) << s;
}

// A coordinator whose Run ends while its endpoint still listens (its process is exiting)
// answers heartbeats that it has stopped: members learn it at once, not after their heartbeat
// limit (10 s here).
TEST(CoordinatorTest, StoppedCoordinatorTellsItsMembersAtOnce) {
  Fleet fleet(0, 1);
  auto endpoint = NewEndpoint();
  auto client = RendezvousClient::Join(
      endpoint.get(), fleet.Options(Role::kWorker, 0, /*heartbeat_timeout_ms=*/10000), nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  std::promise<Status> told;
  (*client)->SetFailureCallback([&](const Status& s) { told.set_value(s); });
  fleet.stop = true;
  fleet.run_thread.join();
  auto future = told.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status s = future.get();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("lost contact with the coordinator"), std::string::npos) << s;
  EXPECT_NE(s.message().find("the coordinator of job 'test' has stopped"), std::string::npos) << s;
  EXPECT_TRUE((*client)->coordinator_stopped_cleanly());  // the fleet's end, not a fault
  fleet.run_thread = std::thread([] {});  // for ~Fleet
}

// With --exit-when-workers-leave the coordinator ends once the job is over; the servers still
// there are then stopped by whoever started them, and must not hear that as a failure.
TEST(CoordinatorTest, AFinishedJobIsNotAFailureForTheServersLeft) {
  Fleet fleet(1, 1, 10000, 10000, /*exit_when_workers_leave=*/true);
  fleet.job_workers = 1;
  std::vector<Process> processes(2);
  for (int i = 0; i < 2; ++i) processes[i].endpoint = NewEndpoint();
  std::thread server([&] {
    // No heartbeat within the test: a heartbeat between the end of Run and the endpoint's
    // shutdown below would be answered "stopped" (a real coordinator's process is gone then).
    RendezvousOptions options = fleet.Options(Role::kServer, 0, 10000);
    options.heartbeat_interval_ms = 5000;
    auto joined = RendezvousClient::Join(processes[0].endpoint.get(), options, nullptr);
    ASSERT_TRUE(joined.ok()) << joined.status();
    processes[0].client = std::move(joined).value();
  });
  auto worker = RendezvousClient::Join(processes[1].endpoint.get(),
                                       fleet.Options(Role::kWorker, 0, 10000), nullptr);
  server.join();
  ASSERT_TRUE(worker.ok()) << worker.status();
  processes[1].client = std::move(worker).value();
  std::atomic<bool> told{false};
  processes[0].client->SetFailureCallback([&](const Status&) { told = true; });
  processes[1].client->Leave("finished");
  auto result = fleet.result.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(result.get().ok());
  // Its process exits now: nothing answers the server's heartbeats any more (10 s limit).
  fleet.coordinator_endpoint->Shutdown();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a notice takes ~1 ms
  EXPECT_FALSE(told.load()) << "the server was told the coordinator failed";
}

// A long-running fleet (num_workers 0): the server rendezvouses alone; two jobs attach one
// after the other with the same ranks; a job's unscoped barrier is its workers'; a worker of
// another job is refused while one runs; the server stays healthy throughout.
TEST(CoordinatorTest, LongRunningFleetServesJobsOneAfterAnother) {
  Fleet fleet(1, 0);
  auto servers = JoinAll(fleet, {{Role::kServer, 0}});
  ASSERT_NE(servers[0].client, nullptr);
  EXPECT_EQ(servers[0].client->view().num_workers, 0);
  for (int job = 1; job <= 2; ++job) {
    fleet.job_workers = 2;
    auto workers = JoinAll(fleet, {{Role::kWorker, 1}, {Role::kWorker, 0}});
    for (auto& w : workers) {
      ASSERT_NE(w.client, nullptr);
      EXPECT_EQ(w.client->view().num_workers, 2);
      EXPECT_EQ(w.client->view().members.size(), 3u);  // the server and this job's 2 workers
      ASSERT_NE(w.client->view().Find(Role::kServer, 0), nullptr);
    }
    std::thread other([&] {
      EXPECT_TRUE(workers[0].client->Barrier("start", std::nullopt, 5000).ok());
    });
    EXPECT_TRUE(workers[1].client->Barrier("start", std::nullopt, 5000).ok());
    other.join();

    auto endpoint = NewEndpoint();
    auto late = RendezvousClient::Join(endpoint.get(), fleet.Options(Role::kWorker, -1), nullptr);
    ASSERT_FALSE(late.ok());
    EXPECT_NE(late.status().message().find("can attach only after that job's workers have left"),
              std::string::npos)
        << late.status();
    for (auto& w : workers) w.client->Leave("job " + std::to_string(job) + " done");
    // The job ends on the coordinator's thread; wait until its workers are gone.
    Deadline deadline = Deadline::AfterMillis(5000);
    while (!deadline.Expired() && fleet.coordinator->Snapshot().members.size() != 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(fleet.coordinator->Snapshot().members.size(), 1u) << "job " << job;
  }
  EXPECT_TRUE(servers[0].client->health().ok()) << servers[0].client->health();
  servers[0].client->Leave("test done");
}

// A job that does not assemble within the rendezvous timeout is turned away naming the missing
// rank; the fleet keeps running and the next job attaches.
TEST(CoordinatorTest, LongRunningFleetTurnsAwayAnIncompleteJobAndGoesOn) {
  Fleet fleet(0, 0, /*rendezvous_ms=*/500);
  fleet.job_workers = 2;
  auto endpoint = NewEndpoint();
  auto alone = RendezvousClient::Join(endpoint.get(), fleet.Options(Role::kWorker, 0), nullptr);
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("did not assemble within 500 ms: missing worker 1"),
            std::string::npos)
      << alone.status();
  fleet.job_workers = 1;
  auto workers = JoinAll(fleet, {{Role::kWorker, 0}});
  ASSERT_NE(workers[0].client, nullptr);
  EXPECT_EQ(workers[0].client->view().num_workers, 1);
  workers[0].client->Leave("done");
}

}  // namespace
}  // namespace tessera::coordinator
