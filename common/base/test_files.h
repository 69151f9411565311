// WriteTestFile: a file with given text and mode under the test's scratch directory, for tests
// of readers that check permissions (key files, auth files).
//
//   std::string path = WriteTestFile("users", "prometheus:s3cret\n", 0600);
//
// Thread-safety: a plain function; tests in one process must not use the same name at once.
#ifndef TESSERA_COMMON_BASE_TEST_FILES_H_
#define TESSERA_COMMON_BASE_TEST_FILES_H_

#include <sys/types.h>

#include <string>

namespace tessera {

// Writes `text` to "<TEST_TMPDIR or /tmp>/<name>" (replacing it) with `mode`; returns the path.
std::string WriteTestFile(const std::string& name, const std::string& text, mode_t mode);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_TEST_FILES_H_
