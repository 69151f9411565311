// Encrypted ring links (Credentials kEncrypt) over real loopback sockets: frames of every size
// arrive bitwise, a relay that tampers with, drops or replays a record makes the receiver fail
// naming its peer, and a relay sees no plaintext (while under kAuthenticate it does).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/security/credentials.h"
#include "worker/collectives/channel/links/ring_link_cipher.h"
#include "worker/collectives/channel/links/ring_link_handshake.h"
#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/links/ring_links_testing.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::KeyOf;
using testing::Listeners;
using testing::Pattern;

using Bytes = std::vector<uint8_t>;

constexpr char kAuthenticationFailure[] =
    "a record failed authentication (tampered or not from the job)";

RingFrame Frame(int sender, uint64_t tag, uint32_t slot, Bytes bytes) {
  RingFrame frame;
  frame.kind = bytes.empty() ? RingFrameKind::kHandshake : RingFrameKind::kData;
  frame.sender_rank = sender;
  frame.tag = tag;
  frame.op = CollectiveOp::kAllReduce;
  frame.reduce_op = ReduceOp::kSum;
  frame.slot = slot;
  frame.dtype = DataType::kUInt8;
  frame.element_count = bytes.size();
  frame.buffer_elements = bytes.size();
  if (!bytes.empty()) frame.data = Payload::FromVector(std::move(bytes));
  return frame;
}

Bytes DataOf(const RingFrame& frame) {
  return Bytes(frame.data.data(), frame.data.data() + frame.data.size());
}

StatusOr<std::unique_ptr<RingLinks>> ConnectRank(int rank, int world, std::string next_address,
                                                 std::unique_ptr<RingLinks::Listener> listener,
                                                 const Credentials& credentials,
                                                 int64_t timeout_ms = 10000) {
  RingLinksOptions options;
  options.rank = rank;
  options.world_size = world;
  options.next_address = std::move(next_address);
  options.timeout_ms = timeout_ms;
  options.credentials = credentials;
  return RingLinks::Connect(options, std::move(listener));
}

// ---------------------------------------------------------------------------------------------

// Every rank sends frames of each size to next, then receives prev's and checks them bitwise.
TEST(RingLinksEncryptionTest, AnEncryptedRingOfTwoOrThreeExchangesFramesBitwise) {
  const std::vector<size_t> sizes = {0, 1, (64 << 10) + 3, 5 << 20};
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Listeners listeners(world);
    std::vector<Status> results(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        results[rank] = [&]() -> Status {
          ASSIGN_OR_RETURN(std::unique_ptr<RingLinks> links,
                           ConnectRank(rank, world, listeners.addresses[(rank + 1) % world],
                                       std::move(listeners.listeners[rank]),
                                       Credentials::Encrypt(KeyOf(7))));
          for (uint32_t slot = 0; slot < sizes.size(); ++slot) {
            RETURN_IF_ERROR(links->Send(
                Frame(rank, 7, slot, Pattern(sizes[slot], static_cast<uint8_t>(rank + slot)))));
          }
          const Deadline deadline = Deadline::AfterMillis(30000);
          const int prev = (rank + world - 1) % world;
          for (uint32_t slot = 0; slot < sizes.size(); ++slot) {
            ASSIGN_OR_RETURN(RingFrame got, links->Recv(7, slot, deadline));
            if (got.sender_rank != prev ||
                DataOf(got) != Pattern(sizes[slot], static_cast<uint8_t>(prev + slot))) {
              return InternalError("slot " + std::to_string(slot) + ": wrong frame");
            }
          }
          return links->Flush(deadline);
        }();
      });
    }
    for (auto& thread : threads) thread.join();
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    }
  }
}

// A frame not read yet when its Recv starts is opened in the caller's buffer.
TEST(RingLinksEncryptionTest, APayloadIsOpenedInTheCallersBuffer) {
  Listeners listeners(2);
  std::unique_ptr<RingLinks> links[2];
  Status results[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto connected = ConnectRank(rank, 2, listeners.addresses[1 - rank],
                                   std::move(listeners.listeners[rank]),
                                   Credentials::Encrypt(KeyOf(7)));
      results[rank] = connected.status();
      if (connected.ok()) links[rank] = std::move(connected).value();
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  constexpr size_t kBytes = (1 << 20) + 12345;
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(links[0]->Send(Frame(0, 1, 0, Pattern(kBytes, 5))).ok());
    EXPECT_TRUE(links[0]->Flush(Deadline::AfterMillis(10000)).ok());
  });
  Bytes place(kBytes);
  auto landed = links[1]->Recv(1, 0, Deadline::AfterMillis(10000), place.data(), place.size());
  sender.join();
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->data.data(), place.data());
  EXPECT_EQ(place, Pattern(kBytes, 5));
}

