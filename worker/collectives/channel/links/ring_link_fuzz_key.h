// The fixed key and cipher choice of ring_link_cipher_fuzzer and its seeds.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_FUZZ_KEY_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_FUZZ_KEY_H_

#include <string>

#include "worker/collectives/channel/links/ring_link_cipher.h"

namespace tessera::worker {

// Even: AES-256-GCM where this CPU runs it; odd (or without AES-NI): ChaCha20-Poly1305.
inline LinkCipher FuzzRecordCipher(uint8_t choice) {
  return choice % 2 == 0 && LinkCipherAvailable(LinkCipher::kAes256Gcm)
             ? LinkCipher::kAes256Gcm
             : LinkCipher::kChaCha20Poly1305;
}

inline KeyBytes FuzzRecordKey(LinkCipher cipher) {
  KeyBytes job;
  job.fill(0x5a);
  return RecordKey(RingLinkAeadKey(JobKey::FromBytes(job)), cipher, 1, 2, std::string(32, 'c'),
                   std::string(32, 'a'));
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINK_FUZZ_KEY_H_
