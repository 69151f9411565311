// HOST:PORT strings and loopback detection, for addresses given by users.
#ifndef TESSERA_COMMON_BASE_HOST_PORT_H_
#define TESSERA_COMMON_BASE_HOST_PORT_H_

#include <string>
#include <string_view>
#include <utility>

#include "common/base/status.h"

namespace tessera {

// `host` without the brackets of an IPv6 literal ("[::1]" -> "::1"); anything else unchanged.
std::string_view Unbracketed(std::string_view host);

// True for addresses only this host can reach: localhost, 127.0.0.0/8, ::1 (bracketed or not).
// Used to warn when a listening socket is reachable from the network.
bool IsLoopbackHost(std::string_view host);

// 0.0.0.0, :: (bracketed or not) and "*": hosts that mean "every interface" when bound and
// that nobody can connect to.
bool IsUnspecifiedHost(std::string_view host);

// "host:port" or "[ipv6]:port" -> {host without brackets, port}; port must be 0..65535.
// Errors quote the text and say what is wrong (missing port, non-numeric port, IPv6 without
// brackets, a URL scheme, ...).
StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view text);

// The inverse: brackets `host` when it contains ':' (IPv6).
std::string JoinHostPort(std::string_view host, int port);

// This machine's name (gethostname), or "" when it cannot be had.
std::string LocalHostName();

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_HOST_PORT_H_
