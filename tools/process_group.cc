#include "tools/process_group.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace tessera {
namespace tools {
namespace {

// Poll() wakes up at least this often to reap children whose exit it cannot watch (no pidfd:
// a kernel before 5.3), so an exit is never missed for long.
constexpr int64_t kReapIntervalMs = 50;
// Bound on reading one stream per wake-up, so one chatty child cannot starve the others.
constexpr size_t kMaxReadPerWake = 1 << 20;
// How long Spawn() waits to learn whether exec succeeded.
constexpr int kExecReportTimeoutMs = 10000;

std::string ErrnoText(int error) { return std::string(strerror(error)); }

void CloseFd(int* fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

// Makes `from` the descriptor `to` in the child; dup2 onto itself would keep FD_CLOEXEC.
void MoveFd(int from, int to) {
  if (from == to) {
    fcntl(to, F_SETFD, 0);
  } else {
    dup2(from, to);
  }
}

// Runs in the child between fork() and exec(): async-signal-safe calls only.
[[noreturn]] void ExecChild(char* const* argv, int devnull, int stdout_w, int stderr_w,
                            int exec_error_w, pid_t parent) {
  setpgid(0, 0);
  // Second line of defence: if the launcher dies without stopping us, the kernel kills us.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl took effect

  // exec() keeps ignored signals ignored and the signal mask as it is; start clean.
  struct sigaction default_action;
  memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &default_action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  MoveFd(devnull, STDIN_FILENO);
  MoveFd(stdout_w, STDOUT_FILENO);
  MoveFd(stderr_w, STDERR_FILENO);
  execv(argv[0], argv);

  int error = errno;
  ssize_t ignored = write(exec_error_w, &error, sizeof(error));
  (void)ignored;
  _exit(127);
}

ChildExit DecodeWaitStatus(int wait_status) {
  ChildExit exit;
  if (WIFSIGNALED(wait_status)) {
    exit.signaled = true;
    exit.signal = WTERMSIG(wait_status);
  } else {
    exit.status = WEXITSTATUS(wait_status);
  }
  return exit;
}

// Waits (bounded) for the exec report of a freshly forked child: 0 when exec succeeded (the
// close-on-exec pipe closed with nothing written), the child's errno when it failed, or
// ETIMEDOUT when neither happened in time.
int ReadExecReport(int exec_error_r) {
  Deadline deadline = Deadline::AfterMillis(kExecReportTimeoutMs);
  while (true) {
    struct pollfd pfd = {exec_error_r, POLLIN, 0};
    int n = poll(&pfd, 1, static_cast<int>(deadline.RemainingMillis()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? ETIMEDOUT : errno;
    int child_errno = 0;
    ssize_t got = read(exec_error_r, &child_errno, sizeof(child_errno));
    if (got < 0 && errno == EINTR) continue;
    if (got == static_cast<ssize_t>(sizeof(child_errno))) return child_errno;
    return 0;  // EOF: exec succeeded
  }
}

void SleepMillis(int64_t millis) {
  struct timespec ts = {static_cast<time_t>(millis / 1000),
                        static_cast<long>((millis % 1000) * 1000000)};
  nanosleep(&ts, nullptr);
}

// A child whose exec failed is exiting already (or hung before exec): make sure it is gone.
void KillAndReapFailedStart(pid_t pid, std::chrono::milliseconds wait) {
  kill(pid, SIGKILL);
  Deadline deadline = Deadline::After(wait);
  while (waitpid(pid, nullptr, WNOHANG) == 0 && !deadline.Expired()) SleepMillis(5);
}

}  // namespace

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev == nullptr) return "signal " + std::to_string(signal);
  return std::string("SIG") + abbrev;
}

std::string ChildExit::Describe() const {
  if (signaled) {
    return "killed by signal " + std::to_string(signal) + " (" + SignalName(signal) + ")";
  }
  return "exited with status " + std::to_string(status);
}

struct ProcessGroup::Child {
  std::string label;
  pid_t pid = -1;
  bool running = true;
  ChildExit exit;
  int fds[2] = {-1, -1};   // read ends of stdout and stderr, indexed by ChildStream
  std::string pending[2];  // bytes read but not yet delivered as a line
  // Readable once the child has exited, so Poll() wakes for an exit at once (its pipes close a
  // moment before it can be reaped, or never, when a grandchild holds them). -1 without one.
  int pidfd = -1;

