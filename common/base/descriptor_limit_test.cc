#include "common/base/descriptor_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

namespace tessera {
namespace {

TEST(DescriptorLimitTest, RaisesTheSoftLimitToTheHardOne) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max <= 256) {
    GTEST_SKIP() << "the hard limit here (" << limit.rlim_max << ") leaves nothing to raise";
  }
  rlimit lowered = limit;
  lowered.rlim_cur = 256;  // as a shell's `ulimit -Sn 256` would leave it
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const uint64_t raised = RaiseDescriptorLimit();
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  const uint64_t want = limit.rlim_max == RLIM_INFINITY ? kMaxDescriptors : limit.rlim_max;
  EXPECT_EQ(now.rlim_cur, want);
  EXPECT_EQ(raised, want);
  // Raising again changes nothing.
  EXPECT_EQ(RaiseDescriptorLimit(), want);
}

}  // namespace
}  // namespace tessera
