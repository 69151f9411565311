#include "common/config/slurm.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "common/base/quote.h"

namespace tessera {
namespace {

// More would be a mistake, not a cluster.
constexpr size_t kMaxHosts = 1 << 20;
// The host names' bytes together: a million hosts of long names would take gigabytes
// (environment_fuzzer ran out of memory on one).
constexpr size_t kMaxNameBytes = size_t{16} << 20;

Status HostlistError(std::string_view hostlist, size_t offset, const std::string& what) {
  return InvalidArgumentError("hostlist " + Quote(hostlist) + " at offset " +
                              std::to_string(offset) + ": " + what);
}

Status TooLong(std::string_view hostlist, size_t offset) {
  return HostlistError(hostlist, offset, "the host names take more than " +
                                             std::to_string(kMaxNameBytes >> 20) + " MiB");
}

// The bytes of `names`.
size_t Bytes(const std::vector<std::string>& names) {
  size_t bytes = 0;
  for (const std::string& name : names) bytes += name.size();
  return bytes;
}

// Expands one bracket group's body ("1-3,07") starting at `offset` in `hostlist`, into
// numbers of at most `budget` bytes together.
StatusOr<std::vector<std::string>> ExpandRanges(std::string_view hostlist, size_t offset,
                                                std::string_view body, size_t budget) {
  std::vector<std::string> out;
  size_t bytes = 0;  // of `out`'s numbers
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string_view::npos) comma = body.size();
    std::string_view range = body.substr(start, comma - start);
    const size_t at = offset + start;
    const size_t dash = range.find('-');
    std::string_view low = range.substr(0, dash);
    std::string_view high = dash == std::string_view::npos ? low : range.substr(dash + 1);
    uint64_t lo = 0, hi = 0;
    auto number = [&](std::string_view text, uint64_t* value) {
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
      return !text.empty() && error == std::errc() && end == text.data() + text.size();
    };
    if (!number(low, &lo) || !number(high, &hi)) {
      return HostlistError(hostlist, at, "expected N or N-M in brackets, got " + Quote(range));
    }
    if (hi < lo) {
      return HostlistError(hostlist, at, "the range " + Quote(range) + " runs backwards");
    }
    if (hi - lo >= kMaxHosts || out.size() + (hi - lo) >= kMaxHosts) {
      return HostlistError(hostlist, at, "more than " + std::to_string(kMaxHosts) + " hosts");
    }
    // Zero-padded to the width of `low`: a million numbers padded to a few thousand digits
    // would take gigabytes.
    const size_t width = std::max(low.size(), std::to_string(hi).size());
    if (bytes + (hi - lo + 1) * width > budget) return TooLong(hostlist, at);
    bytes += (hi - lo + 1) * width;
    // Not `i <= hi`: for hi = 2^64 - 1 that never ends (slurm_hostlist_fuzzer found it).
    for (uint64_t i = lo;; ++i) {
      std::string text = std::to_string(i);
      if (text.size() < low.size()) text.insert(0, low.size() - text.size(), '0');
      out.push_back(std::move(text));
      if (i == hi) break;
    }
    start = comma + 1;
  }
  return out;
}

// Expands one top-level item ("r[1-2]-n[01-02]") starting at `offset`, into names of at most
// `budget` bytes together.
StatusOr<std::vector<std::string>> ExpandItem(std::string_view hostlist, size_t offset,
                                              std::string_view item, size_t budget) {
  std::vector<std::string> names = {""};
  size_t i = 0;
  while (i < item.size()) {
    const size_t open = item.find('[', i);
    const size_t stray = item.find(']', i);
    if (stray != std::string_view::npos && (open == std::string_view::npos || stray < open)) {
      return HostlistError(hostlist, offset + stray, "']' without '['");
    }
    std::string_view literal = item.substr(i, open == std::string_view::npos ? open : open - i);
    if (Bytes(names) + names.size() * literal.size() > budget) return TooLong(hostlist, offset + i);
    for (std::string& name : names) name += literal;
    if (open == std::string_view::npos) break;
    const size_t close = item.find(']', open);
    if (close == std::string_view::npos) {
      return HostlistError(hostlist, offset + open, "'[' without ']'");
    }
    if (item.find('[', open + 1) < close) {
      return HostlistError(hostlist, offset + open, "nested '['");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                     ExpandRanges(hostlist, offset + open + 1,
                                  item.substr(open + 1, close - open - 1), budget));
    if (names.size() * numbers.size() > kMaxHosts) {
      return HostlistError(hostlist, offset + open, "more than " + std::to_string(kMaxHosts) +
                                                        " hosts");
    }
    if (Bytes(names) * numbers.size() + Bytes(numbers) * names.size() > budget) {
      return TooLong(hostlist, offset + open);
    }
    std::vector<std::string> product;
    for (const std::string& name : names) {
      for (const std::string& number : numbers) product.push_back(name + number);
    }
    names = std::move(product);
    i = close + 1;
  }
  return names;
}

