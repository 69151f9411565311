#include "worker/collectives/channel/links/ring_link_handshake.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;
using State = RingLinkHandshake::State;

KeyBytes KeyOf(uint8_t fill) {
  KeyBytes bytes;
  bytes.fill(fill);
  return RingLinkKey(JobKey::FromBytes(bytes));
}

// A connected pair of non-blocking stream sockets, closed at the end.
struct Sockets {
  Sockets() {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  }
  ~Sockets() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  void Close(int i) {
    close(fds[i]);
    fds[i] = -1;
  }
  int fds[2] = {-1, -1};
};

// Advances both until neither runs (or a bounded number of rounds).
void Drive(RingLinkHandshake& a, RingLinkHandshake& b) {
  for (int round = 0; round < 100; ++round) {
    a.Advance();
    b.Advance();
    if (a.state() != State::kRunning && b.state() != State::kRunning) return;
  }
}

// Reads what is there now (the socket is non-blocking).
std::string ReadNow(int fd) {
  std::string got;
  char buffer[256];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT)) > 0) got.append(buffer, n);
  return got;
}

void WriteAll(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

LinkNonce NonceOf(uint8_t fill) {
  LinkNonce nonce;
  nonce.fill(fill);
  return nonce;
}

TEST(RingLinkHandshakeTest, BothEndsWithOneKeyFinishAndLeaveTheFramesThatFollow) {
  Sockets sockets;
  auto connector = RingLinkHandshake::Connector(sockets.fds[0], KeyOf(7), /*rank=*/1, /*next=*/2);
  auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), /*rank=*/2, /*prev=*/1);
  EXPECT_EQ(connector.events(), POLLOUT | POLLIN);
  EXPECT_EQ(acceptor.events(), POLLIN);
  connector.Advance();
  // The first frame may follow the proof at once: the acceptor must not read into it.
  Drive(connector, acceptor);
  EXPECT_EQ(connector.state(), State::kDone) << connector.failure();
  EXPECT_EQ(acceptor.state(), State::kDone) << acceptor.failure();
  WriteAll(sockets.fds[0], "first frame");
  EXPECT_EQ(ReadNow(sockets.fds[1]), "first frame");
  EXPECT_EQ(connector.events(), 0);
}

// Under kEncrypt both ends learn the connection's cipher and both nonces, alike.
TEST(RingLinkHandshakeTest, BothEndsAgreeOnTheSessionTheirRecordKeysComeFrom) {
  Sockets sockets;
  auto connector = RingLinkHandshake::Connector(sockets.fds[0], KeyOf(7), 1, 2,
                                                LinkCipher::kChaCha20Poly1305);
  auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1, /*encrypt=*/true);
  Drive(connector, acceptor);
  ASSERT_EQ(connector.state(), State::kDone) << connector.failure();
  ASSERT_EQ(acceptor.state(), State::kDone) << acceptor.failure();
  const LinkSession ours = connector.session();
  const LinkSession theirs = acceptor.session();
  EXPECT_EQ(ours.cipher, LinkCipher::kChaCha20Poly1305);
  EXPECT_EQ(theirs.cipher, LinkCipher::kChaCha20Poly1305);
  EXPECT_EQ(ours.nonce_c, theirs.nonce_c);
  EXPECT_EQ(ours.nonce_a, theirs.nonce_a);
  EXPECT_NE(ours.nonce_c, ours.nonce_a);
}

// An acceptor refuses a hello whose record protection is not its own, saying which.
TEST(RingLinkHandshakeTest, TheAcceptorRefusesAHelloThatDisagreesOnEncryption) {
  struct Case {
    LinkCipher asked;
    bool encrypt;
    const char* says;
  };
  for (const Case& c : {Case{LinkCipher::kNone, true, "would send frames in the clear"},
                        Case{LinkCipher::kAes256Gcm, false, "would encrypt its frames"},
                        Case{static_cast<LinkCipher>(9), true, "record protection 9"}}) {
    Sockets sockets;
    auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1, c.encrypt);
    WriteAll(sockets.fds[0], EncodeLinkHello(1, 2, NonceOf(3), c.asked));
    acceptor.Advance();
    EXPECT_EQ(acceptor.state(), State::kFailed);
    EXPECT_EQ(acceptor.failure().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(acceptor.failure().message(), HasSubstr(c.says));
  }
}

TEST(RingLinkHandshakeTest, WithAnotherKeyTheConnectorRefusesTheAcceptorsProof) {
  Sockets sockets;
  auto connector = RingLinkHandshake::Connector(sockets.fds[0], KeyOf(7), 1, 2);
  auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(8), 2, 1);
  Drive(connector, acceptor);
  EXPECT_EQ(connector.state(), State::kFailed);
  EXPECT_EQ(connector.failure().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(connector.failure().message(),
            "the peer did not prove it holds the job key (is it this job's worker?)");
  EXPECT_EQ(acceptor.state(), State::kRunning);  // waits for a proof that never comes
  sockets.Close(0);                               // the connector gives up
  acceptor.Advance();
  EXPECT_EQ(acceptor.state(), State::kFailed);
  EXPECT_EQ(acceptor.failure().message(),
            "closed the connection after our challenge: it did not accept our proof of the job "
            "key (do both hold the same key?)");
}

