#include "worker/collectives/ring_channel_setup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Whether a shared-memory segment of this process is still in /dev/shm.
bool AnySegmentLeft() {
  const std::string prefix = "tessera-ring-" + std::to_string(getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// W workers on ZeroMQ endpoints on 127.0.0.1, each with its FailureBus and mailbox, wired as
// tessera-worker wires them; Connect sets up every rank's channel at once, on a thread each.
class Workers {
 public:
  explicit Workers(int world) {
    for (int rank = 0; rank < world; ++rank) {
      ZmqTransportOptions options;
      options.role = Role::kWorker;
      options.rank = rank;
      auto endpoint = StartZmqEndpoint(options, nullptr);
      EXPECT_TRUE(endpoint.ok()) << endpoint.status();
      failures_.push_back(std::make_shared<FailureBus>());
      mailboxes_.push_back(std::make_shared<CollectiveMailbox>(failures_.back()));
      (*endpoint)->SetHandler(MessageType::kRingFrame,
                              CollectiveMailbox::Handler(mailboxes_.back()));
      addresses.push_back((*endpoint)->address());
      endpoints_.push_back(std::move(endpoint).value());
    }
  }
  ~Workers() {
    results.clear();  // the channels refer to the transports
    for (auto& endpoint : endpoints_) endpoint->Shutdown();
  }

  RingChannelSetupOptions Options(int rank, const std::string& kind) {
    RingChannelSetupOptions options;
    options.kind = kind;
    options.rank = rank;
    options.world_size = static_cast<int>(endpoints_.size());
    options.peer_addresses = addresses;
    options.transport = &endpoints_[rank]->transport();
    options.mailbox = mailboxes_[rank];
    options.failures = failures_[rank];
    options.timeout_ms = 10000;
    options.segment_bytes = 64 << 10;
    if (!credentials.empty()) options.credentials = credentials[rank];
    return options;
  }

  // Every rank's setup of `kind`, with `segment_bytes[rank]` if given.
  void Connect(const std::string& kind, const std::vector<size_t>& segment_bytes = {}) {
    results.clear();
    for (size_t rank = 0; rank < endpoints_.size(); ++rank) {
      results.emplace_back(InternalError("not run"));
    }
    std::vector<std::thread> threads;
    for (int rank = 0; rank < static_cast<int>(endpoints_.size()); ++rank) {
      threads.emplace_back([this, rank, kind, segment_bytes] {
        RingChannelSetupOptions options = Options(rank, kind);
        if (!segment_bytes.empty()) options.segment_bytes = segment_bytes[rank];
        results[rank] = ConnectRingChannel(options);
      });
    }
    for (auto& thread : threads) thread.join();
  }

  // Each rank sends its successor a frame, and each checks what its predecessor sent.
  void PassAFrameRound() {
    const int world = static_cast<int>(results.size());
    for (int rank = 0; rank < world; ++rank) {
      RingFrame frame;
      frame.kind = RingFrameKind::kHandshake;
      frame.tag = 1;
      frame.block = static_cast<uint32_t>(rank);
      ASSERT_TRUE(results[rank]->channel->Send(frame).ok());
    }
    for (int rank = 0; rank < world; ++rank) {
      const int prev = (rank + world - 1) % world;
      auto got = results[rank]->channel->Recv(1, 0, Deadline::AfterMillis(10000));
      ASSERT_TRUE(got.ok()) << "rank " << rank << ": " << got.status();
      EXPECT_EQ(got->sender_rank, prev);
      EXPECT_EQ(got->block, static_cast<uint32_t>(prev));
      EXPECT_TRUE(results[rank]->channel->Flush(Deadline::AfterMillis(10000)).ok());
    }
  }

  size_t queued(int rank) const { return mailboxes_[rank]->queued(); }

  std::vector<std::string> addresses;
  std::vector<StatusOr<ConnectedRingChannel>> results;
  std::vector<Credentials> credentials;  // by rank, if not empty

 private:
  std::vector<std::unique_ptr<RpcEndpoint>> endpoints_;
  std::vector<std::shared_ptr<FailureBus>> failures_;
  std::vector<std::shared_ptr<CollectiveMailbox>> mailboxes_;
};

TEST(RingChannelSetupTest, EveryKindConnectsARing) {
  struct Kind {
    std::string kind;
    std::string description;
  };
  for (const Kind& kind : {Kind{"zmq", "zmq (through the transport)"},
                           Kind{"links", "links (TCP to the ring neighbours)"},
                           Kind{"shm", "shm (shared-memory rings of 4 MiB each way)"},
                           Kind{"auto", "shm (shared-memory rings of 4 MiB each way), chosen by "
                                        "auto"}}) {
    SCOPED_TRACE(kind.kind);
    Workers workers(3);
    workers.Connect(kind.kind);
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(workers.results[rank].ok()) << workers.results[rank].status();
      EXPECT_EQ(workers.results[rank]->description, kind.description);
      EXPECT_EQ(workers.results[rank]->channel->rank(), rank);
      EXPECT_EQ(workers.queued(rank), 0u) << "setup left frames behind";
    }
    EXPECT_FALSE(AnySegmentLeft());
    workers.PassAFrameRound();
  }
}

JobKey KeyOf(uint8_t fill) {
  KeyBytes bytes;
  bytes.fill(fill);
  return JobKey::FromBytes(bytes);
}

// The credentials reach the links: with one key the ring connects; with two both ranks fail,
// one at least finding that its successor does not prove it holds the job key (the other may
// find its connection closed first: ring_links_test has the details).
TEST(RingChannelSetupTest, LinksAuthenticateWithTheCredentials) {
  {
    Workers workers(2);
    workers.credentials = {Credentials::Authenticate(KeyOf(1)),
                           Credentials::Authenticate(KeyOf(1))};
    workers.Connect("links");
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(workers.results[rank].ok()) << workers.results[rank].status();
    }
    workers.PassAFrameRound();
  }
  Workers workers(2);
  workers.credentials = {Credentials::Authenticate(KeyOf(1)),
                         Credentials::Authenticate(KeyOf(2))};
  workers.Connect("links");
  int wrong_key = 0;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_FALSE(workers.results[rank].ok());
    const std::string message = workers.results[rank].status().message();
    if (message.find("): the peer did not prove it holds the job key") != std::string::npos) {
      ++wrong_key;
    } else {
      EXPECT_THAT(message, HasSubstr("): closed by the peer during the handshake"));
    }
  }
  EXPECT_GE(wrong_key, 1);
}

