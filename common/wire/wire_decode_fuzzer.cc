// Fuzz target (issue 15): DecodeMessage, every message type's verification and conversion, as
// a transport hands it a peer's frames (wire_fuzz_input.h says how the input becomes frames).
// Seeds: wire_decode_fuzz_corpus/ (one message of every type, written by wire_fuzz_seeds).
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "common/wire/wire_codec.h"
#include "common/wire/wire_fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const Message message = wire::MessageFromFuzzInput(data, size);
  DecodeResult decoded = DecodeMessage(message, 1 << 20);
  if (decoded.status.ok() != decoded.message.has_value()) __builtin_trap();
  if (!decoded.status.ok() && decoded.reason.empty()) __builtin_trap();  // every error counted
  if (!decoded.message.has_value()) return 0;
  // What decoded encodes again and decodes to a message of the same type.
  const size_t type = decoded.message->body.index();
  Message again = EncodeMessage(decoded.message->header, std::move(decoded.message->body));
  DecodeResult twice = DecodeMessage(again, 1 << 20);
  if (!twice.status.ok() || twice.message->body.index() != type) {
    std::fprintf(stderr, "decoded type %zu, re-encoded: %s\n", type,
                 twice.status.ToString().c_str());
    __builtin_trap();
  }
  return 0;
}
