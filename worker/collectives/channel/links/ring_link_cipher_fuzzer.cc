// Fuzz target (issue 15): the record opener of encrypted ring links (ring_link_cipher.h) as a
// receiver meets a peer's bytes. Input: one byte choosing the cipher (even: AES-256-GCM where
// available, odd: ChaCha20-Poly1305), then records as on the wire (length, ciphertext, tag),
// opened in order under a fixed key until one fails. Seeds: ring_link_cipher_fuzz_corpus/
// (records sealed under that key, and damaged ones; written by ring_link_fuzz_seeds).
//
// Besides not crashing: a record that opens is exactly what sealing its plaintext under the
// same key and sequence number gives (the opener accepts nothing else).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/collectives/channel/links/ring_link_cipher.h"
#include "worker/collectives/channel/links/ring_link_fuzz_key.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::worker;
  if (size < 1) return 0;
  const LinkCipher cipher = FuzzRecordCipher(data[0]);
  const KeyBytes key = FuzzRecordKey(cipher);
  RecordOpener opener(cipher, key);
  RecordSealer sealer(cipher, key);
  std::vector<uint8_t> record, again;
  size_t at = 1;
  while (size - at >= kRecordLengthBytes) {
    StatusOr<size_t> length = DecodeRecordLength(data + at);
    if (!length.ok()) return 0;
    if (*length == 0 || *length > kMaxRecordBytes) __builtin_trap();  // the decoder's promise
    const size_t whole = kRecordOverheadBytes + *length;
    if (size - at < whole) return 0;  // a stream would wait for more
    record.assign(data + at, data + at + whole);
    uint8_t* body = record.data() + kRecordLengthBytes;
    if (!opener.Open(record.data(), body, *length, body + *length).ok()) {
      // A failed opener stays failed, even for the next record.
      if (opener.Open(data + at, body, *length, body + *length).ok()) __builtin_trap();
      return 0;
    }
    again.resize(whole);
    if (!sealer.Seal(body, *length, again.data()).ok() ||
        std::memcmp(again.data(), data + at, whole) != 0) {
      __builtin_trap();
    }
    at += whole;
  }
  return 0;
}
