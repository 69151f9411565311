#include "tools/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace tools {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Everything one child produced, in order, up to its exit.
struct Transcript {
  std::vector<std::string> out;
  std::vector<std::string> err;
  std::optional<ChildExit> exit;
  bool events_after_exit = false;  // must stay false: the exit comes after every line
};

void Record(const ChildEvent& event, int id, Transcript* transcript) {
  if (event.child != id) return;
  if (transcript->exit.has_value()) transcript->events_after_exit = true;
  if (event.kind == ChildEvent::Kind::kExit) {
    transcript->exit = event.exit;
  } else if (event.stream == ChildStream::kStdout) {
    transcript->out.push_back(event.line);
  } else {
    transcript->err.push_back(event.line);
  }
}

// Polls until child `id` has exited (or 10 s passed) and returns what it wrote.
Transcript RunToExit(ProcessGroup& group, int id) {
  Transcript transcript;
  Deadline deadline = Deadline::AfterMillis(10000);
  while (!transcript.exit.has_value() && !deadline.Expired()) {
    for (const ChildEvent& event : group.Poll(deadline)) Record(event, id, &transcript);
  }
  return transcript;
}

// Polls until child `id` writes a line on stdout (or 10 s passed); returns that line. Events of
// other children are dropped: use with one child running.
std::string WaitForLine(ProcessGroup& group, int id) {
  Deadline deadline = Deadline::AfterMillis(10000);
  while (!deadline.Expired()) {
    for (const ChildEvent& event : group.Poll(deadline)) {
      if (event.child == id && event.kind == ChildEvent::Kind::kLine) return event.line;
    }
  }
  return "";
}

int SpawnShell(ProcessGroup& group, const std::string& script, const std::string& label = "sh") {
  StatusOr<int> id = group.Spawn(label, {"/bin/sh", "-c", script});
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : -1;
}

// True when `pid` is gone or a zombie (reparented; its new parent has not reaped it yet).
bool ProcessGone(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return true;
  char buffer[512];
  ssize_t got = read(fd, buffer, sizeof(buffer) - 1);
  close(fd);
  if (got <= 0) return true;  // ESRCH: it went away between open and read
  std::string contents(buffer, static_cast<size_t>(got));
  size_t paren = contents.rfind(')');  // "pid (comm) S ..."
  return paren != std::string::npos && contents.size() > paren + 2 && contents[paren + 2] == 'Z';
}

bool WaitUntilGone(pid_t pid) {
  Deadline deadline = Deadline::AfterMillis(5000);
  while (!deadline.Expired()) {
    if (ProcessGone(pid)) return true;
    usleep(10000);
  }
  return false;
}

int64_t MillisSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count();
}

TEST(ProcessGroupTest, DeliversLinesOfBothStreamsThenTheExit) {
  ProcessGroup group;
  int id = SpawnShell(group, "echo one; echo two >&2; echo three; exit 0");
  Transcript t = RunToExit(group, id);
  EXPECT_THAT(t.out, ElementsAre("one", "three"));
  EXPECT_THAT(t.err, ElementsAre("two"));
  ASSERT_TRUE(t.exit.has_value());
  EXPECT_TRUE(t.exit->success());
  EXPECT_FALSE(t.events_after_exit);
  EXPECT_FALSE(group.Running(id));
  EXPECT_EQ(group.RunningCount(), 0);
  EXPECT_EQ(group.Label(id), "sh");
}

TEST(ProcessGroupTest, JoinsALineWrittenInPiecesAndFlushesTheLastPartialLine) {
  ProcessGroup group;
  int id = SpawnShell(group, "printf ab; sleep 0.2; printf 'c\\nd'; sleep 0.1; printf e");
  Transcript t = RunToExit(group, id);
  EXPECT_THAT(t.out, ElementsAre("abc", "de"));
}

TEST(ProcessGroupTest, SplitsOverlongLines) {
  ProcessGroup::Options options;
  options.max_line_bytes = 10;
  ProcessGroup group(options);
  int id = SpawnShell(group, "echo 0123456789abcde; echo short");
  Transcript t = RunToExit(group, id);
  EXPECT_THAT(t.out, ElementsAre("0123456789", "abcde", "short"));
}

