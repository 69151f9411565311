#include "worker/collectives/channel/shm/ring_shm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/failure_bus.h"

namespace tessera::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

constexpr size_t kPage = 4096;

RingFrame Frame(int sender, uint64_t tag, uint32_t slot, size_t bytes, uint8_t seed) {
  RingFrame frame;
  frame.sender_rank = sender;
  frame.tag = tag;
  frame.op = CollectiveOp::kAllGather;
  frame.reduce_op = ReduceOp::kMax;
  frame.slot = slot;
  frame.block = slot + 7;
  frame.dtype = DataType::kBFloat16;
  frame.element_offset = 3 * slot;
  frame.element_count = bytes / 2;
  frame.buffer_elements = 1000 + slot;
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 31);
  frame.data = Payload::FromVector(std::move(data));
  return frame;
}

void ExpectSame(const RingFrame& got, const RingFrame& sent) {
  EXPECT_EQ(got.kind, sent.kind);
  EXPECT_EQ(got.sender_rank, sent.sender_rank);
  EXPECT_EQ(got.tag, sent.tag);
  EXPECT_EQ(got.slot, sent.slot);
  EXPECT_EQ(got.block, sent.block);
  EXPECT_EQ(got.op, sent.op);
  EXPECT_EQ(got.reduce_op, sent.reduce_op);
  EXPECT_EQ(got.dtype, sent.dtype);
  EXPECT_EQ(got.element_offset, sent.element_offset);
  EXPECT_EQ(got.element_count, sent.element_count);
  EXPECT_EQ(got.buffer_elements, sent.buffer_elements);
  ASSERT_EQ(got.data.size(), sent.data.size()) << "slot " << sent.slot;
  if (!sent.data.empty()) {
    EXPECT_EQ(std::memcmp(got.data.data(), sent.data.data(), sent.data.size()), 0)
        << "slot " << sent.slot;
  }
}

// Whether a segment of this process is still in /dev/shm.
bool AnySegmentLeft() {
  const std::string prefix = "tessera-ring-" + std::to_string(getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Two ranks in this process, attached to each other.
struct Pair {
  explicit Pair(size_t ring_bytes, std::shared_ptr<FailureBus> failures0 = nullptr) {
    auto own0 = RingShm::Create(0, ring_bytes);
    auto own1 = RingShm::Create(1, ring_bytes);
    EXPECT_TRUE(own0.ok() && own1.ok()) << own0.status() << own1.status();
    const RingShmSegmentName name0 = RingShm::NameOf(**own0);
    const RingShmSegmentName name1 = RingShm::NameOf(**own1);
    auto shm0 = RingShm::Attach(0, 2, *own0, name1, name1, std::move(failures0));
    auto shm1 = RingShm::Attach(1, 2, *own1, name0, name0, nullptr);
    EXPECT_TRUE(shm0.ok() && shm1.ok()) << shm0.status() << shm1.status();
    rank0 = std::move(shm0).value();
    rank1 = std::move(shm1).value();
    rank0->UnlinkOwnSegment();
    rank1->UnlinkOwnSegment();
  }
  std::unique_ptr<RingShm> rank0;
  std::unique_ptr<RingShm> rank1;
};

TEST(RingShmTest, CarriesFramesOfOddSizesInOrderBothWays) {
  Pair pair(kPage);  // a ring of one page: frames wrap, and the larger ones are streamed
  ASSERT_EQ(pair.rank0->ring_bytes(), kPage);
  EXPECT_FALSE(AnySegmentLeft());
  const std::vector<size_t> sizes = {0, 1, 2, 63, 64, 65, 1000, 4032, 4033, 4096, 9000,
                                     100000, 3, 0, 5000};
  auto run = [&](RingShm& from, RingShm& to, int sender, uint8_t seed) {
    std::thread sending([&] {
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_TRUE(from.Send(Frame(sender, 9, static_cast<uint32_t>(i), sizes[i], seed)).ok());
      }
      EXPECT_TRUE(from.Flush(Deadline::AfterMillis(10000)).ok());
    });
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto got = to.Recv(9, static_cast<uint32_t>(i), Deadline::AfterMillis(10000));
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame(*got, Frame(sender, 9, static_cast<uint32_t>(i), sizes[i], seed));
    }
    sending.join();
  };
  std::thread one_way([&] { run(*pair.rank0, *pair.rank1, 0, 5); });
  run(*pair.rank1, *pair.rank0, 1, 77);
  one_way.join();
  EXPECT_EQ(pair.rank0->kept(), 0u);
  EXPECT_EQ(pair.rank1->kept(), 0u);
}

