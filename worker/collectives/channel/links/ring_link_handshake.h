// The ring links' handshake: how the two ends of a TCP ring link prove to each other that
// they hold the job key before a single frame crosses it (Credentials kAuthenticate and
// kEncrypt; under kNone ring_links.cc sends a bare hello instead).
//
// Wire, all integers little-endian; k is the job key's "ring-link" subkey (JobKey::Derive):
//
//   hello      connector -> acceptor, 48 bytes
//              magic "TRLH" (u32) | version 1 (u16) | records (u16) | connector rank (i32)
//              | acceptor rank (i32) | nonce_c (32 random bytes)
//   challenge  acceptor -> connector, 72 bytes, sent only for a hello from our predecessor
//              to us
//              magic "TRLC" (u32) | acceptor rank (i32) | nonce_a (32 random bytes)
//              | MAC(k, "tessera ring-link v1", "acceptor", ranks, nonce_c, nonce_a)
//   proof      connector -> acceptor, 36 bytes, sent only once the challenge's MAC checks out
//              magic "TRLP" (u32) | MAC(k, "tessera ring-link v1", "connector", ranks,
//                                       nonce_c, nonce_a)
//
// where records is the record protection the connector will send frames with (LinkCipher,
// ring_link_cipher.h: 0, in the clear, under kAuthenticate; 1 AES-256-GCM or 2
// ChaCha20-Poly1305 under kEncrypt), ranks is (connector rank, acceptor rank) and MAC is
// HMAC-SHA-256 over length-prefixed parts (common/security/mac.h), compared in constant time.
// Frames (ring_frame_codec.h), or kEncrypt's records, follow the proof on the same stream; the
// acceptor reads exactly the handshake's bytes.
//
// Why each piece: each side's MAC covers a nonce the other side just drew, so a recorded
// handshake replayed later fails (the acceptor's fresh nonce_a differs; the connector's
// nonce_c makes an old challenge worthless). The direction label keeps a MAC one side made
// from being reflected back as the other side's. The ranks bind a proof to one hop of the
// ring, so a proof for 1 -> 2 says nothing for 3 -> 4. The acceptor answers only a hello from
// its predecessor to itself; the MAC it sends then is no use to anyone without the key.
//
// The acceptor side (RunRingLinkHandshakes) keeps accepting until its predecessor's connection
// has proved itself, within the Connect deadline: a connection that sends garbage, the wrong
// rank or MAC, or nothing at all is closed, logged with its address (the first 10, then every
// 100th) and counted, and the listener goes on. Several pending connections are handshaken at
// once (one poll over all of them), each within its own kLinkHandshakeMs, so a silent one
// delays nobody; at most kMaxPendingLinkHandshakes are pending, the oldest making way for a
// new one (so a flood of idle connections cannot hold the real one off unless
// kMaxPendingLinkHandshakes newer ones arrive within its round trip). Connections still
// pending when prev has proved itself are refused (and counted) too.
//
// Encryption (kEncrypt): the connector proposes AES-256-GCM where its CPU runs it and
// ChaCha20-Poly1305 otherwise; the acceptor refuses a hello whose `records` disagrees with its
// own protection (one end encrypts, the other not) or names a cipher it cannot open, saying
// so. The MACs do not cover `records`, the record keys do (ring_link_cipher.h): a hello whose
// cipher was changed on the way leads to keys that differ, so the first record fails; one
// changed to "in the clear" is refused by an acceptor that encrypts. Both ends then know the
// connection's LinkSession (cipher, nonce_c, nonce_a), from which its record key is derived.
//
// Thread-safety: functions are thread-safe; a RingLinkHandshake is driven by one thread.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_HANDSHAKE_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_HANDSHAKE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/security/job_key.h"
#include "common/security/mac.h"
#include "worker/collectives/channel/links/ring_link_cipher.h"

namespace tessera::worker {

inline constexpr uint32_t kLinkHelloMagic = 0x484c5254;      // "TRLH"
inline constexpr uint32_t kLinkChallengeMagic = 0x434c5254;  // "TRLC"
inline constexpr uint32_t kLinkProofMagic = 0x504c5254;      // "TRLP"
inline constexpr uint16_t kLinkHandshakeVersion = 1;
// The magic of the unauthenticated (kNone) hello, recognised to say what is wrong.
inline constexpr uint32_t kLinkPlainHelloMagic = 0x4f4c4548;  // "HELO"

inline constexpr size_t kLinkNonceBytes = 32;
inline constexpr size_t kLinkHelloBytes = 16 + kLinkNonceBytes;
inline constexpr size_t kLinkChallengeBytes = 8 + kLinkNonceBytes + kMacBytes;
inline constexpr size_t kLinkProofBytes = 4 + kMacBytes;

// How long an accepted connection has to complete its handshake (bounded by the Connect
// deadline too). The real predecessor answers within a round trip of its Connect call.
inline constexpr int64_t kLinkHandshakeMs = 2000;
inline constexpr size_t kMaxPendingLinkHandshakes = 16;

using LinkNonce = std::array<uint8_t, kLinkNonceBytes>;

// What both ends of a connection agree on once its handshake is done: the cipher of its
// records (kNone: frames in the clear) and the nonces their key is derived from.
struct LinkSession {
  LinkCipher cipher = LinkCipher::kNone;
  LinkNonce nonce_c{};
  LinkNonce nonce_a{};
};

// The subkey the handshake's MACs use.
KeyBytes RingLinkKey(const JobKey& key);

// The messages, for the handshake below and for tests that play a foreign peer.
std::string EncodeLinkHello(int connector, int acceptor, const LinkNonce& nonce_c,
                            LinkCipher records = LinkCipher::kNone);
// `side`: "acceptor" (the challenge's MAC) or "connector" (the proof's).
MacBytes LinkMac(const KeyBytes& link_key, std::string_view side, int connector, int acceptor,
                 const LinkNonce& nonce_c, const LinkNonce& nonce_a);
std::string EncodeLinkChallenge(int acceptor, const LinkNonce& nonce_a, const MacBytes& mac);
std::string EncodeLinkProof(const MacBytes& mac);

// One end of one connection's handshake over a non-blocking socket (not owned), advanced
// whenever poll() finds the socket ready for events().
class RingLinkHandshake {
 public:
  enum class State { kRunning, kDone, kFailed };

