// DirectReadCollectives between real processes: each rank a forked child with a RingCollectives
// over shared-memory rings (RingShm) as its control, as tessera-worker's ranks on one host.
// Results against the reference; a rank killed while its peers read it, named by every
// survivor within the timeout; and a kernel that refuses (a seccomp filter in one rank): the
// refusal is logged and the ring carries the calls, correctly.
//
// Every test forks before this process starts any thread.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/failure_bus.h"
#include "worker/collectives/channel/cma/cma_refusal_testing.h"
#include "worker/collectives/channel/shm/ring_shm.h"
#include "worker/collectives/direct_read_collectives.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/collectives/ring_test_harness.h"

namespace tessera::worker {
namespace {

constexpr int64_t kTimeoutMs = 10000;
constexpr uint64_t kProbeTag = 1;

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  return text;
}

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = write(fd, text.data() + done, text.size() - done);
    if (wrote <= 0) return;
    done += static_cast<size_t>(wrote);
  }
}

// What a child runs: its rank and its ring; `started` tells the parent it got going. Returns ""
// when all went as expected, else what did not.
using Body = std::function<std::string(int rank, RingCollectives& ring,
                                       const std::function<void()>& started)>;

// `world` children, each with a ring over shared memory to its neighbours, running `body`.
class ForkedRanks {
 public:
  // `before`: what a child does first, before it sets anything up (e.g. install a filter).
  ForkedRanks(int world, const Body& body,
              const std::function<void(int rank)>& before = [](int) {})
      : world_(world) {
    for (int rank = 0; rank < world; ++rank) {
      int up[2], down[2], signal[2];
      if (pipe(up) != 0 || pipe(down) != 0 || pipe(signal) != 0) ADD_FAILURE() << "pipe";
      const pid_t pid = fork();
      if (pid < 0) {
        ADD_FAILURE() << "fork: " << std::strerror(errno);
        continue;
      }
      if (pid == 0) {
        close(up[0]);
        close(down[1]);
        close(signal[0]);
        // The parent's ends for the ranks forked before: `down` must reach its end of file
        // when the parent closes it.
        for (const Child& earlier : children_) {
          close(earlier.up);
          close(earlier.down);
          close(earlier.signal);
        }
        before(rank);
        _exit(RunChild(rank, body, up[1], down[0], signal[1]));
      }
      close(up[1]);
      close(down[0]);
      close(signal[1]);
      children_.push_back({pid, up[0], down[1], signal[0]});
    }
    std::string names;
    for (Child& child : children_) names += ReadLine(child.up) + "\n";
    for (Child& child : children_) WriteAll(child.down, names);
  }

  ~ForkedRanks() {
    for (Child& child : children_) {
      // Only a child not reaped yet (never kill(-1, ...): that is every process we may signal).
      if (child.pid > 0) {
        kill(child.pid, SIGKILL);
        waitpid(child.pid, nullptr, 0);
      }
      close(child.up);
      if (child.down >= 0) close(child.down);
      close(child.signal);
    }
  }

  // Waits until `rank`'s body called started().
  bool WaitStarted(int rank) {
    char c;
    return read(children_[rank].signal, &c, 1) == 1;
  }

  void Kill(int rank) {
    if (children_[rank].pid > 0) kill(children_[rank].pid, SIGKILL);
  }

  // Every child's result ("" for as expected), once all wrote theirs and exited.
  std::vector<std::string> Results() {
    std::vector<std::string> texts;
    for (Child& child : children_) texts.push_back(ReadAll(child.up));
    for (Child& child : children_) {
      close(child.down);
      child.down = -1;
    }
    std::vector<std::string> results;
    for (Child& child : children_) {
      std::string text = texts[results.size()];
      int status = 0;
      waitpid(child.pid, &status, 0);
      if (WIFSIGNALED(status)) text = "killed by signal " + std::to_string(WTERMSIG(status));
      results.push_back(text);
      child.pid = 0;  // reaped
    }
    return results;
  }

 private:
  struct Child {
    pid_t pid;
    int up;      // the child's segment name, then its result
    int down;    // every rank's segment name
    int signal;  // started
  };

