#include "server/ps/request_ledger.h"

namespace tessera::server {

bool RequestLedger::FirstTime(int rank, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<uint64_t>& seen = seen_[rank];
  if (!seen.insert(request_id).second) return false;
  if (seen.size() > kWindow) seen.erase(seen.begin());
  return true;
}

}  // namespace tessera::server