// ---------------------------------------------------------------------------------------------
// A relay between worker 0 and worker 1's listener.

// Blocking: exactly `bytes` bytes from fd, or false at a close or error.
bool ReadExactly(int fd, size_t bytes, std::string* out) {
  out->resize(bytes);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = recv(fd, out->data() + got, bytes - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

bool WriteAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0) {
    ADD_FAILURE() << "relay: cannot connect to " << address << ": " << std::strerror(errno);
  }
  return fd;
}

// Forwards a connector's connection to `target` both ways, each way on a thread of its own.
// From the connector it forwards the handshake's hello and proof as they are, then either the
// raw bytes (kRaw) or record by record (ring_link_cipher.h), doing `action` to the record
// numbered `record` (0: the first frame's header). It keeps what it forwarded that way.
class Relay {
 public:
  enum class Action { kRaw, kFlipAByte, kDrop, kReplay };

  Relay(std::string target, Action action, int record = 0)
      : target_(std::move(target)), action_(action), record_(record) {
    auto listener = RingLinks::Listen("127.0.0.1");
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(listener).value();
    address = listener_->address;
    thread_ = std::thread([this] { Run(); });
  }

  ~Relay() {
    shutdown(listener_->fd, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (int fd : {from_, to_}) {
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
      }
    }
    thread_.join();
    if (back_.joinable()) back_.join();
    if (from_ >= 0) close(from_);
    if (to_ >= 0) close(to_);
  }

  std::string Seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  std::string address;

 private:
  void Run() {
    const int from = accept(listener_->fd, nullptr, nullptr);
    if (from < 0) return;
    const int to = ConnectTo(target_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      from_ = from;
      to_ = to;
      if (stopping_) return;
    }
    back_ = std::thread([from, to] {  // the acceptor's challenge, as it is
      char buffer[4096];
      while (true) {
        const ssize_t n = recv(to, buffer, sizeof(buffer), 0);
        if (n <= 0 || !WriteAll(from, std::string(buffer, static_cast<size_t>(n)))) break;
      }
      shutdown(from, SHUT_WR);
    });
    std::string hello, proof;
    if (ReadExactly(from, kLinkHelloBytes, &hello) && Forward(to, hello) &&
        ReadExactly(from, kLinkProofBytes, &proof) && Forward(to, proof)) {
      if (action_ == Action::kRaw) {
        ForwardRaw(from, to);
      } else {
        ForwardRecords(from, to);
      }
    }
    shutdown(to, SHUT_WR);
  }

  bool Forward(int to, const std::string& bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_ += bytes;
    }
    return WriteAll(to, bytes);
  }

  void ForwardRaw(int from, int to) {
    char buffer[1 << 16];
    while (true) {
      const ssize_t n = recv(from, buffer, sizeof(buffer), 0);
      if (n <= 0 || !Forward(to, std::string(buffer, static_cast<size_t>(n)))) return;
    }
  }

  void ForwardRecords(int from, int to) {
    for (int index = 0;; ++index) {
      std::string prefix, rest;
      if (!ReadExactly(from, kRecordLengthBytes, &prefix)) return;
      uint32_t length = 0;
      for (int i = 0; i < 4; ++i) length |= uint32_t{static_cast<uint8_t>(prefix[i])} << (8 * i);
      if (length > kMaxRecordBytes || !ReadExactly(from, length + kRecordTagBytes, &rest)) return;
      std::string record = prefix + rest;
      if (index == record_) {
        switch (action_) {
          case Action::kFlipAByte:
            record[kRecordLengthBytes + length / 2] ^= 0x01;  // in the ciphertext
            break;
          case Action::kDrop:
            continue;
          case Action::kReplay:
            if (!Forward(to, record)) return;
            break;
          case Action::kRaw:
            break;
        }
      }
      if (!Forward(to, record)) return;
    }
  }

  const std::string target_;
  const Action action_;
  const int record_;
  std::unique_ptr<RingLinks::Listener> listener_;
  std::thread thread_;
  std::thread back_;
  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_
  int from_ = -1;          // guarded by mu_ until the threads are joined
  int to_ = -1;
  std::string seen_;  // guarded by mu_
};

