#include "common/base/status.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ContextReadsOutermostFirst) {
  Status s = DeadlineExceededError("recv deadline exceeded after 30000 ms");
  s = s.WithContext("peer=1").WithContext("allreduce tag=42 rank=2");
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "allreduce tag=42 rank=2: peer=1: recv deadline exceeded after 30000 ms");
  EXPECT_EQ(s.ToString(),
            "DEADLINE_EXCEEDED: allreduce tag=42 rank=2: peer=1: recv deadline exceeded after 30000 ms");
}

TEST(StatusTest, ContextOnOkIsNoop) { EXPECT_TRUE(OkStatus().WithContext("rank=1").ok()); }

TEST(StatusTest, TheSameContextIsAddedOnce) {
  Status s = NotFoundError("no key 3").WithContext("pull of step 1").WithContext("pull of step 1");
  EXPECT_EQ(s.message(), "pull of step 1: no key 3");
  // Only a whole leading context counts: a longer one, or one not followed by ": ", is added.
  EXPECT_EQ(s.WithContext("pull of step").message(), "pull of step: pull of step 1: no key 3");
  EXPECT_EQ(NotFoundError("pull of step 1").WithContext("pull of step 1").message(),
            "pull of step 1: pull of step 1");
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd value " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusOrTest, ValueAndError) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd value 3");
}

TEST(StatusOrTest, OkStatusIsNotAValue) {
  StatusOr<int> v = OkStatus();
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace tessera
