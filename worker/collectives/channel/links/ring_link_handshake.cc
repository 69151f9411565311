#include "worker/collectives/channel/links/ring_link_handshake.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/base/role.h"

namespace tessera::worker {
namespace {

constexpr std::string_view kMacLabel = "tessera ring-link v1";

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

void PutU32(std::string* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void PutU16(std::string* out, uint16_t value) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
uint32_t GetU32(const std::string& in, size_t at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= uint32_t{static_cast<uint8_t>(in[at + static_cast<size_t>(i)])} << (8 * i);
  }
  return value;
}
uint16_t GetU16(const std::string& in, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(in[at]) |
                               (static_cast<uint8_t>(in[at + 1]) << 8));
}
int32_t GetI32(const std::string& in, size_t at) { return static_cast<int32_t>(GetU32(in, at)); }

// A rank as the 4 bytes the MACs cover.
std::string RankBytes(int rank) {
  std::string bytes;
  PutU32(&bytes, static_cast<uint32_t>(rank));
  return bytes;
}

std::string_view Text(const LinkNonce& nonce) { return AsText(nonce.data(), nonce.size()); }

}  // namespace

KeyBytes RingLinkKey(const JobKey& key) { return key.Derive("ring-link"); }

std::string EncodeLinkHello(int connector, int acceptor, const LinkNonce& nonce_c,
                            LinkCipher records) {
  std::string hello;
  PutU32(&hello, kLinkHelloMagic);
  PutU16(&hello, kLinkHandshakeVersion);
  PutU16(&hello, static_cast<uint16_t>(records));
  PutU32(&hello, static_cast<uint32_t>(connector));
  PutU32(&hello, static_cast<uint32_t>(acceptor));
  hello.append(Text(nonce_c));
  return hello;
}

MacBytes LinkMac(const KeyBytes& link_key, std::string_view side, int connector, int acceptor,
                 const LinkNonce& nonce_c, const LinkNonce& nonce_a) {
  const std::string from = RankBytes(connector);
  const std::string to = RankBytes(acceptor);
  return Mac(link_key, {kMacLabel, side, from, to, Text(nonce_c), Text(nonce_a)});
}

std::string EncodeLinkChallenge(int acceptor, const LinkNonce& nonce_a, const MacBytes& mac) {
  std::string challenge;
  PutU32(&challenge, kLinkChallengeMagic);
  PutU32(&challenge, static_cast<uint32_t>(acceptor));
  challenge.append(Text(nonce_a));
  challenge.append(AsText(mac.data(), mac.size()));
  return challenge;
}

std::string EncodeLinkProof(const MacBytes& mac) {
  std::string proof;
  PutU32(&proof, kLinkProofMagic);
  proof.append(AsText(mac.data(), mac.size()));
  return proof;
}

// ---------------------------------------------------------------------------------------------
// One connection's handshake

RingLinkHandshake::RingLinkHandshake(int fd, const KeyBytes& link_key, int rank, int peer,
                                     bool connector, LinkCipher records, bool encrypt)
    : fd_(fd),
      key_(link_key),
      rank_(rank),
      peer_(peer),
      connector_(connector),
      records_(records),
      encrypt_(encrypt) {
  RandomBytes(own_nonce_.data(), own_nonce_.size());
}

RingLinkHandshake RingLinkHandshake::Connector(int fd, const KeyBytes& link_key, int rank,
                                               int next, LinkCipher records) {
  RingLinkHandshake handshake(fd, link_key, rank, next, /*connector=*/true, records,
                              records != LinkCipher::kNone);
  handshake.out_ = EncodeLinkHello(rank, next, handshake.own_nonce_, records);
  handshake.step_ = Step::kChallenge;
  handshake.in_wanted_ = kLinkChallengeBytes;
  return handshake;
}

