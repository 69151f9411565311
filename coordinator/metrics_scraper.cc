#include "coordinator/metrics_scraper.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/base/host_port.h"
#include "common/base/quote.h"

namespace tessera::coordinator {
namespace {

constexpr std::string_view kHttpScheme = "http://";

// Closes the socket when the request ends, whichever way.
class SocketCloser {
 public:
  explicit SocketCloser(int fd) : fd_(fd) {}
  ~SocketCloser() {
    if (fd_ >= 0) close(fd_);
  }
  SocketCloser(const SocketCloser&) = delete;
  SocketCloser& operator=(const SocketCloser&) = delete;

 private:
  int fd_;
};

// Waits until `fd` is ready for `events`: OK, DeadlineExceeded, or Unavailable on a poll error.
Status WaitFor(int fd, short events, Deadline deadline, const std::string& what) {
  while (true) {
    int64_t left = deadline.RemainingMillis();
    if (left <= 0) return DeadlineExceededError(what);
    pollfd p{fd, events, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready > 0) return OkStatus();
    if (ready < 0 && errno != EINTR) {
      return UnavailableError(what + ": poll: " + std::strerror(errno));
    }
  }
}

// Connects a non-blocking socket to the first address of `host`:`port` that accepts.
StatusOr<int> Connect(const std::string& host, int port, Deadline deadline,
                      const std::string& context) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  std::string service = std::to_string(port);
  int resolved = getaddrinfo(host.c_str(), service.c_str(), &hints, &addresses);
  if (resolved != 0) {
    return UnavailableError(context + ": cannot resolve " + Quote(host) + ": " +
                            gai_strerror(resolved));
  }
  std::string last_error = "no address";
  for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
    int fd = socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    address->ai_protocol);
    if (fd < 0) {
      last_error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int rc = connect(fd, address->ai_addr, address->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      Status writable = WaitFor(fd, POLLOUT, deadline, context + ": connect timed out");
      if (!writable.ok()) {
        close(fd);
        freeaddrinfo(addresses);
        return writable;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      rc = error == 0 ? 0 : -1;
      errno = error;
    }
    if (rc == 0) {
      freeaddrinfo(addresses);
      return fd;
    }
    last_error = std::string("connect: ") + std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(addresses);
  return UnavailableError(context + ": " + last_error);
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// Reads one sample line; an error message (without the line number) when it is malformed.
StatusOr<MetricSample> ParseSampleLine(std::string_view line) {
  MetricSample sample;
  size_t i = 0;
  auto skip_blanks = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  auto read_name = [&](std::string* name) {
    size_t start = i;
    if (i < line.size() && IsNameStart(line[i])) {
      ++i;
      while (i < line.size() && IsNameChar(line[i])) ++i;
    }
    *name = std::string(line.substr(start, i - start));
    return !name->empty();
  };
  if (!read_name(&sample.name)) return DataLossError("expected a metric name");
  skip_blanks();
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      skip_blanks();
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      std::string label;
      if (!read_name(&label)) return DataLossError("expected a label name or '}'");
      skip_blanks();
      if (i >= line.size() || line[i] != '=') return DataLossError("expected '=' after " + label);
      ++i;
      skip_blanks();
      if (i >= line.size() || line[i] != '"') return DataLossError("expected '\"' after " + label + "=");
      ++i;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && i < line.size()) {
          char escaped = line[i++];
          value += escaped == 'n' ? '\n' : escaped;  // \\ and \" stand for themselves
        } else {
          value += c;
        }
      }
      if (!closed) return DataLossError("unterminated value of label " + label);
      sample.labels[label] = std::move(value);
      skip_blanks();
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  skip_blanks();
  size_t start = i;
  while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
  std::string value(line.substr(start, i - start));
  if (value.empty()) return DataLossError("expected a value");
  char* end = nullptr;
  sample.value = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size()) return DataLossError("bad value " + Quote(value));
  skip_blanks();
  start = i;  // an optional timestamp (integer milliseconds), which the dashboard does not use
  while (i < line.size() && (std::isdigit(static_cast<unsigned char>(line[i])) || line[i] == '-')) ++i;
  skip_blanks();
  if (i != line.size()) return DataLossError("unexpected text after the value");
  return sample;
}

}  // namespace