TEST(ProcessGroupTest, LosesNoLinesOfALargeOutput) {
  ProcessGroup group;
  int id = SpawnShell(group, "seq 1 100000");
  Transcript t = RunToExit(group, id);
  ASSERT_EQ(t.out.size(), 100000u);
  EXPECT_EQ(t.out.front(), "1");
  EXPECT_EQ(t.out[49999], "50000");
  EXPECT_EQ(t.out.back(), "100000");
}

TEST(ProcessGroupTest, KeepsEachChildsOrderWhenSeveralRun) {
  ProcessGroup group;
  std::vector<int> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(SpawnShell(
        group, "for i in 1 2 3 4 5; do echo " + std::to_string(i) + ":$i; sleep 0.01; done"));
  }
  std::vector<Transcript> transcripts(ids.size());
  Deadline deadline = Deadline::AfterMillis(10000);
  while (group.RunningCount() > 0 && !deadline.Expired()) {
    for (const ChildEvent& event : group.Poll(deadline)) {
      for (size_t i = 0; i < ids.size(); ++i) Record(event, ids[i], &transcripts[i]);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string p = std::to_string(i) + ":";
    EXPECT_THAT(transcripts[i].out, ElementsAre(p + "1", p + "2", p + "3", p + "4", p + "5"));
    EXPECT_FALSE(transcripts[i].events_after_exit);
  }
}

TEST(ProcessGroupTest, ReportsTheExitStatus) {
  ProcessGroup group;
  int id = SpawnShell(group, "exit 3");
  Transcript t = RunToExit(group, id);
  ASSERT_TRUE(t.exit.has_value());
  EXPECT_FALSE(t.exit->success());
  EXPECT_FALSE(t.exit->signaled);
  EXPECT_EQ(t.exit->status, 3);
  EXPECT_EQ(t.exit->Describe(), "exited with status 3");
  EXPECT_EQ(group.ExitOf(id).status, 3);
}

TEST(ProcessGroupTest, ReportsDeathBySignal) {
  ProcessGroup group;
  int id = SpawnShell(group, "kill -KILL $$");
  Transcript t = RunToExit(group, id);
  ASSERT_TRUE(t.exit.has_value());
  EXPECT_TRUE(t.exit->signaled);
  EXPECT_EQ(t.exit->signal, SIGKILL);
  EXPECT_EQ(t.exit->Describe(), "killed by signal 9 (SIGKILL)");
}

TEST(ProcessGroupTest, SpawnOfAMissingProgramFailsWithItsName) {
  ProcessGroup group;
  StatusOr<int> id = group.Spawn("worker 3", {"/nonexistent/tessera-worker", "--rank", "3"});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(id.status().message(), HasSubstr("worker 3"));
  EXPECT_THAT(id.status().message(), HasSubstr("/nonexistent/tessera-worker"));
  EXPECT_THAT(id.status().message(), HasSubstr("No such file"));
  EXPECT_EQ(group.size(), 0u);
}