RingLinkHandshake RingLinkHandshake::Acceptor(int fd, const KeyBytes& link_key, int rank,
                                              int prev, bool encrypt) {
  RingLinkHandshake handshake(fd, link_key, rank, prev, /*connector=*/false, LinkCipher::kNone,
                              encrypt);
  handshake.step_ = Step::kHello;
  handshake.in_wanted_ = kLinkHelloBytes;
  return handshake;
}

LinkSession RingLinkHandshake::session() const {
  LinkSession session;
  session.cipher = records_;
  session.nonce_c = connector_ ? own_nonce_ : peer_nonce_;
  session.nonce_a = connector_ ? peer_nonce_ : own_nonce_;
  return session;
}

short RingLinkHandshake::events() const {
  if (state_ != State::kRunning) return 0;
  short events = 0;
  if (out_sent_ < out_.size()) events |= POLLOUT;
  if (in_.size() < in_wanted_) events |= POLLIN;
  return events;
}

void RingLinkHandshake::Fail(Status failure) {
  state_ = State::kFailed;
  failure_ = std::move(failure);
}

RingLinkHandshake::State RingLinkHandshake::Advance() {
  while (state_ == State::kRunning) {
    if (out_sent_ < out_.size()) {
      const ssize_t n = send(fd_, out_.data() + out_sent_, out_.size() - out_sent_,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
        Fail(UnavailableError(std::string("send failed during the handshake: ") +
                              std::strerror(errno)));
        return state_;
      }
      out_sent_ += static_cast<size_t>(n);
      continue;
    }
    if (in_.size() < in_wanted_) {
      // Exactly the message's bytes: what follows the proof is the first frame, RingLinks's.
      char buffer[kLinkChallengeBytes];
      const size_t want = std::min(sizeof(buffer), in_wanted_ - in_.size());
      const ssize_t n = recv(fd_, buffer, want, MSG_DONTWAIT);
      // A reset is a close too: a peer that closes with our bytes unread resets.
      if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        if (connector_) {
          Fail(UnavailableError("closed by the peer during the handshake (its log says why: a "
                                "worker of another job, one holding another key, or one with "
                                "other --insecure/--encrypt settings?)"));
        } else if (step_ == Step::kProof) {
          Fail(UnavailableError("closed the connection after our challenge: it did not accept "
                                "our proof of the job key (do both hold the same key?)"));
        } else {
          Fail(UnavailableError("closed the connection before its hello was complete"));
        }
        return state_;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
        Fail(UnavailableError(std::string("receive failed during the handshake: ") +
                              std::strerror(errno)));
        return state_;
      }
      in_.append(buffer, static_cast<size_t>(n));
      // A hello's magic tells at once whether the bytes are a hello at all.
      if (step_ == Step::kHello && in_.size() >= 4 && in_.size() - static_cast<size_t>(n) < 4) {
        const uint32_t magic = GetU32(in_, 0);
        if (magic == kLinkPlainHelloMagic) {
          Fail(FailedPreconditionError("sent a hello without authentication (does it run with "
                                       "--insecure while this job has a key?)"));
          return state_;
        }
        if (magic != kLinkHelloMagic) {
          Fail(FailedPreconditionError("sent bytes that are no ring-link hello"));
          return state_;
        }
      }
      if (in_.size() == in_wanted_) OnMessage();
      continue;
    }
    if (step_ == Step::kFinished) {
      state_ = State::kDone;
      return state_;
    }
    return state_;  // waiting for nothing: cannot happen while running
  }
  return state_;
}