TEST(RingLinkHandshakeTest, AProofMadeWithAnotherKeyIsRefused) {
  Sockets sockets;
  auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1);
  const LinkNonce nonce_c = NonceOf(3);
  WriteAll(sockets.fds[0], EncodeLinkHello(1, 2, nonce_c));
  acceptor.Advance();
  const std::string challenge = ReadNow(sockets.fds[0]);
  ASSERT_EQ(challenge.size(), kLinkChallengeBytes);
  LinkNonce nonce_a;
  std::memcpy(nonce_a.data(), challenge.data() + 8, nonce_a.size());
  WriteAll(sockets.fds[0],
           EncodeLinkProof(LinkMac(KeyOf(8), "connector", 1, 2, nonce_c, nonce_a)));
  acceptor.Advance();
  EXPECT_EQ(acceptor.state(), State::kFailed);
  EXPECT_EQ(acceptor.failure().message(),
            "its proof is wrong (not this job's key, or a replayed handshake)");
}

// Whoever talks to the acceptor gets its MAC; sent back as the connector's proof, the
// direction label gives it away.
TEST(RingLinkHandshakeTest, TheAcceptorsOwnMacReflectedIsNoProof) {
  Sockets sockets;
  auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1);
  WriteAll(sockets.fds[0], EncodeLinkHello(1, 2, NonceOf(3)));
  acceptor.Advance();
  const std::string challenge = ReadNow(sockets.fds[0]);
  ASSERT_EQ(challenge.size(), kLinkChallengeBytes);
  WriteAll(sockets.fds[0], "TRLP" + challenge.substr(8 + kLinkNonceBytes));
  acceptor.Advance();
  EXPECT_EQ(acceptor.state(), State::kFailed);
  EXPECT_THAT(acceptor.failure().message(), HasSubstr("its proof is wrong"));
}

TEST(RingLinkHandshakeTest, TheAcceptorAnswersOnlyAHelloFromPrevToItself) {
  struct Case {
    std::string hello;
    std::string failure;
  };
  std::string old_version = EncodeLinkHello(1, 2, NonceOf(3));
  old_version[4] = 9;
  const std::vector<Case> cases = {
      {EncodeLinkHello(0, 2, NonceOf(3)), "its hello names rank 0, not our predecessor worker 1"},
      {EncodeLinkHello(1, 3, NonceOf(3)), "its hello is meant for worker 3, not us (worker 2)"},
      {old_version, "speaks ring-link handshake version 9, not 1"},
      {"GET / HTTP/1.1\r\n", "sent bytes that are no ring-link hello"},
      {std::string("HELO\1\0\0\0", 8),
       "sent a hello without authentication (does it run with --insecure while this job has a "
       "key?)"},
  };
  for (const Case& c : cases) {
    Sockets sockets;
    auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1);
    WriteAll(sockets.fds[0], c.hello);
    acceptor.Advance();
    EXPECT_EQ(acceptor.state(), State::kFailed) << c.failure;
    EXPECT_EQ(acceptor.failure().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(acceptor.failure().message(), c.failure);
    EXPECT_EQ(ReadNow(sockets.fds[0]), "") << "no challenge for " << c.failure;
  }
}

TEST(RingLinkHandshakeTest, APeerThatClosesFailsEitherEnd) {
  {
    Sockets sockets;
    auto acceptor = RingLinkHandshake::Acceptor(sockets.fds[1], KeyOf(7), 2, 1);
    WriteAll(sockets.fds[0], EncodeLinkHello(1, 2, NonceOf(3)).substr(0, 10));
    sockets.Close(0);
    acceptor.Advance();
    EXPECT_EQ(acceptor.failure().code(), StatusCode::kUnavailable);
    EXPECT_EQ(acceptor.failure().message(), "closed the connection before its hello was complete");
  }
  {
    Sockets sockets;
    auto connector = RingLinkHandshake::Connector(sockets.fds[0], KeyOf(7), 1, 2);
    connector.Advance();
    sockets.Close(1);
    connector.Advance();
    EXPECT_EQ(connector.state(), State::kFailed);
    EXPECT_EQ(connector.failure().code(), StatusCode::kUnavailable);
    EXPECT_THAT(connector.failure().message(),
                HasSubstr("closed by the peer during the handshake (its log says why"));
  }
}

TEST(RingLinkHandshakeTest, MacsDependOnSideRanksNoncesAndKey) {
  const MacBytes base = LinkMac(KeyOf(7), "acceptor", 1, 2, NonceOf(3), NonceOf(4));
  EXPECT_EQ(base, LinkMac(KeyOf(7), "acceptor", 1, 2, NonceOf(3), NonceOf(4)));
  EXPECT_NE(base, LinkMac(KeyOf(7), "connector", 1, 2, NonceOf(3), NonceOf(4)));
  EXPECT_NE(base, LinkMac(KeyOf(7), "acceptor", 2, 1, NonceOf(3), NonceOf(4)));
  EXPECT_NE(base, LinkMac(KeyOf(7), "acceptor", 1, 3, NonceOf(3), NonceOf(4)));
  EXPECT_NE(base, LinkMac(KeyOf(7), "acceptor", 1, 2, NonceOf(4), NonceOf(3)));
  EXPECT_NE(base, LinkMac(KeyOf(8), "acceptor", 1, 2, NonceOf(3), NonceOf(4)));
  EXPECT_EQ(EncodeLinkHello(1, 2, NonceOf(3)).size(), kLinkHelloBytes);
  EXPECT_EQ(EncodeLinkChallenge(2, NonceOf(3), base).size(), kLinkChallengeBytes);
  EXPECT_EQ(EncodeLinkProof(base).size(), kLinkProofBytes);
  EXPECT_EQ(EncodeLinkHello(1, 2, NonceOf(3)).substr(0, 4), "TRLH");
}

}  // namespace
}  // namespace tessera::worker
