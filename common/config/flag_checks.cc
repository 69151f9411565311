#include "common/config/flag_checks.h"

#include <charconv>
#include <cmath>
#include <sstream>
#include <string>

namespace tessera {
namespace {

template <typename T>
std::string Interval(T min, T max) {
  std::ostringstream out;
  out << "[" << min << ", " << max << "]";
  return out.str();
}

}  // namespace

CLI::Validator FiniteRange(double min, double max) {
  const std::string interval = Interval(min, max);
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

CLI::Validator UnsignedRange(uint64_t min, uint64_t max) {
  const std::string interval = Interval(min, max);
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
