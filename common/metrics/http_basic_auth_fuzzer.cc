// Fuzz target (issue 15): the Authorization header a client sends to /metrics, /sd and
// /dashboard (HttpBasicAuth::Matches), and the text of an auth file (HttpBasicAuth::Parse). The
// first byte picks which; an auth file of "tessera:secret" is the one matched against. Seeds:
// http_basic_auth_fuzz_corpus/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/metrics/http_basic_auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static const HttpBasicAuth auth = *HttpBasicAuth::Parse("tessera:secret\n");
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    // Any header, well-formed or not, gets a yes or a no (the corpus holds the one that
    // matches, "Basic dGVzc2VyYTpzZWNyZXQ=").
    (void)auth.Matches(text);
  } else {
    StatusOr<HttpBasicAuth> parsed = HttpBasicAuth::Parse(text);
    if (!parsed.ok() && parsed.status().message().empty()) __builtin_trap();
  }
  return 0;
}