  // The connector (to next) sends its hello (asking for `records`), checks the challenge,
  // sends its proof.
  static RingLinkHandshake Connector(int fd, const KeyBytes& link_key, int rank, int next,
                                     LinkCipher records = LinkCipher::kNone);
  // The acceptor (from prev) checks the hello (that it asks for encrypted records if and only
  // if `encrypt`, with a cipher this machine has), sends the challenge, checks the proof.
  static RingLinkHandshake Acceptor(int fd, const KeyBytes& link_key, int rank, int prev,
                                    bool encrypt = false);

  // Reads and writes what the socket allows now, without blocking.
  State Advance();
  State state() const { return state_; }
  // POLLIN and/or POLLOUT while running.
  short events() const;
  // Why it failed, a sentence about the peer without its name ("its proof is wrong (...)");
  // FailedPrecondition for a peer that is not ours (wrong key, rank, bytes), Unavailable for
  // a closed or broken connection. OK unless failed.
  const Status& failure() const { return failure_; }
  // The connection's cipher and nonces. REQUIRES: state() == kDone.
  LinkSession session() const;

 private:
  enum class Step { kHello, kChallenge, kProof, kFinished };

  RingLinkHandshake(int fd, const KeyBytes& link_key, int rank, int peer, bool connector,
                    LinkCipher records, bool encrypt);
  // Consumes the complete message in in_ (the one `step_` expects).
  void OnMessage();
  void Fail(Status failure);

  int fd_;
  KeyBytes key_;
  int rank_;
  int peer_;  // next for the connector, prev for the acceptor
  bool connector_;
  LinkCipher records_;  // the connector's: what it asks for; the acceptor's: what it was asked
  bool encrypt_;        // the acceptor's: whether it requires encrypted records
  State state_ = State::kRunning;
  Step step_ = Step::kHello;  // the message to receive next (the connector's: kChallenge)
  Status failure_;
  LinkNonce own_nonce_{};
  LinkNonce peer_nonce_{};
  std::string out_;  // to send; out_sent_ of it sent
  size_t out_sent_ = 0;
  std::string in_;  // the message being received
  size_t in_wanted_ = 0;
};

struct RingLinkHandshakeOptions {
  int rank = 0;
  int next = -1;
  int prev = -1;
  std::string next_address;  // for errors
  KeyBytes link_key{};
  // What the connector asks for (kNone: frames in the clear); the acceptor requires encrypted
  // records if and only if this is not kNone.
  LinkCipher records = LinkCipher::kNone;
  Deadline deadline = Deadline::AfterMillis(0);
  int64_t timeout_ms = 0;  // the deadline's length, for errors
  int64_t per_connection_ms = kLinkHandshakeMs;
  Counter* auth_failures = nullptr;  // tessera_auth_failures_total{reason="handshake"}; may be null
  std::string where;                 // "ring links rank=0: ", the prefix of errors and logs
};

struct AuthenticatedPrev {
  int fd = -1;          // non-blocking, owned by the caller from now on; -1 without a listener
  std::string address;  // where it connected from, "tcp://HOST:PORT"
  LinkSession from_prev;  // the session of the connection from prev (fd)
  LinkSession to_next;    // the session of the connection to next (`to_next`)
};

// Runs both ends' handshakes at once (every rank connects first, and its next answers only
// while it runs this, so doing one after the other would deadlock round the ring): the
// connector's on `to_next` (a connected socket, not owned; -1 for none), and the acceptor's on
// connections accepted from `listener` (-1 for none) until one proves to be prev. Errors name
// the peer: "ring link to worker 2 (tcp://...): the peer did not prove it holds the job key
// (is it this job's worker?)"; "worker 1 did not connect within 200 ms; refused 3 connections
// that did not complete the job-key handshake, the last from 127.0.0.1:4567: ...".
StatusOr<AuthenticatedPrev> RunRingLinkHandshakes(const RingLinkHandshakeOptions& options,
                                                  int to_next, int listener);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_HANDSHAKE_H_
