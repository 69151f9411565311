#include "common/metrics/http_basic_auth.h"

#include <sodium.h>

#include <cctype>
#include <cstring>

#include "common/security/private_file.h"

namespace tessera {
namespace {

// An auth file is a handful of short lines; a bigger one is a mistake (and is not read whole).
constexpr size_t kMaxAuthFileBytes = 64 * 1024;
// The longest Authorization header value looked at: base64 of a long user:password line.
constexpr size_t kMaxAuthorizationBytes = 4096;

}  // namespace

HttpBasicAuth::Digest HttpBasicAuth::Hash(std::string_view user_colon_password) {
  Digest digest;
  crypto_generichash(digest.data(), digest.size(),
                     reinterpret_cast<const unsigned char*>(user_colon_password.data()),
                     user_colon_password.size(), nullptr, 0);
  return digest;
}

StatusOr<HttpBasicAuth> HttpBasicAuth::Parse(std::string_view text) {
  HttpBasicAuth auth;
  int line_number = 0;
  while (!text.empty()) {
    ++line_number;
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return InvalidArgumentError("line " + std::to_string(line_number) +
                                  " is not user:password (no ':')");
    }
    if (colon == 0) {
      return InvalidArgumentError("line " + std::to_string(line_number) + " has an empty user");
    }
    auth.digests_.push_back(Hash(line));
  }
  if (auth.digests_.empty()) return InvalidArgumentError("no user:password line");
  return auth;
}

StatusOr<HttpBasicAuth> HttpBasicAuth::ReadFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadPrivateFile(path, "auth file", kMaxAuthFileBytes));
  StatusOr<HttpBasicAuth> auth = Parse(text);
  sodium_memzero(text.data(), text.size());
  if (!auth.ok()) return auth.status().WithContext("auth file " + path);
  return auth;
}

bool HttpBasicAuth::Matches(std::string_view authorization) const {
  constexpr std::string_view kScheme = "Basic ";
  if (authorization.size() <= kScheme.size() || authorization.size() > kMaxAuthorizationBytes) {
    return false;
  }
  // The scheme is case-insensitive (RFC 7617 section 2).
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) !=
        std::tolower(static_cast<unsigned char>(kScheme[i]))) {
      return false;
    }
  }
  std::string_view encoded = authorization.substr(kScheme.size());
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  while (!encoded.empty() && encoded.back() == ' ') encoded.remove_suffix(1);
  std::string decoded(encoded.size(), '\0');
  size_t decoded_size = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(decoded.data()), decoded.size(),
                        encoded.data(), encoded.size(), nullptr, &decoded_size, nullptr,
                        sodium_base64_VARIANT_ORIGINAL) != 0) {
    return false;
  }
  const Digest presented = Hash(std::string_view(decoded.data(), decoded_size));
  sodium_memzero(decoded.data(), decoded.size());
  // Every entry is compared, whatever matched before.
  int matches = 0;
  for (const Digest& digest : digests_) {
    matches |= sodium_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  return matches != 0;
}

}  // namespace tessera