  int RunChild(int rank, const Body& body, int up, int down, int signal) {
    auto fail = [up](const std::string& why) {
      WriteAll(up, "\n" + why);
      return 1;
    };
    auto own = RingShm::Create(rank, 4 << 20);
    if (!own.ok()) return fail(own.status().ToString());
    WriteAll(up, EncodeSegmentName(RingShm::NameOf(**own)) + "\n");
    std::vector<RingShmSegmentName> names;
    for (int q = 0; q < world_; ++q) {
      StatusOr<RingShmSegmentName> name = DecodeSegmentName(ReadLine(down));
      if (!name.ok()) return fail(name.status().ToString());
      names.push_back(*name);
    }
    auto shm = RingShm::Attach(rank, world_, *own, names[(rank + world_ - 1) % world_],
                               names[(rank + 1) % world_], std::make_shared<FailureBus>());
    if (!shm.ok()) return fail(shm.status().ToString());
    RingShm* channel = shm->get();
    RingCollectivesOptions options;
    options.rank = rank;
    options.world_size = world_;
    options.channel = std::shared_ptr<RingChannel>(std::move(*shm));
    options.timeout_ms = kTimeoutMs;
    auto ring = RingCollectives::Create(options);
    if (!ring.ok()) return fail(ring.status().ToString());
    // Every rank has attached: nobody opens the names again.
    if (Status attached = (*ring)->Barrier(2); !attached.ok()) return fail(attached.ToString());
    channel->UnlinkOwnSegment();
    const std::string result = body(rank, **ring, [signal] { (void)!write(signal, "s", 1); });
    WriteAll(up, result);
    close(up);
    // The ring closes, as a failed rank's would, but the process stays until the parent has
    // every rank's result (it closes `down` then): a survivor must name the rank that was
    // killed, not one that exited after failing first.
    ring->reset();
    options.channel.reset();
    char end;
    while (read(down, &end, 1) > 0) {
    }
    return 0;
  }

  const int world_;
  std::vector<Child> children_;
};

StatusOr<std::unique_ptr<DirectReadCollectives>> Connect(int rank, int world,
                                                        Collectives& ring) {
  DirectReadCollectivesOptions options;
  options.rank = rank;
  options.world_size = world;
  options.control = &ring;
  options.timeout_ms = kTimeoutMs;
  return ConnectDirectReads(options, kProbeTag);
}

// A few million elements (chunks of the default size), every collective, float32 and bfloat16.
TEST(DirectReadProcessTest, ThreeProcessesMatchTheReference) {
  constexpr int kWorld = 3;
  ForkedRanks ranks(kWorld, [](int rank, RingCollectives& ring, const auto&) -> std::string {
    auto direct = Connect(rank, kWorld, ring);
    if (!direct.ok()) return direct.status().ToString();
    if (*direct == nullptr) return "direct reads refused between plain processes";
    uint64_t tag = 10;
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      for (size_t count : {size_t{2}, size_t{1000003}}) {
        const std::vector<Bytes> inputs = Inputs(dtype, kWorld, count, count);
        const size_t bytes = DataTypeSize(dtype);
        const ReduceOp op = dtype == DataType::kFloat32 ? ReduceOp::kSum : ReduceOp::kAverage;
        Bytes data = inputs[rank];
        Status done = (*direct)->AllReduce(data.data(), count, dtype, op, "x", ++tag);
        if (!done.ok()) return done.ToString();
        if (!MatchesReference(dtype, op, inputs, 0, count, data.data(), "allreduce")) {
          return "allreduce of " + Describe(count, dtype, op) + " differs from the reference";
        }
        const Partition own = PartitionOf(count, kWorld, rank);
        Bytes out(own.size * bytes + 1);
        done = (*direct)->ReduceScatter(inputs[rank].data(), out.data(), count, dtype, op, "x",
                                        ++tag);
        if (!done.ok()) return done.ToString();
        if (!MatchesReference(dtype, op, inputs, own.offset, own.size, out.data(), "rs")) {
          return "reducescatter of " + Describe(count, dtype, op) + " differs";
        }
        Bytes whole(count * bytes);
        done = (*direct)->AllGather(inputs[rank].data() + own.offset * bytes, whole.data(), count,
                                    dtype, "x", ++tag);
        if (!done.ok()) return done.ToString();
        for (int q = 0; q < kWorld; ++q) {
          const Partition p = PartitionOf(count, kWorld, q);
          if (p.size > 0 && std::memcmp(whole.data() + p.offset * bytes,
                                        inputs[q].data() + p.offset * bytes,
                                        p.size * bytes) != 0) {
            return "allgather: worker " + std::to_string(q) + "'s slice differs";
          }
        }
      }
    }
    return "";
  });
  const std::vector<std::string> results = ranks.Results();
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(results[rank], "") << "rank " << rank;
}

// Many back-to-back calls at world 4, as a benchmark makes them: control frames of one call
// (under one tag) and of the next must never be mixed up (ASan found a shared-memory ring
// frame landing in a finished call's memory here).
TEST(DirectReadProcessTest, ManyCallsAtWorldFour) {
  constexpr int kWorld = 4;
  ForkedRanks ranks(kWorld, [](int rank, RingCollectives& ring, const auto&) -> std::string {
    auto direct = Connect(rank, kWorld, ring);
    if (!direct.ok()) return direct.status().ToString();
    if (*direct == nullptr) return "direct reads refused between plain processes";
    std::vector<float> data(16384);
    for (uint64_t tag = 10; tag < 1500; ++tag) {
      std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
      Status done = (*direct)->AllReduce(data.data(), data.size(), DataType::kFloat32,
                                         ReduceOp::kSum, "many", tag);
      if (!done.ok()) return done.ToString();
      for (float x : data) {
        if (x != 10.0f) return "call " + std::to_string(tag) + ": " + std::to_string(x);
      }
      if (tag % 2 == 0) {
        if (Status b = ring.Barrier(tag + 100000); !b.ok()) return b.ToString();
      }
    }
    return "";
  });
  const std::vector<std::string> results = ranks.Results();
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(results[rank], "") << "rank " << rank;
}