TEST(RingChannelSetupTest, AWorldOfOneNeedsNoChannel) {
  Workers workers(1);
  workers.Connect("shm");
  ASSERT_TRUE(workers.results[0].ok()) << workers.results[0].status();
  EXPECT_EQ(workers.results[0]->description, "none (a world of 1)");
}

TEST(RingChannelSetupTest, RejectsAnUnknownKindAndAMissingBus) {
  Workers workers(1);
  auto unknown = ConnectRingChannel(workers.Options(0, "tcp"));
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "ring transport tcp is not one of auto, shm, links, zmq");
  RingChannelSetupOptions no_bus = workers.Options(0, "zmq");
  no_bus.failures = nullptr;
  EXPECT_EQ(ConnectRingChannel(no_bus).status().message(), "ring channel setup: no failure bus");
}

// Worker 1 cannot make its segment (far larger than /dev/shm). Every rank learns it in the
// agreement: shm fails alike everywhere, naming worker 1, and nothing is left in /dev/shm.
TEST(RingChannelSetupTest, ShmFailsOnEveryRankAlikeWhenOneCannotMapItsNeighbours) {
  Workers workers(3);
  workers.Connect("shm", {64 << 10, size_t{1} << 49, 64 << 10});
  for (int rank = 0; rank < 3; ++rank) {
    const Status& status = workers.results[rank].status();
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                StartsWith("--ring-transport shm: ring shm rank=" + std::to_string(rank) +
                           ": not every rank can map its ring neighbours' shared memory "
                           "(worker 1 cannot)"));
  }
  EXPECT_THAT(workers.results[1].status().message(),
              AllOf(HasSubstr("; this rank: shared memory segment /tessera-ring-"),
                    HasSubstr("cannot reserve")));
  EXPECT_FALSE(AnySegmentLeft());
}

// The same under auto at world 2, where both hops touch worker 1: every rank falls back to
// links together, and says why.
TEST(RingChannelSetupTest, AutoFallsBackToLinksOnEveryRankAlike) {
  Workers workers(2);
  workers.Connect("auto", {64 << 10, size_t{1} << 49});
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(workers.results[rank].ok()) << workers.results[rank].status();
    EXPECT_THAT(workers.results[rank]->description,
                StartsWith("links (TCP to the ring neighbours), chosen by auto: ring shm rank=" +
                           std::to_string(rank) + ": not every rank can map its ring "
                           "neighbours' shared memory (worker 1 cannot)"));
    EXPECT_EQ(workers.queued(rank), 0u) << "setup left frames behind";
  }
  EXPECT_FALSE(AnySegmentLeft());
  workers.PassAFrameRound();
}

