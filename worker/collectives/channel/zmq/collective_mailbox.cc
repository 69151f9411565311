#include "worker/collectives/channel/zmq/collective_mailbox.h"

#include <string>

#include "common/base/logging.h"
#include "common/wire/wire_codec.h"

namespace tessera::worker {

ReceivedChunk ToReceivedChunk(const Envelope& envelope) {
  const proto::CollectiveChunk& body = *envelope.header->body_as_CollectiveChunk();
  ReceivedChunk chunk;
  chunk.sender_role = envelope.header->sender_role();
  chunk.sender_rank = envelope.header->sender_rank();
  chunk.tag = body.tag();
  chunk.op = body.op();
  chunk.reduce_op = body.reduce_op();
  chunk.step = body.step();
  chunk.chunk = body.chunk();
  chunk.dtype = body.dtype();
  chunk.element_offset = body.element_offset();
  chunk.element_count = body.element_count();
  chunk.fingerprint = body.fingerprint();
  // The transport verified that data's slice lies inside its frame; no bytes (payload -1)
  // leaves `data` empty, which the collective reports as a size mismatch naming the sender.
  const proto::TensorMeta* data = body.data();
  if (data != nullptr && data->payload() >= 0) {
    const Payload& frame = envelope.message.payloads[static_cast<size_t>(data->payload())];
    chunk.data = Payload::Borrow(frame.data() + data->offset(), data->byte_length(), frame.owner());
  }
  return chunk;
}

MessageHandler CollectiveMailbox::Handler(std::shared_ptr<CollectiveMailbox> mailbox) {
  return [mailbox](Envelope envelope) { mailbox->Deliver(ToReceivedChunk(envelope)); };
}

void CollectiveMailbox::Deliver(ReceivedChunk chunk) {
  Status overflow;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return;  // every Pop fails with the root cause anyway
    if (queued_ >= max_queued_chunks_) {
      overflow = UnavailableError(
          "collective mailbox full (" + std::to_string(max_queued_chunks_) +
          " chunks waiting) when " + std::string(RoleLabel(chunk.sender_role)) + " " +
          std::to_string(chunk.sender_rank) + " sent tag=" + std::to_string(chunk.tag) +
          " step " + std::to_string(chunk.step) + ": chunks arrive for no running collective");
    } else {
      chunks_[{chunk.tag, chunk.step}].push_back(std::move(chunk));
      ++queued_;
    }
  }
  if (!overflow.ok()) {
    TLOG(ERROR) << overflow.message();
    Fail(overflow);
    return;
  }
  arrived_.notify_all();
}

StatusOr<ReceivedChunk> CollectiveMailbox::Pop(uint64_t tag, uint32_t step, Deadline deadline) {
  const std::pair<uint64_t, uint32_t> key{tag, step};
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!failure_.ok()) return failure_;
    auto it = chunks_.find(key);
    if (it != chunks_.end()) {
      ReceivedChunk chunk = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) chunks_.erase(it);
      --queued_;
      return chunk;
    }
    if (arrived_.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
        chunks_.count(key) == 0 && failure_.ok()) {
      return DeadlineExceededError("deadline passed");
    }
  }
}

void CollectiveMailbox::Fail(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return;
    failure_ = status.ok() ? InternalError("CollectiveMailbox::Fail called with OK") : status;
    chunks_.clear();
    queued_ = 0;
  }
  arrived_.notify_all();
}

Status CollectiveMailbox::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void CollectiveMailbox::Discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = chunks_.lower_bound({tag, 0}); it != chunks_.end() && it->first.first == tag;) {
    queued_ -= it->second.size();
    it = chunks_.erase(it);
  }
}

size_t CollectiveMailbox::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

}  // namespace tessera::worker
