#include "server/ps/replication_log.h"

#include "server/ps/forward_chain.h"

namespace tessera::server {

void ReplicationLogBase::AwaitCopies(int64_t update, const std::string& chain, Ack ack) {
  if (!chain.empty()) chain_ = chain;
  acks_.emplace_back(update, std::move(ack));
}

void ReplicationLogBase::TakeDue(int64_t version, std::vector<Ack>* due) {
  if (acks_.empty()) return;
  std::vector<std::pair<int64_t, Ack>> waiting;
  for (auto& [update, ack] : acks_) {
    // Applied here, and every update up to it at the copies after this one: a copy that
    // acknowledged holds every update the ones after it hold, so the next primary has them all.
    if (version >= update && AcknowledgedThrough(update)) {
      due->push_back(std::move(ack));
    } else {
      waiting.emplace_back(update, std::move(ack));
    }
  }
  acks_.swap(waiting);
}

std::string ReplicationLogBase::ChainOfParked(const std::string& forward_to) const {
  // The parked forwards go on numbered as applied here, so the copies after this one stay a
  // prefix of it.
  return ChainWith(forward_to.empty() ? chain_ : forward_to, joined_);
}

Status ReplicationLogBase::CheckPushedBy(const std::string& what, int pushed_by,
                                         int num_workers) {
  if (pushed_by < 0 || pushed_by >= num_workers) {
    return InvalidArgumentError(what + ": the job has workers 0 to " +
                                std::to_string(num_workers - 1));
  }
  return OkStatus();
}

void ReplicationLogBase::ClearAcknowledgements(std::vector<Ack>* acks) {
  unacknowledged_.clear();
  for (auto& [update, ack] : acks_) acks->push_back(std::move(ack));
  acks_.clear();
}

}  // namespace tessera::server
