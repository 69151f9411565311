#include "common/base/host_port.h"

#include <unistd.h>

#include <cctype>

#include "common/base/quote.h"

namespace tessera {

std::string_view Unbracketed(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsLoopbackHost(std::string_view host) {
  host = Unbracketed(host);
  std::string lower;
  for (char c : host) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "localhost" || lower == "localhost.") return true;
  if (lower == "::1" || lower == "0:0:0:0:0:0:0:1") return true;
  std::string_view v4 = lower;
  if (v4.rfind("::ffff:", 0) == 0) v4.remove_prefix(7);  // IPv4-mapped IPv6
  // Dotted quad 127.a.b.c, each part 1-3 decimal digits <= 255.
  int parts = 0;
  int first = -1;
  size_t start = 0;
  while (true) {
    size_t dot = v4.find('.', start);
    std::string_view part = v4.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (part.empty() || part.size() > 3) return false;
    int value = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + (c - '0');
    }
    if (value > 255) return false;
    if (parts == 0) first = value;
    ++parts;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts == 4 && first == 127;
}

bool IsUnspecifiedHost(std::string_view host) {
  host = Unbracketed(host);
  return host == "0.0.0.0" || host == "::" || host == "0:0:0:0:0:0:0:0" || host == "*";
}

StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view text) {
  auto fail = [text](std::string_view why) {
    return InvalidArgumentError(Quote(text) + " is not HOST:PORT: " + std::string(why));
  };
  if (text.empty()) return fail("empty");
  if (text.find("://") != std::string_view::npos) {
    return fail("give HOST:PORT without a scheme such as tcp://");
  }
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) return fail("contains whitespace");
  }
  std::string_view host;
  std::string_view port_text;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return fail("missing ']' after the IPv6 address");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (rest.empty()) return fail("missing :PORT");
    if (rest.front() != ':') return fail("expected ':' after ']'");
    port_text = rest.substr(1);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return fail("missing :PORT");
    if (text.find(':') != colon) return fail("an IPv6 address needs brackets, e.g. [::1]:5555");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) return fail("empty host");
  // Brackets only enclose an IPv6 address; one inside a host ("[[::1]]:5", "a]:5") is a typo
  // that would otherwise become part of the name (found by host_port_fuzzer).
  if (host.find_first_of("[]") != std::string_view::npos) {
    return fail("stray '[' or ']' in the host");
  }
  if (port_text.empty()) return fail("missing port after ':'");
  for (char c : port_text) {
    if (c < '0' || c > '9') return fail("port " + Quote(port_text) + " is not a number");
  }
  const std::string out_of_range = "port " + std::string(port_text) + " is out of range 0..65535";
  if (port_text.size() > 5) return fail(out_of_range);
  int port = 0;
  for (char c : port_text) port = port * 10 + (c - '0');
  if (port > 65535) return fail(out_of_range);
  return std::make_pair(std::string(host), port);
}

std::string JoinHostPort(std::string_view host, int port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out = "[" + std::string(host) + "]";
  } else {
    out = std::string(host);
  }
  return out + ":" + std::to_string(port);
}

std::string LocalHostName() {
  char name[256] = {0};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

}  // namespace tessera
