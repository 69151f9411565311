// RingLinks: a rank's two point-to-point TCP links in the ring (one to next, one from prev),
// driven by the threads that run collectives, with no I/O thread in between (like Gloo's pairs
// and MPI's tcp BTL).
//
//   ASSIGN_OR_RETURN(auto listener, RingLinks::Listen(host));
//   ... tell prev listener->address, learn next's (ring_channel_setup.cc does, over RingZmq) ...
//   ASSIGN_OR_RETURN(std::unique_ptr<RingLinks> links,
//                    RingLinks::Connect({rank, world, next_address, failures}, std::move(listener)));
//
// Why: over the transport a frame passes four thread hand-offs (ring thread -> transport I/O
// thread -> ZeroMQ I/O thread -> TCP -> ZeroMQ I/O thread -> transport handler -> mailbox ->
// ring thread). Here the sending thread writes the frame to the socket itself and the receiving
// thread reads it itself: TCP is the only hop.
//
// Connect (every rank at once, once each rank has told its predecessor where it listens):
// connects to next's link address and accepts its predecessor's connection. How each end
// knows the other depends on options.credentials (common/security/credentials.h):
//   kNone          the connector sends a hello with its rank; the listener accepts one
//                  connection and checks the rank (a wrong one fails Connect).
//   kAuthenticate  a mutual challenge-response handshake keyed by the job key
//                  (ring_link_handshake.h has the wire): neither end accepts a frame before the
//                  other proved it holds the key. The listener keeps accepting until prev's
//                  connection proves itself, closing (logging, counting in
//                  tessera_auth_failures_total{reason="handshake"}) every other connection, so
//                  a foreign or failed connection never disturbs the ring.
//   kEncrypt       authenticates the same way, then every byte of every frame travels sealed
//                  in AEAD records (ring_link_cipher.h: AES-256-GCM where the CPU runs it,
//                  else ChaCha20-Poly1305; a fresh key per connection from the handshake's
//                  nonces; counter nonces).
//
// Wire: ring_frame_codec.h (a 64-byte header and the payload); under kEncrypt the header is one
// record and the payload follows in records of at most kSendRecordBytes. Every header is
// checked on receipt (magic, ranges, sender, payload size cap) before anything is allocated: a
// bad one fails the link, naming the peer, since a byte stream cannot be resynchronised; so
// does a record that fails authentication ("ring link from worker 3 (tcp://...): a record
// failed authentication (tampered or not from the job)"): one tampered with, dropped,
// replayed, reordered or sealed under another key.
//
// Costs of kEncrypt: the sending thread seals each frame's bytes into a reused buffer of one
// record or a few (one pass, then the socket's copy, as without it; a borrowed payload is free
// once sealed), and the receiving thread reads each record's ciphertext where its plaintext
// belongs (the header, the payload's buffer or the caller's landing) and opens it in place
// (one pass). kNone and kAuthenticate write and read frames as before, untouched.
//
// Progress: a thread that waits (Recv, Flush) polls both sockets with the call's deadline: it
// reads whatever prev sent (frames are kept by (tag, slot) until a Recv takes them) and writes
// whatever is queued for next, so no rank blocks writing while its peer blocks writing too.
// Before it sleeps in poll() it spins (reads and writes without sleeping, yielding the core
// each round) for an adaptive budget of at most spin_us (adaptive_spin.h): a frame due within
// microseconds is then read without a poll() wake-up (~20-25 us here), while long or contended
// waits soon stop spinning. Send never blocks: it writes what the socket takes and queues the
// rest. With concurrent calls (different tags) one waiting thread polls at a time and the
// others wait on a condition variable; a lone thread never touches one. A failure on the
// process's FailureBus (the coordinator's notice that a worker died) wakes waiters within
// kFailureCheckMs.
//
// Errors name the peer: "ring link from worker 0 (tcp://127.0.0.1:4567): closed by the peer".
// A broken direction stays broken (every later Recv or Send on it fails with the same status);
// the other direction keeps working, so an abort notice still reaches next.
//
// Thread-safety: thread-safe. Payloads handed to Send must stay unchanged until written: they
// are shared_ptr-owned, or borrow the caller's memory without an owner, in which case the
// caller keeps it until Flush returns OK or CopyUnsentPayloads has run.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/security/credentials.h"
#include "worker/collectives/channel/adaptive_spin.h"
#include "worker/collectives/channel/kept_frames.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/ring_frame_codec.h"