  ~Child() {
    CloseFd(&fds[0]);
    CloseFd(&fds[1]);
    CloseFd(&pidfd);
  }
};

ProcessGroup::ProcessGroup() : ProcessGroup(Options()) {}

ProcessGroup::ProcessGroup(Options options) : options_(options) {}

ProcessGroup::~ProcessGroup() {
  StopReport report;
  KillAndReap(AllChildren(), nullptr, &report);
}

StatusOr<int> ProcessGroup::Spawn(const std::string& label, const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].empty()) {
    return InvalidArgumentError("cannot start " + label + ": empty command line");
  }
  const std::string what = "cannot start " + label + " (" + argv[0] + ")";
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);

  // Close-on-exec everywhere, so no child inherits another child's pipes (which would keep
  // them open and hide that child's end of output).
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_error[2] = {-1, -1};
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &exec_error[0], &exec_error[1], &devnull}) {
      CloseFd(fd);
    }
  };
  if (devnull < 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
      pipe2(exec_error, O_CLOEXEC) != 0) {
    int error = errno;
    close_all();
    return UnavailableError(what + ": cannot create pipes: " + ErrnoText(error));
  }

  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int error = errno;
    close_all();
    return UnavailableError(what + ": fork: " + ErrnoText(error));
  }
  if (pid == 0) ExecChild(args.data(), devnull, out[1], err[1], exec_error[1], parent);

  // Also set the group from this side, so a signal sent right after Spawn() reaches it. It
  // fails harmlessly (EACCES) when the child has already exec'd, by which time it set it itself.
  setpgid(pid, pid);
  CloseFd(&out[1]);
  CloseFd(&err[1]);
  CloseFd(&exec_error[1]);
  CloseFd(&devnull);

  int exec_errno = ReadExecReport(exec_error[0]);
  CloseFd(&exec_error[0]);
  if (exec_errno != 0) {
    CloseFd(&out[0]);
    CloseFd(&err[0]);
    KillAndReapFailedStart(pid, options_.kill_wait);
    std::string message = what + ": exec: " + ErrnoText(exec_errno);
    if (exec_errno == ENOENT) return NotFoundError(std::move(message));
    return FailedPreconditionError(std::move(message));
  }
  auto child = std::make_unique<Child>();
  child->label = label;
  child->pid = pid;
  child->fds[0] = out[0];
  child->fds[1] = err[0];
  child->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  fcntl(child->fds[0], F_SETFL, O_NONBLOCK);
  fcntl(child->fds[1], F_SETFL, O_NONBLOCK);
  children_.push_back(std::move(child));
  return static_cast<int>(children_.size()) - 1;
}

