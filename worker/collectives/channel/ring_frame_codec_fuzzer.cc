// Fuzz target (issue 15): the ring frame header and payload as a direct channel (TCP links,
// shared memory) decodes them from a peer's bytes. Input: a 64-byte header, then the payload
// bytes. Seeds: ring_frame_codec_fuzz_corpus/ (a data, handshake and abort frame of each
// collective, written by ring_frame_codec_fuzz_seeds).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "worker/collectives/channel/ring_frame_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::worker;
  if (size < kFrameHeaderBytes) return 0;
  constexpr size_t kCap = 1 << 20;
  RingFrame frame;
  uint64_t payload_bytes = 0;
  if (!DecodeFrameHeader(data, kCap, &frame, &payload_bytes).ok()) return 0;
  if (payload_bytes > kCap) __builtin_trap();  // the cap is the decoder's promise
  const size_t rest = size - kFrameHeaderBytes;
  if (payload_bytes > rest) return 0;  // a stream would wait for more
  if (!AttachFramePayload(&frame, Payload::Copy(data + kFrameHeaderBytes, payload_bytes)).ok()) {
    return 0;
  }
  // A frame that decoded encodes to the same header.
  uint8_t again[kFrameHeaderBytes];
  EncodeFrameHeader(frame, FramePayload(frame).size(), again);
  RingFrame twice;
  uint64_t twice_bytes = 0;
  if (!DecodeFrameHeader(again, kCap, &twice, &twice_bytes).ok() || twice_bytes != payload_bytes) {
    __builtin_trap();
  }
  return 0;
}
