#include "worker/data/mnist_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace tessera::worker::data {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  EXPECT_NE(dir, nullptr);
  return std::string(dir == nullptr ? "/tmp" : dir) + "/" + name;
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = TmpPath(name);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr) << path;
  if (file == nullptr) return path;
  EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), file), bytes.size());
  EXPECT_EQ(std::fclose(file), 0);
  return path;
}

void PutBigEndian(uint32_t v, std::string* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

// `count` images of 2x3 pixels: image i's pixel p is (i * 6 + p) * 10 (mod 256), last = 255.
std::string Images(uint32_t count, uint32_t rows = 2, uint32_t cols = 3, uint32_t magic = 2051) {
  std::string out;
  PutBigEndian(magic, &out);
  PutBigEndian(count, &out);
  PutBigEndian(rows, &out);
  PutBigEndian(cols, &out);
  for (uint32_t k = 0; k < count * rows * cols; ++k) out.push_back(static_cast<char>(k * 10));
  if (count * rows * cols > 0) out.back() = static_cast<char>(255);
  return out;
}

std::string Labels(std::initializer_list<int> values, uint32_t magic = 2049) {
  std::string out;
  PutBigEndian(magic, &out);
  PutBigEndian(static_cast<uint32_t>(values.size()), &out);
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

Status Read(const std::string& images, const std::string& labels) {
  return ReadMnist(WriteFile("images-idx3-ubyte", images), WriteFile("labels-idx1-ubyte", labels))
      .status();
}

TEST(MnistReaderTest, ReadsImagesScaledToUnitRangeWithLabels) {
  auto dataset = ReadMnist(WriteFile("ok-images", Images(3)), WriteFile("ok-labels", Labels({7, 0, 9})));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 3u);
  EXPECT_EQ((*dataset)->feature_dim(), 6u);
  EXPECT_EQ((*dataset)->num_classes(), 10u);
  EXPECT_EQ((*dataset)->labels(), (std::vector<int64_t>{7, 0, 9}));
  const std::vector<float>& f = (*dataset)->features();
  ASSERT_EQ(f.size(), 18u);
  EXPECT_FLOAT_EQ(f[0], 0.0f);
  EXPECT_FLOAT_EQ(f[1], 10 / 255.0f);
  EXPECT_FLOAT_EQ(f[7], 70 / 255.0f);  // image 1, pixel 1
  EXPECT_FLOAT_EQ(f[17], 1.0f);
  for (float v : f) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
}

TEST(MnistReaderTest, EmptyFilesAreAnEmptyDataset) {
  auto dataset = ReadMnist(WriteFile("e-images", Images(0, 28, 28)), WriteFile("e-labels", Labels({})));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 0u);
  EXPECT_EQ((*dataset)->feature_dim(), 784u);
}

TEST(MnistReaderTest, RejectsBadMagicsNamingTheFile) {
  Status swapped = Read(Labels({1, 2}), Images(2));
  EXPECT_EQ(swapped.code(), StatusCode::kDataLoss);
  EXPECT_THAT(swapped.message(),
              HasSubstr("images-idx3-ubyte: offset 0: bad magic 2049 (expected 2051"));
  Status labels = Read(Images(2), Labels({1, 2}, /*magic=*/2051));
  EXPECT_THAT(labels.message(),
              HasSubstr("labels-idx1-ubyte: offset 0: bad magic 2051 (expected 2049"));
  std::string gz("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00", 16);
  EXPECT_THAT(Read(gz, Labels({})).message(), HasSubstr("gunzip it first"));
}

TEST(MnistReaderTest, RejectsCountMismatch) {
  Status status = Read(Images(3), Labels({1, 2}));
  EXPECT_THAT(status.message(), HasSubstr("labels-idx1-ubyte: offset 4: label count 2 does not "
                                          "match image count 3"));
  EXPECT_THAT(status.message(), HasSubstr("images-idx3-ubyte"));
}

TEST(MnistReaderTest, TruncatedImagesAtEveryLength) {
  const std::string full = Images(2);  // 16 + 12 bytes
  const std::string labels = Labels({1, 2});
  struct Case {
    size_t length;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {0, "offset 0: truncated in magic"},
      {3, "offset 0: truncated in magic"},
      {4, "offset 4: truncated in image count"},
      {9, "offset 8: truncated in rows"},
      {15, "offset 12: truncated in cols"},
      {16, "offset 16: truncated in image 0 pixel 0: file ends at offset 16"},
      {21, "offset 21: truncated in image 0 pixel 5"},
      {27, "offset 27: truncated in image 1 pixel 5"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Read(full.substr(0, c.length), labels).message(),
                HasSubstr("images-idx3-ubyte: " + c.expected))
        << "length " << c.length;
  }
  for (size_t length = 0; length < full.size(); ++length) {
    EXPECT_FALSE(Read(full.substr(0, length), labels).ok()) << length;
  }
  EXPECT_THAT(Read(full + "??", labels).message(),
              HasSubstr("images-idx3-ubyte: offset 28: 2 unexpected bytes"));
}

TEST(MnistReaderTest, TruncatedAndCorruptLabels) {
  const std::string images = Images(3);
  const std::string labels = Labels({1, 2, 3});
  EXPECT_THAT(Read(images, labels.substr(0, 6)).message(),
              HasSubstr("labels-idx1-ubyte: offset 4: truncated in label count"));
  EXPECT_THAT(Read(images, labels.substr(0, 10)).message(),
              HasSubstr("labels-idx1-ubyte: offset 10: truncated in label 2: file ends at "
                        "offset 10"));
  EXPECT_THAT(Read(images, labels + "x").message(),
              HasSubstr("labels-idx1-ubyte: offset 11: 1 unexpected bytes"));
  EXPECT_THAT(Read(images, Labels({1, 10, 3})).message(),
              HasSubstr("labels-idx1-ubyte: offset 9: label 1 is 10 (must be in [0, 10))"));
}

TEST(MnistReaderTest, RejectsZeroDimensionsAndOverflow) {
  EXPECT_THAT(Read(Images(0, 0, 3), Labels({})).message(), HasSubstr("offset 8: rows is 0"));
  EXPECT_THAT(Read(Images(0, 3, 0), Labels({})).message(), HasSubstr("offset 12: cols is 0"));
  // 2^32-1 images of (2^32-1)^2 pixels overflows 64 bits; only the header exists.
  std::string huge;
  for (uint32_t v : {2051u, 0xffffffffu, 0xffffffffu, 0xffffffffu}) PutBigEndian(v, &huge);
  EXPECT_THAT(Read(huge, Labels({})).message(),
              HasSubstr("images-idx3-ubyte: offset 4: 4294967295 images of "
                        "4294967295x4294967295 pixels overflow"));
  // Large but representable: a truncation error, never a giant allocation.
  std::string large;
  for (uint32_t v : {2051u, 60000u, 28u, 28u}) PutBigEndian(v, &large);
  EXPECT_THAT(Read(large, Labels({})).message(),
              HasSubstr("offset 16: truncated in image 0 pixel 0"));
}

TEST(MnistReaderTest, MissingFile) {
  auto missing = ReadMnist(TmpPath("nope-images"), TmpPath("nope-labels"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope-images"));
}

}  // namespace
}  // namespace tessera::worker::data
