#include "common/base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace tessera {
namespace {

struct LogState {
  std::mutex mu;
  std::string identity;  // guarded by mu
  std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: threads may log during exit
  return *state;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning" || name == "warn") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return InvalidArgumentError("unknown log level '" + std::string(name) +
                              "' (expected debug, info, warning or error)");
}

void SetLogIdentity(std::string_view role, int rank) {
  std::string identity(role);
  if (rank >= 0) identity += " " + std::to_string(rank);
  LogState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.identity = std::move(identity);
}

void SetMinLogLevel(LogLevel level) { State().min_level.store(static_cast<int>(level)); }

bool LogLevelEnabled(LogLevel level) {
  return static_cast<int>(level) >= State().min_level.load(std::memory_order_relaxed);
}

LogLine::LogLine(LogLevel level) : level_(level) {}

LogLine::~LogLine() {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm_utc;
  gmtime_r(&seconds, &tm_utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm_utc);

  LogState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  std::fprintf(stderr, "%s.%03d %c %s | %s\n", stamp, millis, LevelLetter(level_),
               state.identity.empty() ? "tessera" : state.identity.c_str(),
               stream_.str().c_str());
  std::fflush(stderr);
}

}  // namespace tessera
