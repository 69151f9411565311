#include "tests/fleet_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/security/credentials.h"
#include "common/security/job_key.h"

namespace tessera::testing {

std::string BinaryPath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string root = srcdir ? srcdir : ".";
  return root + "/" + (workspace ? workspace : "tessera") + "/" + workspace_relative;
}

std::string_view Sanitizer() {
  const char* sanitizer = std::getenv("TESSERA_SANITIZER");
  return sanitizer != nullptr ? sanitizer : "";
}

bool UnderSanitizer() { return !Sanitizer().empty(); }

StatusOr<HttpResult> HttpGet(const std::string& url, int64_t timeout_ms) {
  constexpr std::string_view kPrefix = "http://";
  const size_t colon = url.find(':', kPrefix.size());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  const std::string host = colon == std::string::npos ? "" : url.substr(kPrefix.size(), colon - kPrefix.size());
  if (url.compare(0, kPrefix.size(), kPrefix) != 0 ||
      inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgumentError("HttpGet supports only http://IPV4:PORT/...: " + url);
  }
  size_t slash = url.find('/', colon);
  int port = std::stoi(url.substr(colon + 1, slash - colon - 1));
  std::string path = slash == std::string::npos ? "/" : url.substr(slash);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return InternalError("socket failed");
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return UnavailableError("cannot connect to " + url);
  }
  std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return UnavailableError("cannot send request to " + url);
  }
  std::string response;
  Deadline deadline = Deadline::AfterMillis(timeout_ms);
  char buffer[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(deadline.RemainingMillis()));
    if (ready <= 0) {
      close(fd);
      return DeadlineExceededError("no complete response from " + url + " within " +
                                   std::to_string(timeout_ms) + " ms");
    }
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  HttpResult result;
  if (response.size() < 12) return DataLossError("short HTTP response from " + url);
  result.status = std::atoi(response.substr(9, 3).c_str());
  size_t body = response.find("\r\n\r\n");
  if (body != std::string::npos) result.body = response.substr(body + 4);
  return result;
}

StatusOr<std::pair<int, std::string>> RunWithInput(const std::string& command,
                                                   const std::string& input) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = tmp ? tmp : "/tmp";
  static int counter = 0;
  std::string in_path = dir + "/input_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  {
    std::ofstream out(in_path, std::ios::binary);
    out << input;
  }
  std::string full = command + " < " + in_path + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return InternalError("cannot run: " + command);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = pclose(pipe);
  std::remove(in_path.c_str());
  return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
}

StatusOr<int> FleetHarness::Start(const std::string& label, const std::string& binary,
                                  const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BinaryPath(binary)};
  argv.insert(argv.end(), args.begin(), args.end());
  return StartCommand(label, argv);
}

const std::string& TestJobKeyFile() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string file = std::string(tmp ? tmp : "/tmp") + "/job-" + std::to_string(getpid()) +
                       ".key";
    std::remove(file.c_str());
    Status written = WriteKeyFile(file, JobKey::Generate());
    if (!written.ok()) {
      std::fprintf(stderr, "cannot write the test's job key: %s\n", written.message().c_str());
      std::abort();
    }
    setenv(kAuthKeyFileVariable, file.c_str(), 1);
    return file;
  }();
  return path;
}

StatusOr<int> FleetHarness::StartCommand(const std::string& label,
                                         const std::vector<std::string>& argv) {
  TestJobKeyFile();  // every child inherits TESSERA_AUTH_KEY_FILE
  ASSIGN_OR_RETURN(int id, group_.Spawn(label, argv));
  processes_[id].label = label;
  return id;
}

StatusOr<std::string> FleetHarness::StartCoordinator(const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(int id, Start("coordinator", "coordinator/tessera-coordinator", args));
  RETURN_IF_ERROR(WaitReady(id, Deadline::AfterMillis(30000)));
  const std::string& address = processes_[id].address;  // tcp://127.0.0.1:PORT
  return address.substr(std::string("tcp://").size());
}

void FleetHarness::PollOnce(Deadline deadline) {
  for (const tools::ChildEvent& event : group_.Poll(deadline)) {
    Process& process = processes_[event.child];
    const SteadyClock::time_point now = SteadyClock::now();
    if (event.kind == tools::ChildEvent::Kind::kExit) {
      exits_[event.child] = event.exit;
      exit_times_[event.child] = now;
      continue;
    }
    process.lines.push_back(event.line);
    process.line_times.push_back(now);
    if (event.line.rfind("TESSERA_READY ", 0) == 0) {
      std::istringstream fields(event.line);
      std::string field;
      while (fields >> field) {
        size_t eq = field.find('=');
        if (eq == std::string::npos) continue;
        std::string key = field.substr(0, eq), value = field.substr(eq + 1);
        if (key == "address") process.address = value;
        if (key == "metrics") process.metrics_url = value;
        if (key == "rank") process.rank = std::atoi(value.c_str());
        if (key == "pid") process.pid = std::atoll(value.c_str());
      }
      process.ready = true;
    }
  }
}

