// FleetHarness: real Tessera processes on 127.0.0.1 for integration tests.
//
// Starts the built binaries (from the test's runfiles) as child processes, collects their
// output lines, waits for their TESSERA_READY lines and exits with deadlines, and signals
// them. Every process gets OS-chosen ports (port 0), so tests never collide.
//
// Thread-safety: one thread owns a harness.
#ifndef TESSERA_TESTS_FLEET_HARNESS_H_
#define TESSERA_TESTS_FLEET_HARNESS_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "tools/process_group.h"

namespace tessera::testing {

// The path of a binary built by Bazel, e.g. "coordinator/tessera-coordinator", in the runfiles.
std::string BinaryPath(const std::string& workspace_relative);

// A minimal blocking HTTP/1.0 GET of http://IPV4:PORT/PATH: the status code and body.
struct HttpResult {
  int status = 0;
  std::string body;
};
StatusOr<HttpResult> HttpGet(const std::string& url, int64_t timeout_ms);

// Whether the test runs under a sanitizer (.bazelrc's asan and tsan configurations set
// TESSERA_SANITIZER). Everything runs several times slower there, and CI runs the suite in all
// three configurations within one budget: the heaviest multi-process tests run a slice of
// their cases under a sanitizer (the same code paths, fewer seeds or values), all of them in
// the default configuration.
bool UnderSanitizer();

// The sanitizer the test runs under: "asan", "tsan", or empty in the default configuration.
std::string_view Sanitizer();

// In the body of a multi-process test that runs under one sanitizer only (and in the default
// configuration): skips it under the other. ThreadSanitizer takes the scenarios that are about
// concurrency (chains of forwards, joins, retries); AddressSanitizer those that are about data
// (embedding rows, checkpoint files). Each scenario still runs under one of the two.
#define TESSERA_ONLY_UNDER_SANITIZER(name)                                            \
  if (!::tessera::testing::Sanitizer().empty() &&                                     \
      ::tessera::testing::Sanitizer() != (name))                                      \
  GTEST_SKIP() << "under " << (name) << " only, not " << ::tessera::testing::Sanitizer()

// The job key file every process the harness starts uses: made once per test binary in
// TEST_TMPDIR and set as TESSERA_AUTH_KEY_FILE in the test's environment, which the children
// inherit (tessera-launch then uses it instead of making one).
const std::string& TestJobKeyFile();

// Runs `command` (sh -c) with `input` on stdin; returns its exit status and output.
StatusOr<std::pair<int, std::string>> RunWithInput(const std::string& command,
                                                   const std::string& input);

class FleetHarness {
 public:
  struct Process {
    std::string label;
    bool ready = false;
    std::string address;      // from TESSERA_READY
    std::string metrics_url;  // from TESSERA_READY
    int rank = -1;
    int64_t pid = 0;                 // from TESSERA_READY
    std::vector<std::string> lines;  // stdout and stderr, in arrival order
    // When the harness read each line (it reads while a Wait* call polls).
    std::vector<SteadyClock::time_point> line_times;
  };

  // Starts `binary` (workspace-relative) with `args`; returns its id.
  StatusOr<int> Start(const std::string& label, const std::string& binary,
                      const std::vector<std::string>& args);
  // Starts `argv` as given (argv[0] an absolute path or a name looked up in PATH, e.g.
  // {"/usr/bin/env", "RANK=1", BinaryPath("worker/tessera-worker"), ...}); returns its id.
  StatusOr<int> StartCommand(const std::string& label, const std::vector<std::string>& argv);
  // Starts a coordinator and waits for it; returns its HOST:PORT for --coordinator.
  StatusOr<std::string> StartCoordinator(const std::vector<std::string>& args);

  Status WaitReady(int id, Deadline deadline);
  // The exit of `id`, or DeadlineExceeded naming it.
  StatusOr<tools::ChildExit> WaitExit(int id, Deadline deadline);
  // Starts `binary args` (as Start) and waits for its exit: OK when it exited 0 within
  // `timeout_ms`, else an error naming `label` with its exit and its output.
  Status RunToSuccess(const std::string& label, const std::string& binary,
                      const std::vector<std::string>& args, int64_t timeout_ms);
  Status Signal(int id, int signal) { return group_.Signal(id, signal); }

  const Process& process(int id) const { return processes_.at(id); }
  // Every line `id` printed so far, joined by newlines.
  std::string Output(int id) const;
  // Waits until `id` printed a line containing `text`.
  Status WaitForLine(int id, const std::string& text, Deadline deadline);
  // When the first line of `id` containing `text` was read; NotFound if there is none yet.
  StatusOr<SteadyClock::time_point> LineTime(int id, const std::string& text) const;
  // When the harness saw `id` exit; NotFound while it runs.
  StatusOr<SteadyClock::time_point> ExitTime(int id) const;

  // Stops everything still running (SIGTERM, SIGKILL after 5 s).
  void StopAll();

 private:
  void PollOnce(Deadline deadline);

  tools::ProcessGroup group_;
  std::map<int, Process> processes_;
  std::map<int, tools::ChildExit> exits_;
  std::map<int, SteadyClock::time_point> exit_times_;
};

// A job of two workers on a fleet of its own: a coordinator (with `coordinator_flags`),
// `num_servers` servers and worker r in `mode` with `worker_flags[r]` (after its mode,
// coordinator, fleet size and rank). The first process that does not start is the error.
struct TwoWorkerJob {
  int coordinator = -1;
  std::string address;  // the coordinator's HOST:PORT
  std::vector<int> servers;
  std::vector<int> workers;
};
StatusOr<TwoWorkerJob> StartTwoWorkerJob(FleetHarness& harness, const std::string& mode,
                                         int num_servers,
                                         const std::vector<std::string>& coordinator_flags,
                                         const std::vector<std::vector<std::string>>& worker_flags);

// The whole content of the file at `path` ("" when it cannot be read).
std::string ReadWholeFile(const std::string& path);

// `name` under the test's scratch directory ($TEST_TMPDIR, else /tmp).
std::string TempPath(const std::string& name);

// `a` followed by `b` (argument lists).
std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_FLEET_HARNESS_H_
