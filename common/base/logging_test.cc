#include "common/base/logging.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(LoggingTest, ParsesLevelsAndRejectsOthersByName) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  StatusOr<LogLevel> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
}

int evaluations = 0;
int Counted() { return ++evaluations; }

TEST(LoggingTest, DisabledLevelsDoNotEvaluateArguments) {
  SetMinLogLevel(LogLevel::kWarning);
  TLOG(INFO) << Counted();
  EXPECT_EQ(evaluations, 0);
  TLOG(ERROR) << "expected in the test log: " << Counted();
  EXPECT_EQ(evaluations, 1);
  SetMinLogLevel(LogLevel::kInfo);
}

TEST(LoggingTest, LinesCarryTheIdentity) {
  SetLogIdentity("worker", 3);
  testing::internal::CaptureStderr();
  TLOG(WARNING) << "hello";
  std::string line = testing::internal::GetCapturedStderr();
  EXPECT_NE(line.find(" W worker 3 | hello\n"), std::string::npos) << line;
}

TEST(LoggingTest, TlogIsOneStatementUnderAnUnbracedIf) {
  bool reached_else = false;
  if (false)
    TLOG(ERROR) << "never";
  else
    reached_else = true;
  EXPECT_TRUE(reached_else);
}

}  // namespace
}  // namespace tessera
