#include "worker/data/binary_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/base/byte_cursor.h"
#include "worker/data/synthetic_classification.h"

namespace tessera::worker::data {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  EXPECT_NE(dir, nullptr);
  return std::string(dir == nullptr ? "/tmp" : dir) + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), file), bytes.size());
  ASSERT_EQ(std::fclose(file), 0);
}

// The format built by hand from the spec, independently of the writer.
void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutF32(float f, std::string* out) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  PutU32(bits, out);
}
std::string Header(uint64_t n, uint32_t dim, uint32_t classes, uint32_t version = 1) {
  std::string out = "TSRDATA1";
  PutU32(version, &out);
  PutU64(n, &out);
  PutU32(dim, &out);
  PutU32(classes, &out);
  return out;
}
// Two samples of dimension 3 with 4 classes: 28 + 2 * 16 = 60 bytes.
std::string TwoSamples(int32_t second_label = 2) {
  std::string out = Header(2, 3, 4);
  for (float f : {1.5f, -2.0f, 0.25f}) PutF32(f, &out);
  PutU32(0, &out);
  for (float f : {3.0f, 4.0f, 5.0f}) PutF32(f, &out);
  PutU32(static_cast<uint32_t>(second_label), &out);
  return out;
}

Status ReadBytesAsDataset(const std::string& name, const std::string& bytes) {
  const std::string path = TmpPath(name);
  WriteBytes(path, bytes);
  return ReadBinaryDataset(path).status();
}

TEST(BinaryDatasetTest, ReadsAHandBuiltFile) {
  const std::string path = TmpPath("hand.bin");
  WriteBytes(path, TwoSamples());
  auto dataset = ReadBinaryDataset(path);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->feature_dim(), 3u);
  EXPECT_EQ((*dataset)->num_classes(), 4u);
  EXPECT_EQ((*dataset)->features(), (std::vector<float>{1.5f, -2.0f, 0.25f, 3, 4, 5}));
  EXPECT_EQ((*dataset)->labels(), (std::vector<int64_t>{0, 2}));
}

