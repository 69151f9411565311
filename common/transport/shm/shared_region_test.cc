#include "common/transport/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(SharedRegionTest, APeerMapsTheSameBytes) {
  auto created = SharedRegion::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto region = *created;
  ASSERT_GE(region->fd(), 0);
  std::memset(region->data(), 7, 4096);
  // Another process of this user: a child opens the region by the parent's pid and fd, checks
  // the bytes and writes its own.
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto peer = SharedRegion::Open(parent, region->fd(), 4096, region->token());
    if (!peer.ok()) _exit(2);
    if ((*peer)->data()[4095] != 7) _exit(3);
    (*peer)->data()[0] = 42;
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  EXPECT_EQ(region->data()[0], 42);
  // The mapping outlives the descriptor.
  region->CloseFd();
  EXPECT_EQ(region->fd(), -1);
  region->data()[1] = 1;
}

TEST(SharedRegionTest, RefusesAnotherTokenOrSize) {
  auto region = *SharedRegion::Create(128);
  SharedRegionToken wrong = region->token();
  wrong.low ^= 1;
  auto bad_token = SharedRegion::Open(getpid(), region->fd(), 128, wrong);
  ASSERT_FALSE(bad_token.ok());
  EXPECT_THAT(bad_token.status().message(), HasSubstr("does not hold the expected token"));
  auto bad_size = SharedRegion::Open(getpid(), region->fd(), 256, region->token());
  ASSERT_FALSE(bad_size.ok());
  EXPECT_THAT(bad_size.status().message(), HasSubstr("not the expected 320"));
  auto opened = SharedRegion::Open(getpid(), region->fd(), 128, region->token());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->fd(), -1);
}

TEST(SharedRegionTest, RefusesWhatIsNotARegion) {
  auto gone = SharedRegion::Open(getpid(), 1000000, 128, SharedRegionToken{1, 2});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("/proc/"));
  EXPECT_THAT(gone.status().message(), HasSubstr("another host"));
  EXPECT_FALSE(SharedRegion::Open(0, 3, 128, SharedRegionToken{}).ok());
  // A memfd that can still be resized: a peer's mapping could fault past its end.
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, SharedRegion::kHeaderBytes + 128), 0);
  auto unsealed = SharedRegion::Open(getpid(), fd, 128, SharedRegionToken{});
  close(fd);
  ASSERT_FALSE(unsealed.ok());
  EXPECT_THAT(unsealed.status().message(), HasSubstr("not sealed"));
  // A pipe is not a regular file.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  auto piped = SharedRegion::Open(getpid(), pipe_fds[0], 128, SharedRegionToken{});
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  ASSERT_FALSE(piped.ok());
  EXPECT_THAT(piped.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace tessera
