// Helpers shared by tessera-bench's benchmarks (tools/bench/*_bench.cc): child processes run
// to completion under a deadline, their JSON summaries, runfiles, scratch directories, list
// flags and the median.
#ifndef TESSERA_TOOLS_BENCH_BENCH_UTIL_H_
#define TESSERA_TOOLS_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace CLI {
class App;
}

namespace tessera::tools {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, where python3-torch installs

// A subcommand of tessera-bench: AddXBench(parent) adds its CLI::App with its flags, and `run`
// (called only when that subcommand was parsed) runs it and returns the exit status.
struct BenchCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

struct ChildOutput {
  std::vector<std::string> stdout_lines;
  std::vector<std::string> stderr_lines;
};

// Per child run of the train benchmark; a run of the defaults takes seconds.
constexpr int64_t kChildTimeoutMillis = 600'000;

// Runs argv until it exits (at most timeout_ms, then it is stopped) and returns its output.
// An error names `label`, how the child ended and the last lines of its stderr.
StatusOr<ChildOutput> RunToCompletion(const std::string& label,
                                      const std::vector<std::string>& argv,
                                      int64_t timeout_ms = kChildTimeoutMillis);

// Runs the children together until all have exited (at most timeout_ms, then every one still
// running is stopped, and the error names them). The first child to fail stops the others,
// and the error names it, how it ended and the last lines of its stderr. The outputs are in
// the order of `children`.
struct ChildSpec {
  std::string label;
  std::vector<std::string> argv;
};
StatusOr<std::vector<ChildOutput>> RunAllToCompletion(const std::vector<ChildSpec>& children,
                                                      int64_t timeout_ms);

// The {"bench": `bench`, ...} objects the children printed on stdout (after any "[worker N] "
// prefix tessera-launch adds), in order.
std::vector<nlohmann::json> BenchLines(const std::vector<ChildOutput>& outputs,
                                       const std::string& bench);

// The last stdout line that parses as a JSON object.
StatusOr<nlohmann::json> LastJsonLine(const std::string& label, const ChildOutput& output);

// Where Bazel puts a data dependency of this binary: its runfiles, or (for a binary copied
// out of bazel-bin with its tree) relative to it.
StatusOr<std::string> FindRunfile(const std::string& workspace_path);

// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it, and it was closed).
StatusOr<int> FreePort();

// "1-2-3" for ({1, 2, 3}, "-").
std::string JoinInts(const std::vector<int64_t>& values, const char* separator);

// REQUIRES: !values.empty().
double Median(std::vector<double> values);

// A scratch directory under $TMPDIR (or /tmp), removed with everything in it when destroyed.
class ScratchDirectory {
 public:
  static StatusOr<std::unique_ptr<ScratchDirectory>> Create();
  ~ScratchDirectory();
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDirectory(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

// The value of `key=` in a TESSERA_READY line ("address", "pid", ...); empty when absent.
std::string ReadyField(const std::string& line, const std::string& key);

// A new job key for the children a benchmark starts itself (tessera-launch makes its own):
// written to `directory`/job.key and named by TESSERA_AUTH_KEY_FILE in this process's
// environment, which every child started later inherits.
Status ShareNewJobKey(const std::string& directory);

// Comma-separated values of `flag`, each parsed by `parse`; an error quotes the flag and text.
template <typename T>
StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text,
                                   const std::function<StatusOr<T>(const std::string&)>& parse) {
  std::vector<T> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    StatusOr<T> value = parse(item);
    if (!value.ok()) {
      return InvalidArgumentError(flag + "=\"" + text + "\": " + value.status().message());
    }
    values.push_back(*value);
  }
  if (values.empty()) return InvalidArgumentError(flag + " is empty");
  return values;
}

// An integer in [1, 1048576].
StatusOr<int64_t> ParsePositive(const std::string& item);

// "4096", "4K", "16M" (binary units; also KiB, MiB, G, GiB): a multiple of 4 bytes (float32)
// between 4 and 1 GiB.
StatusOr<size_t> ParseByteSize(const std::string& item);

// "4096,16777216": byte counts as child processes take them.
std::string JoinSizes(const std::vector<size_t>& sizes);

// "16 MiB", "4 KiB", "100 B".
std::string HumanBytes(size_t bytes);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_BENCH_UTIL_H_