namespace tessera::worker {

class RecordSealer;  // ring_link_cipher.h
class RecordOpener;

// The default cap of the adaptive spin (RingLinksOptions::spin_us, --ring-spin-us).
inline constexpr int64_t kDefaultRingSpinCapUs = 200;

struct RingLinksOptions {
  int rank = 0;
  int world_size = 1;
  // The neighbours' ranks; -1: in rank order (rank + 1 and rank - 1, mod world_size).
  int next = -1;
  int prev = -1;
  std::string next_address;  // where next's Listener listens, "tcp://HOST:PORT"
  std::shared_ptr<FailureBus> failures;  // the process's failures, which wake waiters; may be null
  int64_t timeout_ms = 30000;            // bounds Connect
  // A larger frame fails the link (the ring's largest is a segment).
  size_t max_payload_bytes = (64u << 20) + 4096;
  int socket_buffer_bytes = 4 << 20;  // SO_SNDBUF and SO_RCVBUF
  // The most a waiting thread keeps reading without sleeping before it sleeps in poll(), as
  // MPI's progress engine does; the budget within it adapts to recent waits (adaptive_spin.h).
  // 0: never spin.
  int64_t spin_us = kDefaultRingSpinCapUs;
  // Who may connect (see Connect above); every rank of the ring must use the same protection
  // and key. The default admits anyone (the hello only checks the rank).
  Credentials credentials;
  // Where refused connections are counted (tessera_auth_failures_total); may be null. Not
  // owned; outlives Connect.
  MetricsRegistry* metrics = nullptr;
};

class RingLinks : public RingChannel {
 public:
  static constexpr int64_t kFailureCheckMs = 20;

  // A socket listening for prev's connection, and its address for prev.
  struct Listener {
    int fd = -1;
    std::string address;  // "tcp://HOST:PORT"
    ~Listener();
  };
  // Listens on an OS-chosen port of `host` (this rank's transport host).
  static StatusOr<std::unique_ptr<Listener>> Listen(const std::string& host);

  // Connects as described above; every rank of the ring must call it. REQUIRES:
  // world_size >= 2. Errors name the peer and the step that failed. One direction only (a
  // ring whose other hop is another channel, mixed_hop_channel.h): without a listener there is no
  // link from prev (Recv fails FailedPrecondition), without next_address none to next (Send
  // fails so).
  static StatusOr<std::unique_ptr<RingLinks>> Connect(const RingLinksOptions& options,
                                                      std::unique_ptr<Listener> listener);

  // Over sockets already connected (tests): `to_next` and `from_prev` are owned from now on.
  // `failures` may be null.
  static std::unique_ptr<RingLinks> FromSockets(int rank, int world_size, int to_next,
                                                int from_prev, std::string next_address,
                                                std::string prev_address,
                                                std::shared_ptr<FailureBus> failures,
                                                size_t max_payload_bytes = (64u << 20) + 4096,
                                                int64_t spin_us = kDefaultRingSpinCapUs);
  ~RingLinks() override;
  RingLinks(const RingLinks&) = delete;
  RingLinks& operator=(const RingLinks&) = delete;

  int rank() const override { return rank_; }
  int next() const { return next_; }
  int prev() const { return prev_; }

  // Queues `frame` (its fields and data) for next and writes as much as the socket takes now.
  // Never blocks. Fails only if the link to next is broken.
  Status Send(RingFrame frame) override;

  // Waits for prev's frame (tag, slot). DeadlineExceeded with an empty message once `deadline`
  // passes (the caller names what it waited for); otherwise the link's or the process's failure.
  // `into`, if not null, is where the caller will copy the payload: if the frame is not read
  // yet and carries exactly `into_bytes`, its payload is read straight into it (before the
  // caller checked the header: `into` is written even if the frame then proves wrong), and the
  // returned frame's data points there. REQUIRES: [into, into + into_bytes) is not touched by
  // anyone else during the call.
  StatusOr<RingFrame> Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                               uint8_t* into = nullptr, size_t into_bytes = 0) override;

  // Waits until every queued frame is written to next (sealed and written, under kEncrypt).
  // DeadlineExceeded naming next.
  Status Flush(Deadline deadline) override;

  void CopyUnsentPayloads() override;
  // Under kEncrypt, records sealed but not yet written count as one more frame.
  size_t unsent() const override;

  // Why Recv fails (the link from prev broken, or the process failed); OK otherwise.
  Status failure() const override;

  void Discard(uint64_t tag) override;
  size_t kept() const override;

  class BufferPool;  // receive buffers, reused (defined in the .cc)

