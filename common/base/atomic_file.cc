#include "common/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const void* bytes, size_t size) {
  const std::string temporary = path + ".tmp";
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", temporary);
  const char* data = static_cast<const char*>(bytes);
  size_t written = 0;
  Status status = OkStatus();
  while (written < size && status.ok()) {
    ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = Errno("cannot write", temporary);
    } else {
      written += static_cast<size_t>(n);
    }
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("cannot fsync", temporary);
  ::close(fd);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = Errno("cannot rename " + temporary + " to", path);
  }
  if (!status.ok()) {
    ::unlink(temporary.c_str());
    return status;
  }
  // The rename itself is durable only once the directory is.
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return OkStatus();
}

Status MakeDirectories(const std::string& path) {
  std::string prefix;
  size_t position = 0;
  while (position != std::string::npos) {
    position = path.find('/', position + 1);
    prefix = path.substr(0, position);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", prefix);
    }
  }
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return UnavailableError(path + " is not a directory");
  }
  return OkStatus();
}

}  // namespace tessera
