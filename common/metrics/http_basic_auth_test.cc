#include "common/metrics/http_basic_auth.h"

#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "common/base/test_files.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Basic(const std::string& user_colon_password) {
  std::string out(sodium_base64_ENCODED_LEN(user_colon_password.size(),
                                            sodium_base64_VARIANT_ORIGINAL),
                  '\0');
  sodium_bin2base64(out.data(), out.size(),
                    reinterpret_cast<const unsigned char*>(user_colon_password.data()),
                    user_colon_password.size(), sodium_base64_VARIANT_ORIGINAL);
  out.pop_back();  // the terminating NUL
  return "Basic " + out;
}

TEST(HttpBasicAuthTest, MatchesOnlyAListedUserWithItsPassword) {
  StatusOr<HttpBasicAuth> auth =
      HttpBasicAuth::Parse("# scrapers\nprometheus:s3cret:with:colons\n\r\nalice:pw\r\n");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->num_users(), 2u);
  EXPECT_TRUE(auth->Matches(Basic("prometheus:s3cret:with:colons")));
  EXPECT_TRUE(auth->Matches(Basic("alice:pw")));
  EXPECT_TRUE(auth->Matches("basic " + Basic("alice:pw").substr(6)));  // scheme ignores case
  EXPECT_FALSE(auth->Matches(""));
  EXPECT_FALSE(auth->Matches("Basic "));
  EXPECT_FALSE(auth->Matches(Basic("alice:pW")));
  EXPECT_FALSE(auth->Matches(Basic("alice:pw ")));
  EXPECT_FALSE(auth->Matches(Basic("prometheus:pw")));
  EXPECT_FALSE(auth->Matches(Basic("# scrapers")));
  EXPECT_FALSE(auth->Matches("Bearer " + Basic("alice:pw").substr(6)));
  EXPECT_FALSE(auth->Matches("Basic !!!not-base64!!!"));
  EXPECT_FALSE(auth->Matches("Basic " + std::string(10000, 'A')));
}

TEST(HttpBasicAuthTest, RejectsBadLinesNamingTheLineButNotItsText) {
  StatusOr<HttpBasicAuth> no_colon = HttpBasicAuth::Parse("alice:pw\nbob-secret\n");
  ASSERT_FALSE(no_colon.ok());
  EXPECT_THAT(no_colon.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(no_colon.status().message(), Not(HasSubstr("bob-secret")));
  EXPECT_THAT(HttpBasicAuth::Parse(":pw\n").status().message(), HasSubstr("empty user"));
  EXPECT_THAT(HttpBasicAuth::Parse("# only a comment\n\n").status().message(),
              HasSubstr("no user:password"));
}

TEST(HttpBasicAuthTest, ReadsAPrivateFileAndRefusesOthers) {
  std::string good = WriteTestFile("auth-good", "prometheus:pw\n", 0600);
  StatusOr<HttpBasicAuth> auth = HttpBasicAuth::ReadFile(good);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE(auth->Matches(Basic("prometheus:pw")));
  EXPECT_TRUE(HttpBasicAuth::ReadFile(WriteTestFile("auth-0400", "a:b\n", 0400)).ok());

  for (mode_t mode : {0640, 0604, 0660, 0644}) {
    std::string path = WriteTestFile("auth-open", "prometheus:pw\n", mode);
    StatusOr<HttpBasicAuth> refused = HttpBasicAuth::ReadFile(path);
    ASSERT_FALSE(refused.ok()) << std::oct << mode;
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr("chmod 600 " + path));
  }
  StatusOr<HttpBasicAuth> missing = HttpBasicAuth::ReadFile(good + ".missing");
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr(good + ".missing"));

  std::string link = good + ".link";
  unlink(link.c_str());
  ASSERT_EQ(symlink(good.c_str(), link.c_str()), 0);
  EXPECT_THAT(HttpBasicAuth::ReadFile(link).status().message(), HasSubstr("symbolic link"));

  std::string bad = WriteTestFile("auth-bad", "no-colon-here\n", 0600);
  EXPECT_THAT(HttpBasicAuth::ReadFile(bad).status().message(), HasSubstr(bad));

  if (geteuid() == 0) {
    std::string foreign = WriteTestFile("auth-foreign", "a:b\n", 0600);
    ASSERT_EQ(chown(foreign.c_str(), 12345, 12345), 0);
    EXPECT_THAT(HttpBasicAuth::ReadFile(foreign).status().message(), HasSubstr("uid 12345"));
  }
}

}  // namespace
}  // namespace tessera
