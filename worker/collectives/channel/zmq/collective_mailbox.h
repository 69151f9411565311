// CollectiveMailbox: where CollectiveChunks wait between the transport and the collective that
// expects them.
//
//   auto mailbox = std::make_shared<CollectiveMailbox>();
//   endpoint.SetHandler(proto::Body::CollectiveChunk, CollectiveMailbox::Handler(mailbox));
//   client.SetFailureCallback([mailbox](const Status& s) { mailbox->Fail(s); });
//   StatusOr<ReceivedChunk> chunk = mailbox->Pop(tag, step, deadline);
//
// The transport's I/O thread delivers every chunk as it arrives (Deliver never blocks beyond a
// short mutex); a collective pops the one it needs by (tag, step), in whatever order they came.
// A chunk may arrive before its collective has started: it waits here.
//
// The mailbox is bounded (max_queued_chunks): a peer that floods it makes the mailbox fail with
// an error naming that peer, rather than growing without limit or dropping chunks silently.
// Fail(status) wakes every waiter with `status` (the root cause, e.g. the coordinator's notice
// that a worker died) and makes every later Pop fail with it too.
//
// Thread-safety: all methods are thread-safe.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/base/deadline.h"
#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/transport/transport.h"
#include "proto/wire_generated.h"

namespace tessera::worker {

// A received CollectiveChunk as plain values. `data` views the chunk's bytes inside the
// received frame (no copy); it may be unaligned for its dtype, so read it with memcpy.
struct ReceivedChunk {
  proto::Role sender_role = proto::Role::Unknown;
  int32_t sender_rank = -1;
  uint64_t tag = 0;
  proto::CollectiveOp op = proto::CollectiveOp::AllReduce;
  proto::ReduceOp reduce_op = proto::ReduceOp::Sum;
  uint32_t step = 0;
  uint32_t chunk = 0;
  proto::DType dtype = proto::DType::Float32;
  uint64_t element_offset = 0;
  uint64_t element_count = 0;
  uint64_t fingerprint = 0;
  Payload data;  // empty when the chunk carried no bytes (data.payload = -1)
};

// Converts a verified CollectiveChunk envelope. REQUIRES: its body is a CollectiveChunk.
ReceivedChunk ToReceivedChunk(const Envelope& envelope);

class CollectiveMailbox {
 public:
  static constexpr size_t kDefaultMaxQueuedChunks = 65536;

  explicit CollectiveMailbox(size_t max_queued_chunks = kDefaultMaxQueuedChunks)
      : max_queued_chunks_(max_queued_chunks) {}

  // A MessageHandler for proto::Body::CollectiveChunk that delivers to `mailbox`; it shares
  // ownership, so the mailbox lives as long as the endpoint may call the handler.
  static MessageHandler Handler(std::shared_ptr<CollectiveMailbox> mailbox);

  // Queues `chunk` under (chunk.tag, chunk.step). Never blocks beyond the mutex. Over the
  // bound, the mailbox fails (see the file comment) instead of queueing.
  void Deliver(ReceivedChunk chunk);

  // The oldest chunk queued under (tag, step). DeadlineExceeded (with a bare message: the
  // caller knows what it waited for and says so) once `deadline` passes, or the status given
  // to Fail.
  StatusOr<ReceivedChunk> Pop(uint64_t tag, uint32_t step, Deadline deadline);

  // Wakes every waiter with `status` and fails every later Pop with it. The first status given
  // is kept as the root cause. REQUIRES: !status.ok().
  void Fail(const Status& status);
  Status failure() const;

  // Drops every chunk queued under `tag` (a collective that failed leaves its peers' chunks
  // behind; the next operation uses another tag).
  void Discard(uint64_t tag);
  size_t queued() const;

 private:
  const size_t max_queued_chunks_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::map<std::pair<uint64_t, uint32_t>, std::deque<ReceivedChunk>> chunks_;  // guarded by mu_
  size_t queued_ = 0;  // chunks in chunks_; guarded by mu_
  Status failure_;     // guarded by mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COLLECTIVE_MAILBOX_H_
