// ProcessGroup: a set of child processes whose stdout and stderr come back as whole lines.
//
// Each child runs in a process group of its own (so a signal reaches anything it started too),
// with stdin on /dev/null, stdout and stderr on pipes, and PR_SET_PDEATHSIG(SIGKILL) so it
// dies with the launcher even when the launcher is killed outright. Nothing outlives the
// ProcessGroup: its destructor sends SIGKILL to every child still running and reaps it, and
// when a child exits, whatever it left running in its process group is killed with SIGKILL.
//
//   ProcessGroup group;
//   ASSIGN_OR_RETURN(int id, group.Spawn("worker 0", {"/path/to/tessera-worker", "--rank", "0"}));
//   for (const ChildEvent& event : group.Poll(Deadline::AfterMillis(100))) { ... }
//   group.Stop({id}, std::chrono::seconds(5), sink);  // SIGTERM, then SIGKILL after the grace
//
// Poll() delivers a child's output lines in the order the child wrote them on each stream, and
// a child's exit only after every line it wrote (lines from different children, and from one
// child's two streams, are interleaved in the order they were read). A line longer than
// Options::max_line_bytes is delivered in pieces; a last line without a newline is delivered
// when the stream closes or the child exits.
//
// Thread-safety: not thread-safe; one thread owns a ProcessGroup. Not copyable.
#ifndef TESSERA_TOOLS_PROCESS_GROUP_H_
#define TESSERA_TOOLS_PROCESS_GROUP_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"

namespace tessera {
namespace tools {

// How a child ended, as waitpid() told it.
struct ChildExit {
  bool signaled = false;  // killed by a signal (then `signal` is set) rather than exited
  int status = 0;         // the exit status when !signaled
  int signal = 0;

  bool success() const { return !signaled && status == 0; }
  // "exited with status 3" or "killed by signal 9 (SIGKILL)".
  std::string Describe() const;
};

// "SIGKILL" for 9; "signal 64" when the signal has no name.
std::string SignalName(int signal);

enum class ChildStream { kStdout, kStderr };

struct ChildEvent {
  enum class Kind { kLine, kExit };
  Kind kind = Kind::kLine;
  int child = -1;  // the id Spawn() returned
  // kLine: the line without its newline, and the stream it came from.
  ChildStream stream = ChildStream::kStdout;
  std::string line;
  // kExit:
  ChildExit exit;
};

using ChildEventSink = std::function<void(const ChildEvent&)>;

// What Stop() had to do.
struct StopReport {
  std::vector<int> killed;    // children that outlived the grace and got SIGKILL
  std::vector<int> unreaped;  // children still not reaped after SIGKILL (uninterruptible sleep)
};

class ProcessGroup {
 public:
  struct Options {
    size_t max_line_bytes = 64 * 1024;
    // How long the destructor and Stop() wait for the exit of a child sent SIGKILL.
    std::chrono::milliseconds kill_wait{5000};
  };

  ProcessGroup();
  explicit ProcessGroup(Options options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv[0] (a path: it is not looked up in PATH) with arguments argv[1..]. `label`
  // names the child in messages ("worker 1"). Returns the child's id (0, 1, 2, ... in spawn
  // order), or an error naming the label and path when the program cannot be started (the
  // exec error is reported here, not as an exit status).
  StatusOr<int> Spawn(const std::string& label, const std::vector<std::string>& argv);

  // Waits until at least one event is ready or `deadline` passes, then returns what is ready
  // (empty on timeout). Returns early and empty when a signal interrupts the wait or the wake
  // fd (WakeOn) is readable, so a caller that handles signals can check its flags; returns at
  // once when no child is running.
  std::vector<ChildEvent> Poll(Deadline deadline);
  // `fd` (the read end of a non-blocking pipe whose write end a signal handler writes a byte
  // to) ends every Poll() wait once readable, and Poll() drains it. A signal that arrives after
  // the caller looked at its flags but before poll() began interrupts nothing (EINTR needs the
  // signal during the call), and would leave the wait to its deadline: the whole --linger, or
  // the whole grace of a stop. The caller keeps the pipe open while this group polls; -1: none.
  void WakeOn(int fd) { wake_fd_ = fd; }

  // Sends `signal` to the child's process group. No-op (OK) when the child has been reaped.
  Status Signal(int child, int signal);

  // Stops the given children (those still running): SIGTERM (and SIGCONT, so stopped children
  // see it), then SIGKILL to those still running after `grace`, or at once when `hurry`
  // returns true. Output lines and exits that arrive meanwhile, from any child, go to `sink`.
  // Every wait is bounded.
  StopReport Stop(const std::vector<int>& children, std::chrono::milliseconds grace,
                  const ChildEventSink& sink, const std::function<bool()>& hurry = nullptr);
  // Stop() of every child.
  StopReport StopAll(std::chrono::milliseconds grace, const ChildEventSink& sink,
                     const std::function<bool()>& hurry = nullptr);

  size_t size() const;
  int RunningCount() const;
  bool Running(int child) const;
  pid_t Pid(int child) const;
  const std::string& Label(int child) const;
  // REQUIRES: !Running(child).
  const ChildExit& ExitOf(int child) const;

 private:
  struct Child;

  void ReapExited(std::vector<ChildEvent>* events);
  void DrainStream(int child, ChildStream stream, std::vector<ChildEvent>* events);
  void EmitLines(int child, ChildStream stream, bool flush_partial,
                 std::vector<ChildEvent>* events);
  bool AnyRunning(const std::vector<int>& children) const;
  std::vector<int> AllChildren() const;
  void KillAndReap(const std::vector<int>& children, const ChildEventSink& sink,
                   StopReport* report);

  Options options_;
  std::vector<std::unique_ptr<Child>> children_;
  int wake_fd_ = -1;  // WakeOn's
};

}  // namespace tools
}  // namespace tessera

#endif  // TESSERA_TOOLS_PROCESS_GROUP_H_