// At world 4 only the hops to and from worker 1 need links: auto chooses per hop, the same on
// every rank, and each rank says which of its hops is which.
TEST(RingChannelSetupTest, AutoChoosesPerHop) {
  Workers workers(4);
  workers.Connect("auto", {64 << 10, size_t{1} << 49, 64 << 10, 64 << 10});
  const std::string map = "chosen by auto per hop (0->1 links, 1->2 links, 2->3 shm, 3->0 shm)";
  const std::vector<std::string> hops = {"links to worker 1, shm from worker 3, ",
                                         "links to worker 2, links from worker 0, ",
                                         "shm to worker 3, links from worker 1, ",
                                         "shm to worker 0, shm from worker 2, "};
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(workers.results[rank].ok()) << workers.results[rank].status();
    const std::string description = workers.results[rank]->description;
    if (rank == 1) {  // the one with an error of its own
      EXPECT_THAT(description, AllOf(StartsWith(hops[rank] + map + "; this rank: shared memory "
                                                                   "segment /tessera-ring-"),
                                     HasSubstr("cannot reserve")));
    } else {
      EXPECT_EQ(description, hops[rank] + map);
    }
    EXPECT_EQ(workers.queued(rank), 0u) << "setup left frames behind";
  }
  EXPECT_FALSE(AnySegmentLeft());
  workers.PassAFrameRound();
}

// Worker 1 never answers (nobody listens at its address): the setup ends at its timeout,
// naming what it waited for.
TEST(RingChannelSetupTest, SetupTimesOutNamingASilentNeighbour) {
  Workers workers(1);
  for (const auto& [kind, waited_for] :
       {std::pair<std::string, std::string>{"links", "ring links rank=0: waiting for worker 1's "
                                                     "link address"},
        std::pair<std::string, std::string>{"shm", "ring shm rank=0: waiting for worker 1's "
                                                   "segment name"}}) {
    RingChannelSetupOptions options = workers.Options(0, kind);
    options.world_size = 2;
    options.peer_addresses.push_back("tcp://127.0.0.1:1");
    options.timeout_ms = 200;
    const auto started = SteadyClock::now();
    auto connected = ConnectRingChannel(options);
    EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
    EXPECT_EQ(connected.status().code(), StatusCode::kDeadlineExceeded) << connected.status();
    EXPECT_THAT(connected.status().message(),
                HasSubstr(waited_for + ": no answer within 200 ms"));
  }
  EXPECT_FALSE(AnySegmentLeft());
}

TEST(RingChannelSetupTest, RingPeerAddressesAreTheWorkersInRankOrder) {
  FleetView view;
  auto member = [](Role role, int rank, const std::string& address) {
    MemberInfo info;
    info.role = role;
    info.rank = rank;
    info.address = address;
    return info;
  };
  view.members = {member(Role::kCoordinator, 0, "tcp://c:1"), member(Role::kServer, 0, "tcp://s:1"),
                  member(Role::kWorker, 0, "tcp://w0:1"), member(Role::kWorker, 1, "tcp://w1:1")};
  auto addresses = RingPeerAddresses(view);
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_EQ(*addresses, (std::vector<std::string>{"tcp://w0:1", "tcp://w1:1"}));
  view.members.back().rank = 2;
  EXPECT_EQ(RingPeerAddresses(view).status().message(),
            "the fleet view's worker ranks are not 0..1: found worker 2 at position 1");
}

TEST(RingChannelSetupTest, RingOrderPutsEachHostsRanksNextToEachOther) {
  struct Case {
    std::vector<std::string> addresses;
    std::vector<int> order;
  };
  for (const Case& c : std::vector<Case>{
           {{}, {}},
           {{"tcp://127.0.0.1:5"}, {0}},
           {{"tcp://127.0.0.1:5", "tcp://127.0.0.1:6", "tcp://127.0.0.1:7"}, {0, 1, 2}},
           {{"tcp://a:1", "tcp://a:2", "tcp://b:1", "tcp://b:2"}, {0, 1, 2, 3}},
           {{"tcp://a:1", "tcp://b:1", "tcp://a:2", "tcp://b:2"}, {0, 2, 1, 3}},
           {{"tcp://b:1", "tcp://a:1", "tcp://b:2", "tcp://a:2"}, {0, 2, 1, 3}},
           {{"tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://a:2"}, {0, 3, 1, 2}},
           {{"tcp://[::1]:1", "tcp://10.0.0.2:1", "tcp://[::1]:2"}, {0, 2, 1}},
           {{"not an address", "tcp://a:1", "not an address"}, {0, 2, 1}},
       }) {
    EXPECT_EQ(RingOrder(c.addresses), c.order) << ::testing::PrintToString(c.addresses);
  }
}

TEST(RingChannelSetupTest, ShmRingsHoldTwoSegmentsAndAtLeastFourMiB) {
  EXPECT_EQ(ShmRingBytes(1 << 20), size_t{4} << 20);
  EXPECT_EQ(ShmRingBytes(4 << 20), 2 * ((size_t{4} << 20) + 4096));
}

}  // namespace
}  // namespace tessera::worker
