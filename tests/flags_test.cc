// Every numeric flag of every binary refuses a bad value with a clear error (issue 19: "--lr
// -1" and "--lr nan" trained with the default lr, "--seed -1" became 2^64 - 1). The flags are
// read from each binary's --help, so a flag added later is checked too: each must refuse a
// negative number, nan, inf, a number too large for any range, an empty value and text, and
// those whose range starts above 0 (or whose zero means nothing) must refuse 0, each with a
// non-zero exit (not a crash) and an error naming the flag. No number means "the default":
// that is an absent flag.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

struct Binary {
  std::string label;
  std::string path;                 // workspace-relative
  std::vector<std::string> before;  // a subcommand
  std::vector<std::string> after;   // required flags (before the bad one, so it is the last)
  size_t min_numeric_flags;         // guards the --help parsing
};

const std::vector<Binary> kBinaries = {
    {"tessera-worker", "worker/tessera-worker", {}, {}, 40},
    {"tessera-server", "server/ps/tessera-server", {}, {"--coordinator", "127.0.0.1:1"}, 10},
    {"tessera-coordinator", "coordinator/tessera-coordinator", {}, {}, 8},
    {"tessera-launch", "tools/tessera-launch", {}, {}, 8},
    {"tessera-export-params", "tools/tessera-export-params", {},
     {"--checkpoint-dir", "/nonexistent", "--out", "/nonexistent/params"}, 1},
    {"tessera-bench transport", "tools/tessera-bench", {"transport"}, {}, 2},
    {"tessera-bench train", "tools/tessera-bench", {"train"}, {}, 5},
    {"tessera-bench allreduce", "tools/tessera-bench", {"allreduce"}, {"--np", "2"}, 5},
    {"tessera-bench memory", "tools/tessera-bench", {"memory"}, {}, 2},
    {"tessera-bench exit", "tools/tessera-bench", {"exit"}, {}, 1},
    {"tessera-bench torch", "tools/tessera-bench", {"torch"}, {}, 5},
    {"tessera-bench ps", "tools/tessera-bench", {"ps"}, {}, 5},
    {"tessera-bench groups", "tools/tessera-bench", {"groups"}, {}, 5},
    {"tessera-bench pipeline", "tools/tessera-bench", {"pipeline"}, {}, 7},
    {"comm-handoff-bench", "tools/comm-handoff-bench", {}, {}, 3},
};

// Type names of numeric options in --help.
const std::set<std::string> kNumericTypes = {"INT", "UINT", "FLOAT", "N",     "R",
                                             "P",   "MS",   "SECONDS", "BYTES", "PORT"};
// Numeric flags whose --help shows no range and for which 0 is meaningless.
const std::set<std::string> kZeroIsInvalid = {
    "--rendezvous-timeout-ms", "--heartbeat-interval-ms", "--heartbeat-timeout-ms",
    "--request-timeout-ms",    "--max-message-bytes",     "--start-timeout",
    "--nnodes"};

std::string Quoted(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `argv` with stdin from /dev/null; its exit status (-1: killed by a signal) and output.
std::pair<int, std::string> RunArgv(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& arg : argv) command += Quoted(arg) + " ";
  command += "< /dev/null 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-2, "cannot run " + command};
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

struct NumericFlag {
  std::string name;  // "--lr"
  bool zero_invalid = false;
};

// The numeric flags of a --help text, with whether 0 is outside their range.
std::vector<NumericFlag> NumericFlags(const std::string& help) {
  std::vector<NumericFlag> flags;
  // "  --steps INT:INT in [0 - 1099511627776]=100  ...", "  --num-workers,--world-size INT=1"
  const std::regex option(R"(^\s+(--[a-z0-9-]+)(,--[a-z0-9-]+)*\s+([A-Z]+)((?:[:=]\S*)?)(?:\s|$))");
  const std::regex range_start(R"(in \[(-?[0-9.e+]+)[ ,-])");
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (!std::regex_search(line, match, option) || !kNumericTypes.count(match[3])) continue;
    NumericFlag flag{match[1], kZeroIsInvalid.count(match[1]) != 0};
    std::smatch range;
    const std::string rest = match[4];
    if (std::regex_search(rest, range, range_start) && std::stod(range[1]) > 0) {
      flag.zero_invalid = true;
    }
    flags.push_back(flag);
  }
  return flags;
}

TEST(FlagsTest, EveryNumericFlagOfEveryBinaryRefusesBadValuesNamingTheFlag) {
  for (const Binary& binary : kBinaries) {
    SCOPED_TRACE(binary.label);
    std::vector<std::string> help_argv = {BinaryPath(binary.path)};
    help_argv.insert(help_argv.end(), binary.before.begin(), binary.before.end());
    help_argv.push_back("--help");
    auto [help_status, help] = RunArgv(help_argv);
    ASSERT_EQ(help_status, 0) << help;
    const std::vector<NumericFlag> flags = NumericFlags(help);
    EXPECT_GE(flags.size(), binary.min_numeric_flags) << help;
    for (const NumericFlag& flag : flags) {
      std::vector<std::string> values = {"-1",   "nan",  "inf", "1e999", "99999999999999999999",
                                         "abc", ""};
      if (flag.zero_invalid) values.push_back("0");
      for (const std::string& value : values) {
        std::vector<std::string> argv = {BinaryPath(binary.path)};
        argv.insert(argv.end(), binary.before.begin(), binary.before.end());
        argv.insert(argv.end(), binary.after.begin(), binary.after.end());
        argv.push_back(flag.name + "=" + value);
        auto [status, output] = RunArgv(argv);
        const std::string what = flag.name + "=" + value + " -> exit " +
                                 std::to_string(status) + ":\n" + output;
        EXPECT_GT(status, 0) << what;
        EXPECT_LT(status, 128) << what;  // an error, not a crash
        EXPECT_NE(output.find(flag.name), std::string::npos) << what;
        // The value as given (a number too large for an integer may be shown as parsed, 1e+20).
        if (!value.empty() && value != "99999999999999999999") {
          EXPECT_NE(output.find(value), std::string::npos) << what;
        }
      }
    }
  }
}

// The parameter-server mode flags of the benchmarks name the value they refuse and what they
// take instead.
TEST(FlagsTest, BenchmarkModeFlagsRefuseUnknownModesNamingThem) {
  struct Case {
    std::vector<std::string> argv;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{BinaryPath("worker/tessera-worker"), "--bench-ps-mode=ps-bogus"},
       "--bench-ps-mode: unknown parameter-server mode 'ps-bogus'; expected ps-sync, ps-async "
       "or ps-ssp"},
      {{BinaryPath("tools/tessera-bench"), "ps", "--replicas", "2", "--replica-mode=bogus"},
       "--replica-mode: bogus not in {ps-sync,ps-async}"},
      {{BinaryPath("tools/tessera-bench"), "ps", "--replicas", "2", "--replica-paths=shm,disk"},
       "--replica-paths=\"shm,disk\": \"disk\" is not shm or sockets"},
  };
  for (const Case& c : cases) {
    auto [status, output] = RunArgv(c.argv);
    EXPECT_GT(status, 0) << output;
    EXPECT_LT(status, 128) << output;
    EXPECT_NE(output.find(c.expected), std::string::npos) << output;
  }
}

}  // namespace
}  // namespace tessera::testing
