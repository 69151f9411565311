// The ring links' record layer (Credentials kEncrypt): after the handshake
// (ring_link_handshake.h), every byte a ring link carries, frame headers and payloads alike,
// travels sealed in AEAD records.
//
// Record (all integers little-endian):
//   length u32       the plaintext's bytes, 1..kMaxRecordBytes; in the clear, authenticated
//                    as the record's associated data
//   ciphertext       `length` bytes
//   tag              16 bytes
// sealed with AES-256-GCM, or ChaCha20-Poly1305 (IETF) where the CPU has no AES instructions
// (libsodium's AES-GCM needs them). The nonce is 12 bytes: 4 zero bytes and the record's
// sequence number (u64, from 0, one per record, never reused: a sealer refuses to seal past
// 2^64 - 1 records, which would wrap it).
//
// Keys: one per connection. A ring link's TCP connection carries frames one way only, from its
// connector (rank r) to its acceptor (r's next), so a connection's single direction has a key
// of its own:
//   RecordKey = BLAKE2b-256 keyed with the job key's "ring-link-aead" subkey, over the
//               length-prefixed parts "tessera ring-link records v1", "connector-to-acceptor",
//               the cipher's name, connector rank (u32), acceptor rank (u32), nonce_c, nonce_a
// where nonce_c and nonce_a are the handshake's fresh nonces: every connection, and every
// reconnection, seals under a fresh key, so the counter nonce starting at 0 is never reused
// under one key, and records recorded from one connection mean nothing on another.
//
// What opening guarantees: the receiver expects sequence number n for its n-th record, so a
// record tampered with (length, ciphertext or tag), dropped, replayed, reordered, from another
// connection or another key fails authentication, and the link fails (a byte stream cannot be
// resynchronised). A stream cut short ends mid-record or mid-frame (the links report the
// close). The length is checked against kMaxRecordBytes before anything is read into place, so
// a receiver never buffers more than one record's worth it has not authenticated.
//
// How the links cut frames into records (ring_links.cc): a frame's 64-byte header is one record
// and its payload follows in records of at most kSendRecordBytes, so a receiver opens each
// record in place where its plaintext belongs (the header buffer, the payload's buffer or the
// caller's landing).
//
// Thread-safety: a RecordSealer or RecordOpener is used by one thread at a time (the links
// hold their mutex).
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_CIPHER_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_CIPHER_H_

#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/status.h"
#include "common/security/job_key.h"

namespace tessera::worker {

// The record protection a connector asks for in its hello (ring_link_handshake.h); kNone:
// authentication only, frames in the clear.
enum class LinkCipher : uint16_t { kNone = 0, kAes256Gcm = 1, kChaCha20Poly1305 = 2 };

inline constexpr size_t kRecordLengthBytes = 4;
inline constexpr size_t kRecordTagBytes = 16;
inline constexpr size_t kRecordOverheadBytes = kRecordLengthBytes + kRecordTagBytes;
// The largest record a receiver accepts, and the largest a sender makes.
inline constexpr size_t kMaxRecordBytes = size_t{1} << 20;
inline constexpr size_t kSendRecordBytes = size_t{256} << 10;

// AES-256-GCM where this CPU can run it (AES-NI and PCLMUL), ChaCha20-Poly1305 otherwise.
LinkCipher PreferredLinkCipher();
// Whether this machine can seal and open `cipher`'s records (kNone: false).
bool LinkCipherAvailable(LinkCipher cipher);
// "AES-256-GCM", "ChaCha20-Poly1305", "none".
std::string_view LinkCipherName(LinkCipher cipher);

// The job key's subkey every record key is derived from.
KeyBytes RingLinkAeadKey(const JobKey& key);
// The key of the records of one connection (see the file comment). `nonce_c`, `nonce_a`: the
// handshake's nonces.
KeyBytes RecordKey(const KeyBytes& aead_key, LinkCipher cipher, int connector, int acceptor,
                   std::string_view nonce_c, std::string_view nonce_a);

// The length a record's prefix declares. InvalidArgument for 0 or more than kMaxRecordBytes.
StatusOr<size_t> DecodeRecordLength(const uint8_t* prefix);

// Seals one connection's records, numbering them.
class RecordSealer {
 public:
  // REQUIRES: LinkCipherAvailable(cipher).
  RecordSealer(LinkCipher cipher, const KeyBytes& key);
  ~RecordSealer();
  RecordSealer(const RecordSealer&) = delete;
  RecordSealer& operator=(const RecordSealer&) = delete;

  // Writes the record of [in, in + bytes) to `out` (bytes + kRecordOverheadBytes of it; `out`
  // may not overlap `in`). REQUIRES: 1 <= bytes <= kMaxRecordBytes. ResourceExhausted once the
  // sequence number would wrap (the link must fail: nothing more can be sealed).
  Status Seal(const uint8_t* in, size_t bytes, uint8_t* out);

  uint64_t sealed() const { return sequence_; }

 private:
  friend class RecordOpener;
  LinkCipher cipher_;
  KeyBytes key_;
  crypto_aead_aes256gcm_state aes_;  // expanded key, for kAes256Gcm
  uint64_t sequence_ = 0;            // the next record's
  bool exhausted_ = false;
};

// Opens one connection's records in order.
class RecordOpener {
 public:
  // REQUIRES: LinkCipherAvailable(cipher).
  RecordOpener(LinkCipher cipher, const KeyBytes& key);
  ~RecordOpener();
  RecordOpener(const RecordOpener&) = delete;
  RecordOpener& operator=(const RecordOpener&) = delete;

  // Opens the next record in place: `prefix` its 4 length bytes as received, [data, data +
  // bytes) its ciphertext (replaced by the plaintext; garbage if it fails), `tag` its 16 tag
  // bytes. `bytes` must be what the prefix declares. DataLoss "a record failed authentication
  // (tampered or not from the job)" otherwise, or if the record is not the next one sealed
  // under this key; once failed, the opener stays failed.
  Status Open(const uint8_t* prefix, uint8_t* data, size_t bytes, const uint8_t* tag);

  uint64_t opened() const { return sequence_; }

 private:
  LinkCipher cipher_;
  KeyBytes key_;
  crypto_aead_aes256gcm_state aes_;
  uint64_t sequence_ = 0;  // the next record's
  bool failed_ = false;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_CIPHER_H_