TEST(RingShmTest, ReadsInPlaceOrIntoTheLandingAndKeepsFramesAskedForLater) {
  Pair pair(16 * kPage);
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 1, 0, 800, 1)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 1, 1, 800, 2)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 2, 0, 100, 3)).ok());
  // Asked for last: read meanwhile, and kept.
  auto second = pair.rank1->Recv(2, 0, Deadline::AfterMillis(5000));
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectSame(*second, Frame(0, 2, 0, 100, 3));
  EXPECT_EQ(pair.rank1->kept(), 2u);
  std::vector<uint8_t> landing(800);
  auto landed = pair.rank1->Recv(1, 0, Deadline::AfterMillis(5000), landing.data(), 800);
  ASSERT_TRUE(landed.ok()) << landed.status();
  ExpectSame(*landed, Frame(0, 1, 0, 800, 1));
  auto last = pair.rank1->Recv(1, 1, Deadline::AfterMillis(5000));
  ASSERT_TRUE(last.ok());
  ExpectSame(*last, Frame(0, 1, 1, 800, 2));

  // A frame read while its Recv waits lands in `into`, or stays in the ring without one.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(pair.rank0->Send(Frame(0, 3, 0, 800, 4)).ok());
    EXPECT_TRUE(pair.rank0->Send(Frame(0, 3, 1, 800, 5)).ok());
  });
  auto into = pair.rank1->Recv(3, 0, Deadline::AfterMillis(5000), landing.data(), 800);
  ASSERT_TRUE(into.ok()) << into.status();
  EXPECT_EQ(into->data.data(), landing.data());
  ExpectSame(*into, Frame(0, 3, 0, 800, 4));
  auto in_place = pair.rank1->Recv(3, 1, Deadline::AfterMillis(5000));
  later.join();
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  ExpectSame(*in_place, Frame(0, 3, 1, 800, 5));
  EXPECT_EQ(pair.rank1->kept(), 0u);
}

// Two frames under one (tag, slot) (two calls under a reused tag): only the one a Recv takes
// lands in its `into`, whether the two are read in one pass or the first was kept before.
TEST(RingShmTest, ASecondFrameUnderTheSameKeyDoesNotLandInTheWaitersMemory) {
  Pair pair(16 * kPage);
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 7, 0, 800, 6)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 7, 0, 800, 7)).ok());
  std::vector<uint8_t> landing(800);
  auto first = pair.rank1->Recv(7, 0, Deadline::AfterMillis(5000), landing.data(), 800);
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectSame(*first, Frame(0, 7, 0, 800, 6));
  first->data = Payload();
  landing.assign(800, 0);  // the caller's memory is its own again
  auto second = pair.rank1->Recv(7, 0, Deadline::AfterMillis(5000));
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectSame(*second, Frame(0, 7, 0, 800, 7));

  // The first kept while waiting for another frame; the second read while a Recv waits.
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 8, 0, 800, 8)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 9, 0, 100, 9)).ok());
  ASSERT_TRUE(pair.rank1->Recv(9, 0, Deadline::AfterMillis(5000)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 8, 0, 800, 10)).ok());
  std::vector<uint8_t> other(800);
  auto kept = pair.rank1->Recv(8, 0, Deadline::AfterMillis(5000), other.data(), 800);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ExpectSame(*kept, Frame(0, 8, 0, 800, 8));
  kept->data = Payload();
  other.assign(800, 0);
  auto behind = pair.rank1->Recv(8, 0, Deadline::AfterMillis(5000));
  ASSERT_TRUE(behind.ok()) << behind.status();
  ExpectSame(*behind, Frame(0, 8, 0, 800, 10));
}

