#include "worker/collectives/channel/links/ring_link_cipher.h"

#include <cstring>
#include <limits>
#include <string>

namespace tessera::worker {
namespace {

constexpr std::string_view kRecordKeyLabel = "tessera ring-link records v1";
constexpr size_t kNonceBytes = 12;
static_assert(crypto_aead_aes256gcm_NPUBBYTES == kNonceBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == kNonceBytes);
static_assert(crypto_aead_aes256gcm_ABYTES == kRecordTagBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == kRecordTagBytes);
static_assert(crypto_aead_aes256gcm_KEYBYTES == kJobKeyBytes);
static_assert(crypto_aead_chacha20poly1305_ietf_KEYBYTES == kJobKeyBytes);

// sodium_init detects the CPU's features, which crypto_aead_aes256gcm_is_available reports;
// it is idempotent and thread-safe.
bool SodiumReady() {
  static const bool ready = sodium_init() >= 0;
  return ready;
}

void PutU32(uint8_t* at, uint32_t value) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<uint8_t>(value >> (8 * i));
}

// 4 zero bytes, then the sequence number.
void Nonce(uint64_t sequence, uint8_t* nonce) {
  std::memset(nonce, 0, 4);
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(sequence >> (8 * i));
}

// Length-prefixed, as common/security/mac.h's parts are.
void Absorb(crypto_generichash_state* state, std::string_view part) {
  uint8_t length[4];
  PutU32(length, static_cast<uint32_t>(part.size()));
  crypto_generichash_update(state, length, sizeof(length));
  crypto_generichash_update(state, reinterpret_cast<const uint8_t*>(part.data()), part.size());
}

Status AuthenticationFailure() {
  return DataLossError("a record failed authentication (tampered or not from the job)");
}

}  // namespace

LinkCipher PreferredLinkCipher() {
  return LinkCipherAvailable(LinkCipher::kAes256Gcm) ? LinkCipher::kAes256Gcm
                                                     : LinkCipher::kChaCha20Poly1305;
}

bool LinkCipherAvailable(LinkCipher cipher) {
  if (!SodiumReady()) return false;
  switch (cipher) {
    case LinkCipher::kAes256Gcm:
      return crypto_aead_aes256gcm_is_available() == 1;
    case LinkCipher::kChaCha20Poly1305:
      return true;
    case LinkCipher::kNone:
      return false;
  }
  return false;
}

std::string_view LinkCipherName(LinkCipher cipher) {
  switch (cipher) {
    case LinkCipher::kAes256Gcm:
      return "AES-256-GCM";
    case LinkCipher::kChaCha20Poly1305:
      return "ChaCha20-Poly1305";
    case LinkCipher::kNone:
      return "none";
  }
  return "unknown";
}

KeyBytes RingLinkAeadKey(const JobKey& key) { return key.Derive("ring-link-aead"); }

KeyBytes RecordKey(const KeyBytes& aead_key, LinkCipher cipher, int connector, int acceptor,
                   std::string_view nonce_c, std::string_view nonce_a) {
  SodiumReady();
  crypto_generichash_state state;
  crypto_generichash_init(&state, aead_key.data(), aead_key.size(), kJobKeyBytes);
  uint8_t ranks[8];
  PutU32(ranks, static_cast<uint32_t>(connector));
  PutU32(ranks + 4, static_cast<uint32_t>(acceptor));
  const auto text = [](const uint8_t* bytes, size_t n) {
    return std::string_view(reinterpret_cast<const char*>(bytes), n);
  };
  for (std::string_view part : {kRecordKeyLabel, std::string_view("connector-to-acceptor"),
                                LinkCipherName(cipher), text(ranks, 4), text(ranks + 4, 4),
                                nonce_c, nonce_a}) {
    Absorb(&state, part);
  }
  KeyBytes out;
  crypto_generichash_final(&state, out.data(), out.size());
  sodium_memzero(&state, sizeof(state));
  return out;
}

