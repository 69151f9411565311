// ReadPeerMemory against real processes: a forked child's buffer, the errors for an exited
// peer, an unmapped address and a kernel that refuses (a seccomp filter), each naming the peer.
#include "worker/collectives/channel/cma/cross_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "worker/collectives/channel/cma/cma_refusal_testing.h"

namespace tessera::worker {
namespace {

PeerMemory Self(const void* address) {
  return {getpid(), reinterpret_cast<uint64_t>(address), "worker 0"};
}

TEST(CrossMemoryTest, ReadsThisProcessesOwnBuffer) {
  std::vector<uint8_t> source(1 << 20);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> into(source.size());
  ASSERT_TRUE(ReadPeerMemory(Self(source.data()), into.data(), into.size()).ok());
  EXPECT_EQ(into, source);
}

TEST(CrossMemoryTest, AnUnmappedAddressIsNamed) {
  uint8_t into[16];
  Status read = ReadPeerMemory(Self(reinterpret_cast<void*>(uint64_t{4096})), into, sizeof(into));
  EXPECT_EQ(read.code(), StatusCode::kInvalidArgument) << read;
  EXPECT_NE(read.message().find("0x1000 of worker 0 (pid "), std::string::npos) << read;
  EXPECT_NE(read.message().find("EFAULT"), std::string::npos) << read;
}

// A child holds a buffer until told to exit: read while it lives, ESRCH once it has exited.
TEST(CrossMemoryTest, ReadsAChildProcessAndNamesItOnceItExited) {
  std::vector<uint64_t> buffer(4096);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 0x9e3779b97f4a7c15ull;
  int to_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (uint64_t& value : buffer) value ^= 1;  // the child's copy differs from ours
    char go;
    (void)!read(to_child[0], &go, 1);
    _exit(0);
  }
  close(to_child[0]);
  const PeerMemory peer{child, reinterpret_cast<uint64_t>(buffer.data()), "worker 1"};
  std::vector<uint64_t> got(buffer.size());
  ASSERT_TRUE(ReadPeerMemory(peer, got.data(), got.size() * sizeof(uint64_t)).ok());
  // The child flips bits after fork; wait until it surely did (its pages differ from ours).
  for (int i = 0; i < 1000 && got[5] == buffer[5]; ++i) {
    usleep(1000);
    ASSERT_TRUE(ReadPeerMemory(peer, got.data(), got.size() * sizeof(uint64_t)).ok());
  }
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], buffer[i] ^ 1) << i;
  EXPECT_FALSE(ProcessExited(child));
  EXPECT_FALSE(ProcessExited(getpid()));
  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  // A zombie (exited, not reaped yet) has exited already.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(ProcessExited(child));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(ProcessExited(child));
  Status read = ReadPeerMemory(peer, got.data(), 64);
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read;
  EXPECT_NE(read.message().find("worker 1 (pid " + std::to_string(child) +
                                "): the process exited (ESRCH)"),
            std::string::npos)
      << read;
}

// A child under a seccomp filter is refused reading us: FAILED_PRECONDITION, EPERM.
TEST(CrossMemoryTest, AKernelRefusalIsNamed) {
  ProbeBuffer probe;
  int from_child[2];
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string result = "the filter was not installed";
    if (RefuseCrossMemoryAttach()) {
      Status checked = CheckProbe({getppid(), probe.address(), "worker 0"}, probe.value());
      result = std::to_string(static_cast<int>(checked.code())) + " " + checked.message();
    }
    (void)!write(from_child[1], result.data(), result.size());
    _exit(0);
  }
  close(from_child[1]);
  std::string result;
  char c;
  while (read(from_child[0], &c, 1) == 1) result += c;
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(result.substr(0, result.find(' ')),
            std::to_string(static_cast<int>(StatusCode::kFailedPrecondition)))
      << result;
  EXPECT_NE(result.find("of worker 0 (pid " + std::to_string(getpid()) +
                        "): the kernel refused cross-memory attach"),
            std::string::npos)
      << result;
  EXPECT_NE(result.find("(EPERM)"), std::string::npos) << result;
}

TEST(CrossMemoryTest, AProbeOfAnotherValueIsRefused) {
  ProbeBuffer probe;
  EXPECT_TRUE(CheckProbe(Self(reinterpret_cast<void*>(probe.address())), probe.value()).ok());
  Status wrong = CheckProbe(Self(reinterpret_cast<void*>(probe.address())), probe.value() + 1);
  EXPECT_EQ(wrong.code(), StatusCode::kFailedPrecondition) << wrong;
}

}  // namespace
}  // namespace tessera::worker
