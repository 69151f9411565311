#include "common/training/nonfinite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tessera {
namespace {

// Both kernels (FirstNonFinite uses the AVX2 one where the CPU has it).
class NonFiniteKernelTest
    : public ::testing::TestWithParam<std::optional<size_t> (*)(const void*, size_t)> {};

TEST_P(NonFiniteKernelTest, FindsTheFirstNanOrInfAnywhere) {
  const auto FirstNonFinite = GetParam();
  std::vector<float> values(10000, 1.5f);
  values[7] = -0.0f;
  values[9999] = std::numeric_limits<float>::max();  // large, but finite
  values[5000] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FirstNonFinite(values.data(), values.size()), std::nullopt);
  EXPECT_EQ(FirstNonFinite(values.data(), 0), std::nullopt);
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
    for (float bad : {std::nanf(""), -std::nanf(""), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> copy = values;
      copy[at] = bad;
      copy[at == 9999 ? 0 : 9999] = bad;  // a later one (or an earlier one) too
      const size_t first = at == 9999 ? 0 : at;
      EXPECT_EQ(FirstNonFinite(copy.data(), copy.size()), first) << at << " " << bad;
    }
  }
  // Every position of a round and of the tail after the last whole round (100 = 3 * 32 + 4).
  for (size_t at = 0; at < 100; ++at) {
    std::vector<float> short_values(100, -2.0f);
    short_values[at] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(FirstNonFinite(short_values.data(), short_values.size()), at);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, NonFiniteKernelTest,
                         ::testing::Values(&FirstNonFinite, &FirstNonFiniteSse2));

TEST(NonFiniteTest, UnalignedBuffersAndDescriptions) {
  std::vector<unsigned char> bytes(4 * 100 + 1, 0);
  const float inf = -std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + 1 + 4 * 42, &inf, 4);
  EXPECT_EQ(FirstNonFinite(bytes.data() + 1, 100), 42u);
  EXPECT_EQ(DescribeNonFinite(bytes.data() + 1, 42), "-inf at element 42");
  const float values[] = {0, std::nanf(""), std::numeric_limits<float>::infinity()};
  EXPECT_EQ(DescribeNonFinite(values, 1), "nan at element 1");
  EXPECT_EQ(DescribeNonFinite(values, 2), "inf at element 2");
}

}  // namespace
}  // namespace tessera
