#include "server/ps/forward_chain.h"

namespace tessera::server {

std::pair<std::string, std::string> SplitChain(const std::string& chain) {
  const size_t comma = chain.find(',');
  if (comma == std::string::npos) return {chain, std::string()};
  return {chain.substr(0, comma), chain.substr(comma + 1)};
}

std::string ChainWith(const std::string& chain, const std::string& joined) {
  if (joined.empty()) return chain;
  if (chain.empty()) return joined;
  std::string rest = chain;
  while (!rest.empty()) {
    auto [first, after] = SplitChain(rest);
    if (first == joined) return chain;
    rest = std::move(after);
  }
  return chain + "," + joined;
}

}  // namespace tessera::server
