// Fuzz target (issue 15): Slurm's hostlist syntax as SLURM_JOB_NODELIST gives it
// (ExpandHostlist). Seeds: slurm_hostlist_fuzz_corpus/ (the forms of slurm_test's table).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/config/slurm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  StatusOr<std::vector<std::string>> hosts =
      ExpandHostlist(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!hosts.ok()) return 0;
  if (hosts->size() > (size_t{1} << 20)) __builtin_trap();  // the documented cap
  for (const std::string& host : *hosts) {
    if (host.empty()) __builtin_trap();
  }
  return 0;
}