TEST(ProcessGroupTest, SpawnRejectsAnEmptyCommandLine) {
  ProcessGroup group;
  EXPECT_EQ(group.Spawn("x", {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ProcessGroupTest, StdinIsEmpty) {
  ProcessGroup group;
  int id = SpawnShell(group, "cat; echo done");
  Transcript t = RunToExit(group, id);
  EXPECT_THAT(t.out, ElementsAre("done"));
}

TEST(ProcessGroupTest, ChildStartsWithDefaultSignalDispositions) {
  // exec() keeps ignored signals ignored; the child must not inherit our SIG_IGN.
  struct sigaction ignore = {}, previous = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  ProcessGroup group;
  int id = SpawnShell(group, "grep SigIgn /proc/$$/status");
  Transcript t = RunToExit(group, id);
  sigaction(SIGPIPE, &previous, nullptr);
  ASSERT_EQ(t.out.size(), 1u);
  ASSERT_THAT(t.out[0], HasSubstr("SigIgn:"));
  // Bit n-1 stands for signal n. glibc keeps 32 and 33 for itself and they cannot be reset.
  uint64_t ignored = std::stoull(t.out[0].substr(t.out[0].find(':') + 1), nullptr, 16);
  EXPECT_EQ(ignored & 0x7fffffffu, 0u) << t.out[0];
}

TEST(ProcessGroupTest, PollTimesOutWhenNothingHappens) {
  ProcessGroup group;
  int id = SpawnShell(group, "exec sleep 30");
  auto start = SteadyClock::now();
  std::vector<ChildEvent> events = group.Poll(Deadline::AfterMillis(150));
  EXPECT_TRUE(events.empty());
  EXPECT_GE(MillisSince(start), 140);
  EXPECT_LT(MillisSince(start), 3000);
  EXPECT_TRUE(group.Running(id));
}

// A signal handler's byte, written before the wait began (where poll() sees no EINTR), ends
// the wait at once; the pipe is drained, so the next wait runs to its deadline.
TEST(ProcessGroupTest, PollReturnsAtOnceWhenTheWakeFdWasWritten) {
  int wake[2];
  ASSERT_EQ(pipe2(wake, O_NONBLOCK | O_CLOEXEC), 0);
  ProcessGroup group;
  group.WakeOn(wake[0]);
  int id = SpawnShell(group, "exec sleep 30");
  const char bytes[2] = {0, 0};
  ASSERT_EQ(write(wake[1], bytes, 2), 2);
  auto start = SteadyClock::now();
  EXPECT_TRUE(group.Poll(Deadline::AfterMillis(20000)).empty());
  EXPECT_LT(MillisSince(start), 1000);
  start = SteadyClock::now();
  EXPECT_TRUE(group.Poll(Deadline::AfterMillis(150)).empty());
  EXPECT_GE(MillisSince(start), 140);
  EXPECT_TRUE(group.Running(id));
  close(wake[0]);
  close(wake[1]);
}

TEST(ProcessGroupTest, PollReturnsAtOnceWhenNothingRuns) {
  ProcessGroup group;
  auto start = SteadyClock::now();
  EXPECT_TRUE(group.Poll(Deadline::AfterMillis(5000)).empty());
  EXPECT_LT(MillisSince(start), 1000);
}

TEST(ProcessGroupTest, SignalReachesTheChild) {
  ProcessGroup group;
  int id =
      SpawnShell(group, "trap 'echo got; exit 7' USR1; echo started; while :; do sleep 0.05; done");
  ASSERT_EQ(WaitForLine(group, id), "started");
  ASSERT_TRUE(group.Signal(id, SIGUSR1).ok());
  Transcript t = RunToExit(group, id);
  EXPECT_THAT(t.out, ElementsAre("got"));
  ASSERT_TRUE(t.exit.has_value());
  EXPECT_EQ(t.exit->status, 7);
  EXPECT_TRUE(group.Signal(id, SIGUSR1).ok());  // no-op once reaped
}

TEST(ProcessGroupTest, StopAllEndsACooperativeChildWithSigterm) {
  ProcessGroup group;
  int id = SpawnShell(group, "echo started; exec sleep 30");
  ASSERT_EQ(WaitForLine(group, id), "started");
  std::vector<ChildEvent> seen;
  auto start = SteadyClock::now();
  StopReport report =
      group.StopAll(milliseconds(5000), [&](const ChildEvent& e) { seen.push_back(e); });
  EXPECT_LT(MillisSince(start), 3000);
  EXPECT_TRUE(report.killed.empty());
  EXPECT_TRUE(report.unreaped.empty());
  EXPECT_FALSE(group.Running(id));
  EXPECT_TRUE(group.ExitOf(id).signaled);
  EXPECT_EQ(group.ExitOf(id).signal, SIGTERM);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().kind, ChildEvent::Kind::kExit);
}

TEST(ProcessGroupTest, StopAllKillsAChildThatIgnoresSigtermAfterTheGrace) {
  ProcessGroup group;
  int id = SpawnShell(group, "trap '' TERM; echo started; while :; do sleep 0.05; done");
  ASSERT_EQ(WaitForLine(group, id), "started");
  auto start = SteadyClock::now();
  StopReport report = group.StopAll(milliseconds(300), nullptr);
  int64_t elapsed = MillisSince(start);
  EXPECT_GE(elapsed, 290);
  EXPECT_LT(elapsed, 5000);
  EXPECT_THAT(report.killed, ElementsAre(id));
  EXPECT_TRUE(report.unreaped.empty());
  EXPECT_TRUE(group.ExitOf(id).signaled);
  EXPECT_EQ(group.ExitOf(id).signal, SIGKILL);
}

TEST(ProcessGroupTest, StopAllCutsTheGraceShortWhenHurried) {
  ProcessGroup group;
  int id = SpawnShell(group, "trap '' TERM; echo started; while :; do sleep 0.05; done");
  ASSERT_EQ(WaitForLine(group, id), "started");
  auto start = SteadyClock::now();
  StopReport report = group.StopAll(milliseconds(30000), nullptr, [] { return true; });
  EXPECT_LT(MillisSince(start), 5000);
  EXPECT_THAT(report.killed, ElementsAre(id));
}

TEST(ProcessGroupTest, StopAllStopsEveryChildAndDeliversTheirLastLines) {
  ProcessGroup group;
  int a = SpawnShell(group,
                     "trap 'echo bye-a; exit 0' TERM; echo started; "
                     "while :; do sleep 0.05; done");
  int b = SpawnShell(group, "trap '' TERM; echo started; while :; do sleep 0.05; done");
  // Both announce themselves, possibly in one batch of events.
  std::set<int> started;
  Deadline deadline = Deadline::AfterMillis(10000);
  while (started.size() < 2 && !deadline.Expired()) {
    for (const ChildEvent& event : group.Poll(deadline)) {
      if (event.kind == ChildEvent::Kind::kLine && event.line == "started") {
        started.insert(event.child);
      }
    }
  }
  ASSERT_EQ(started.size(), 2u);
  std::vector<std::string> lines;
  StopReport report = group.StopAll(milliseconds(500), [&](const ChildEvent& e) {
    if (e.kind == ChildEvent::Kind::kLine) lines.push_back(e.line);
  });
  EXPECT_THAT(lines, ::testing::Contains("bye-a"));
  EXPECT_THAT(report.killed, ElementsAre(b));
  EXPECT_TRUE(group.ExitOf(a).success());
  EXPECT_EQ(group.RunningCount(), 0);
}

TEST(ProcessGroupTest, StopLeavesTheOtherChildrenRunning) {
  ProcessGroup group;
  int a = SpawnShell(group, "exec sleep 30");
  int b = SpawnShell(group, "exec sleep 30");
  StopReport report = group.Stop({a}, milliseconds(5000), nullptr);
  EXPECT_TRUE(report.killed.empty());
  EXPECT_FALSE(group.Running(a));
  EXPECT_EQ(group.ExitOf(a).signal, SIGTERM);
  EXPECT_TRUE(group.Running(b));
  EXPECT_EQ(group.RunningCount(), 1);
  group.StopAll(milliseconds(5000), nullptr);
  EXPECT_FALSE(group.Running(b));
}

TEST(ProcessGroupTest, DestructorLeavesNoChildBehind) {
  pid_t pid = -1;
  {
    ProcessGroup group;
    int id = SpawnShell(group, "exec sleep 30");
    pid = group.Pid(id);
    ASSERT_GT(pid, 0);
  }
  EXPECT_TRUE(WaitUntilGone(pid));
}

TEST(ProcessGroupTest, WhatAChildLeftRunningDiesWithIt) {
  ProcessGroup group;
  int id = SpawnShell(group, "sleep 30 & echo $!; exit 0");
  Transcript t = RunToExit(group, id);
  ASSERT_EQ(t.out.size(), 1u);
  pid_t grandchild = static_cast<pid_t>(std::stol(t.out[0]));
  EXPECT_TRUE(WaitUntilGone(grandchild));
}

TEST(ProcessGroupTest, SignalNames) {
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  ChildExit segv;
  segv.signaled = true;
  segv.signal = SIGSEGV;
  EXPECT_EQ(segv.Describe(), "killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(ChildExit{}.Describe(), "exited with status 0");
}

}  // namespace
}  // namespace tools
}  // namespace tessera
