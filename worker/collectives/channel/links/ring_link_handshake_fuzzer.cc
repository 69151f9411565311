// Fuzz target (issue 15): the ring links' handshake messages (ring_link_handshake.h) as one end
// parses what a peer sends. Input: one byte choosing the end (bit 0: the connector, else the
// acceptor; bit 1: it encrypts), then the peer's bytes, which reach a RingLinkHandshake over a
// socket pair (closed after them) exactly as from a TCP connection; it is advanced until it
// stops. Seeds: ring_link_handshake_fuzz_corpus/ (hellos, challenges and proofs, valid in form;
// written by ring_link_fuzz_seeds).
//
// Besides not crashing: no input completes a handshake (the MACs cover nonces this end just
// drew), and a failed one says why.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "worker/collectives/channel/links/ring_link_handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::worker;
  if (size < 1 || size > 4096) return 0;  // the socket pair holds it whole
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  KeyBytes job;
  job.fill(0x5a);
  const KeyBytes key = RingLinkKey(JobKey::FromBytes(job));
  const bool connector = (data[0] & 1) != 0;
  const bool encrypt = (data[0] & 2) != 0;
  RingLinkHandshake handshake =
      connector ? RingLinkHandshake::Connector(
                      fds[0], key, 1, 2,
                      encrypt ? LinkCipher::kChaCha20Poly1305 : LinkCipher::kNone)
                : RingLinkHandshake::Acceptor(fds[0], key, 2, 1, encrypt);
  if (size > 1 &&
      send(fds[1], data + 1, size - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(size - 1)) {
    __builtin_trap();
  }
  shutdown(fds[1], SHUT_WR);
  for (int round = 0; round < 8 && handshake.state() == RingLinkHandshake::State::kRunning;
       ++round) {
    handshake.Advance();
  }
  if (handshake.state() == RingLinkHandshake::State::kDone) __builtin_trap();
  if (handshake.state() == RingLinkHandshake::State::kFailed &&
      handshake.failure().message().empty()) {
    __builtin_trap();
  }
  close(fds[0]);
  close(fds[1]);
  return 0;
}