StatusOr<HttpGetResult> HttpGet(std::string_view url, Deadline deadline,
                                size_t max_response_bytes) {
  const std::string context = "GET " + std::string(url);
  if (url.compare(0, kHttpScheme.size(), kHttpScheme) != 0) {
    return InvalidArgumentError(context + ": not an http://HOST:PORT/PATH URL");
  }
  std::string_view rest = url.substr(kHttpScheme.size());
  size_t slash = rest.find('/');
  std::string path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  StatusOr<std::pair<std::string, int>> host_port = ParseHostPort(rest.substr(0, slash));
  if (!host_port.ok()) return InvalidArgumentError(context + ": " + host_port.status().message());
  const auto& [host, port] = *host_port;
  if (port == 0) return InvalidArgumentError(context + ": port 0");

  ASSIGN_OR_RETURN(int fd, Connect(host, port, deadline, context));
  SocketCloser closer(fd);
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + JoinHostPort(host, port) +
                              "\r\nAccept: text/plain\r\nConnection: close\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, context + ": send timed out"));
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return UnavailableError(context + ": send: " + std::strerror(errno));
    sent += static_cast<size_t>(n);
  }

  // HTTP/1.0 with Connection: close: the response ends when the server closes, or after
  // Content-Length bytes of body when the server says so.
  std::string response;
  size_t body_start = std::string::npos;
  std::optional<size_t> content_length;
  char buffer[16384];
  while (true) {
    if (body_start != std::string::npos && content_length &&
        response.size() - body_start >= *content_length) {
      break;
    }
    RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline,
                            context + ": no complete response in time (" +
                                std::to_string(response.size()) + " bytes so far)"));
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return UnavailableError(context + ": recv: " + std::strerror(errno));
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
    if (response.size() > max_response_bytes) {
      return ResourceExhaustedError(context + ": response exceeds " +
                                    std::to_string(max_response_bytes) + " bytes");
    }
    if (body_start == std::string::npos) {
      size_t end_of_head = response.find("\r\n\r\n");
      if (end_of_head == std::string::npos) continue;
      body_start = end_of_head + 4;
      std::string head = Lower(std::string_view(response).substr(0, end_of_head));
      size_t at = head.find("\r\ncontent-length:");
      if (at != std::string::npos) {
        content_length = std::strtoull(head.c_str() + at + 17, nullptr, 10);
      }
      if (head.find("\r\ntransfer-encoding:") != std::string::npos) {
        return UnimplementedError(context + ": chunked or encoded responses are not supported");
      }
    }
  }
  HttpGetResult result;
  if (body_start == std::string::npos || response.compare(0, 5, "HTTP/") != 0) {
    return DataLossError(context + ": not an HTTP response: " +
                         Quote(response.substr(0, std::min<size_t>(response.size(), 80))));
  }
  size_t space = response.find(' ');
  if (space == std::string::npos || space + 4 > body_start) {
    return DataLossError(context + ": bad status line");
  }
  result.status = std::atoi(response.c_str() + space + 1);
  std::string head = Lower(std::string_view(response).substr(0, body_start - 2));
  size_t at = head.find("\r\ncontent-type:");
  if (at != std::string::npos) {
    size_t start = at + 15;
    size_t end = head.find("\r\n", start);
    result.content_type = response.substr(start, end - start);
    while (!result.content_type.empty() && result.content_type.front() == ' ') {
      result.content_type.erase(0, 1);
    }
  }
  result.body = response.substr(body_start);
  if (content_length && result.body.size() < *content_length) {
    return UnavailableError(context + ": connection closed after " +
                            std::to_string(result.body.size()) + " of " +
                            std::to_string(*content_length) + " body bytes");
  }
  if (content_length) result.body.resize(*content_length);
  return result;
}

StatusOr<std::vector<MetricSample>> ParseExpositionText(std::string_view text) {
  std::vector<MetricSample> samples;
  size_t line_number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    StatusOr<MetricSample> sample = ParseSampleLine(line.substr(first));
    if (!sample.ok()) {
      return DataLossError("metrics line " + std::to_string(line_number) + " " + Quote(line) +
                           ": " + sample.status().message());
    }
    samples.push_back(std::move(*sample));
  }
  return samples;
}

StatusOr<std::vector<MetricSample>> ScrapeMetrics(std::string_view url, Deadline deadline) {
  ASSIGN_OR_RETURN(HttpGetResult result, HttpGet(url, deadline));
  if (result.status != 200) {
    std::string body = result.body.substr(0, std::min<size_t>(result.body.size(), 200));
    return UnavailableError("GET " + std::string(url) + ": HTTP " +
                            std::to_string(result.status) + ": " + Quote(body));
  }
  StatusOr<std::vector<MetricSample>> samples = ParseExpositionText(result.body);
  if (!samples.ok()) return samples.status().WithContext("GET " + std::string(url));
  return samples;
}

std::optional<double> FindSample(const std::vector<MetricSample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels) {
  for (const MetricSample& sample : samples) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto it = sample.labels.find(key);
      if (it == sample.labels.end() || it->second != value) {
        match = false;
        break;
      }
    }
    if (match) return sample.value;
  }
  return std::nullopt;
}

}  // namespace tessera::coordinator
