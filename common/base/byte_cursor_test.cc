#include "common/base/byte_cursor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(ByteCursorTest, DecodesBothByteOrders) {
  const std::string bytes("\x00\x00\x08\x03\x01\x02\x03\x04\x00\x00\x80\x3f\xfe\xff\xff\xff"
                          "\x01\x00\x00\x00\x00\x00\x00\x80",
                          24);
  ByteCursor cursor("f", bytes);
  uint32_t u32 = 0;
  ASSERT_TRUE(cursor.ReadU32BigEndian("magic", &u32).ok());
  EXPECT_EQ(u32, 2051u);
  ASSERT_TRUE(cursor.ReadU32LittleEndian("x", &u32).ok());
  EXPECT_EQ(u32, 0x04030201u);
  float f = 0;
  ASSERT_TRUE(cursor.ReadF32LittleEndian("f", &f).ok());
  EXPECT_EQ(f, 1.0f);
  int32_t i32 = 0;
  ASSERT_TRUE(cursor.ReadI32LittleEndian("i", &i32).ok());
  EXPECT_EQ(i32, -2);
  uint64_t u64 = 0;
  ASSERT_TRUE(cursor.ReadU64LittleEndian("u", &u64).ok());
  EXPECT_EQ(u64, 0x8000000000000001ull);
  EXPECT_EQ(cursor.remaining(), 0u);
}

TEST(ByteCursorTest, TruncationNamesFileFieldAndOffsetAndConsumesNothing) {
  ByteCursor cursor("data/x.bin", std::string_view("\x01\x02\x03\x04\x05\x06", 6));
  uint32_t value;
  ASSERT_TRUE(cursor.ReadU32LittleEndian("first", &value).ok());
  Status status = cursor.ReadU32LittleEndian("sample 0 label", &value);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr("data/x.bin: offset 4: truncated in sample 0 label: need 4 bytes, "
                        "file ends at offset 6"));
  EXPECT_EQ(cursor.offset(), 4u);
}

TEST(ByteCursorTest, ReadWholeFileRoundTripAndMissingFile) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string path = std::string(tmp) + "/whole_file.bin";
  std::string contents(200000, '\0');
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<char>(i * 7);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(std::fwrite(contents.data(), 1, contents.size(), file), contents.size());
  std::fclose(file);
  auto read = ReadWholeFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, contents);

  auto missing = ReadWholeFile(std::string(tmp) + "/no_such_file");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no_such_file: cannot open"));
}

}  // namespace
}  // namespace tessera
