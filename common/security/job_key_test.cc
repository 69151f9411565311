#include "common/security/job_key.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  unlink(path.c_str());
  return path;
}

TEST(JobKeyTest, KeysAreRandomAndRoundTripThroughTheirText) {
  const JobKey a = JobKey::Generate();
  const JobKey b = JobKey::Generate();
  EXPECT_NE(a.bytes(), b.bytes());
  StatusOr<JobKey> parsed = JobKey::Parse(a.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->bytes(), a.bytes());
  EXPECT_THAT(a.Serialize(), ::testing::StartsWith("tessera-job-key-v1 "));
}

TEST(JobKeyTest, PurposesGiveIndependentSubkeysAndTheFingerprintIsNotTheKey) {
  const JobKey key = JobKey::Generate();
  EXPECT_NE(key.Derive("zap-token"), key.Derive("curve"));
  EXPECT_EQ(key.Derive("curve"), JobKey::FromBytes(key.bytes()).Derive("curve"));
  const std::string fingerprint = key.Fingerprint();
  EXPECT_EQ(fingerprint.size(), 8u);
  EXPECT_THAT(key.Serialize(), Not(HasSubstr(fingerprint)));
}

TEST(JobKeyTest, MalformedTextIsRefusedWithoutEchoingIt) {
  EXPECT_THAT(JobKey::Parse("hello").status().message(), HasSubstr("not a Tessera key file"));
  EXPECT_THAT(JobKey::Parse("tessera-job-key-v1 abcd\n").status().message(),
              HasSubstr("must be 64 hex digits"));
  const std::string bad = "tessera-job-key-v1 " + std::string(63, 'a') + "z";
  StatusOr<JobKey> parsed = JobKey::Parse(bad);
  EXPECT_THAT(parsed.status().message(), HasSubstr("not 64 hex digits"));
  EXPECT_THAT(parsed.status().message(), Not(HasSubstr("aaaa")));
}

TEST(JobKeyTest, WritesA0600FileAndReadsItBack) {
  const std::string path = TempPath("key");
  const JobKey key = JobKey::Generate();
  ASSERT_TRUE(WriteKeyFile(path, key).ok());
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  StatusOr<JobKey> read = ReadKeyFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes(), key.bytes());
  // Never overwritten.
  Status again = WriteKeyFile(path, JobKey::Generate());
  EXPECT_THAT(again.message(), HasSubstr("never overwritten"));
  EXPECT_EQ(ReadKeyFile(path)->bytes(), key.bytes());
}

TEST(JobKeyTest, AKeyFileOthersCanReadIsRefusedWithTheFix) {
  const std::string path = TempPath("open-key");
  ASSERT_TRUE(WriteKeyFile(path, JobKey::Generate()).ok());
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  Status status = ReadKeyFile(path).status();
  EXPECT_THAT(status.message(), HasSubstr("mode 0644 lets other users read or change it"));
  EXPECT_THAT(status.message(), HasSubstr("chmod 600 " + path));
  ASSERT_EQ(chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(ReadKeyFile(path).ok());
}

TEST(JobKeyTest, MissingFilesDirectoriesAndSymlinksAreRefused) {
  EXPECT_THAT(ReadKeyFile(TempPath("absent")).status().message(),
              HasSubstr("No such file or directory"));
  const std::string dir = TempPath("dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  EXPECT_THAT(ReadKeyFile(dir).status().message(), HasSubstr("not a regular file"));
  const std::string target = TempPath("target");
  ASSERT_TRUE(WriteKeyFile(target, JobKey::Generate()).ok());
  const std::string link = TempPath("link");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  EXPECT_THAT(ReadKeyFile(link).status().message(), HasSubstr("symbolic link"));
}

TEST(JobKeyTest, AnOversizedFileIsRefused) {
  const std::string path = TempPath("big");
  {
    std::ofstream out(path);
    out << "tessera-job-key-v1 " << std::string(10000, 'a');
  }
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_THAT(ReadKeyFile(path).status().message(), HasSubstr("larger than 256 bytes"));
}

}  // namespace
}  // namespace tessera
