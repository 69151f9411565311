// Deadline: an absolute point on the steady clock that every wait in Tessera is bounded by.
#ifndef TESSERA_COMMON_BASE_DEADLINE_H_
#define TESSERA_COMMON_BASE_DEADLINE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tessera {

using SteadyClock = std::chrono::steady_clock;

// How often a wait that nothing else wakes on a stop request (SIGTERM, SIGINT) looks at it.
inline constexpr int64_t kStopCheckMs = 20;

class Deadline {
 public:
  static Deadline After(std::chrono::milliseconds timeout) {
    return Deadline(SteadyClock::now() + timeout);
  }
  static Deadline AfterMillis(int64_t millis) {
    return After(std::chrono::milliseconds(millis));
  }
  explicit Deadline(SteadyClock::time_point when) : when_(when) {}

  SteadyClock::time_point when() const { return when_; }
  bool Expired() const { return SteadyClock::now() >= when_; }
  // Milliseconds left, never negative.
  int64_t RemainingMillis() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(when_ - SteadyClock::now());
    return std::max<int64_t>(0, left.count());
  }

 private:
  SteadyClock::time_point when_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_DEADLINE_H_