TEST(RingShmTest, SpaceHeldByAPayloadIsFreedWhenItIsDropped) {
  Pair pair(kPage);
  // 3 frames of 1984 + 64 bytes fill... only 2 fit in a page.
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 1, 0, 1984, 1)).ok());
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 1, 1, 1984, 2)).ok());
  std::thread waiting([&] {
    auto held = pair.rank1->Recv(1, 0, Deadline::AfterMillis(5000));  // waits: in place
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_TRUE(pair.rank0->Send(Frame(0, 1, 2, 1984, 3)).ok());
    // The first frame's space is still lent out.
    EXPECT_EQ(pair.rank0->Flush(Deadline::AfterMillis(100)).code(),
              StatusCode::kDeadlineExceeded);
  });
  waiting.join();  // `held` dropped
  EXPECT_TRUE(pair.rank1->Recv(1, 1, Deadline::AfterMillis(5000)).ok());
  EXPECT_TRUE(pair.rank0->Flush(Deadline::AfterMillis(5000)).ok());
  auto third = pair.rank1->Recv(1, 2, Deadline::AfterMillis(5000));
  ASSERT_TRUE(third.ok());
  ExpectSame(*third, Frame(0, 1, 2, 1984, 3));
}

// A frame that borrows its caller's memory (no owner), larger than the ring and so half
// streamed when the call fails: once CopyUnsentPayloads ran, the caller may overwrite that
// memory and the frame still arrives whole and unchanged.
TEST(RingShmTest, CopyUnsentPayloadsLetsTheCallerReuseBorrowedMemory) {
  Pair pair(kPage);
  const RingFrame expected = Frame(0, 5, 0, 3 * kPage + 10, 9);
  std::vector<uint8_t> borrowed(expected.data.data(), expected.data.data() + expected.data.size());
  RingFrame frame = expected;
  frame.data = Payload::Borrow(borrowed.data(), borrowed.size(), nullptr);
  ASSERT_TRUE(pair.rank0->Send(std::move(frame)).ok());
  EXPECT_EQ(pair.rank0->Flush(Deadline::AfterMillis(20)).code(), StatusCode::kDeadlineExceeded);
  pair.rank0->CopyUnsentPayloads();
  std::fill(borrowed.begin(), borrowed.end(), 0xee);
  borrowed.clear();
  borrowed.shrink_to_fit();
  Status flushed;
  std::thread sender([&] { flushed = pair.rank0->Flush(Deadline::AfterMillis(10000)); });
  auto got = pair.rank1->Recv(5, 0, Deadline::AfterMillis(10000));
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(flushed.ok()) << flushed;
  ExpectSame(*got, expected);
}

TEST(RingShmTest, DeadlinesAreEmptyForRecvAndNameThePeerForFlush) {
  Pair pair(kPage);
  const auto started = SteadyClock::now();
  auto nothing = pair.rank1->Recv(4, 0, Deadline::AfterMillis(100));
  EXPECT_EQ(nothing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(nothing.status().message(), "");
  EXPECT_GE(SteadyClock::now() - started, std::chrono::milliseconds(100));
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2000));

  ASSERT_TRUE(pair.rank0->Send(Frame(0, 4, 0, 10000, 1)).ok());  // never fits: nobody reads
  Status flushed = pair.rank0->Flush(Deadline::AfterMillis(100));
  EXPECT_EQ(flushed.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(flushed.message(),
              StartsWith("ring shm to worker 1 (pid " + std::to_string(getpid()) + "): 1 frame"));
}

TEST(RingShmTest, APeerThatClosesFailsBothDirectionsNamingIt) {
  Pair pair(kPage);
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 5, 0, 10, 1)).ok());
  std::thread closing([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pair.rank0.reset();
  });
  // What it wrote before it closed still arrives.
  EXPECT_TRUE(pair.rank1->Recv(5, 0, Deadline::AfterMillis(5000)).ok());
  auto after = pair.rank1->Recv(5, 1, Deadline::AfterMillis(5000));
  closing.join();
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(after.status().message(),
            "ring shm from worker 0 (pid " + std::to_string(getpid()) + "): closed by the peer");
  EXPECT_EQ(pair.rank1->failure().message(), after.status().message());
  // The other direction: at Send if already noticed, else at Flush.
  Status sent = pair.rank1->Send(Frame(1, 5, 0, 10000, 1));
  if (sent.ok()) sent = pair.rank1->Flush(Deadline::AfterMillis(5000));
  EXPECT_EQ(sent.message(),
            "ring shm to worker 0 (pid " + std::to_string(getpid()) + "): closed by the peer");
}

