#include "common/security/job_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/security/private_file.h"

namespace tessera {
namespace {

constexpr std::string_view kKeyFilePrefix = "tessera-job-key-v1 ";
// A key file is one short line; anything much longer is not one (and is not read whole).
constexpr size_t kMaxKeyFileBytes = 256;

void InitSodium() {
  // Idempotent and thread-safe; fails only when the kernel has no random source.
  if (sodium_init() < 0) {
    std::fprintf(stderr, "libsodium failed to initialize\n");
    std::abort();
  }
}

std::string Hex(const uint8_t* bytes, size_t n) {
  std::string text(2 * n + 1, '\0');
  sodium_bin2hex(text.data(), text.size(), bytes, n);
  text.pop_back();
  return text;
}

}  // namespace

JobKey JobKey::Generate() {
  InitSodium();
  KeyBytes bytes;
  randombytes_buf(bytes.data(), bytes.size());
  return JobKey(bytes);
}

StatusOr<JobKey> JobKey::Parse(std::string_view text) {
  if (text.substr(0, kKeyFilePrefix.size()) != kKeyFilePrefix) {
    return InvalidArgumentError("not a Tessera key file: it does not start with \"" +
                                std::string(kKeyFilePrefix.substr(0, kKeyFilePrefix.size() - 1)) +
                                "\"");
  }
  std::string_view hex = text.substr(kKeyFilePrefix.size());
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r')) hex.remove_suffix(1);
  if (hex.size() != 2 * kJobKeyBytes) {
    return InvalidArgumentError("the key must be " + std::to_string(2 * kJobKeyBytes) +
                                " hex digits; the file has " + std::to_string(hex.size()) +
                                " characters after the prefix");
  }
  KeyBytes bytes;
  size_t decoded = 0;
  if (sodium_hex2bin(bytes.data(), bytes.size(), hex.data(), hex.size(), nullptr, &decoded,
                     nullptr) != 0 ||
      decoded != bytes.size()) {
    return InvalidArgumentError("the key is not " + std::to_string(2 * kJobKeyBytes) +
                                " hex digits");
  }
  return JobKey(bytes);
}

KeyBytes JobKey::Derive(std::string_view purpose) const {
  InitSodium();
  KeyBytes out;
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const uint8_t*>(purpose.data()),
                     purpose.size(), bytes_.data(), bytes_.size());
  return out;
}

std::string JobKey::Fingerprint() const {
  const KeyBytes id = Derive("fingerprint");
  return Hex(id.data(), 4);
}

std::string JobKey::Serialize() const {
  return std::string(kKeyFilePrefix) + Hex(bytes_.data(), bytes_.size()) + "\n";
}

StatusOr<JobKey> ReadKeyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadPrivateFile(path, "key file", kMaxKeyFileBytes));
  StatusOr<JobKey> key = JobKey::Parse(text);
  sodium_memzero(text.data(), text.size());
  if (!key.ok()) return key.status().WithContext("key file " + path);
  return key;
}

Status WriteKeyFile(const std::string& path, const JobKey& key) {
  const std::string where = "key file " + path + ": ";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return FailedPreconditionError(where + std::strerror(errno) +
                                   (errno == EEXIST ? " (an existing file is never overwritten)"
                                                    : ""));
  }
  std::string text = key.Serialize();
  size_t written = 0;
  int error = 0;
  // The umask may only have narrowed 0600; make it exactly that.
  if (fchmod(fd, 0600) != 0) error = errno;
  while (error == 0 && written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (error == 0 && fsync(fd) != 0) error = errno;
  close(fd);
  sodium_memzero(text.data(), text.size());
  if (error != 0) {
    unlink(path.c_str());
    return FailedPreconditionError(where + std::strerror(error));
  }
  return OkStatus();
}

}  // namespace tessera