std::vector<ChildEvent> ProcessGroup::Poll(Deadline deadline) {
  std::vector<ChildEvent> events;
  while (true) {
    ReapExited(&events);
    if (!events.empty() || RunningCount() == 0) return events;

    std::vector<struct pollfd> pfds;
    std::vector<std::pair<int, ChildStream>> owners;  // of the stream entries of pfds
    bool all_watched = true;  // every running child's exit wakes poll()
    for (size_t id = 0; id < children_.size(); ++id) {
      const Child& child = *children_[id];
      if (!child.running) continue;
      for (ChildStream stream : {ChildStream::kStdout, ChildStream::kStderr}) {
        int fd = child.fds[static_cast<int>(stream)];
        if (fd < 0) continue;
        pfds.push_back({fd, POLLIN, 0});
        owners.emplace_back(static_cast<int>(id), stream);
      }
      all_watched &= child.pidfd >= 0;
    }
    const size_t streams = pfds.size();
    for (const auto& child : children_) {
      if (child->running && child->pidfd >= 0) pfds.push_back({child->pidfd, POLLIN, 0});
    }
    if (wake_fd_ >= 0) pfds.push_back({wake_fd_, POLLIN, 0});
    int64_t wait = deadline.RemainingMillis();
    if (!all_watched) wait = std::min(wait, kReapIntervalMs);
    int wait_ms = static_cast<int>(std::min<int64_t>(wait, INT32_MAX));
    int ready = poll(pfds.data(), pfds.size(), wait_ms);
    if (ready < 0) {
      if (errno == EINTR) return events;  // let the caller look at its signal flags
      SleepMillis(std::min<int64_t>(wait_ms, kReapIntervalMs));  // unexpected (ENOMEM)
    }
    for (size_t i = 0; ready > 0 && i < streams; ++i) {
      if (pfds[i].revents != 0) DrainStream(owners[i].first, owners[i].second, &events);
    }
    if (ready > 0 && wake_fd_ >= 0 && pfds.back().revents != 0) {
      char bytes[64];
      while (read(wake_fd_, bytes, sizeof(bytes)) > 0) {
      }
      ReapExited(&events);
      return events;  // let the caller look at its signal flags
    }
    if (!events.empty()) {
      ReapExited(&events);
      return events;
    }
    if (deadline.Expired()) return events;
  }
}

void ProcessGroup::ReapExited(std::vector<ChildEvent>* events) {
  for (size_t id = 0; id < children_.size(); ++id) {
    Child& child = *children_[id];
    if (!child.running) continue;
    int wait_status = 0;
    pid_t reaped = waitpid(child.pid, &wait_status, WNOHANG);
    if (reaped == 0 || (reaped < 0 && errno == EINTR)) continue;
    child.running = false;
    CloseFd(&child.pidfd);
    if (reaped == child.pid) {
      child.exit = DecodeWaitStatus(wait_status);
    } else {
      child.exit.status = 255;  // ECHILD: reaped behind our back; should not happen
    }
    // Whatever the child left behind in its process group goes with it. The group id cannot
    // have been reused: it stays allocated while any member lives.
    kill(-child.pid, SIGKILL);
    // Everything the child wrote is in the pipes by now: deliver it before the exit.
    for (ChildStream stream : {ChildStream::kStdout, ChildStream::kStderr}) {
      DrainStream(static_cast<int>(id), stream, events);
      EmitLines(static_cast<int>(id), stream, /*flush_partial=*/true, events);
      CloseFd(&child.fds[static_cast<int>(stream)]);
    }
    ChildEvent event;
    event.kind = ChildEvent::Kind::kExit;
    event.child = static_cast<int>(id);
    event.exit = child.exit;
    events->push_back(std::move(event));
  }
}

void ProcessGroup::DrainStream(int id, ChildStream stream, std::vector<ChildEvent>* events) {
  Child& child = *children_[id];
  int& fd = child.fds[static_cast<int>(stream)];
  std::string& pending = child.pending[static_cast<int>(stream)];
  char buffer[64 * 1024];
  size_t total = 0;
  bool closed = false;
  while (fd >= 0 && total < kMaxReadPerWake) {
    ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got > 0) {
      pending.append(buffer, static_cast<size_t>(got));
      total += static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    closed = true;  // EOF, or an error that makes the stream unusable
    break;
  }
  EmitLines(id, stream, /*flush_partial=*/closed, events);
  if (closed) CloseFd(&fd);
}

