#include "common/security/connect_token.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/security/mac.h"

namespace tessera {
namespace {

constexpr uint8_t kTokenVersion = 1;
constexpr size_t kNonceBytes = 16;
constexpr std::string_view kPurpose = "zap-token";
constexpr std::string_view kLabel = "tessera connect";

void PutIssued(int64_t issued, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(issued) >> (8 * i));
}

int64_t GetIssued(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{in[i]} << (8 * i);
  return static_cast<int64_t>(value);
}

MacBytes TokenMac(const KeyBytes& key, const uint8_t* body) {
  return Mac(key, {kLabel, AsText(body, 1), AsText(body + 1, 8), AsText(body + 9, kNonceBytes)});
}

}  // namespace

int64_t WallClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string MakeConnectToken(const JobKey& key, int64_t now_ms) {
  std::string token(kConnectTokenBytes, '\0');
  uint8_t* bytes = reinterpret_cast<uint8_t*>(token.data());
  bytes[0] = kTokenVersion;
  PutIssued(now_ms, bytes + 1);
  RandomBytes(bytes + 9, kNonceBytes);
  const MacBytes mac = TokenMac(key.Derive(kPurpose), bytes);
  std::memcpy(bytes + 9 + kNonceBytes, mac.data(), mac.size());
  return token;
}

ConnectTokenVerifier::ConnectTokenVerifier(const JobKey& key) : key_(key.Derive(kPurpose)) {}

TokenVerdict ConnectTokenVerifier::Verify(std::string_view token, int64_t now_ms) {
  TokenVerdict verdict;
  if (token.size() != kConnectTokenBytes || static_cast<uint8_t>(token[0]) != kTokenVersion) {
    verdict.reason = "malformed";
    verdict.detail = "the password is not a Tessera connection token (" +
                     std::to_string(token.size()) + " bytes)";
    return verdict;
  }
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(token.data());
  if (!MacMatches(TokenMac(key_, bytes), token.substr(9 + kNonceBytes))) {
    verdict.reason = "wrong_key";
    verdict.detail = "the token was not made with this job's key";
    return verdict;
  }
  const int64_t issued = GetIssued(bytes + 1);
  // |now - issued| in unsigned arithmetic: any two int64 clocks, without overflow.
  const bool ahead = issued > now_ms;
  const uint64_t skew = ahead ? uint64_t(issued) - uint64_t(now_ms)
                              : uint64_t(now_ms) - uint64_t(issued);
  if (skew > uint64_t{kTokenWindowMs}) {
    verdict.reason = "expired";
    verdict.detail = "the token was issued " + std::to_string(skew / 1000) + " s " +
                     (ahead ? "ahead of" : "before") + " this host's clock (" +
                     std::to_string(kTokenWindowMs / 1000) +
                     " s allowed: are the hosts' clocks apart?)";
    return verdict;
  }
  // Forget what the window has passed (saturating: `now_ms` may be near the int64 limits).
  const int64_t window_start = now_ms < INT64_MIN + kTokenWindowMs ? INT64_MIN
                                                                    : now_ms - kTokenWindowMs;
  while (!by_issue_.empty() && by_issue_.front().first < window_start) {
    seen_.erase(by_issue_.front().second);
    by_issue_.pop_front();
  }
  std::string nonce(token.substr(9, kNonceBytes));
  if (!seen_.insert(nonce).second) {
    verdict.reason = "replayed";
    verdict.detail = "the token was already used (a replayed handshake)";
    return verdict;
  }
  // Tokens arrive roughly in issue order; one issued earlier than the newest is still
  // forgotten no later than the window after the newest.
  by_issue_.emplace_back(std::max(issued, by_issue_.empty() ? issued : by_issue_.back().first),
                         std::move(nonce));
  verdict.ok = true;
  return verdict;
}

}  // namespace tessera
