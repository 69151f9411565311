// For fuzz targets of readers that take a path: the input written to a file in a directory of
// the process's own, so that the reader reads exactly those bytes from disk.
#ifndef TESSERA_FUZZ_FUZZ_FILES_H_
#define TESSERA_FUZZ_FUZZ_FILES_H_

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera::fuzz {

// A directory made once per process (mkdtemp under $TMPDIR or /tmp), left behind at exit.
inline const std::string& ScratchDirectory() {
  static const std::string directory = [] {
    const char* tmp = getenv("TEST_TMPDIR");
    if (tmp == nullptr) tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/tessera-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) __builtin_trap();
    return pattern;
  }();
  return directory;
}

// Writes [data, data + size) to `path` (replacing it); traps when it cannot: a fuzz run on a
// full disk should stop, not report the reader's errors as coverage.
inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) __builtin_trap();
  std::fclose(file);
}

}  // namespace tessera::fuzz

#endif  // TESSERA_FUZZ_FUZZ_FILES_H_
