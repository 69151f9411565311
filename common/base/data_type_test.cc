#include "common/base/data_type.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace tessera {
namespace {

// The direct ring channels carry a dtype as its enum value in one byte: appending keeps every
// older value's number.
static_assert(static_cast<int>(DataType::kFloat32) == 0);
static_assert(static_cast<int>(DataType::kUInt8) == 5);
static_assert(static_cast<int>(DataType::kFloat64) == 6);
static_assert(static_cast<int>(DataType::kInt8) == 7);
static_assert(static_cast<int>(DataType::kBool) == 8);

TEST(DataTypeTest, SizesNamesAndKinds) {
  struct Expected {
    DataType dtype;
    size_t size;
    std::string_view name;
    bool floating;
  };
  const Expected all[] = {
      {DataType::kFloat32, 4, "float32", true},  {DataType::kFloat16, 2, "float16", true},
      {DataType::kBFloat16, 2, "bfloat16", true}, {DataType::kInt64, 8, "int64", false},
      {DataType::kInt32, 4, "int32", false},      {DataType::kUInt8, 1, "uint8", false},
      {DataType::kFloat64, 8, "float64", true},   {DataType::kInt8, 1, "int8", false},
      {DataType::kBool, 1, "bool", false},
  };
  for (const Expected& e : all) {
    EXPECT_EQ(DataTypeSize(e.dtype), e.size) << e.name;
    EXPECT_EQ(DataTypeName(e.dtype), e.name);
    EXPECT_EQ(IsFloatingPoint(e.dtype), e.floating) << e.name;
  }
  EXPECT_EQ(DataTypeSize(DataType::kFloat64), sizeof(double));
}

TEST(DataTypeTest, AValueOutsideTheEnumHasNoSizeAndNoName) {
  for (int value : {9, 10, 255, -1}) {
    const auto dtype = static_cast<DataType>(value);
    EXPECT_EQ(DataTypeSize(dtype), 0u) << value;
    EXPECT_EQ(DataTypeName(dtype), "invalid") << value;
    EXPECT_FALSE(IsFloatingPoint(dtype)) << value;
  }
}

}  // namespace
}  // namespace tessera