TEST(RingShmTest, AFailureOnTheBusWakesAWaitingRecv) {
  auto failures = std::make_shared<FailureBus>();
  Pair pair(kPage, failures);
  std::thread failing([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    failures->Fail(UnavailableError("worker 1 failed (the coordinator says)"));
  });
  const auto started = SteadyClock::now();
  auto got = pair.rank0->Recv(6, 0, Deadline::AfterMillis(10000));
  failing.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2000));
  EXPECT_EQ(got.status(), UnavailableError("worker 1 failed (the coordinator says)"));
  EXPECT_EQ(pair.rank0->failure(), got.status());
  // The root cause comes first even where the channel itself would have something to say.
  ASSERT_TRUE(pair.rank0->Send(Frame(0, 6, 0, 10000, 1)).ok());
  EXPECT_EQ(pair.rank0->Flush(Deadline::AfterMillis(10000)), got.status());
}

// Worker 0's ring carries a frame stamped by another rank (here a channel that took worker 0's
// segment for its own but calls itself worker 2): worker 1 fails the direction, naming the
// peer it expected and the sender the frame claims.
TEST(RingShmTest, AFrameFromAnotherSenderFailsTheDirectionNamingThePeer) {
  auto zero = RingShm::Create(0, kPage);
  auto one = RingShm::Create(1, kPage);
  auto two = RingShm::Create(2, kPage);
  ASSERT_TRUE(zero.ok() && one.ok() && two.ok());
  auto impostor = RingShm::Attach(2, 3, *zero, RingShm::NameOf(**one), RingShm::NameOf(**zero),
                                  nullptr);
  auto receiver = RingShm::Attach(1, 3, *one, RingShm::NameOf(**zero), RingShm::NameOf(**two),
                                  nullptr);
  ASSERT_TRUE(impostor.ok() && receiver.ok()) << impostor.status() << receiver.status();
  ASSERT_TRUE((*impostor)->Send(Frame(2, 1, 0, 10, 1)).ok());
  auto got = (*receiver)->Recv(1, 0, Deadline::AfterMillis(5000));
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(), "ring shm from worker 0 (pid " + std::to_string(getpid()) +
                                        "): a frame claims to come from worker 2");
  EXPECT_EQ((*receiver)->failure(), got.status());
  EXPECT_EQ((*receiver)->Recv(1, 1, Deadline::AfterMillis(5000)).status(), got.status());
}

TEST(RingShmTest, RejectsASegmentWithAnotherToken) {
  auto own0 = RingShm::Create(0, kPage);
  auto own1 = RingShm::Create(1, kPage);
  ASSERT_TRUE(own0.ok() && own1.ok());
  RingShmSegmentName forged = RingShm::NameOf(**own1);
  forged.token[1] ^= 1;
  auto attached = RingShm::Attach(0, 2, *own0, forged, forged, nullptr);
  EXPECT_EQ(attached.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(attached.status().message(),
            "ring shm rank=0: worker 1's shared memory segment " + forged.name +
                ": holds another token: not the segment worker 1 created");
  RingShmSegmentName missing = RingShm::NameOf(**own1);
  missing.name += "-gone";
  attached = RingShm::Attach(0, 2, *own0, missing, missing, nullptr);
  EXPECT_EQ(attached.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(attached.status().message(), HasSubstr("shm_open: No such file or directory"));
}

// A neighbour's segment that its group or others may access is not mapped: someone else
// could watch or forge the frames in it.
TEST(RingShmTest, RefusesASegmentThatOthersMayAccess) {
  auto own0 = RingShm::Create(0, kPage);
  auto own1 = RingShm::Create(1, kPage);
  ASSERT_TRUE(own0.ok() && own1.ok()) << own0.status() << own1.status();
  const RingShmSegmentName name1 = RingShm::NameOf(**own1);
  const std::string path = "/dev/shm" + name1.name;
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
  EXPECT_EQ(info.st_mode & 0777, 0600u);  // as Create makes it
  for (mode_t mode : {0640, 0606, 0660}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    auto attached = RingShm::Attach(0, 2, *own0, name1, name1, nullptr);
    EXPECT_EQ(attached.status().code(), StatusCode::kFailedPrecondition);
    char text[8];
    std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode));
    EXPECT_EQ(attached.status().message(),
              "ring shm rank=0: worker 1's shared memory segment " + name1.name + ": has mode " +
                  text + " (its group or others may access it): refusing to map it");
  }
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(RingShm::Attach(0, 2, *own0, name1, name1, nullptr).ok());
}

