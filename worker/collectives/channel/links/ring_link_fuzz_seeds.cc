// Writes the seed corpora of ring_link_cipher_fuzzer (records under the fuzz key, and damaged
// ones) and ring_link_handshake_fuzzer (hellos, challenges and proofs):
//
//   cd worker/collectives/channel/links &&
//     bazel run :ring_link_fuzz_seeds -- $PWD
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "worker/collectives/channel/links/ring_link_cipher.h"
#include "worker/collectives/channel/links/ring_link_fuzz_key.h"
#include "worker/collectives/channel/links/ring_link_handshake.h"

namespace {

using namespace tessera;
using namespace tessera::worker;

int written = 0;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ++written;
}

// Records of these sizes sealed in order under the fuzz key, after the cipher byte.
std::string Records(uint8_t choice, const std::vector<size_t>& sizes) {
  const LinkCipher cipher = FuzzRecordCipher(choice);
  RecordSealer sealer(cipher, FuzzRecordKey(cipher));
  std::string out(1, static_cast<char>(choice));
  for (size_t size : sizes) {
    std::vector<uint8_t> plain(size), record(size + kRecordOverheadBytes);
    for (size_t i = 0; i < size; ++i) plain[i] = static_cast<uint8_t>(i * 7);
    if (!sealer.Seal(plain.data(), size, record.data()).ok()) std::abort();
    out.append(record.begin(), record.end());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (worker/collectives/channel/links)\n", argv[0]);
    return 2;
  }
  const std::string records = std::string(argv[1]) + "/ring_link_cipher_fuzz_corpus/";
  for (uint8_t choice : {0, 1}) {
    const std::string name = choice == 0 ? "aes-" : "chacha-";
    Write(records + name + "header", Records(choice, {64}));
    Write(records + name + "frame", Records(choice, {64, 1, 100, 5000}));
    std::string tampered = Records(choice, {64, 300});
    tampered[tampered.size() - 1] ^= 1;
    Write(records + name + "tampered-tag", tampered);
    std::string replayed = Records(choice, {64});
    replayed += replayed.substr(1);
    Write(records + name + "replayed", replayed);
  }
  Write(records + "length-zero", std::string("\0\0\0\0\0", 5) + std::string(16, 'x'));
  Write(records + "length-over-cap", std::string("\0\x01\0\x10\0", 5) + std::string(16, 'x'));

  const std::string handshakes = std::string(argv[1]) + "/ring_link_handshake_fuzz_corpus/";
  LinkNonce nonce;
  nonce.fill(0x11);
  MacBytes zero_mac{};
  // (The role byte first: 0 the acceptor, 1 the connector, + 2 if it encrypts.)
  const std::string proof = EncodeLinkProof(zero_mac);
  Write(handshakes + "acceptor-hello-proof",
        std::string(1, '\0') + EncodeLinkHello(1, 2, nonce) + proof);
  Write(handshakes + "acceptor-encrypted-hello-proof",
        "\x02" + EncodeLinkHello(1, 2, nonce, LinkCipher::kChaCha20Poly1305) + proof);
  Write(handshakes + "acceptor-hello-wrong-rank",
        std::string(1, '\0') + EncodeLinkHello(3, 2, nonce));
  Write(handshakes + "acceptor-hello-disagrees",
        "\x02" + EncodeLinkHello(1, 2, nonce, LinkCipher::kNone));
  Write(handshakes + "acceptor-plain-hello", std::string("\x00HELO\x01\0\0\0", 9));
  Write(handshakes + "connector-challenge", "\x01" + EncodeLinkChallenge(2, nonce, zero_mac));
  Write(handshakes + "connector-encrypted-challenge",
        "\x03" + EncodeLinkChallenge(2, nonce, zero_mac));
  Write(handshakes + "connector-wrong-rank", "\x01" + EncodeLinkChallenge(5, nonce, zero_mac));
  std::printf("wrote %d seeds\n", written);
  return 0;
}