TEST(BinaryDatasetTest, RoundTripsASyntheticSetBitForBit) {
  SyntheticClassificationOptions options;
  options.num_samples = 300;
  options.feature_dim = 7;
  options.num_classes = 5;
  options.seed = 3;
  auto synthetic = SyntheticClassification::Create(options);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  const std::string path = TmpPath("round_trip.bin");
  ASSERT_TRUE(WriteBinaryDataset(**synthetic, path).ok());
  auto read = ReadBinaryDataset(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ((*read)->size(), 300u);
  ASSERT_EQ((*read)->feature_dim(), 7u);
  ASSERT_EQ((*read)->num_classes(), 5u);
  std::vector<float> expected(7), actual(7);
  for (size_t i = 0; i < 300; ++i) {
    int64_t expected_label, actual_label;
    ASSERT_TRUE((*synthetic)->Get(i, expected.data(), &expected_label).ok());
    ASSERT_TRUE((*read)->Get(i, actual.data(), &actual_label).ok());
    ASSERT_EQ(std::memcmp(expected.data(), actual.data(), 7 * sizeof(float)), 0) << i;
    ASSERT_EQ(expected_label, actual_label) << i;
  }
  // The writer's bytes are exactly the spec's: header + 300 records of 32 bytes.
  auto bytes = ReadWholeFile(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 28u + 300u * 32u);
  EXPECT_EQ(bytes->substr(0, 28), Header(300, 7, 5));
  // No temporary file is left behind.
  EXPECT_EQ(ReadWholeFile(path + ".tmp").status().code(), StatusCode::kNotFound);
}

TEST(BinaryDatasetTest, EmptyDatasetRoundTrips) {
  auto empty = InMemoryDataset::Create(2, 3, {}, {});
  ASSERT_TRUE(empty.ok());
  const std::string path = TmpPath("empty.bin");
  ASSERT_TRUE(WriteBinaryDataset(**empty, path).ok());
  auto read = ReadBinaryDataset(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->size(), 0u);
  EXPECT_EQ((*read)->feature_dim(), 2u);
}

TEST(BinaryDatasetTest, TruncationAtEveryOffsetNamesFileAndField) {
  const std::string full = TwoSamples();
  ASSERT_EQ(full.size(), 60u);
  struct Case {
    size_t length;
    size_t offset;
    const char* what;
  };
  const Case cases[] = {
      {0, 0, "magic"},
      {5, 0, "magic"},
      {8, 8, "version"},
      {11, 8, "version"},
      {12, 12, "num_samples"},
      {19, 12, "num_samples"},
      {22, 20, "feature_dim"},
      {27, 24, "num_classes"},
      {28, 28, "sample 0 feature 0"},
      {33, 32, "sample 0 feature 1"},
      {40, 40, "sample 0 label"},
      {43, 40, "sample 0 label"},
      {44, 44, "sample 1 feature 0"},
      {56, 56, "sample 1 label"},
      {59, 56, "sample 1 label"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("length " + std::to_string(c.length));
    Status status = ReadBytesAsDataset("truncated.bin", full.substr(0, c.length));
    EXPECT_EQ(status.code(), StatusCode::kDataLoss);
    EXPECT_THAT(status.message(), HasSubstr("truncated.bin: offset " + std::to_string(c.offset) +
                                            ": truncated in " + c.what));
    EXPECT_THAT(status.message(), HasSubstr("file ends at offset " + std::to_string(c.length)));
  }
  // Every other length too: an error, never a crash.
  for (size_t length = 0; length < full.size(); ++length) {
    EXPECT_FALSE(ReadBytesAsDataset("truncated.bin", full.substr(0, length)).ok()) << length;
  }
}

TEST(BinaryDatasetTest, RejectsBadMagicAndVersion) {
  std::string bytes = TwoSamples();
  bytes[0] = 'X';
  Status magic = ReadBytesAsDataset("magic.bin", bytes);
  EXPECT_EQ(magic.code(), StatusCode::kDataLoss);
  EXPECT_THAT(magic.message(),
              HasSubstr("magic.bin: offset 0: bad magic \"XSRDATA1\" (expected \"TSRDATA1\")"));

  std::string gz = "\x1f\x8b\x08";
  gz += std::string(60, '\0');
  EXPECT_THAT(ReadBytesAsDataset("gz.bin", gz).message(), HasSubstr("\\x1f\\x8b\\x08"));

  std::string v2 = Header(2, 3, 4, /*version=*/2) + TwoSamples().substr(28);
  EXPECT_THAT(ReadBytesAsDataset("v2.bin", v2).message(),
              HasSubstr("v2.bin: offset 8: unsupported version 2"));
}

TEST(BinaryDatasetTest, RejectsLabelsOutOfRangeAtTheirOffset) {
  Status high = ReadBytesAsDataset("label.bin", TwoSamples(/*second_label=*/4));
  EXPECT_EQ(high.code(), StatusCode::kDataLoss);
  EXPECT_THAT(high.message(), HasSubstr("label.bin: offset 56: sample 1 label 4 is outside [0, 4)"));
  EXPECT_THAT(ReadBytesAsDataset("label.bin", TwoSamples(-1)).message(),
              HasSubstr("offset 56: sample 1 label -1"));
}

TEST(BinaryDatasetTest, RejectsSizeMismatchesAndOverflow) {
  Status trailing = ReadBytesAsDataset("trailing.bin", TwoSamples() + "xyz");
  EXPECT_THAT(trailing.message(),
              HasSubstr("trailing.bin: offset 60: 3 unexpected bytes after the last sample"));
  EXPECT_THAT(trailing.message(), HasSubstr("= 60 bytes"));

  // The header claims more samples than the file holds.
  std::string more = Header(3, 3, 4) + TwoSamples().substr(28);
  EXPECT_THAT(ReadBytesAsDataset("more.bin", more).message(),
              HasSubstr("offset 60: truncated in sample 2 feature 0"));
  // ... or fewer.
  std::string fewer = Header(1, 3, 4) + TwoSamples().substr(28);
  EXPECT_THAT(ReadBytesAsDataset("fewer.bin", fewer).message(),
              HasSubstr("offset 44: 16 unexpected bytes"));

  // num_samples * record size overflows 64 bits: rejected before any allocation.
  std::string huge = Header(uint64_t{1} << 62, 3, 4);
  EXPECT_THAT(ReadBytesAsDataset("huge.bin", huge).message(),
              HasSubstr("huge.bin: offset 12: num_samples 4611686018427387904 x 16-byte records "
                        "overflows"));
  // Large but not overflowing: a clean truncation error, no giant allocation.
  std::string large = Header(uint64_t{1} << 40, 1000, 4);
  EXPECT_THAT(ReadBytesAsDataset("large.bin", large).message(),
              HasSubstr("offset 28: truncated in sample 0 feature 0"));

  EXPECT_THAT(ReadBytesAsDataset("dim0.bin", Header(0, 0, 4)).message(),
              HasSubstr("offset 20: feature_dim is 0"));
  EXPECT_THAT(ReadBytesAsDataset("classes0.bin", Header(0, 3, 0)).message(),
              HasSubstr("offset 24: num_classes is 0"));
}

TEST(BinaryDatasetTest, RejectsNonFiniteFeatures) {
  std::string bytes = TwoSamples();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string nan_bytes;
  PutF32(nan, &nan_bytes);
  bytes.replace(48, 4, nan_bytes);  // sample 1 feature 1
  EXPECT_THAT(ReadBytesAsDataset("nan.bin", bytes).message(),
              HasSubstr("nan.bin: offset 48: sample 1 feature 1 is not finite"));
}

TEST(BinaryDatasetTest, MissingFileAndBadWrites) {
  auto missing = ReadBinaryDataset(TmpPath("does_not_exist.bin"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("does_not_exist.bin"));

  auto dataset = InMemoryDataset::Create(1, 2, {0.5f}, {1});
  ASSERT_TRUE(dataset.ok());
  Status unwritable = WriteBinaryDataset(**dataset, TmpPath("no_such_dir/x.bin"));
  EXPECT_FALSE(unwritable.ok());
  EXPECT_THAT(unwritable.message(), HasSubstr("no_such_dir/x.bin"));
}

}  // namespace
}  // namespace tessera::worker::data
