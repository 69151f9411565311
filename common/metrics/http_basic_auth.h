// HttpBasicAuth: the users allowed to read the HTTP pages (--metrics-auth-file), and the check
// of a request's `Authorization: Basic ...` header against them (RFC 7617).
//
// The file holds one `user:password` per line (the user has no ':'; the password is the rest of
// the line, ':' included); empty lines and lines starting with '#' are skipped. Like a job key
// file (common/security/job_key.h) it must be a regular file of this user with no permission
// bits for group or others (mode 0600 or stricter), and is refused otherwise.
//
// Only a hash (BLAKE2b) of each "user:password" is kept; Matches hashes the presented one and
// compares it with every entry in constant time, so neither the time taken nor an early exit
// tells which user exists or how much of a password was right.
//
// Thread-safety: immutable after construction; Matches may be called from any thread.
#ifndef TESSERA_COMMON_METRICS_HTTP_BASIC_AUTH_H_
#define TESSERA_COMMON_METRICS_HTTP_BASIC_AUTH_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tessera {

class HttpBasicAuth {
 public:
  // Parses the text of an auth file. InvalidArgument naming the line number (never its
  // content, which holds a password) for a line without ':' or with an empty user, and for a
  // file without any user.
  static StatusOr<HttpBasicAuth> Parse(std::string_view text);

  // Reads and parses the file at `path` (see the file comment). FailedPrecondition naming the
  // path for a missing, foreign, non-regular or group/world-accessible file.
  static StatusOr<HttpBasicAuth> ReadFile(const std::string& path);

  // Whether `authorization` (the value of the request's Authorization header, "" if absent)
  // is "Basic <base64 of user:password>" for one of the users.
  bool Matches(std::string_view authorization) const;

  size_t num_users() const { return digests_.size(); }

 private:
  using Digest = std::array<uint8_t, 32>;
  static Digest Hash(std::string_view user_colon_password);

  HttpBasicAuth() = default;
  std::vector<Digest> digests_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_HTTP_BASIC_AUTH_H_
