#include "worker/collectives/half_float.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

namespace tessera::worker {
namespace {

float FromBits(uint32_t bits) { return half_float_internal::FromBits(bits); }
uint32_t Bits(float value) { return half_float_internal::Bits(value); }

// A 16-bit format described by its numbers, for references computed in double arithmetic
// (independent of the bit manipulations under test).
struct Format {
  const char* name;
  int mantissa_bits;      // stored mantissa bits
  int min_exponent;       // exponent of the smallest normal value
  double overflow_limit;  // |x| at or above this rounds to infinity (max + half an ulp)
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);
};

void PrintTo(const Format& format, std::ostream* out) { *out << format.name; }

const Format kHalf = {"float16", 10, -14, 65520.0, FloatToHalf, HalfToFloat};
const Format kBFloat16 = {"bfloat16", 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127),
                          FloatToBFloat16, BFloat16ToFloat};

// The value of the 16-bit pattern `bits`, from the definition of the format.
double Decode(const Format& format, uint16_t bits) {
  const int exponent_bits = 15 - format.mantissa_bits;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const bool negative = (bits & 0x8000) != 0;
  const int exponent = (bits >> format.mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << format.mantissa_bits) - 1);
  double value;
  if (exponent == (1 << exponent_bits) - 1) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(mantissa, 1 - bias - format.mantissa_bits);
  } else {
    value = std::ldexp((1 << format.mantissa_bits) + mantissa,
                       exponent - bias - format.mantissa_bits);
  }
  return negative ? -value : value;
}

// The value of the format nearest to x, ties to the even mantissa, as a double.
double RoundToFormat(const Format& format, float x) {
  if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = std::fabs(static_cast<double>(x));
  double rounded;
  if (magnitude >= format.overflow_limit) {
    rounded = std::numeric_limits<double>::infinity();
  } else if (magnitude == 0) {
    rounded = 0;
  } else {
    const int exponent = std::max(std::ilogb(magnitude), format.min_exponent);
    const double quantum = std::ldexp(1.0, exponent - format.mantissa_bits);
    rounded = std::nearbyint(magnitude / quantum) * quantum;  // nearbyint: ties to even
  }
  return std::copysign(rounded, static_cast<double>(x));
}

// Checks the conversion of x against the reference; returns false (after one failure) so
// loops stop at the first wrong value.
bool ConvertsLikeTheReference(const Format& format, float x) {
  const uint16_t bits = format.encode(x);
  const double got = Decode(format, bits);
  const double want = RoundToFormat(format, x);
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << format.name << " of NaN 0x" << std::hex << Bits(x)
                                 << " is 0x" << bits;
    return std::isnan(got);
  }
  const bool same = got == want && std::signbit(got) == std::signbit(want);
  EXPECT_TRUE(same) << format.name << " of " << x << " (0x" << std::hex << Bits(x) << std::dec
                    << ") is " << got << ", expected " << want;
  return same;
}

// Every finite value of the format, in increasing order of magnitude, positive only.
std::vector<uint16_t> FinitePositive(const Format& format) {
  std::vector<uint16_t> values;
  for (uint32_t bits = 0; bits < 0x8000; ++bits) {
    if (std::isfinite(Decode(format, static_cast<uint16_t>(bits)))) {
      values.push_back(static_cast<uint16_t>(bits));
    }
  }
  return values;
}

class HalfFloatTest : public ::testing::TestWithParam<Format> {};

TEST_P(HalfFloatTest, DecodesEveryPatternExactly) {
  const Format& format = GetParam();
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const double want = Decode(format, static_cast<uint16_t>(bits));
    const float got = format.decode(static_cast<uint16_t>(bits));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << bits;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << bits;
    }
  }
}

TEST_P(HalfFloatTest, RoundTripsEveryPattern) {
  const Format& format = GetParam();
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = format.decode(static_cast<uint16_t>(bits));
    const uint16_t back = format.encode(value);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(format.decode(back))) << std::hex << bits;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << "NaN keeps its sign: " << std::hex << bits;
    } else {
      ASSERT_EQ(back, bits) << std::hex << bits;
    }
  }
}

