// Forward chains: the copies of a key range an update goes along after the one that applied it
// (ps-async and ps-ssp forward every push; --replicas 3 or more forwards along a chain, see
// dense_shard.h), written as their addresses in order, comma-separated: "b1,b2".
#ifndef TESSERA_SERVER_PS_FORWARD_CHAIN_H_
#define TESSERA_SERVER_PS_FORWARD_CHAIN_H_

#include <string>
#include <utility>

namespace tessera::server {

// "a,b,c" -> {"a", "b,c"}; "a" -> {"a", ""}.
std::pair<std::string, std::string> SplitChain(const std::string& chain);

// `chain` with `joined` (a server that joined in a failed one's place and took a copy, or
// empty) last, unless it is in it already: a push sent before the copy names the range's
// other copies only, and every update after the copy must reach the joined server too.
std::string ChainWith(const std::string& chain, const std::string& joined);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_FORWARD_CHAIN_H_
