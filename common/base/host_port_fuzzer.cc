// Fuzz target (issue 15): HOST:PORT as flags, environment variables and peers' registrations
// give it (ParseHostPort), and back (JoinHostPort). Seeds: host_port_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/host_port.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)Unbracketed(text);
  StatusOr<std::pair<std::string, int>> parsed = ParseHostPort(text);
  if (!parsed.ok()) return 0;
  if (parsed->second < 0 || parsed->second > 65535) __builtin_trap();
  // What parsed joins to text that parses to the same.
  StatusOr<std::pair<std::string, int>> again =
      ParseHostPort(JoinHostPort(parsed->first, parsed->second));
  if (!again.ok() || *again != *parsed) __builtin_trap();
  return 0;
}
