#include "common/base/test_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace tessera {

std::string WriteTestFile(const std::string& name, const std::string& text, mode_t mode) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  unlink(path.c_str());
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

}  // namespace tessera