// A segment another user owns is not mapped either. Only root can give one away.
TEST(RingShmTest, RefusesASegmentAnotherUserOwns) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a segment";
  auto own0 = RingShm::Create(0, kPage);
  auto own1 = RingShm::Create(1, kPage);
  ASSERT_TRUE(own0.ok() && own1.ok()) << own0.status() << own1.status();
  const RingShmSegmentName name1 = RingShm::NameOf(**own1);
  const std::string path = "/dev/shm" + name1.name;
  ASSERT_EQ(chown(path.c_str(), 65534, static_cast<gid_t>(-1)), 0) << std::strerror(errno);
  auto attached = RingShm::Attach(0, 2, *own0, name1, name1, nullptr);
  EXPECT_EQ(attached.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(attached.status().message(),
            "ring shm rank=0: worker 1's shared memory segment " + name1.name +
                ": owned by uid 65534, not ours: refusing to map it");
}

TEST(RingShmTest, ASegmentThatDoesNotFitInDevShmFailsClearly) {
  auto huge = RingShm::Create(0, size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(huge.status().message(), HasSubstr("cannot reserve"));
  EXPECT_FALSE(AnySegmentLeft());
}

// Sends a segment's name through a pipe as its text, one line, as setup sends it as a frame.
void WriteName(int fd, const RingShmSegmentName& name) {
  const std::string line = EncodeSegmentName(name) + "\n";
  ASSERT_EQ(write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
}
RingShmSegmentName ReadName(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line += c;
  StatusOr<RingShmSegmentName> name = DecodeSegmentName(line);
  EXPECT_TRUE(name.ok()) << name.status();
  return name.ok() ? *name : RingShmSegmentName();
}

// Rank 1 runs in a child process and is killed while it writes a frame larger than the ring:
// rank 0's Recv fails naming it within a few failure checks, not at its deadline.
TEST(RingShmTest, APeerProcessKilledMidFrameFailsRecvNamingIt) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    auto own = RingShm::Create(1, kPage);
    if (!own.ok()) _exit(2);
    WriteName(to_parent[1], RingShm::NameOf(**own));
    const RingShmSegmentName parent = ReadName(to_child[0]);
    auto shm = RingShm::Attach(1, 2, *own, parent, parent, nullptr);
    if (!shm.ok()) _exit(3);
    char attached = 0;  // the parent has attached to ours
    if (read(to_child[0], &attached, 1) != 1) _exit(4);
    (*shm)->UnlinkOwnSegment();
    (void)(*shm)->Send(Frame(1, 8, 0, 1 << 20, 1));  // streams the first page, then waits
    (void)!write(to_parent[1], "s", 1);
    (void)(*shm)->Flush(Deadline::AfterMillis(60000));
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  auto own = RingShm::Create(0, kPage);
  ASSERT_TRUE(own.ok()) << own.status();
  WriteName(to_child[1], RingShm::NameOf(**own));
  const RingShmSegmentName name = ReadName(to_parent[0]);
  auto shm = RingShm::Attach(0, 2, *own, name, name, nullptr);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_EQ(write(to_child[1], "p", 1), 1);
  char sent = 0;
  ASSERT_EQ(read(to_parent[0], &sent, 1), 1) << "the child failed";
  (*shm)->UnlinkOwnSegment();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Not reaped yet: a zombie answers kill(pid, 0), but it is gone all the same.
  const auto started = SteadyClock::now();
  auto got = (*shm)->Recv(8, 0, Deadline::AfterMillis(20000));
  const auto took = SteadyClock::now() - started;
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(got.status().message(),
            "ring shm from worker 1 (pid " + std::to_string(child) + "): the process exited");
  EXPECT_LT(took, std::chrono::milliseconds(2000));
  EXPECT_FALSE(AnySegmentLeft());
  for (int fd : {to_child[1], to_parent[0]}) close(fd);
}

TEST(RingShmTest, SegmentNamesRoundTripAsText) {
  auto own = RingShm::Create(0, kPage);
  ASSERT_TRUE(own.ok()) << own.status();
  const RingShmSegmentName name = RingShm::NameOf(**own);
  const std::string prefix = "/tessera-ring-" + std::to_string(getpid()) + "-0-";
  EXPECT_THAT(name.name, StartsWith(prefix));
  // 64 random bits in hex: nobody can guess the name, and no two are alike.
  EXPECT_THAT(name.name.substr(prefix.size()), MatchesRegex("[0-9a-f]{16}"));
  auto other = RingShm::Create(0, kPage);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(RingShm::NameOf(**other).name, name.name);
  const std::string text = EncodeSegmentName(name);
  StatusOr<RingShmSegmentName> decoded = DecodeSegmentName(text);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->name, name.name);
  EXPECT_EQ(decoded->token, name.token);
  // No segment: no text, and back.
  EXPECT_EQ(EncodeSegmentName(RingShmSegmentName()), "");
  decoded = DecodeSegmentName("");
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded->name.empty());
  const std::vector<std::string> malformed = {"/tessera-ring-1", "/tessera-ring-1 12", "/x 1 zz",
                                              std::string(300, 'a') + " 1 2"};
  for (const std::string& bad : malformed) {
    EXPECT_EQ(DecodeSegmentName(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(DecodeSegmentName("/x").status().message(), "a segment name is malformed: /x");
}

TEST(RingShmTest, AttachRejectsAWorldOfOne) {
  auto own = RingShm::Create(0, kPage);
  ASSERT_TRUE(own.ok()) << own.status();
  const RingShmSegmentName name = RingShm::NameOf(**own);
  auto attached = RingShm::Attach(0, 1, *own, name, name, nullptr);
  EXPECT_EQ(attached.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(attached.status().message(),
            "ring shm rank=0: needs world_size >= 2, a rank in it and its segment");
}

// Three ranks, each with its own segment, attached to both neighbours' (the second maps only
// next's doorbell): a frame goes round, and once every rank unlinked its name nothing is left
// in /dev/shm.
TEST(RingShmTest, ThreeRanksAttachInARingAndLeaveNothingInDevShm) {
  constexpr int kWorld = 3;
  std::vector<std::shared_ptr<RingShm::Segment>> own;
  std::vector<RingShmSegmentName> names;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto created = RingShm::Create(rank, kPage);
    ASSERT_TRUE(created.ok()) << created.status();
    names.push_back(RingShm::NameOf(**created));
    own.push_back(std::move(created).value());
  }
  std::vector<std::unique_ptr<RingShm>> shm;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto attached = RingShm::Attach(rank, kWorld, own[rank], names[(rank + kWorld - 1) % kWorld],
                                    names[(rank + 1) % kWorld], nullptr);
    ASSERT_TRUE(attached.ok()) << attached.status();
    shm.push_back(std::move(attached).value());
  }
  own.clear();  // the channels hold them
  EXPECT_TRUE(AnySegmentLeft());
  for (auto& channel : shm) channel->UnlinkOwnSegment();
  EXPECT_FALSE(AnySegmentLeft());
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(shm[rank]->Send(Frame(rank, 1, 0, 100, static_cast<uint8_t>(rank))).ok());
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    const int prev = (rank + kWorld - 1) % kWorld;
    auto got = shm[rank]->Recv(1, 0, Deadline::AfterMillis(5000));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, Frame(prev, 1, 0, 100, static_cast<uint8_t>(prev)));
    EXPECT_TRUE(shm[rank]->Flush(Deadline::AfterMillis(5000)).ok());
  }
}

}  // namespace
}  // namespace tessera::worker