void ProcessGroup::EmitLines(int id, ChildStream stream, bool flush_partial,
                             std::vector<ChildEvent>* events) {
  std::string& pending = children_[id]->pending[static_cast<int>(stream)];
  auto emit = [&](size_t begin, size_t length) {
    ChildEvent event;
    event.kind = ChildEvent::Kind::kLine;
    event.child = id;
    event.stream = stream;
    event.line = pending.substr(begin, length);
    events->push_back(std::move(event));
  };
  size_t begin = 0;
  while (begin < pending.size()) {
    size_t newline = pending.find('\n', begin);
    size_t limit = std::min(pending.size(), begin + options_.max_line_bytes);
    if (newline != std::string::npos && newline < limit) {
      emit(begin, newline - begin);
      begin = newline + 1;
    } else if (pending.size() - begin >= options_.max_line_bytes) {
      emit(begin, options_.max_line_bytes);  // an over-long line, in pieces
      begin += options_.max_line_bytes;
    } else {
      break;
    }
  }
  if (flush_partial && begin < pending.size()) {
    emit(begin, pending.size() - begin);
    begin = pending.size();
  }
  pending.erase(0, begin);
}

Status ProcessGroup::Signal(int id, int signal) {
  if (id < 0 || static_cast<size_t>(id) >= children_.size()) {
    return InvalidArgumentError("no child with id " + std::to_string(id));
  }
  const Child& child = *children_[id];
  if (!child.running) return OkStatus();
  if (kill(-child.pid, signal) == 0) return OkStatus();
  if (kill(child.pid, signal) == 0) return OkStatus();  // not (yet) a group leader
  int error = errno;
  if (error == ESRCH) return OkStatus();  // exited, not reaped yet
  return UnavailableError("cannot send " + SignalName(signal) + " to " + child.label + " (pid " +
                          std::to_string(child.pid) + "): " + ErrnoText(error));
}

StopReport ProcessGroup::Stop(const std::vector<int>& children, std::chrono::milliseconds grace,
                              const ChildEventSink& sink, const std::function<bool()>& hurry) {
  StopReport report;
  if (!AnyRunning(children)) return report;
  for (int id : children) {
    Status ignored = Signal(id, SIGTERM);  // only fails for vanished children
    ignored = Signal(id, SIGCONT);
    (void)ignored;
  }
  Deadline grace_deadline = Deadline::After(grace);
  while (AnyRunning(children) && !grace_deadline.Expired() && !(hurry && hurry())) {
    for (const ChildEvent& event : Poll(grace_deadline)) {
      if (sink) sink(event);
    }
  }
  KillAndReap(children, sink, &report);
  return report;
}

StopReport ProcessGroup::StopAll(std::chrono::milliseconds grace, const ChildEventSink& sink,
                                 const std::function<bool()>& hurry) {
  return Stop(AllChildren(), grace, sink, hurry);
}

void ProcessGroup::KillAndReap(const std::vector<int>& children, const ChildEventSink& sink,
                               StopReport* report) {
  for (int id : children) {
    if (!Running(id)) continue;
    report->killed.push_back(id);
    Status ignored = Signal(id, SIGKILL);
    (void)ignored;
  }
  Deadline deadline = Deadline::After(options_.kill_wait);
  while (AnyRunning(children) && !deadline.Expired()) {
    for (const ChildEvent& event : Poll(deadline)) {
      if (sink) sink(event);
    }
  }
  for (int id : children) {
    if (Running(id)) report->unreaped.push_back(id);
  }
}

bool ProcessGroup::AnyRunning(const std::vector<int>& children) const {
  return std::any_of(children.begin(), children.end(), [this](int id) { return Running(id); });
}

std::vector<int> ProcessGroup::AllChildren() const {
  std::vector<int> all(children_.size());
  for (size_t id = 0; id < all.size(); ++id) all[id] = static_cast<int>(id);
  return all;
}

size_t ProcessGroup::size() const { return children_.size(); }

int ProcessGroup::RunningCount() const {
  return static_cast<int>(std::count_if(children_.begin(), children_.end(),
                                        [](const auto& child) { return child->running; }));
}

bool ProcessGroup::Running(int id) const { return children_.at(id)->running; }

pid_t ProcessGroup::Pid(int id) const { return children_.at(id)->pid; }

const std::string& ProcessGroup::Label(int id) const { return children_.at(id)->label; }

const ChildExit& ProcessGroup::ExitOf(int id) const { return children_.at(id)->exit; }

}  // namespace tools
}  // namespace tessera
