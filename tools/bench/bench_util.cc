#include "tools/bench/bench_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/base/deadline.h"
#include "common/security/credentials.h"
#include "common/security/job_key.h"
#include "tools/process_group.h"

namespace tessera::tools {

StatusOr<ChildOutput> RunToCompletion(const std::string& label,
                                      const std::vector<std::string>& argv, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                   RunAllToCompletion({ChildSpec{label, argv}}, timeout_ms));
  return std::move(outputs[0]);
}

StatusOr<std::vector<ChildOutput>> RunAllToCompletion(const std::vector<ChildSpec>& children,
                                                      int64_t timeout_ms) {
  ProcessGroup group;
  std::vector<int> ids;
  for (const ChildSpec& child : children) {
    ASSIGN_OR_RETURN(int id, group.Spawn(child.label, child.argv));
    ids.push_back(id);
  }
  const Deadline deadline = Deadline::AfterMillis(timeout_ms);
  std::vector<ChildOutput> outputs(children.size());
  auto collect = [&outputs, &ids](const ChildEvent& event) {
    if (event.kind != ChildEvent::Kind::kLine) return;
    const size_t index = static_cast<size_t>(
        std::find(ids.begin(), ids.end(), event.child) - ids.begin());
    if (index >= outputs.size()) return;
    ChildOutput& output = outputs[index];
    (event.stream == ChildStream::kStdout ? output.stdout_lines : output.stderr_lines)
        .push_back(event.line);
  };
  auto failure = [&](size_t index, const std::string& how) {
    std::string tail;
    const std::vector<std::string>& lines = outputs[index].stderr_lines;
    const size_t n = lines.size();
    for (size_t i = n > 5 ? n - 5 : 0; i < n; ++i) tail += "\n  " + lines[i];
    return children[index].label + " " + how + (tail.empty() ? "" : ":" + tail);
  };
  while (group.RunningCount() > 0) {
    if (deadline.Expired()) {
      std::string running;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (group.Running(ids[i])) running += (running.empty() ? "" : ", ") + children[i].label;
      }
      group.StopAll(std::chrono::seconds(2), collect);
      return DeadlineExceededError(running + ": still running after " +
                                   std::to_string(timeout_ms / 1000) + " s; stopped");
    }
    std::vector<ChildEvent> events =
        group.Poll(Deadline::AfterMillis(std::min<int64_t>(1000, deadline.RemainingMillis())));
    for (const ChildEvent& event : events) collect(event);
    // The first child to fail ends the run: the others may be waiting for it.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (group.Running(ids[i]) || group.ExitOf(ids[i]).success()) continue;
      const std::string how = group.ExitOf(ids[i]).Describe();
      group.StopAll(std::chrono::seconds(2), collect);
      return UnavailableError(failure(i, how));
    }
  }
  return outputs;
}

StatusOr<nlohmann::json> LastJsonLine(const std::string& label, const ChildOutput& output) {
  for (auto line = output.stdout_lines.rbegin(); line != output.stdout_lines.rend(); ++line) {
    if (line->empty() || (*line)[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) return j;
  }
  return DataLossError(label + ": printed no JSON summary on stdout");
}

StatusOr<std::string> FindRunfile(const std::string& workspace_path) {
  std::vector<char> buffer(4096);
  ssize_t length = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) {
    return UnavailableError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  }
  const std::string self(buffer.data(), static_cast<size_t>(length));
  const std::string self_dir = self.substr(0, self.rfind('/'));
  std::vector<std::string> roots = {self + ".runfiles/tessera"};
  // Started by a test (which has our data in its runfiles) the binary has no runfiles of its
  // own, and /proc/self/exe names the target outside them: the test's are in the environment.
  for (const char* variable : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* dir = std::getenv(variable);
    if (dir != nullptr && *dir != '\0') roots.push_back(std::string(dir) + "/tessera");
  }
  roots.push_back(self_dir + "/..");
  std::string tried;
  for (const std::string& root : roots) {
    const std::string path = root + "/" + workspace_path;
    if (access(path.c_str(), R_OK) == 0) return path;
    tried += "\n  " + path;
  }
  return NotFoundError("cannot find " + workspace_path +
                       "; build with `bazel build //tools:tessera-bench`. Looked in:" + tried);
}


std::string JoinInts(const std::vector<int64_t>& values, const char* separator) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : separator) + std::to_string(v);
  return text;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return UnavailableError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return UnavailableError("binding a free port on 127.0.0.1: " + error);
  }
  close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

StatusOr<std::unique_ptr<ScratchDirectory>> ScratchDirectory::Create() {
  std::error_code error;
  std::filesystem::path base = std::filesystem::temp_directory_path(error);
  if (error) base = "/tmp";
  std::string pattern = (base / "tessera-bench-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return UnavailableError("mkdtemp " + pattern + ": " + std::strerror(errno));
  }
  return std::unique_ptr<ScratchDirectory>(new ScratchDirectory(pattern));
}

ScratchDirectory::~ScratchDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ReadyField(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 2;
  return line.substr(begin, line.find(' ', begin) - begin);
}

Status ShareNewJobKey(const std::string& directory) {
  const std::string path = directory + "/job.key";
  RETURN_IF_ERROR(WriteKeyFile(path, JobKey::Generate()));
  if (setenv(kAuthKeyFileVariable, path.c_str(), 1) != 0) {
    return InternalError(std::string("setenv ") + kAuthKeyFileVariable + ": " +
                         std::strerror(errno));
  }
  return OkStatus();
}

StatusOr<int64_t> ParsePositive(const std::string& item) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(item.c_str(), &end, 10);
  if (item.empty() || *end != '\0' || errno == ERANGE || value < 1 || value > (1 << 20)) {
    return InvalidArgumentError("\"" + item + "\" is not an integer in [1, 1048576]");
  }
  return static_cast<int64_t>(value);
}

StatusOr<size_t> ParseByteSize(const std::string& item) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(item.c_str(), &end, 10);
  const std::string unit(end);
  if (unit == "K" || unit == "KiB") value <<= 10;
  else if (unit == "M" || unit == "MiB") value <<= 20;
  else if (unit == "G" || unit == "GiB") value <<= 30;
  else if (!unit.empty()) value = 0;
  if (item.empty() || end == item.c_str() || errno == ERANGE || value < 4 || value % 4 != 0 ||
      value > (1ull << 30)) {
    return InvalidArgumentError("\"" + item + "\" is not a multiple of 4 bytes between 4 and 1G");
  }
  return static_cast<size_t>(value);
}

std::string JoinSizes(const std::vector<size_t>& sizes) {
  std::string text;
  for (size_t s : sizes) text += (text.empty() ? "" : ",") + std::to_string(s);
  return text;
}

std::string HumanBytes(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::vector<nlohmann::json> BenchLines(const std::vector<ChildOutput>& outputs,
                                       const std::string& bench) {
  std::vector<nlohmann::json> lines;
  for (const ChildOutput& output : outputs) {
    for (const std::string& line : output.stdout_lines) {
      const size_t start = line.find("{\"bench\"");
      if (start == std::string::npos) continue;
      nlohmann::json j = nlohmann::json::parse(line.substr(start), nullptr, false);
      if (j.is_object() && j.value("bench", "") == bench) lines.push_back(std::move(j));
    }
  }
  return lines;
}

}  // namespace tessera::tools
