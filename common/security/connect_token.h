// Connection tokens: how a ZeroMQ connection proves it holds the job key when traffic is not
// encrypted (on the loopback, or with --encrypt off).
//
// The connecting side presents a fresh token as the password of ZeroMQ's PLAIN mechanism; the
// listener's ZAP handler verifies it before the connection may carry a single message. A token
// is
//
//   version (1 byte) | issued at (8 bytes, ms since the epoch) | nonce (16 bytes)
//   | HMAC-SHA-256(job subkey "zap-token", "tessera connect", version, issued at, nonce)
//
// so it cannot be made without the key; a verifier accepts each nonce once (a replayed
// handshake is refused) and only within kTokenWindowMs of its clock (which bounds what it
// remembers, and allows for clock skew between hosts). Each connection attempt needs a new
// token: ZmqTransport makes one per outgoing socket and replaces a socket whose token was
// refused.
//
// Why not CURVE everywhere: CURVE encrypts every frame, at 0.06-0.39x of unencrypted
// throughput here (notes/learned.md); a token costs one MAC per connection. With encryption
// on, CURVE's own handshake (keys derived from the job key) authenticates instead.
//
// Thread-safety: MakeConnectToken is thread-safe; a ConnectTokenVerifier is used by one thread
// (its transport's I/O thread).
#ifndef TESSERA_COMMON_SECURITY_CONNECT_TOKEN_H_
#define TESSERA_COMMON_SECURITY_CONNECT_TOKEN_H_

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_set>

#include "common/security/job_key.h"

namespace tessera {

inline constexpr int64_t kTokenWindowMs = 10 * 60 * 1000;
inline constexpr size_t kConnectTokenBytes = 1 + 8 + 16 + 32;

// A new token (binary, kConnectTokenBytes long) issued at `now_ms`.
std::string MakeConnectToken(const JobKey& key, int64_t now_ms);

// Milliseconds since the epoch (the clock tokens carry).
int64_t WallClockMs();

// Why a token was refused: the label of tessera_auth_failures_total{reason} and a sentence.
struct TokenVerdict {
  bool ok = false;
  std::string_view reason;  // "malformed", "wrong_key", "expired", "replayed"; empty when ok
  std::string detail;
};

class ConnectTokenVerifier {
 public:
  explicit ConnectTokenVerifier(const JobKey& key);

  TokenVerdict Verify(std::string_view token, int64_t now_ms);

  // Nonces remembered (for tests).
  size_t remembered() const { return seen_.size(); }

 private:
  KeyBytes key_;
  // Nonces of accepted tokens and when they were issued, oldest first: one older than the
  // window is forgotten, since its token would be refused as expired anyway.
  std::unordered_set<std::string> seen_;
  std::deque<std::pair<int64_t, std::string>> by_issue_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_SECURITY_CONNECT_TOKEN_H_