// Worker 1 is killed while the ranks all-reduce 32 MiB over and over (most of the time goes to
// reading each other's buffers): each survivor fails its call naming worker 1 and that it
// exited, well within the timeout.
TEST(DirectReadProcessTest, APeerKilledMidReadIsNamedWithinTheTimeout) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 8 << 20;
  ForkedRanks ranks(kWorld, [](int rank, RingCollectives& ring,
                               const std::function<void()>& started) -> std::string {
    auto direct = Connect(rank, kWorld, ring);
    if (!direct.ok()) return direct.status().ToString();
    if (*direct == nullptr) return "direct reads refused between plain processes";
    std::vector<float> data(kCount, 1.0f);
    for (uint64_t tag = 10; tag < 100000; ++tag) {
      const auto start = std::chrono::steady_clock::now();
      Status done = (*direct)->AllReduce(data.data(), kCount, DataType::kFloat32, ReduceOp::kMax,
                                         "grads", tag);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start).count();
      if (!done.ok()) return "after " + std::to_string(ms) + " ms: " + done.ToString();
      if (tag == 11) started();
    }
    return "no call failed";
  });
  ASSERT_TRUE(ranks.WaitStarted(1));
  usleep(50 * 1000);
  ranks.Kill(1);
  const std::vector<std::string> results = ranks.Results();
  EXPECT_EQ(results[1], "killed by signal 9");
  for (int rank : {0, 2}) {
    const std::string& result = results[rank];
    EXPECT_NE(result.find("worker 1"), std::string::npos) << "rank " << rank << ": " << result;
    EXPECT_NE(result.find("exited"), std::string::npos) << "rank " << rank << ": " << result;
    ASSERT_EQ(result.rfind("after ", 0), 0u) << result;
    EXPECT_LT(std::stoll(result.substr(6)), kTimeoutMs) << "rank " << rank << ": " << result;
  }
}

// Worker 1 runs under a seccomp filter that fails process_vm_readv with EPERM (as a container
// profile may): every rank agrees on no direct reads, logs why once, and the ring's results are
// right.
TEST(DirectReadProcessTest, AKernelRefusalIsLoggedAndTheRingCarriesTheCalls) {
  constexpr int kWorld = 3;
  ForkedRanks ranks(
      kWorld,
      [](int rank, RingCollectives& ring, const auto&) -> std::string {
        // TLOG writes to stderr: keep this rank's lines in a file to check them.
        char path[] = "/tmp/direct-read-log-XXXXXX";
        const int log = mkstemp(path);
        if (log < 0) return "mkstemp";
        unlink(path);
        const int saved = dup(2);
        dup2(log, 2);
        auto direct = Connect(rank, kWorld, ring);
        dup2(saved, 2);
        if (!direct.ok()) return direct.status().ToString();
        if (*direct != nullptr) return "direct reads chosen although worker 1 is refused";
        lseek(log, 0, SEEK_SET);
        const std::string logged = ReadAll(log);
        for (std::string expected :
             {std::string("direct reads between this host's ranks are refused"),
              std::string("worker 1 cannot read its peers' memory")}) {
          if (logged.find(expected) == std::string::npos) return "log lacks '" + expected + "'";
        }
        if (rank == 1 && logged.find("(EPERM)") == std::string::npos) {
          return "worker 1's log does not say EPERM: " + logged;
        }
        const size_t lines = static_cast<size_t>(std::count(logged.begin(), logged.end(), '\n'));
        if (lines != 1) return "logged " + std::to_string(lines) + " lines: " + logged;
        const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, kWorld, 1001, 5);
        Bytes data = inputs[rank];
        Status done = ring.AllReduce(data.data(), 1001, DataType::kFloat32, ReduceOp::kSum, "x", 9);
        if (!done.ok()) return done.ToString();
        if (!MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, 1001, data.data(),
                              "ring")) {
          return "the ring's all-reduce differs from the reference";
        }
        return "";
      },
      [](int rank) {
        if (rank == 1 && !RefuseCrossMemoryAttach()) _exit(7);
      });
  const std::vector<std::string> results = ranks.Results();
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(results[rank], "") << "rank " << rank;
}

}  // namespace
}  // namespace tessera::worker
