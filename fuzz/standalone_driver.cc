// The main() of a fuzz target outside libFuzzer: feeds LLVMFuzzerTestOneInput every file of
// the directories and files named on the command line (relative paths are looked up in the
// test's runfiles first), in name order, as `fuzzer -runs=0 DIR` does. A crash, a sanitizer
// report or an exit code other than 0 fails it; so does a directory without a single file (a
// corpus that went missing would otherwise test nothing).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::filesystem::path Resolve(const std::string& arg) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr && !arg.empty() && arg[0] != '/') {
    std::filesystem::path in_runfiles = std::filesystem::path(srcdir) / workspace / arg;
    if (std::filesystem::exists(in_runfiles)) return in_runfiles;
  }
  return arg;
}

}  // namespace

int main(int argc, char** argv) {
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path = Resolve(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        std::fprintf(stderr, "%s: no input in %s\n", argv[0], path.c_str());
        return 1;
      }
    } else {
      files.push_back(path);
    }
    for (const std::filesystem::path& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "%s: cannot read %s\n", argv[0], file.c_str());
        return 1;
      }
      // A buffer of exactly the input's size, so that ASan sees any read past its end.
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      std::vector<uint8_t> input(bytes.begin(), bytes.end());
      LLVMFuzzerTestOneInput(input.data(), input.size());
      ++ran;
    }
  }
  std::printf("ran %zu inputs\n", ran);
  return 0;
}
