#include "common/security/mac.h"

#include <sodium.h>

#include <cstdio>
#include <cstdlib>

namespace tessera {

MacBytes Mac(const KeyBytes& key, std::initializer_list<std::string_view> parts) {
  if (sodium_init() < 0) std::abort();
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, key.data(), key.size());
  for (std::string_view part : parts) {
    uint8_t length[8];
    uint64_t size = part.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(size >> (8 * i));
    crypto_auth_hmacsha256_update(&state, length, sizeof(length));
    crypto_auth_hmacsha256_update(&state, reinterpret_cast<const uint8_t*>(part.data()),
                                  part.size());
  }
  MacBytes mac;
  crypto_auth_hmacsha256_final(&state, mac.data());
  sodium_memzero(&state, sizeof(state));
  return mac;
}

bool MacMatches(const MacBytes& expected, std::string_view mac) {
  if (mac.size() != expected.size()) return false;
  return sodium_memcmp(expected.data(), mac.data(), expected.size()) == 0;
}

void RandomBytes(uint8_t* out, size_t n) {
  if (sodium_init() < 0) std::abort();
  randombytes_buf(out, n);
}

}  // namespace tessera