 private:
  struct OutFrame {
    uint8_t header[kFrameHeaderBytes];
    Payload payload;
    size_t written = 0;  // of header and payload together (without encryption)
    size_t sealed = 0;   // of header and payload together (kEncrypt)
  };

  // `sealer` and `opener`: kEncrypt's records to next and from prev; both null otherwise.
  RingLinks(int rank, int next, int prev, int to_next, int from_prev, std::string next_address,
            std::string prev_address, std::shared_ptr<FailureBus> failures,
            size_t max_payload_bytes, int64_t spin_us,
            std::unique_ptr<RecordSealer> sealer = nullptr,
            std::unique_ptr<RecordOpener> opener = nullptr);

  // All REQUIRE mu_ held. WriteSome writes queued frames until the socket would block;
  // ReadSome reads until it would block or one frame is complete. Under kEncrypt they
  // delegate to WriteSealed (which seals records with SealSome) and ReadSealed.
  void WriteSome();
  void ReadSome();
  void WriteSealed();
  void SealSome();
  void ReadSealed();
  // The frame's header is in: decodes it and picks where its payload goes. False if the link
  // failed (recv_failure_ says why).
  bool OnHeader();
  // The frame is complete: keeps it for its Recv.
  void OnFrame();
  // Whether anything handed to Send is still to be written.
  bool HasUnsent() const;
  // Where the record being read puts its bytes (kEncrypt): the header, or the payload's place.
  uint8_t* RecordTarget();
  // The current frame's payload bytes already at in_target_ (with kEncrypt, the record being
  // read counts: its ciphertext is there too).
  size_t PayloadBytesAtTarget() const;
  // Reads up to `bytes` (> 0) into `at` without blocking: how many it read; 0 when nothing is
  // there now or the link failed (then recv_failure_ says how; `mid_frame`: part of a frame
  // is in already). REQUIRES mu_ held.
  size_t RecvSome(uint8_t* at, size_t bytes, bool mid_frame);
  // Polls and makes progress until `done()` (called under mu_) or the deadline.
  Status Wait(const std::function<bool()>& done, Deadline deadline, bool for_recv);
  std::string LinkTo() const;
  std::string LinkFrom() const;

  const int rank_;
  const int next_;
  const int prev_;
  const int to_next_;    // socket
  const int from_prev_;  // socket
  const int wake_;       // eventfd: a Send queued bytes while another thread polls
  const std::string next_address_;
  const std::string prev_address_;
  const std::shared_ptr<FailureBus> failures_;
  const size_t max_payload_bytes_;
  const std::shared_ptr<BufferPool> pool_;

  mutable std::mutex mu_;
  std::condition_variable progressed_;
  bool polling_ = false;           // a thread polls without mu_; guarded by mu_
  AdaptiveSpin recv_spin_;         // Recv's waits; guarded by mu_
  AdaptiveSpin flush_spin_;        // Flush's waits; guarded by mu_
  std::deque<OutFrame> out_;       // guarded by mu_
  Status send_failure_;            // guarded by mu_
  Status recv_failure_;            // guarded by mu_
  KeptFrames kept_;  // guarded by mu_
  // The frame being read; guarded by mu_.
  uint8_t in_header_[kFrameHeaderBytes];
  size_t in_header_got_ = 0;
  RingFrame in_frame_;
  std::shared_ptr<uint8_t> in_buffer_;  // null when reading into a landing
  uint8_t* in_target_ = nullptr;        // where the payload goes: in_buffer_ or a landing
  // Where waiting Recv calls want their frames' payloads: (tag, slot) -> (into, into_bytes).
  std::map<std::pair<uint64_t, uint32_t>, std::pair<uint8_t*, size_t>> landings_;
  uint64_t in_payload_bytes_ = 0;
  uint64_t in_payload_got_ = 0;

  // kEncrypt (ring_link_cipher.h); all null/empty otherwise, and all guarded by mu_.
  const std::unique_ptr<RecordSealer> sealer_;
  const std::unique_ptr<RecordOpener> opener_;
  std::unique_ptr<uint8_t[]> sealed_;  // records sealed for next: [sealed_sent_, sealed_end_)
  size_t sealed_end_ = 0;              // still to write
  size_t sealed_sent_ = 0;
  // The record being read: its length prefix and tag (the body goes to RecordTarget()).
  uint8_t in_record_length_[4];
  uint8_t in_record_tag_[16];
  size_t in_record_bytes_ = 0;  // the plaintext's, once the length is in
  size_t in_record_got_ = 0;    // of length, body and tag together
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_H_
