#include "server/ps/request_ledger.h"

#include <utility>

namespace tessera::server {

RequestLedger::Seen RequestLedger::Take(int rank, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uint64_t, Entry>& seen = seen_[rank];
  auto [it, inserted] = seen.try_emplace(request_id);
  if (!inserted) return it->second.answered ? kAnswered : kTaken;
  if (seen.size() > kWindow) seen.erase(seen.begin());
  return kNew;
}

void RequestLedger::Answered(int rank, uint64_t request_id, std::optional<MessageBody> reply) {
  std::lock_guard<std::mutex> lock(mu_);
  auto worker = seen_.find(rank);
  if (worker == seen_.end()) return;
  auto it = worker->second.find(request_id);
  if (it == worker->second.end()) return;  // forgotten (older than the window)
  it->second.answered = true;
  it->second.reply = std::move(reply);
}

std::optional<MessageBody> RequestLedger::ReplyOf(int rank, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto worker = seen_.find(rank);
  if (worker == seen_.end()) return std::nullopt;
  auto it = worker->second.find(request_id);
  if (it == worker->second.end()) return std::nullopt;
  return it->second.reply;
}

}  // namespace tessera::server