void RingLinkHandshake::OnMessage() {
  const std::string message = std::move(in_);
  in_.clear();
  in_wanted_ = 0;
  switch (step_) {
    case Step::kHello: {  // the acceptor's
      const uint16_t version = GetU16(message, 4);
      const int connector = GetI32(message, 8);
      const int acceptor = GetI32(message, 12);
      if (version != kLinkHandshakeVersion) {
        return Fail(FailedPreconditionError("speaks ring-link handshake version " +
                                            std::to_string(version) + ", not " +
                                            std::to_string(kLinkHandshakeVersion)));
      }
      if (connector != peer_) {
        return Fail(FailedPreconditionError("its hello names rank " + std::to_string(connector) +
                                            ", not our predecessor " + Worker(peer_)));
      }
      if (acceptor != rank_) {
        return Fail(FailedPreconditionError("its hello is meant for " + Worker(acceptor) +
                                            ", not us (" + Worker(rank_) + ")"));
      }
      const uint16_t records = GetU16(message, 6);
      if (records == static_cast<uint16_t>(LinkCipher::kNone) && encrypt_) {
        return Fail(FailedPreconditionError(
            "it would send frames in the clear while this worker encrypts its ring links (do "
            "both run with the same --encrypt?)"));
      }
      if (records != static_cast<uint16_t>(LinkCipher::kNone) && !encrypt_) {
        return Fail(FailedPreconditionError(
            "it would encrypt its frames while this worker does not (do both run with the same "
            "--encrypt?)"));
      }
      if (records != static_cast<uint16_t>(LinkCipher::kNone) &&
          !LinkCipherAvailable(static_cast<LinkCipher>(records))) {
        const bool aes = records == static_cast<uint16_t>(LinkCipher::kAes256Gcm);
        return Fail(FailedPreconditionError(
            aes ? "it would encrypt with AES-256-GCM, which this machine's CPU cannot run (no "
                  "AES-NI): every worker of a job needs it, or none"
                : "it asks for record protection " + std::to_string(records) +
                      ", which this worker does not know"));
      }
      records_ = static_cast<LinkCipher>(records);
      std::memcpy(peer_nonce_.data(), message.data() + 16, kLinkNonceBytes);
      out_ = EncodeLinkChallenge(
          rank_, own_nonce_, LinkMac(key_, "acceptor", peer_, rank_, peer_nonce_, own_nonce_));
      out_sent_ = 0;
      step_ = Step::kProof;
      in_wanted_ = kLinkProofBytes;
      return;
    }
    case Step::kChallenge: {  // the connector's
      if (GetU32(message, 0) != kLinkChallengeMagic) {
        return Fail(FailedPreconditionError("its answer to our hello is no ring-link challenge "
                                            "(is it this job's worker?)"));
      }
      const int acceptor = GetI32(message, 4);
      if (acceptor != peer_) {
        return Fail(FailedPreconditionError("it says it is rank " + std::to_string(acceptor) +
                                            ", not " + Worker(peer_)));
      }
      std::memcpy(peer_nonce_.data(), message.data() + 8, kLinkNonceBytes);
      const MacBytes expected = LinkMac(key_, "acceptor", rank_, peer_, own_nonce_, peer_nonce_);
      if (!MacMatches(expected, std::string_view(message).substr(8 + kLinkNonceBytes))) {
        return Fail(FailedPreconditionError(
            "the peer did not prove it holds the job key (is it this job's worker?)"));
      }
      out_ = EncodeLinkProof(LinkMac(key_, "connector", rank_, peer_, own_nonce_, peer_nonce_));
      out_sent_ = 0;
      step_ = Step::kFinished;
      return;
    }
    case Step::kProof: {  // the acceptor's
      const MacBytes expected = LinkMac(key_, "connector", peer_, rank_, peer_nonce_, own_nonce_);
      if (GetU32(message, 0) != kLinkProofMagic ||
          !MacMatches(expected, std::string_view(message).substr(4))) {
        return Fail(FailedPreconditionError(
            "its proof is wrong (not this job's key, or a replayed handshake)"));
      }
      step_ = Step::kFinished;
      return;
    }
    case Step::kFinished:
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Both ends at once

namespace {

// An accepted connection whose handshake is under way.
struct Pending {
  int fd = -1;
  std::string peer;  // "HOST:PORT"
  RingLinkHandshake handshake;
  Deadline until;
};

int PollMillis(const Deadline& deadline) {
  // Rounded up, so that a wait does not end just before the deadline and spin.
  const auto left = deadline.when() - SteadyClock::now();
  const int64_t ms =
      (std::chrono::duration_cast<std::chrono::microseconds>(left).count() + 999) / 1000;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

// What the listener refused, for the log, the metric and the timeout's error.
class Refusals {
 public:
  explicit Refusals(const RingLinkHandshakeOptions& options) : options_(options) {}

  void Refuse(Pending& pending, const std::string& why) {
    close(pending.fd);
    pending.fd = -1;
    ++count_;
    last_ = "the last from " + pending.peer + ": " + why;
    if (options_.auth_failures != nullptr) options_.auth_failures->Increment();
    // Rate-limited: a scanner or a stuck foreign client must not flood the log.
    if (count_ <= 10 || count_ % 100 == 0) {
      TLOG(WARNING) << options_.where << "refused a ring-link connection from " << pending.peer
                    << " (waiting for " << Worker(options_.prev) << "): " << why << " ("
                    << count_ << " refused so far)";
    }
  }

  // "; refused 3 connections that did not complete the job-key handshake, the last from
  // 127.0.0.1:4567: its proof is wrong (...)".
  std::string Summary() const {
    if (count_ == 0) return "";
    return "; refused " + std::to_string(count_) + " connection" + (count_ == 1 ? "" : "s") +
           " that did not complete the job-key handshake, " + last_;
  }

 private:
  const RingLinkHandshakeOptions& options_;
  int64_t count_ = 0;
  std::string last_;
};

std::string PeerName(const sockaddr_in& peer) {
  char host[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &peer.sin_addr, host, sizeof(host));
  return std::string(host) + ":" + std::to_string(ntohs(peer.sin_port));
}

}  // namespace

StatusOr<AuthenticatedPrev> RunRingLinkHandshakes(const RingLinkHandshakeOptions& options,
                                                  int to_next, int listener) {
  const std::string link_to =
      "ring link to " + Worker(options.next) + " (" + options.next_address + ")";
  Refusals refusals(options);
  std::vector<Pending> pending;
  AuthenticatedPrev prev;
  auto close_pending = [&pending] {
    for (Pending& p : pending) {
      if (p.fd >= 0) close(p.fd);
    }
    pending.clear();
  };
  // Takes a pending connection that proved to be prev, or refuses one that failed or ran out
  // of time.
  auto settle = [&](Pending& p) {
    switch (p.handshake.state()) {
      case RingLinkHandshake::State::kDone:
        if (prev.fd < 0) {
          prev.fd = std::exchange(p.fd, -1);
          prev.address = "tcp://" + p.peer;
          prev.from_prev = p.handshake.session();
        }
        break;
      case RingLinkHandshake::State::kFailed:
        refusals.Refuse(p, p.handshake.failure().message());
        break;
      case RingLinkHandshake::State::kRunning:
        if (p.until.Expired()) {
          refusals.Refuse(p, "did not complete the handshake within " +
                                 std::to_string(options.per_connection_ms) + " ms");
        }
        break;
    }
  };

  bool outbound_done = to_next < 0;
  RingLinkHandshake outbound = RingLinkHandshake::Connector(
      to_next, options.link_key, options.rank, options.next, options.records);
  if (!outbound_done) outbound.Advance();
  const bool inbound = listener >= 0;
  if (inbound) fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);

  while (true) {
    if (!outbound_done) {
      if (outbound.state() == RingLinkHandshake::State::kFailed) {
        close_pending();
        if (prev.fd >= 0) close(prev.fd);
        // A peer that is not ours (it failed to prove the key, or answered with bytes that are
        // no challenge) counts as a refusal too; a closed connection is the peer's refusal.
        if (options.auth_failures != nullptr &&
            outbound.failure().code() == StatusCode::kFailedPrecondition) {
          options.auth_failures->Increment();
        }
        return outbound.failure().WithContext(options.where + link_to);
      }
      outbound_done = outbound.state() == RingLinkHandshake::State::kDone;
    }
    if (outbound_done && (!inbound || prev.fd >= 0)) {
      if (to_next >= 0) prev.to_next = outbound.session();
      return prev;
    }
    if (options.deadline.Expired()) {
      close_pending();
      if (prev.fd >= 0) close(prev.fd);
      if (!outbound_done) {
        return DeadlineExceededError(options.where + link_to + ": no answer to our hello within " +
                                     std::to_string(options.timeout_ms) + " ms");
      }
      return DeadlineExceededError(options.where + Worker(options.prev) +
                                   " did not connect within " +
                                   std::to_string(options.timeout_ms) + " ms" +
                                   refusals.Summary());
    }

    // One poll over next's socket, the listener and every pending connection, until the
    // earliest deadline among them.
    std::vector<pollfd> fds;
    Deadline wake = options.deadline;
    const size_t outbound_at = fds.size();
    if (!outbound_done) fds.push_back({to_next, outbound.events(), 0});
    const size_t listener_at = fds.size();
    const bool accepting = inbound && prev.fd < 0;
    if (accepting) fds.push_back({listener, POLLIN, 0});
    const size_t pending_at = fds.size();
    for (const Pending& p : pending) {
      fds.push_back({p.fd, p.handshake.events(), 0});
      if (p.until.when() < wake.when()) wake = p.until;
    }
    const int ready = poll(fds.data(), fds.size(), PollMillis(wake));
    if (ready < 0 && errno != EINTR) {
      close_pending();
      if (prev.fd >= 0) close(prev.fd);
      return UnavailableError(options.where + "poll: " + std::strerror(errno));
    }

    if (!outbound_done && fds[outbound_at].revents != 0) outbound.Advance();
    const size_t polled = pending.size();
    for (size_t i = 0; i < polled; ++i) {
      if (fds[pending_at + i].revents != 0) pending[i].handshake.Advance();
      settle(pending[i]);
    }
    if (accepting && fds[listener_at].revents != 0) {
      while (true) {
        sockaddr_in peer{};
        socklen_t peer_length = sizeof(peer);
        const int fd = accept4(listener, reinterpret_cast<sockaddr*>(&peer), &peer_length,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          close_pending();
          if (prev.fd >= 0) close(prev.fd);
          return UnavailableError(options.where + "accept: " + std::strerror(errno));
        }
        size_t live = 0;
        for (const Pending& p : pending) live += p.fd >= 0 ? 1 : 0;
        if (live >= kMaxPendingLinkHandshakes) {
          for (Pending& p : pending) {  // the oldest still pending makes way
            if (p.fd < 0) continue;
            refusals.Refuse(p, "crowded out by " + std::to_string(kMaxPendingLinkHandshakes) +
                                   " newer connections before it completed the handshake");
            break;
          }
        }
        const int64_t allowed =
            std::min(options.per_connection_ms, options.deadline.RemainingMillis());
        pending.push_back(Pending{fd, PeerName(peer),
                                  RingLinkHandshake::Acceptor(fd, options.link_key, options.rank,
                                                              options.prev,
                                                              options.records !=
                                                                  LinkCipher::kNone),
                                  Deadline::AfterMillis(allowed)});
        pending.back().handshake.Advance();  // its hello may be here already
        settle(pending.back());
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return p.fd < 0; }),
                  pending.end());
    // Prev is in: whatever else is pending is not from it (it connects once). It has not
    // proved the key, so it is refused like the rest.
    if (prev.fd >= 0) {
      for (Pending& p : pending) {
        refusals.Refuse(p, "had not completed the handshake when " + Worker(options.prev) +
                               "'s connection did");
      }
      pending.clear();
    }
  }
}

}  // namespace tessera::worker
