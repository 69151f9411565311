#include "common/training/nonfinite.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tessera {
namespace {

constexpr uint32_t kExponent = 0x7f800000u;  // all ones: Inf or NaN
constexpr size_t kBlock = 4096;              // floats scanned between early exits

float FloatAt(const void* values, size_t index) {
  float value;
  std::memcpy(&value, static_cast<const char*>(values) + index * sizeof(float), sizeof(value));
  return value;
}

// Whether any of values[0, count) is non-finite: branch-free, so the compiler vectorises it.
bool AnyNonFinite(const unsigned char* bytes, size_t count) {
  uint32_t found = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes + i * sizeof(bits), sizeof(bits));
    found |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return found != 0;
}

}  // namespace

std::optional<size_t> FirstNonFinite(const void* values, size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(values);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = count - begin < kBlock ? count - begin : kBlock;
    if (!AnyNonFinite(bytes + begin * sizeof(float), n)) continue;
    for (size_t i = begin; i < begin + n; ++i) {
      if (!std::isfinite(FloatAt(values, i))) return i;
    }
  }
  return std::nullopt;
}

std::string DescribeNonFinite(const void* values, size_t index) {
  const float value = FloatAt(values, index);
  const char* what = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  return std::string(what) + " at element " + std::to_string(index);
}

}  // namespace tessera
