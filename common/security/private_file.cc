#include "common/security/private_file.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tessera {

StatusOr<std::string> ReadPrivateFile(const std::string& path, std::string_view what,
                                      size_t max_bytes) {
  const std::string where = std::string(what) + " " + path + ": ";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return FailedPreconditionError(where + std::strerror(errno) +
                                   (errno == ELOOP ? " (a symbolic link is not accepted)" : ""));
  }
  auto refuse = [fd](std::string message) {
    close(fd);
    return FailedPreconditionError(std::move(message));
  };
  struct stat info;
  if (fstat(fd, &info) != 0) return refuse(where + std::strerror(errno));
  if (!S_ISREG(info.st_mode)) return refuse(where + "not a regular file");
  if (info.st_uid != geteuid()) {
    return refuse(where + "owned by uid " + std::to_string(info.st_uid) +
                  ", not by this user (uid " + std::to_string(geteuid()) +
                  "); a file that holds a secret must be its user's own");
  }
  if ((info.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    return refuse(where + "mode " + mode + " lets other users read or change it; run chmod 600 " +
                  path);
  }
  std::string text(max_bytes + 1, '\0');
  size_t size = 0;
  while (size < text.size()) {
    const ssize_t n = read(fd, text.data() + size, text.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      sodium_memzero(text.data(), text.size());
      return refuse(where + std::strerror(error));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  close(fd);
  if (size > max_bytes) {
    sodium_memzero(text.data(), text.size());
    return InvalidArgumentError(where + "larger than " + std::to_string(max_bytes) + " bytes");
  }
  text.resize(size);
  return text;
}

}  // namespace tessera