// Halfway between two neighbours the result is the one with the even mantissa; a float ulp
// either side, the nearer one. Midpoints of 16-bit neighbours are exact in float.
TEST_P(HalfFloatTest, RoundsMidpointsToEvenAndNeighboursToTheNearest) {
  const Format& format = GetParam();
  std::vector<uint16_t> values = FinitePositive(format);
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float low = format.decode(values[i]);
    const float high = format.decode(values[i + 1]);
    const float mid = static_cast<float>((static_cast<double>(low) + high) / 2);
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(low) + high) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, high)}) {
      ASSERT_TRUE(ConvertsLikeTheReference(format, x));
      ASSERT_TRUE(ConvertsLikeTheReference(format, -x));
    }
    const uint16_t even = (values[i] & 1) == 0 ? values[i] : values[i + 1];
    ASSERT_EQ(format.encode(mid), even) << format.name << " midpoint " << mid;
  }
  // Beyond the largest finite value: half an ulp or more rounds to infinity.
  const float max = format.decode(values.back());
  const float limit = static_cast<float>(format.overflow_limit);
  EXPECT_EQ(format.decode(format.encode(std::nextafter(limit, 0.0f))), max);
  EXPECT_TRUE(std::isinf(format.decode(format.encode(limit))));
  EXPECT_TRUE(std::isinf(format.decode(format.encode(-limit))));
}

TEST_P(HalfFloatTest, RoundsRandomFloatsLikeTheReference) {
  const Format& format = GetParam();
  std::mt19937 random(12345);
  // Any bit pattern (NaNs, infinities, huge and tiny values)...
  for (int i = 0; i < 1000000; ++i) {
    ASSERT_TRUE(ConvertsLikeTheReference(format, FromBits(static_cast<uint32_t>(random()))));
  }
  // ...and magnitudes around the format's own range, where rounding matters most.
  const int low = format.min_exponent - format.mantissa_bits - 2;
  const int high = format.mantissa_bits == 10 ? 17 : 127;
  std::uniform_int_distribution<int> exponent(low, high);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t biased = static_cast<uint32_t>(std::max(exponent(random) + 127, 1));
    const uint32_t bits = (biased << 23) | mantissa(random) | ((i & 1) ? 0x80000000u : 0);
    ASSERT_TRUE(ConvertsLikeTheReference(format, FromBits(bits)));
  }
}

TEST_P(HalfFloatTest, KeepsSpecialValues) {
  const Format& format = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(format.decode(format.encode(inf)), inf);
  EXPECT_EQ(format.decode(format.encode(-inf)), -inf);
  EXPECT_EQ(format.encode(0.0f), 0x0000);
  EXPECT_EQ(format.encode(-0.0f), 0x8000);
  EXPECT_EQ(format.encode(1.0f), format.mantissa_bits == 10 ? 0x3c00 : 0x3f80);
  // NaNs, including those whose payload lies only in the bits that are dropped, stay NaN
  // (quiet) with their sign, and never become infinity.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u, 0xffffffffu}) {
    const uint16_t bits = format.encode(FromBits(nan));
    EXPECT_TRUE(std::isnan(format.decode(bits))) << std::hex << nan;
    EXPECT_EQ(bits & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
    EXPECT_NE(bits & (1u << (format.mantissa_bits - 1)), 0u) << "quiet: " << std::hex << nan;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfFloatTest, ::testing::Values(kHalf, kBFloat16),
                         [](const ::testing::TestParamInfo<Format>& info) {
                           return std::string(info.param.name);
                         });

TEST(HalfFloatTest, KnownFloat16Values) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);          // the largest finite float16
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);          // below the midpoint to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);          // the midpoint: ties to even = infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // half of it: ties to even = 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);  // above half: rounds up
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(HalfToFloat(0x2e66), 0.0999755859375f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
}

TEST(HalfFloatTest, KnownBFloat16Values) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fffu)), 0x7f7f);  // just below the midpoint
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00000001u)), 0x0000);  // float subnormals keep rounding
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xc0a0), -5.0f);
}

}  // namespace
}  // namespace tessera::worker
