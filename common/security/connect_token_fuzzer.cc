// Fuzz target (issue 15): a PLAIN password as a ZAP request hands it to the listener
// (ConnectTokenVerifier::Verify), with the first 8 bytes of the input as the verifier's clock.
// Whatever is accepted is accepted once. Seeds: connect_token_fuzz_corpus/ (one a genuine token
// of the fuzzer's key, so the accepting path is covered).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/security/connect_token.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static const JobKey key = JobKey::FromBytes(KeyBytes{1, 2, 3, 4, 5, 6, 7, 8, 9});
  int64_t now = 1'800'000'000'000;
  if (size >= sizeof(now)) {
    std::memcpy(&now, data, sizeof(now));
    data += sizeof(now);
    size -= sizeof(now);
  }
  ConnectTokenVerifier verifier(key);
  const std::string_view token(reinterpret_cast<const char*>(data), size);
  const TokenVerdict verdict = verifier.Verify(token, now);
  if (verdict.ok && verifier.Verify(token, now).reason != "replayed") __builtin_trap();
  if (!verdict.ok && (verdict.reason.empty() || verdict.detail.empty())) __builtin_trap();
  // A genuine token at that clock is accepted once, even after whatever came before.
  const std::string genuine = MakeConnectToken(key, now);
  if (!verifier.Verify(genuine, now).ok || verifier.Verify(genuine, now).ok) __builtin_trap();
  return 0;
}