// A ring of two whose hop from worker 0 to worker 1 passes `relay`'s kind; worker 0 sends
// `frames` (tag 3, slots 0, 1, ...). What worker 1's Recv of each returned.
std::vector<StatusOr<RingFrame>> SendThroughARelay(const Credentials& credentials,
                                                   Relay::Action action, int record,
                                                   const std::vector<Bytes>& frames,
                                                   std::string* seen = nullptr) {
  Listeners listeners(2);
  Relay relay(listeners.addresses[1], action, record);
  std::unique_ptr<RingLinks> links[2];
  Status results[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto connected =
          ConnectRank(rank, 2, rank == 0 ? relay.address : listeners.addresses[0],
                      std::move(listeners.listeners[rank]), credentials);
      results[rank] = connected.status();
      if (connected.ok()) links[rank] = std::move(connected).value();
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<StatusOr<RingFrame>> got;
  if (!results[0].ok() || !results[1].ok()) {
    ADD_FAILURE() << "connect: " << results[0] << "; " << results[1];
    return got;
  }
  for (uint32_t slot = 0; slot < frames.size(); ++slot) {
    EXPECT_TRUE(links[0]->Send(Frame(0, 3, slot, frames[slot])).ok());
  }
  for (uint32_t slot = 0; slot < frames.size(); ++slot) {
    got.push_back(links[1]->Recv(3, slot, Deadline::AfterMillis(10000)));
  }
  (void)links[0]->Flush(Deadline::AfterMillis(1000));
  if (seen != nullptr) *seen = relay.Seen();
  return got;
}

void ExpectAuthenticationFailure(Relay::Action action, int record) {
  // Records: 0 the header, then the payload's 4 records of kSendRecordBytes.
  const std::vector<Bytes> frames = {Pattern(4 * kSendRecordBytes, 1)};
  auto got = SendThroughARelay(Credentials::Encrypt(KeyOf(7)), action, record, frames);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_FALSE(got[0].ok()) << "the frame arrived";
  EXPECT_EQ(got[0].status().code(), StatusCode::kDataLoss) << got[0].status();
  EXPECT_THAT(got[0].status().message(),
              AllOf(StartsWith("ring link from worker 0 (tcp://127.0.0.1:"),
                    HasSubstr(kAuthenticationFailure)));
}

TEST(RingLinksEncryptionTest, AFlippedCiphertextByteFailsTheLinkNamingThePeer) {
  ExpectAuthenticationFailure(Relay::Action::kFlipAByte, 0);  // the header's record
  ExpectAuthenticationFailure(Relay::Action::kFlipAByte, 2);  // a payload record
}

TEST(RingLinksEncryptionTest, ADroppedRecordFailsTheLinkNamingThePeer) {
  ExpectAuthenticationFailure(Relay::Action::kDrop, 2);
}

TEST(RingLinksEncryptionTest, AReplayedRecordFailsTheLinkNamingThePeer) {
  ExpectAuthenticationFailure(Relay::Action::kReplay, 1);
}

// What a relay sees: under kEncrypt no trace of the payload (a repeated ASCII marker, and a
// run of 0xAB); under kAuthenticate both, as they are.
TEST(RingLinksEncryptionTest, ARelaySeesNoPlaintextOnlyWhenEncrypted) {
  const std::string marker = "TESSERA-PLAINTEXT-MARKER-";
  std::string text;
  while (text.size() < (100 << 10)) text += marker;
  const std::vector<Bytes> frames = {Bytes(text.begin(), text.end()), Bytes(70000, 0xab)};
  const std::string run(64, '\xab');
  for (bool encrypted : {true, false}) {
    SCOPED_TRACE(encrypted ? "encrypted" : "authenticated only");
    std::string seen;
    auto got = SendThroughARelay(encrypted ? Credentials::Encrypt(KeyOf(7))
                                           : Credentials::Authenticate(KeyOf(7)),
                                 Relay::Action::kRaw, 0, frames, &seen);
    ASSERT_EQ(got.size(), frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_EQ(DataOf(*got[i]), frames[i]);
    }
    EXPECT_GT(seen.size(), text.size() + frames[1].size());
    EXPECT_EQ(seen.find(marker) != std::string::npos, !encrypted);
    EXPECT_EQ(seen.find(run) != std::string::npos, !encrypted);
  }
}

// One end encrypts, the other does not: both fail saying so.
TEST(RingLinksEncryptionTest, EncryptingAgainstNotEncryptingFailsBothEndsClearly) {
  Listeners listeners(2);
  Status results[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = ConnectRank(rank, 2, listeners.addresses[1 - rank],
                                  std::move(listeners.listeners[rank]),
                                  rank == 0 ? Credentials::Encrypt(KeyOf(7))
                                            : Credentials::Authenticate(KeyOf(7)),
                                  /*timeout_ms=*/1500)
                          .status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_FALSE(results[rank].ok()) << "rank " << rank;
    EXPECT_THAT(results[rank].message(), HasSubstr("--encrypt")) << results[rank];
  }
}

}  // namespace
}  // namespace tessera::worker
