// The input format of wire_decode_fuzzer, shared with the seed writer: a message's frames as
// one byte string. Byte 0 gives the number of payload frames k (its value mod 4); then k
// little-endian u32 lengths; then the k payloads, in order (a length beyond what is left takes
// what is left); the rest is the header frame.
#ifndef TESSERA_COMMON_WIRE_WIRE_FUZZ_INPUT_H_
#define TESSERA_COMMON_WIRE_WIRE_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/base/payload.h"

namespace tessera::wire {

inline Message MessageFromFuzzInput(const uint8_t* data, size_t size) {
  Message message;
  if (size == 0) return message;
  const size_t k = data[0] % 4;
  size_t at = 1;
  uint32_t lengths[4] = {};
  for (size_t i = 0; i < k; ++i) {
    if (size - at >= 4) std::memcpy(&lengths[i], data + at, 4);
    at = std::min(size, at + 4);
  }
  for (size_t i = 0; i < k; ++i) {
    const size_t n = std::min<size_t>(lengths[i], size - at);
    message.payloads.push_back(Payload::Copy(data + at, n));
    at += n;
  }
  // A copy of its own: the header must be 8-byte aligned, as a received frame is.
  message.header = Payload::Copy(data + at, size - at);
  return message;
}

inline std::string FuzzInputOf(const Message& message) {
  std::string out(1, static_cast<char>(message.payloads.size()));
  for (const Payload& payload : message.payloads) {
    const uint32_t length = static_cast<uint32_t>(payload.size());
    out.append(reinterpret_cast<const char*>(&length), 4);
  }
  for (const Payload& payload : message.payloads) {
    out.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  }
  out.append(reinterpret_cast<const char*>(message.header.data()), message.header.size());
  return out;
}

}  // namespace tessera::wire

#endif  // TESSERA_COMMON_WIRE_WIRE_FUZZ_INPUT_H_
