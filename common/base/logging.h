// Leveled logging with a role/rank prefix.
//
//   TLOG(INFO) << "registered as rank " << rank;
//   -> "2026-11-21 07:41:44.123 I worker 1 | registered as rank 1"
//
// One line per statement, written atomically to stderr (lines from different threads never
// interleave). The identity (role, rank) and the minimum level are process-wide and set once
// by main() after the config is parsed; that is the one piece of global state we allow,
// because every line of a process shares it.
//
// Thread-safety: all functions are thread-safe.
#ifndef TESSERA_COMMON_BASE_LOGGING_H_
#define TESSERA_COMMON_BASE_LOGGING_H_

#include <sstream>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Parses "debug", "info", "warning"/"warn", "error".
StatusOr<LogLevel> ParseLogLevel(std::string_view name);

// Sets the prefix of every later line, e.g. ("worker", 1) -> "worker 1"; rank < 0 prints the
// role alone (a process that has no rank yet).
void SetLogIdentity(std::string_view role, int rank);
void SetMinLogLevel(LogLevel level);
bool LogLevelEnabled(LogLevel level);

// Builds one line and writes it when destroyed. Use through TLOG.
class LogLine {
 public:
  explicit LogLine(LogLevel level);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns a stream expression into void so TLOG can be the branch of a conditional expression.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tessera

#define TESSERA_LOG_LEVEL_DEBUG ::tessera::LogLevel::kDebug
#define TESSERA_LOG_LEVEL_INFO ::tessera::LogLevel::kInfo
#define TESSERA_LOG_LEVEL_WARNING ::tessera::LogLevel::kWarning
#define TESSERA_LOG_LEVEL_ERROR ::tessera::LogLevel::kError

// TLOG(INFO) << ...; arguments are not evaluated when the level is disabled. An expression,
// not an if/else, so `if (x) TLOG(INFO) << y; else ...` means what it says.
#define TLOG(level)                                            \
  !::tessera::LogLevelEnabled(TESSERA_LOG_LEVEL_##level)       \
      ? (void)0                                                \
      : ::tessera::LogVoidify() & ::tessera::LogLine(TESSERA_LOG_LEVEL_##level).stream()

#endif  // TESSERA_COMMON_BASE_LOGGING_H_
