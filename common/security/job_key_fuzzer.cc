// Fuzz target (issue 15): the text of a key file (JobKey::Parse, what ReadKeyFile hands it).
// A parsed key serializes to text that parses to the same key. Seeds: job_key_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/security/job_key.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  StatusOr<JobKey> key = JobKey::Parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!key.ok()) {
    if (key.status().message().empty()) __builtin_trap();
    return 0;
  }
  StatusOr<JobKey> again = JobKey::Parse(key->Serialize());
  if (!again.ok() || again->bytes() != key->bytes()) __builtin_trap();
  return 0;
}
