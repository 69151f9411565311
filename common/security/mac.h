// Message authentication with a job subkey: HMAC-SHA-256 over the concatenation of labelled
// parts, and a constant-time comparison. The building block of the connection tokens
// (connect_token.h) and the ring links' challenge-response handshake.
//
// Thread-safety: functions only.
#ifndef TESSERA_COMMON_SECURITY_MAC_H_
#define TESSERA_COMMON_SECURITY_MAC_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "common/security/job_key.h"

namespace tessera {

inline constexpr size_t kMacBytes = 32;
using MacBytes = std::array<uint8_t, kMacBytes>;

// HMAC-SHA-256 under `key` of the parts, each preceded by its length (so that ("ab", "c") and
// ("a", "bc") differ).
MacBytes Mac(const KeyBytes& key, std::initializer_list<std::string_view> parts);

// Whether `mac` (any length) equals `expected`, in time independent of where they differ.
bool MacMatches(const MacBytes& expected, std::string_view mac);

// `n` bytes from the kernel's random source (nonces, challenges).
void RandomBytes(uint8_t* out, size_t n);

// Bytes as a string_view, for Mac's parts.
inline std::string_view AsText(const uint8_t* bytes, size_t n) {
  return std::string_view(reinterpret_cast<const char*>(bytes), n);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_SECURITY_MAC_H_
