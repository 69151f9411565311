// JobKey: the job's secret, from which every credential a Tessera process presents is derived.
//
// A key is 32 random bytes. On disk it is a key file: one line, "tessera-job-key-v1 " and 64
// lowercase hex digits, readable by its owner only (mode 0600 or stricter). tessera-launch makes
// one per job (in a private directory, handed to its children as TESSERA_AUTH_KEY_FILE, never
// in argv); `tessera-launch --make-key-file PATH` writes one for multi-node jobs and
// long-running fleets (--auth-key-file).
//
// Nothing ever prints the key. Logs may name its fingerprint (a hash, "key 1a2b3c4d"), which
// tells two keys apart without revealing either.
//
// Thread-safety: a JobKey is an immutable value.
#ifndef TESSERA_COMMON_SECURITY_JOB_KEY_H_
#define TESSERA_COMMON_SECURITY_JOB_KEY_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

inline constexpr size_t kJobKeyBytes = 32;
using KeyBytes = std::array<uint8_t, kJobKeyBytes>;

class JobKey {
 public:
  // 32 bytes from the kernel's random source.
  static JobKey Generate();
  // For tests and the fuzzers: a key made of these bytes.
  static JobKey FromBytes(const KeyBytes& bytes) { return JobKey(bytes); }
  // The text of a key file (see the file comment); errors say what is wrong, never the text.
  static StatusOr<JobKey> Parse(std::string_view text);

  // A subkey for one purpose ("zap-token", "curve", "ring-link"): BLAKE2b keyed with the key.
  // Distinct purposes give independent keys, so a MAC made for one is worthless for another.
  KeyBytes Derive(std::string_view purpose) const;

  // Eight hex digits of a hash of the key, for logs.
  std::string Fingerprint() const;

  // The key file's text.
  std::string Serialize() const;

  const KeyBytes& bytes() const { return bytes_; }

 private:
  explicit JobKey(const KeyBytes& bytes) : bytes_(bytes) {}
  KeyBytes bytes_;
};

// Reads a key file. Refused, with the path and the reason: a file that is not a regular file,
// that someone other than this user owns, or that its group or others may read or write ("run
// chmod 600 PATH"); a malformed one.
StatusOr<JobKey> ReadKeyFile(const std::string& path);

// Writes `key` to a new file at `path` with mode 0600; fails if it exists (nothing is
// overwritten) or cannot be written, naming the path.
Status WriteKeyFile(const std::string& path, const JobKey& key);

}  // namespace tessera

#endif  // TESSERA_COMMON_SECURITY_JOB_KEY_H_
