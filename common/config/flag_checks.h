// CLI11 checks for numeric flags. Every numeric flag of every binary states its range with one
// of these (or CLI::Range for integers), so a value outside it is refused naming the flag, the
// value and the range, and no number means "use the default": that is an absent flag.
//
//   app.add_option("--lr", lr, "Learning rate")->check(FiniteRange(0, 1e6));
//   app.add_option("--seed", seed, "Seed")->check(UnsignedRange(0, UINT64_MAX));
//
// CLI::Range alone is not enough for these: it lets nan through (every comparison with nan is
// false), and CLI11 reads "-1" into an unsigned flag as 2^64 - 1.
//
// Defined here, not in a source of their own: only sources that already include CLI11 use
// them, and a source that includes CLI11 costs about 6 CPU-seconds to compile (issue 43).
#ifndef TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_
#define TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_

#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

namespace tessera {
namespace flag_checks_internal {

template <typename T>
std::string Interval(T min, T max) {
  std::ostringstream out;
  out << "[" << min << ", " << max << "]";
  return out.str();
}

}  // namespace flag_checks_internal

// A finite number in [min, max]: "nan is not a finite number in [0, 1000000]".
inline CLI::Validator FiniteRange(double min, double max) {
  const std::string interval = flag_checks_internal::Interval(min, max);
  return CLI::Validator(
      [min, max, interval](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::general);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) ||
            value < min || value > max) {
          return "'" + text + "' is not a finite number in " + interval;
        }
        return std::string();
      },
      "FLOAT in " + interval);
}

// A decimal integer in [min, max], without a sign:
// "-1 is not an integer in [0, 18446744073709551615]".
inline CLI::Validator UnsignedRange(uint64_t min, uint64_t max) {
  const std::string interval = flag_checks_internal::Interval(min, max);
  return CLI::Validator(
      [min, max, interval](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
          return "'" + text + "' is not an integer in " + interval;
        }
        return std::string();
      },
      "UINT in " + interval);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_
