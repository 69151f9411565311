#include "worker/ring_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/fleet_view.h"
#include "common/wire_codec.h"

namespace tessera::worker {
namespace {

constexpr size_t kElementBytes = sizeof(float);

// The time left until `deadline`, to the nearest millisecond, for messages: a deadline made
// with AfterMillis(30000) a moment ago reads "30000 ms", not "29999 ms".
int64_t RoundedMillisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.when() -
                                                                    SteadyClock::now());
  return std::max<int64_t>(0, (left.count() + 500) / 1000);
}

// One all-reduce on one rank: the algorithm, then the primitives it is written in.
class RingAllReduceRun {
 public:
  RingAllReduceRun(const RingAllReduceArgs& args, const CollectiveContext& context)
      : args_(args),
        context_(context),
        world_(context.world_size),
        rank_(context.rank),
        next_((context.rank + 1) % context.world_size),
        prev_((context.rank + context.world_size - 1) % context.world_size),
        timeout_ms_(RoundedMillisUntil(context.deadline)) {}

  // The algorithm, and the words the code below uses for it.
  //
  //   ring   the W workers, ranks 0..W-1, in a circle: rank r sends only to its successor
  //          next = (r + 1) mod W and receives only from its predecessor prev = (r - 1) mod W.
  //   chunk  the buffer of n elements is cut into W contiguous chunks; chunk c holds elements
  //          [ChunkBegin(c), ChunkBegin(c + 1)), the first (n mod W) chunks one element more
  //          than the rest. Chunk numbers are taken mod W. A chunk may be empty (n < W).
  //   step   one round in which every rank sends one chunk to next and receives one chunk
  //          from prev. An all-reduce takes 2(W - 1) steps, numbered 0 .. 2W - 3 on the wire.
  //
  //   reduce-scatter, steps s = 0 .. W - 2:
  //     Send chunk (r - s); RecvReduce chunk (r - s - 1), i.e. add prev's partial sum into ours.
  //     After step s our chunk (r - s - 1) holds the sum over ranks r - s - 1 .. r, so after
  //     step W - 2 chunk (r + 1) holds the sum over every rank: it is complete.
  //   all-gather, steps s = W - 1 .. 2W - 3, with t = s - (W - 1):
  //     Send chunk (r + 1 - t), complete; RecvCopy chunk (r - t), i.e. overwrite ours with
  //     prev's complete one. After step 2W - 3 every chunk is complete on every rank.
  //
  // Send never waits (the transport queues), so every rank sends before it receives and the
  // ring cannot deadlock; each receive waits until the operation's deadline at most.
  Status Run() {
    for (int s = 0; s <= world_ - 2; ++s) {
      const uint32_t step = static_cast<uint32_t>(s);
      RETURN_IF_ERROR(Send(step, rank_ - s));
      RETURN_IF_ERROR(RecvReduce(step, rank_ - s - 1));
    }
    for (int s = world_ - 1; s <= 2 * world_ - 3; ++s) {
      const uint32_t step = static_cast<uint32_t>(s);
      const int t = s - (world_ - 1);
      RETURN_IF_ERROR(Send(step, rank_ + 1 - t));
      RETURN_IF_ERROR(RecvCopy(step, rank_ - t));
    }
    return OkStatus();
  }

  // "allreduce tag=3 tensor=layer3.w rank=2".
  std::string Prefix() const {
    std::string prefix = "allreduce tag=" + std::to_string(context_.tag);
    if (!args_.tensor.empty()) prefix += " tensor=" + args_.tensor;
    return prefix + " rank=" + std::to_string(rank_);
  }

 private:
  // ---- chunks ----

  int Wrap(int chunk) const { return ((chunk % world_) + world_) % world_; }
  size_t ChunkBegin(int chunk) const {
    const size_t c = static_cast<size_t>(chunk);
    const size_t base = args_.count / world_;
    const size_t extra = args_.count % world_;
    return c * base + std::min(c, extra);
  }
  size_t ChunkSize(int chunk) const { return ChunkBegin(chunk + 1) - ChunkBegin(chunk); }