StatusOr<int> ReadInt(const Environment& env, const char* name, int min) {
  const std::string& text = env.at(name);
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < min) {
    return InvalidArgumentError(std::string(name) + "=" + Quote(text) + ": not an integer >= " +
                                std::to_string(min));
  }
  return value;
}

const std::string* Find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist) {
  std::vector<std::string> hosts;
  size_t bytes = 0;  // of `hosts`' names
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    // A comma inside brackets separates ranges; the end of the list ends the last item, whose
    // own parse reports a bracket left open.
    if (i < hostlist.size() && (c != ',' || depth > 0)) continue;
    std::string_view item = hostlist.substr(start, i - start);
    if (item.empty()) return HostlistError(hostlist, start, "an empty host name");
    ASSIGN_OR_RETURN(std::vector<std::string> names,
                     ExpandItem(hostlist, start, item, kMaxNameBytes - bytes));
    bytes += Bytes(names);
    if (hosts.size() + names.size() > kMaxHosts) {
      return HostlistError(hostlist, start, "more than " + std::to_string(kMaxHosts) + " hosts");
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
    start = i + 1;
  }
  return hosts;
}

int SlurmJobPort(int64_t job_id) { return 20000 + static_cast<int>(job_id % 10000); }

StatusOr<std::optional<SlurmJob>> ReadSlurmJob(const Environment& env) {
  const std::string* job_id = Find(env, "SLURM_JOB_ID");
  if (job_id == nullptr) return std::optional<SlurmJob>();
  SlurmJob job;
  ASSIGN_OR_RETURN(int id, ReadInt(env, "SLURM_JOB_ID", 0));
  job.job_id = id;
  const char* list_name = Find(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                          : Find(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                            : nullptr;
  if (list_name == nullptr) {
    return InvalidArgumentError("SLURM_JOB_ID=" + *job_id +
                                " is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST");
  }
  StatusOr<std::vector<std::string>> nodes = ExpandHostlist(env.at(list_name));
  if (!nodes.ok()) return nodes.status().WithContext(list_name);
  job.nodes = std::move(nodes).value();
  if (Find(env, "SLURM_NODEID")) {
    ASSIGN_OR_RETURN(job.node_id, ReadInt(env, "SLURM_NODEID", 0));
  }
  if (job.node_id >= static_cast<int>(job.nodes.size())) {
    return InvalidArgumentError("SLURM_NODEID=" + std::to_string(job.node_id) + " is not below " +
                                std::to_string(job.nodes.size()) + ", the nodes of " + list_name);
  }
  for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    if (Find(env, name) && !job.num_tasks) {
      ASSIGN_OR_RETURN(int n, ReadInt(env, name, 1));
      job.num_tasks = n;
    }
  }
  if (Find(env, "SLURM_PROCID")) {
    ASSIGN_OR_RETURN(int n, ReadInt(env, "SLURM_PROCID", 0));
    job.proc_id = n;
  }
  if (Find(env, "SLURM_LOCALID")) {
    ASSIGN_OR_RETURN(int n, ReadInt(env, "SLURM_LOCALID", 0));
    job.local_id = n;
  }
  job.in_step = Find(env, "SLURM_STEP_ID") != nullptr;
  return std::optional<SlurmJob>(std::move(job));
}

StatusOr<std::string> RunCommand(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& arg : argv) command += Quote(arg) + " ";
  command += "2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return UnavailableError("cannot run " + argv.at(0) + ": " + std::strerror(errno));
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return UnavailableError(argv.at(0) + " exited with status " +
                            std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  return output;
}

StatusOr<std::string> ResolveSlurmNode(const std::string& node, const CommandRunner& scontrol) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(node.c_str(), nullptr, &hints, &found);
  if (error == 0) {
    char text[64] = "";
    getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
    freeaddrinfo(found);
    return std::string(text);
  }
  const std::string resolution = std::string("resolving ") + Quote(node) + ": " + gai_strerror(error);
  StatusOr<std::string> shown = scontrol({"scontrol", "show", "node", node});
  if (!shown.ok()) {
    return UnavailableError("cannot find the address of Slurm node " + Quote(node) + ": " +
                            resolution + "; `scontrol show node " + node +
                            "`: " + shown.status().message());
  }
  const size_t at = shown->find("NodeAddr=");
  if (at == std::string::npos) {
    return UnavailableError("cannot find the address of Slurm node " + Quote(node) + ": " +
                            resolution + "; `scontrol show node " + node +
                            "` printed no NodeAddr=");
  }
  const size_t begin = at + std::strlen("NodeAddr=");
  const size_t end = shown->find_first_of(" \t\n", begin);
  return shown->substr(begin, end == std::string::npos ? end : end - begin);
}

}  // namespace tessera