StatusOr<size_t> DecodeRecordLength(const uint8_t* prefix) {
  const uint32_t length = uint32_t{prefix[0]} | (uint32_t{prefix[1]} << 8) |
                          (uint32_t{prefix[2]} << 16) | (uint32_t{prefix[3]} << 24);
  if (length == 0 || length > kMaxRecordBytes) {
    return InvalidArgumentError("a record declares " + std::to_string(length) +
                                " bytes (1 to " + std::to_string(kMaxRecordBytes) +
                                " allowed)");
  }
  return static_cast<size_t>(length);
}

// ---------------------------------------------------------------------------------------------

RecordSealer::RecordSealer(LinkCipher cipher, const KeyBytes& key) : cipher_(cipher), key_(key) {
  SodiumReady();
  if (cipher_ == LinkCipher::kAes256Gcm) crypto_aead_aes256gcm_beforenm(&aes_, key_.data());
}

RecordSealer::~RecordSealer() {
  sodium_memzero(key_.data(), key_.size());
  sodium_memzero(&aes_, sizeof(aes_));
}

Status RecordSealer::Seal(const uint8_t* in, size_t bytes, uint8_t* out) {
  if (exhausted_ || sequence_ == std::numeric_limits<uint64_t>::max()) {
    exhausted_ = true;
    return ResourceExhaustedError("sealed 2^64 - 1 records under one key: the sequence number "
                                  "would wrap (reconnect for a fresh key)");
  }
  uint8_t nonce[kNonceBytes];
  Nonce(sequence_, nonce);
  PutU32(out, static_cast<uint32_t>(bytes));
  uint8_t* ciphertext = out + kRecordLengthBytes;
  uint8_t* tag = ciphertext + bytes;
  unsigned long long tag_bytes = 0;
  const int sealed =
      cipher_ == LinkCipher::kAes256Gcm
          ? crypto_aead_aes256gcm_encrypt_detached_afternm(ciphertext, tag, &tag_bytes, in,
                                                           bytes, out, kRecordLengthBytes,
                                                           nullptr, nonce, &aes_)
          : crypto_aead_chacha20poly1305_ietf_encrypt_detached(ciphertext, tag, &tag_bytes, in,
                                                               bytes, out, kRecordLengthBytes,
                                                               nullptr, nonce, key_.data());
  if (sealed != 0) return InternalError("sealing a record failed");
  ++sequence_;
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------

RecordOpener::RecordOpener(LinkCipher cipher, const KeyBytes& key) : cipher_(cipher), key_(key) {
  SodiumReady();
  if (cipher_ == LinkCipher::kAes256Gcm) crypto_aead_aes256gcm_beforenm(&aes_, key_.data());
}

RecordOpener::~RecordOpener() {
  sodium_memzero(key_.data(), key_.size());
  sodium_memzero(&aes_, sizeof(aes_));
}

Status RecordOpener::Open(const uint8_t* prefix, uint8_t* data, size_t bytes,
                          const uint8_t* tag) {
  if (failed_ || sequence_ == std::numeric_limits<uint64_t>::max()) {
    failed_ = true;
    return AuthenticationFailure();
  }
  StatusOr<size_t> declared = DecodeRecordLength(prefix);
  if (!declared.ok() || *declared != bytes) {
    failed_ = true;
    return AuthenticationFailure();
  }
  uint8_t nonce[kNonceBytes];
  Nonce(sequence_, nonce);
  // In place: libsodium's detached decryption allows m == c.
  const int opened =
      cipher_ == LinkCipher::kAes256Gcm
          ? crypto_aead_aes256gcm_decrypt_detached_afternm(data, nullptr, data, bytes, tag,
                                                           prefix, kRecordLengthBytes, nonce,
                                                           &aes_)
          : crypto_aead_chacha20poly1305_ietf_decrypt_detached(data, nullptr, data, bytes, tag,
                                                               prefix, kRecordLengthBytes,
                                                               nonce, key_.data());
  if (opened != 0) {
    failed_ = true;
    return AuthenticationFailure();
  }
  ++sequence_;
  return OkStatus();
}

}  // namespace tessera::worker