  // ---- primitives ----

  // Sends our chunk `chunk` to next, tagged with `step`.
  Status Send(uint32_t step, int chunk) {
    chunk = Wrap(chunk);
    const size_t begin = ChunkBegin(chunk);
    const size_t size = ChunkSize(chunk);
    MessageBuilder builder(proto::Role::Worker, rank_);
    // A copy, not a borrow: ZeroMQ may still hold the frame after this call returns, and the
    // caller's buffer is neither ours to keep alive nor unchanged (later steps write it).
    int32_t frame = builder.AddPayload(
        size == 0 ? Payload() : Payload::Copy(args_.data + begin, size * kElementBytes));
    std::vector<int64_t> shape = {static_cast<int64_t>(size)};
    auto data = proto::CreateTensorMetaDirect(builder.fbb(), args_.tensor.c_str(), 0,
                                              proto::DType::Float32, &shape, frame, 0,
                                              size * kElementBytes);
    auto body = proto::CreateCollectiveChunk(
        builder.fbb(), context_.tag, proto::CollectiveOp::AllReduce, proto::ReduceOp::Sum, step,
        static_cast<uint32_t>(chunk), proto::DType::Float32, begin, size, Fingerprint(), data);
    const std::string& address = context_.peer_addresses[static_cast<size_t>(next_)];
    Status sent = context_.transport->Send(address, builder.Finish(body, /*request_id=*/0));
    if (!sent.ok()) {
      return sent.WithContext(Prefix() + ": sending chunk " + std::to_string(chunk) + " (step " +
                              std::to_string(step) + ") to " + Worker(next_) + " at " + address);
    }
    return OkStatus();
  }

  // Receives chunk `chunk` of `step` from prev and adds it into ours.
  Status RecvReduce(uint32_t step, int chunk) {
    chunk = Wrap(chunk);
    ASSIGN_OR_RETURN(ReceivedChunk received, Recv(step, chunk));
    float* out = args_.data + ChunkBegin(chunk);
    const uint8_t* in = received.data.data();
    for (size_t i = 0; i < received.element_count; ++i) {
      float value;  // the frame need not be aligned for float
      std::memcpy(&value, in + i * kElementBytes, kElementBytes);
      out[i] += value;
    }
    return OkStatus();
  }

  // Receives chunk `chunk` of `step` from prev and overwrites ours with it.
  Status RecvCopy(uint32_t step, int chunk) {
    chunk = Wrap(chunk);
    ASSIGN_OR_RETURN(ReceivedChunk received, Recv(step, chunk));
    if (received.element_count > 0) {
      std::memcpy(args_.data + ChunkBegin(chunk), received.data.data(),
                  received.element_count * kElementBytes);
    }
    return OkStatus();
  }

  // Waits for prev's chunk of `step` and checks that it is the chunk we expect.
  StatusOr<ReceivedChunk> Recv(uint32_t step, int chunk) {
    StatusOr<ReceivedChunk> popped = context_.mailbox->Pop(context_.tag, step, context_.deadline);
    if (!popped.ok()) {
      if (popped.status().code() == StatusCode::kDeadlineExceeded && context_.mailbox->failure().ok()) {
        return DeadlineExceededError(Prefix() + ": no chunk from " + Worker(prev_) + " (step " +
                                     std::to_string(step) + ") within " +
                                     std::to_string(timeout_ms_) + " ms");
      }
      // The root cause (e.g. the coordinator's notice that a worker failed), quoted.
      return popped.status().WithContext(Prefix() + ": waiting for " + Worker(prev_) +
                                         " (step " + std::to_string(step) + ")");
    }
    RETURN_IF_ERROR(Check(*popped, step, chunk));
    return popped;
  }

