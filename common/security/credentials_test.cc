#include "common/security/credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string KeyFile() {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/credentials-key";
  unlink(path.c_str());
  EXPECT_TRUE(WriteKeyFile(path, JobKey::Generate()).ok());
  return path;
}

TEST(CredentialsTest, AutoEncryptsOffTheLoopbackOnly) {
  const std::string path = KeyFile();
  StatusOr<Credentials> local = ResolveCredentials(false, "auto", path, "127.0.0.1", "127.0.0.1");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->protection, Protection::kAuthenticate);
  EXPECT_THAT(local->Describe(), HasSubstr("not encrypted"));
  EXPECT_THAT(local->Describe(), HasSubstr("on the loopback"));
  StatusOr<Credentials> remote = ResolveCredentials(false, "auto", path, "10.77.0.1", "10.77.0.1");
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ(remote->protection, Protection::kEncrypt);
  EXPECT_THAT(remote->Describe(), HasSubstr("listens on 10.77.0.1, off the loopback"));
  // A process listening on the loopback whose coordinator is elsewhere encrypts like it.
  StatusOr<Credentials> follower = ResolveCredentials(false, "auto", path, "127.0.0.1", "10.0.0.1");
  ASSERT_TRUE(follower.ok());
  EXPECT_EQ(follower->protection, Protection::kEncrypt);
  EXPECT_THAT(follower->Describe(), HasSubstr("the coordinator is at 10.0.0.1"));
  EXPECT_EQ(ResolveCredentials(false, "auto", path, "127.0.0.1", "")->protection,
            Protection::kAuthenticate);
  EXPECT_EQ(ResolveCredentials(false, "on", path, "127.0.0.2", "")->protection,
            Protection::kEncrypt);
  EXPECT_EQ(ResolveCredentials(false, "off", path, "10.0.0.1", "10.0.0.1")->protection,
            Protection::kAuthenticate);
}

TEST(CredentialsTest, NoKeySaysHowToGetOne) {
  Status status = ResolveCredentials(false, "auto", "", "127.0.0.1", "").status();
  EXPECT_THAT(status.message(), HasSubstr("no job key"));
  EXPECT_THAT(status.message(), HasSubstr("--auth-key-file"));
  EXPECT_THAT(status.message(), HasSubstr("TESSERA_AUTH_KEY_FILE"));
  EXPECT_THAT(status.message(), HasSubstr("tessera-launch --make-key-file"));
  EXPECT_THAT(status.message(), HasSubstr("--insecure"));
}

TEST(CredentialsTest, InsecureNeedsNoKeyButCannotEncrypt) {
  StatusOr<Credentials> none = ResolveCredentials(true, "auto", "", "10.0.0.1", "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->authenticated());
  EXPECT_THAT(none->Describe(), HasSubstr("NOT authenticated"));
  EXPECT_THAT(ResolveCredentials(true, "on", "", "127.0.0.1", "").status().message(),
              HasSubstr("contradict"));
  EXPECT_THAT(ResolveCredentials(false, "maybe", "", "127.0.0.1", "").status().message(),
              HasSubstr("expected auto, on or off"));
}

}  // namespace
}  // namespace tessera
