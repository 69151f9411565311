#include "common/security/connect_token.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

constexpr int64_t kNow = 1'800'000'000'000;

TEST(ConnectTokenTest, AFreshTokenIsAcceptedOnceThenRefusedAsReplayed) {
  const JobKey key = JobKey::Generate();
  ConnectTokenVerifier verifier(key);
  const std::string token = MakeConnectToken(key, kNow);
  EXPECT_EQ(token.size(), kConnectTokenBytes);
  EXPECT_TRUE(verifier.Verify(token, kNow + 5).ok);
  TokenVerdict again = verifier.Verify(token, kNow + 10);
  EXPECT_FALSE(again.ok);
  EXPECT_EQ(again.reason, "replayed");
  EXPECT_TRUE(verifier.Verify(MakeConnectToken(key, kNow), kNow).ok);
}

TEST(ConnectTokenTest, AnotherKeysTokenIsRefused) {
  ConnectTokenVerifier verifier(JobKey::Generate());
  TokenVerdict verdict = verifier.Verify(MakeConnectToken(JobKey::Generate(), kNow), kNow);
  EXPECT_FALSE(verdict.ok);
  EXPECT_EQ(verdict.reason, "wrong_key");
}

TEST(ConnectTokenTest, EveryAlteredByteIsRefused) {
  const JobKey key = JobKey::Generate();
  ConnectTokenVerifier verifier(key);
  const std::string token = MakeConnectToken(key, kNow);
  for (size_t i = 0; i < token.size(); ++i) {
    std::string altered = token;
    altered[i] = static_cast<char>(altered[i] ^ 0x01);
    EXPECT_FALSE(verifier.Verify(altered, kNow).ok) << "byte " << i;
  }
  EXPECT_EQ(verifier.Verify(token.substr(1), kNow).reason, "malformed");
  EXPECT_EQ(verifier.Verify("", kNow).reason, "malformed");
}

TEST(ConnectTokenTest, TokensOutsideTheWindowAreRefusedAndOldNoncesForgotten) {
  const JobKey key = JobKey::Generate();
  ConnectTokenVerifier verifier(key);
  EXPECT_EQ(verifier.Verify(MakeConnectToken(key, kNow - kTokenWindowMs - 1), kNow).reason,
            "expired");
  EXPECT_EQ(verifier.Verify(MakeConnectToken(key, kNow + kTokenWindowMs + 1), kNow).reason,
            "expired");
  EXPECT_TRUE(verifier.Verify(MakeConnectToken(key, kNow - kTokenWindowMs), kNow).ok);
  EXPECT_TRUE(verifier.Verify(MakeConnectToken(key, kNow), kNow).ok);
  EXPECT_EQ(verifier.remembered(), 2u);
  // A window later the first is forgotten (its token would be expired); the second is not.
  EXPECT_TRUE(verifier.Verify(MakeConnectToken(key, kNow + 1), kNow + 1).ok);
  EXPECT_EQ(verifier.remembered(), 2u);
}

// Found by connect_token_fuzzer: the skew of a token from a clock near the int64 limits
// overflowed (undefined behaviour) while the refusal was worded.
TEST(ConnectTokenTest, ClocksAtTheLimitsAreRefusedWithoutOverflow) {
  const JobKey key = JobKey::Generate();
  ConnectTokenVerifier verifier(key);
  for (int64_t issued : {INT64_MIN, int64_t{0}, INT64_MAX}) {
    for (int64_t now : {INT64_MIN, int64_t{-1}, INT64_MAX}) {
      TokenVerdict verdict = verifier.Verify(MakeConnectToken(key, issued), now);
      EXPECT_EQ(verdict.ok, issued == now || (issued == 0 && now == -1))
          << issued << " at " << now << ": " << verdict.detail;
      if (!verdict.ok) {
        EXPECT_EQ(verdict.reason, "expired");
      }
    }
  }
  EXPECT_EQ(verifier.Verify(MakeConnectToken(key, kNow - 3600 * 1000), kNow).detail,
            "the token was issued 3600 s before this host's clock (600 s allowed: are the "
            "hosts' clocks apart?)");
}

}  // namespace
}  // namespace tessera
