// Conversions between float32 and the two 16-bit floating-point formats collectives carry:
// IEEE 754 binary16 ("float16": 1 sign, 5 exponent, 10 mantissa bits) and bfloat16 (the upper
// half of a float32: 1 sign, 8 exponent, 7 mantissa bits).
//
//   uint16_t h = FloatToHalf(0.1f);   // 0x2e66, the float16 nearest to 0.1f
//   float f = HalfToFloat(h);         // 0.0999755859375, exactly
//
// To 16 bits: round to nearest, ties to even (IEEE's default), as hardware conversions do.
// Values beyond the largest finite 16-bit value by half an ulp or more become +-infinity;
// values below the smallest subnormal by more than half of it become +-0; NaN stays NaN (a
// quiet NaN with the same sign), never infinity. From 16 bits: exact (every float16 and bfloat16
// value is a float32 value). Float16 subnormals are produced and read; the code needs the
// default floating-point environment (round to nearest, no flush-to-zero).
//
// Thread-safety: pure functions.
#ifndef TESSERA_WORKER_COLLECTIVES_HALF_FLOAT_H_
#define TESSERA_WORKER_COLLECTIVES_HALF_FLOAT_H_

#include <cstdint>
#include <cstring>

namespace tessera::worker {
namespace half_float_internal {

inline uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace half_float_internal

// float32 -> float16. The method is F. Giesen's float_to_half_fast3_rtne: the exponent is
// re-biased with integer arithmetic and the rounding bias added to the bits, except for results
// that are float16 subnormals, which a float addition of a magic constant rounds.
inline uint16_t FloatToHalf(float value) {
  using half_float_internal::Bits;
  using half_float_internal::FromBits;
  constexpr uint32_t kFloatInfinity = 255u << 23;
  constexpr uint32_t kHalfOverflow = (127u + 16) << 23;  // 65536.0f: at or above, +-inf or NaN
  constexpr uint32_t kHalfMinNormal = 113u << 23;        // 2^-14, the smallest normal float16
  // 0.5f: adding it leaves a value below 2^-14 rounded to a multiple of 2^-24, the float16
  // subnormal spacing, in the low mantissa bits.
  constexpr uint32_t kSubnormalMagic = ((127u - 15) + (23 - 10) + 1) << 23;

  uint32_t bits = Bits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;  // |value|
  uint16_t half;
  if (bits >= kHalfOverflow) {
    half = bits > kFloatInfinity ? 0x7e00 : 0x7c00;  // NaN -> quiet NaN; too large -> infinity
  } else if (bits < kHalfMinNormal) {
    half = static_cast<uint16_t>(Bits(FromBits(bits) + FromBits(kSubnormalMagic)) -
                                 kSubnormalMagic);
  } else {
    const uint32_t mantissa_odd = (bits >> 13) & 1;
    bits += ((15u - 127u) << 23) + 0xfff;  // re-bias the exponent; rounding bias, part 1
    bits += mantissa_odd;                  // part 2: ties go to the even mantissa
    half = static_cast<uint16_t>(bits >> 13);  // a carry into the exponent rounds up correctly
  }
  return static_cast<uint16_t>(half | (sign >> 16));
}

// float16 -> float32, exact (Giesen's half_to_float with a float subtraction renormalising
// subnormals).
inline float HalfToFloat(uint16_t half) {
  using half_float_internal::Bits;
  using half_float_internal::FromBits;
  constexpr uint32_t kShiftedExponent = 0x7c00u << 13;
  uint32_t bits = (half & 0x7fffu) << 13;  // exponent and mantissa in float position
  const uint32_t exponent = bits & kShiftedExponent;
  bits += (127u - 15) << 23;  // re-bias the exponent
  if (exponent == kShiftedExponent) {
    bits += (128u - 16) << 23;  // infinity or NaN: exponent all ones
  } else if (exponent == 0) {
    bits += 1u << 23;  // zero or subnormal: renormalise
    bits = Bits(FromBits(bits) - FromBits(113u << 23));
  }
  return FromBits(bits | (static_cast<uint32_t>(half & 0x8000u) << 16));
}

// float32 -> bfloat16: drop the lower 16 bits, rounding to nearest even by adding 0x7fff plus
// the lowest kept bit first (a carry into the exponent rounds up correctly, up to infinity).
inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = half_float_internal::Bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: quiet, never rounded to inf
  }
  const uint32_t lowest_kept = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7fffu + lowest_kept) >> 16);
}

// bfloat16 -> float32, exact.
inline float BFloat16ToFloat(uint16_t bfloat16) {
  return half_float_internal::FromBits(static_cast<uint32_t>(bfloat16) << 16);
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_HALF_FLOAT_H_
