// The flake hunt's fixtures (tools/flake_hunt/BUILD): a test case that fails one run in three
// (FAILS_EVERY=3) or never (FAILS_EVERY=0), counting its runs in the file that
// FLAKE_FIXTURE_COUNTER names (each run of a test under Bazel has a fresh TEST_TMPDIR, so the
// count lives outside it). Tagged manual: only the flake hunt's own test and tools/test.sh
// --repeat run them.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace {

constexpr int kFailsEvery = FAILS_EVERY;

// This run's number (1, 2, ...), counted in the file `path` under a lock: Bazel runs several
// runs of one target at once.
int NextRun(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    ADD_FAILURE() << "cannot open and lock the counter file " << path;
    return 0;
  }
  char text[32] = {};
  const ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
  const int run = (got > 0 ? std::atoi(text) : 0) + 1;
  const std::string next = std::to_string(run);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, next.data(), next.size(), 0) < 0) {
    ADD_FAILURE() << "cannot write the counter file " << path;
  }
  close(fd);  // and with it the lock
  return run;
}

TEST(FlakeFixture, FailsEveryNthRun) {
  if (kFailsEvery == 0) return;  // the deterministic fixture
  const char* counter = std::getenv("FLAKE_FIXTURE_COUNTER");
  if (counter == nullptr) GTEST_SKIP() << "FLAKE_FIXTURE_COUNTER names no counter file";
  const int run = NextRun(counter);
  EXPECT_NE(run % std::max(kFailsEvery, 1), 0) << "run " << run << " fails by design";
}

TEST(FlakeFixture, AlwaysPasses) { EXPECT_EQ(1 + 1, 2); }

}  // namespace
