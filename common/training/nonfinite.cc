#include "common/training/nonfinite.h"

#include <immintrin.h>

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

// Four floats' bits at once: GCC's vector extension in the width of one SSE2 register (wider
// vectors are lowered lane by lane without AVX; unsigned lanes are compared in scalar code).
typedef int32_t Lanes __attribute__((vector_size(16)));
constexpr int32_t kExponentLanes = static_cast<int32_t>(kExponent);

// Whether any of values[0, count) is non-finite: the exponent bits compared sixteen floats a
// round, in four independent accumulators, branch-free (GCC -O2 leaves the scalar loop as it
// is: 5 GB/s).
bool AnyNonFiniteSse2(const unsigned char* bytes, size_t count) {
  const Lanes exponent = {kExponentLanes, kExponentLanes, kExponentLanes, kExponentLanes};
  // Named, not an array: GCC keeps an array of vectors in memory, one store per round.
  Lanes f0 = {}, f1 = {}, f2 = {}, f3 = {};
  const auto at = [bytes](size_t element) {
    Lanes bits;
    std::memcpy(&bits, bytes + element * sizeof(uint32_t), sizeof(bits));
    return bits;
  };
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    f0 |= (at(i) & exponent) == exponent;
    f1 |= (at(i + 4) & exponent) == exponent;
    f2 |= (at(i + 8) & exponent) == exponent;
    f3 |= (at(i + 12) & exponent) == exponent;
  }
  const Lanes all = f0 | f1 | f2 | f3;
  uint32_t any = 0;
  for (int lane = 0; lane < 4; ++lane) any |= static_cast<uint32_t>(all[lane]);
  for (; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes + i * sizeof(bits), sizeof(bits));
    any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return any != 0;
}

// The same question, 32 floats a round: each multiplied by zero and added into one of four
// accumulators (one fused multiply-add per eight floats; a NaN or infinity makes its
// accumulator NaN for good). 25-30% faster than the SSE2 kernel on gradients that backward has
// just written (7.4 MB: 0.15 ms against 0.19-0.2 ms on this project's VM).
__attribute__((target("avx2,fma"))) bool AnyNonFiniteAvx2(const unsigned char* bytes,
                                                          size_t count) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 f0 = zero, f1 = zero, f2 = zero, f3 = zero;
  // (No lambda for the loads: it would not inherit this function's target.)
  const float* floats = reinterpret_cast<const float*>(bytes);
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    f0 = _mm256_fmadd_ps(_mm256_loadu_ps(floats + i), zero, f0);
    f1 = _mm256_fmadd_ps(_mm256_loadu_ps(floats + i + 8), zero, f1);
    f2 = _mm256_fmadd_ps(_mm256_loadu_ps(floats + i + 16), zero, f2);
    f3 = _mm256_fmadd_ps(_mm256_loadu_ps(floats + i + 24), zero, f3);
  }
  const __m256 all = _mm256_add_ps(_mm256_add_ps(f0, f1), _mm256_add_ps(f2, f3));
  if (_mm256_movemask_ps(_mm256_cmp_ps(all, all, _CMP_UNORD_Q)) != 0) return true;
  return i < count && AnyNonFiniteSse2(bytes + i * sizeof(float), count - i);
}

using AnyNonFiniteKernel = bool (*)(const unsigned char*, size_t);

std::optional<size_t> FirstNonFiniteWith(AnyNonFiniteKernel any, const void* values,
                                         size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(values);
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = count - begin < kBlock ? count - begin : kBlock;
    if (!any(bytes + begin * sizeof(float), n)) continue;
    for (size_t i = begin; i < begin + n; ++i) {
      if (!std::isfinite(FloatAt(values, i))) return i;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<size_t> FirstNonFinite(const void* values, size_t count) {
  static const AnyNonFiniteKernel kernel =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? AnyNonFiniteAvx2
                                                                       : AnyNonFiniteSse2;
  return FirstNonFiniteWith(kernel, values, count);
}

std::optional<size_t> FirstNonFiniteSse2(const void* values, size_t count) {
  return FirstNonFiniteWith(AnyNonFiniteSse2, values, count);
}

std::string NonFiniteName(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return std::to_string(value);
}

std::string DescribeNonFinite(const void* values, size_t index) {
  return NonFiniteName(FloatAt(values, index)) + " at element " + std::to_string(index);
}

}  // namespace tessera