Status FleetHarness::WaitReady(int id, Deadline deadline) {
  while (!processes_[id].ready) {
    if (exits_.count(id)) {
      return FailedPreconditionError(processes_[id].label + " " + exits_[id].Describe() +
                                     " before it was ready; output:\n" + Output(id));
    }
    if (deadline.Expired()) {
      return DeadlineExceededError(processes_[id].label + " was not ready in time; output:\n" +
                                   Output(id));
    }
    PollOnce(Deadline::AfterMillis(std::min<int64_t>(100, deadline.RemainingMillis() + 1)));
  }
  return OkStatus();
}

Status FleetHarness::RunToSuccess(const std::string& label, const std::string& binary,
                                  const std::vector<std::string>& args, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(int id, Start(label, binary, args));
  ASSIGN_OR_RETURN(tools::ChildExit exit, WaitExit(id, Deadline::AfterMillis(timeout_ms)));
  if (exit.success()) return OkStatus();
  return InternalError(label + ": " + exit.Describe() + "\n" + Output(id));
}

StatusOr<tools::ChildExit> FleetHarness::WaitExit(int id, Deadline deadline) {
  while (!exits_.count(id)) {
    if (deadline.Expired()) {
      return DeadlineExceededError(processes_[id].label + " did not exit in time; output:\n" +
                                   Output(id));
    }
    PollOnce(Deadline::AfterMillis(std::min<int64_t>(100, deadline.RemainingMillis() + 1)));
  }
  return exits_[id];
}

Status FleetHarness::WaitForLine(int id, const std::string& text, Deadline deadline) {
  size_t checked = 0;
  while (true) {
    const std::vector<std::string>& lines = processes_[id].lines;
    for (; checked < lines.size(); ++checked) {
      if (lines[checked].find(text) != std::string::npos) return OkStatus();
    }
    if (exits_.count(id)) {
      return FailedPreconditionError(processes_[id].label + " " + exits_[id].Describe() +
                                     " without printing '" + text + "'; output:\n" + Output(id));
    }
    if (deadline.Expired()) {
      return DeadlineExceededError(processes_[id].label + " did not print '" + text +
                                   "' in time; output:\n" + Output(id));
    }
    PollOnce(Deadline::AfterMillis(std::min<int64_t>(100, deadline.RemainingMillis() + 1)));
  }
}

StatusOr<SteadyClock::time_point> FleetHarness::LineTime(int id, const std::string& text) const {
  auto it = processes_.find(id);
  if (it != processes_.end()) {
    const Process& process = it->second;
    for (size_t i = 0; i < process.lines.size(); ++i) {
      if (process.lines[i].find(text) != std::string::npos) return process.line_times[i];
    }
  }
  return NotFoundError("no line containing '" + text + "' from process " + std::to_string(id));
}

StatusOr<SteadyClock::time_point> FleetHarness::ExitTime(int id) const {
  auto it = exit_times_.find(id);
  if (it == exit_times_.end()) {
    return NotFoundError("process " + std::to_string(id) + " has not exited");
  }
  return it->second;
}

std::string FleetHarness::Output(int id) const {
  std::string out;
  auto it = processes_.find(id);
  if (it == processes_.end()) return out;
  for (const std::string& line : it->second.lines) out += line + "\n";
  return out;
}

void FleetHarness::StopAll() {
  group_.StopAll(std::chrono::seconds(5), [this](const tools::ChildEvent& event) {
    if (event.kind == tools::ChildEvent::Kind::kLine) {
      processes_[event.child].lines.push_back(event.line);
      processes_[event.child].line_times.push_back(SteadyClock::now());
    } else {
      exits_[event.child] = event.exit;
      exit_times_[event.child] = SteadyClock::now();
    }
  });
}

StatusOr<TwoWorkerJob> StartTwoWorkerJob(FleetHarness& harness, const std::string& mode,
                                         int num_servers,
                                         const std::vector<std::string>& coordinator_flags,
                                         const std::vector<std::vector<std::string>>& worker_flags) {
  TwoWorkerJob job;
  const std::string n = std::to_string(num_servers);
  ASSIGN_OR_RETURN(job.coordinator,
                   harness.Start("coordinator", "coordinator/tessera-coordinator",
                                 Concat({"--num-servers", n, "--num-workers", "2"},
                                        coordinator_flags)));
  RETURN_IF_ERROR(harness.WaitReady(job.coordinator, Deadline::AfterMillis(30000)));
  job.address = harness.process(job.coordinator).address.substr(std::string("tcp://").size());
  for (int s = 0; s < num_servers; ++s) {
    ASSIGN_OR_RETURN(int id, harness.Start("server " + std::to_string(s),
                                           "server/ps/tessera-server",
                                           {"--coordinator", job.address, "--num-servers", n,
                                            "--num-workers", "2", "--rank", std::to_string(s)}));
    job.servers.push_back(id);
  }
  for (int r = 0; r < 2; ++r) {
    ASSIGN_OR_RETURN(
        int id, harness.Start("worker " + std::to_string(r), "worker/tessera-worker",
                              Concat({"--mode", mode, "--coordinator", job.address,
                                      "--num-servers", n, "--num-workers", "2", "--rank",
                                      std::to_string(r)},
                                     worker_flags[r])));
    job.workers.push_back(id);
  }
  return job;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace tessera::testing
