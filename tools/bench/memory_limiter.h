// Per-process memory limits for the rank processes a benchmark starts (tessera-bench torch
// --fsdp's largest-model search): each process joins a memory cgroup of its own, made under
// this process's cgroup (v2 memory.max, else v1 memory.limit_in_bytes; needs write access,
// e.g. root), or, where no cgroup is writable, runs under RLIMIT_DATA through prlimit (which
// counts the heap and private mappings, not shared memory: the method() says which).
// Not thread-safe.
#ifndef TESSERA_TOOLS_BENCH_MEMORY_LIMITER_H_
#define TESSERA_TOOLS_BENCH_MEMORY_LIMITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera::tools {

class MemoryLimiter {
 public:
  // Finds a writable memory cgroup under this process's own (v2, then v1), else prlimit;
  // an error when neither is there.
  static StatusOr<MemoryLimiter> Find();

  MemoryLimiter(MemoryLimiter&& other) = default;
  // Removes the cgroups still made (their processes must have exited).
  ~MemoryLimiter() { Clear(); }

  // How the limit is applied, for the report.
  const std::string& method() const { return method_; }

  // argv wrapped so that it runs under `limit` bytes; `label` names its cgroup (one per
  // label, until Clear()).
  StatusOr<std::vector<std::string>> Wrap(const std::string& label, int64_t limit,
                                          std::vector<std::string> argv);

  // Whether the kernel's OOM killer acted (or, in cgroup v1, the limit was hit) in the
  // cgroups made since the last Clear(). Always false under prlimit.
  bool OomKilled() const;

  // Removes the cgroups made since the last Clear() (their processes have exited).
  void Clear();

 private:
  MemoryLimiter(std::string method, std::string parent, std::string limit_file)
      : method_(std::move(method)), parent_(std::move(parent)),
        limit_file_(std::move(limit_file)) {}

  std::string method_;
  std::string parent_;  // the cgroup directory the ranks' are made in; empty: prlimit
  std::string limit_file_;
  std::vector<std::string> made_;
};

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_MEMORY_LIMITER_H_
