#include "worker/params_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace tessera::worker {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(ParamsFileTest, RoundTripsValuesAndManifestBitwise) {
  ParameterLayout layout;
  ASSERT_TRUE(layout.Add("a.weight", {2, 3}).ok());
  ASSERT_TRUE(layout.Add("a.bias", {2}).ok());
  std::vector<float> values = {1.5f, -0.0f, 3e-38f, 1e30f, 7, 8, -1, 2.25f};
  const std::string path = TempPath("params.bin");
  ASSERT_TRUE(SaveParams(path, layout, values).ok());
  // The data file is exactly the little-endian float32 values.
  std::ifstream raw(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), values.size() * 4);
  EXPECT_EQ(std::memcmp(bytes.data(), values.data(), bytes.size()), 0);
  auto loaded = LoadParams(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->layout.Fingerprint(), layout.Fingerprint());
  EXPECT_EQ(std::memcmp(loaded->values.data(), values.data(), bytes.size()), 0);
  EXPECT_EQ(loaded->layout.Find("a.bias")->offset, 6u);
}

TEST(ParamsFileTest, ErrorsNameTheFile) {
  ParameterLayout layout;
  ASSERT_TRUE(layout.Add("w", {4}).ok());
  const std::string path = TempPath("short.bin");
  ASSERT_TRUE(SaveParams(path, layout, {1, 2, 3, 4}).ok());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc";  // truncated data file
  auto truncated = LoadParams(path);
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find(path + " has 3 bytes"), std::string::npos)
      << truncated.status();
  auto missing = LoadParams(TempPath("nothing.bin"));
  EXPECT_NE(missing.status().message().find("nothing.bin.json"), std::string::npos);
  std::ofstream(path + ".json", std::ios::trunc) << "{not json";
  EXPECT_NE(LoadParams(path).status().message().find(path + ".json"), std::string::npos);
  EXPECT_FALSE(SaveParams(path, layout, {1, 2}).ok());
  EXPECT_FALSE(SaveParams("/nonexistent-dir/x.bin", layout, {1, 2, 3, 4}).ok());
}

}  // namespace
}  // namespace tessera::worker