  // Every field of `got` that the algorithm relies on, against what this rank expects.
  Status Check(const ReceivedChunk& got, uint32_t step, int chunk) const {
    if (got.sender_role != proto::Role::Worker || got.sender_rank != prev_) {
      return Mismatch(got, step, "came from " + std::string(RoleLabel(got.sender_role)) + " " +
                                     std::to_string(got.sender_rank) + ", not from " +
                                     Worker(prev_) + ", this rank's predecessor in the ring");
    }
    if (got.op != proto::CollectiveOp::AllReduce || got.reduce_op != proto::ReduceOp::Sum) {
      return Mismatch(got, step,
                      "is for a " + std::string(proto::EnumNameCollectiveOp(got.op)) + " (" +
                          proto::EnumNameReduceOp(got.reduce_op) +
                          "), not an AllReduce (Sum): do all ranks run the same collective "
                          "under this tag?");
    }
    if (got.fingerprint != Fingerprint()) {
      return Mismatch(got, step, "is for a buffer of " + std::to_string(got.fingerprint) +
                                     " elements; this rank's has " + std::to_string(args_.count));
    }
    if (got.dtype != proto::DType::Float32) {
      return Mismatch(got, step, "holds " + std::string(proto::EnumNameDType(got.dtype)) +
                                     ", not Float32");
    }
    const uint64_t begin = ChunkBegin(chunk);
    const uint64_t size = ChunkSize(chunk);
    if (got.chunk != static_cast<uint32_t>(chunk) || got.element_offset != begin ||
        got.element_count != size) {
      return Mismatch(got, step, "is chunk " + std::to_string(got.chunk) + " elements " +
                                     Range(got.element_offset, got.element_count) +
                                     ", expected chunk " + std::to_string(chunk) + " elements " +
                                     Range(begin, size));
    }
    if (got.data.size() != size * kElementBytes) {
      return Mismatch(got, step, "carries " + std::to_string(got.data.size()) + " bytes for " +
                                     std::to_string(size) + " float32 elements");
    }
    return OkStatus();
  }

  Status Mismatch(const ReceivedChunk& got, uint32_t step, const std::string& problem) const {
    return InvalidArgumentError(Prefix() + ": the chunk from " + Worker(prev_) + " (step " +
                                std::to_string(step) + ") " + problem);
  }

  // What every rank's chunks carry so that a receiver can tell that its peers reduce the same
  // thing: here, the element count of the whole buffer.
  uint64_t Fingerprint() const { return args_.count; }

  static std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }
  static std::string Range(uint64_t begin, uint64_t count) {
    return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
  }

  const RingAllReduceArgs& args_;
  const CollectiveContext& context_;
  const int world_;
  const int rank_;
  const int next_;
  const int prev_;
  const int64_t timeout_ms_;
};

Status CheckContext(const RingAllReduceArgs& args, const CollectiveContext& context) {
  std::string where = "allreduce tag=" + std::to_string(context.tag);
  if (context.world_size < 1 || context.rank < 0 || context.rank >= context.world_size) {
    return InvalidArgumentError(where + ": rank " + std::to_string(context.rank) +
                                " is not in [0, " + std::to_string(context.world_size) + ")");
  }
  if (context.peer_addresses.size() != static_cast<size_t>(context.world_size)) {
    return InvalidArgumentError(where + ": " + std::to_string(context.peer_addresses.size()) +
                                " peer addresses for a world of " +
                                std::to_string(context.world_size));
  }
  if (context.world_size > 1 && (context.transport == nullptr || context.mailbox == nullptr)) {
    return InvalidArgumentError(where + ": the context has no transport or no mailbox");
  }
  if (args.data == nullptr && args.count > 0) {
    return InvalidArgumentError(where + ": null buffer of " + std::to_string(args.count) +
                                " elements");
  }
  return OkStatus();
}

}  // namespace

Status RingAllReduce(const RingAllReduceArgs& args, const CollectiveContext& context) {
  RETURN_IF_ERROR(CheckContext(args, context));
  if (context.world_size == 1) return OkStatus();  // the sum of one buffer is itself
  RingAllReduceRun run(args, context);
  Status status = run.Run();
  // Chunks that peers sent before they noticed the failure would wait forever under a tag
  // nobody pops again.
  if (!status.ok()) context.mailbox->Discard(context.tag);
  return status;
}

}  // namespace tessera::worker
