#include "tools/bench/memory_limiter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tessera::tools {

StatusOr<MemoryLimiter> MemoryLimiter::Find() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, v1_path, v2_path;
  bool v2_seen = false;
  while (std::getline(self, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.rfind("0::", 0) == 0) {
      v2_path = path;
      v2_seen = true;
    }
    std::stringstream list(controllers);
    std::string controller;
    while (std::getline(list, controller, ',')) {
      if (controller == "memory") v1_path = path;
    }
  }
  auto writable = [](const std::string& dir) { return access(dir.c_str(), W_OK) == 0; };
  if (v2_seen && access("/sys/fs/cgroup/cgroup.controllers", R_OK) == 0 &&
      writable("/sys/fs/cgroup" + v2_path)) {
    return MemoryLimiter("cgroup v2 memory.max", "/sys/fs/cgroup" + v2_path, "memory.max");
  }
  if (!v1_path.empty() && writable("/sys/fs/cgroup/memory" + v1_path)) {
    return MemoryLimiter("cgroup v1 memory.limit_in_bytes", "/sys/fs/cgroup/memory" + v1_path,
                         "memory.limit_in_bytes");
  }
  if (access("/usr/bin/prlimit", X_OK) == 0) {
    return MemoryLimiter("RLIMIT_DATA (prlimit --data; no writable memory cgroup)", "", "");
  }
  return UnavailableError("no writable memory cgroup and no /usr/bin/prlimit: cannot limit "
                          "the ranks' memory");
}

StatusOr<std::vector<std::string>> MemoryLimiter::Wrap(const std::string& label, int64_t limit,
                                                       std::vector<std::string> argv) {
  if (parent_.empty()) {
    std::vector<std::string> wrapped = {"/usr/bin/prlimit", "--data=" + std::to_string(limit),
                                        "--"};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    return wrapped;
  }
  const std::string dir = parent_ + "/tessera-bench-" + std::to_string(getpid()) + "-" + label;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return UnavailableError("mkdir " + dir + ": " + std::strerror(errno));
  }
  made_.push_back(dir);
  const std::string limit_path = dir + "/" + limit_file_;
  if (access(limit_path.c_str(), W_OK) != 0) {
    return UnavailableError(limit_path + ": " + std::strerror(errno) +
                            " (cgroup v2: is the memory controller in " + parent_ +
                            "/cgroup.subtree_control?)");
  }
  {
    std::ofstream file(limit_path);
    file << limit << "\n";
    if (!file.flush()) return UnavailableError("writing " + limit_path);
  }
  // The shell joins the cgroup, then becomes the rank: everything it allocates counts.
  std::vector<std::string> wrapped = {"/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"",
                                      dir + "/cgroup.procs"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

bool MemoryLimiter::OomKilled() const {
  for (const std::string& dir : made_) {
    for (const char* name : {"memory.events", "memory.oom_control"}) {
      std::ifstream file(dir + "/" + name);
      std::string key;
      int64_t value = 0;
      while (file >> key >> value) {
        if (key == "oom_kill" && value > 0) return true;
      }
    }
    // cgroup v1 on kernels whose memory.oom_control has no oom_kill: the limit was hit.
    std::ifstream failcnt(dir + "/memory.failcnt");
    int64_t count = 0;
    if (failcnt >> count && count > 0) return true;
  }
  return false;
}

void MemoryLimiter::Clear() {
  for (const std::string& dir : made_) rmdir(dir.c_str());
  made_.clear();
}

}  // namespace tessera::tools
