// Quote: user-supplied text as it appears in error messages: in double quotes, with quotes,
// backslashes and control characters escaped, so an empty or odd value is visible as such.
#ifndef TESSERA_COMMON_BASE_QUOTE_H_
#define TESSERA_COMMON_BASE_QUOTE_H_

#include <cstdio>
#include <string>
#include <string_view>

namespace tessera {

inline std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_QUOTE_H_
