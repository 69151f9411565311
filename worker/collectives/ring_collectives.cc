#include "worker/collectives/ring_collectives.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/role.h"
#include "worker/collectives/element_reduction.h"

namespace tessera::worker {

// ---------------------------------------------------------------------------------------------
// Staging buffers

// Send buffers for segments: each is the caller's alone until every copy of the pointer Acquire
// returned is gone, i.e. until the call has ended and the transport has put the frames that
// borrow it on the wire. Then the next call reuses it instead of allocating (and faulting in)
// fresh pages. Slots are shared with the leases, so a lease may outlive the pool.
class RingCollectives::StagingPool {
 public:
  // At least `bytes` bytes; null for 0.
  std::shared_ptr<uint8_t> Acquire(size_t bytes) {
    if (bytes == 0) return nullptr;
    std::shared_ptr<Slot> chosen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::shared_ptr<Slot> free_but_small;
      for (const std::shared_ptr<Slot>& slot : slots_) {
        if (slot->busy.load(std::memory_order_acquire)) continue;
        if (slot->capacity >= bytes) {
          if (chosen == nullptr || slot->capacity < chosen->capacity) chosen = slot;
        } else if (free_but_small == nullptr) {
          free_but_small = slot;
        }
      }
      if (chosen == nullptr && free_but_small != nullptr) {
        chosen = std::move(free_but_small);
        chosen->bytes.reset(new uint8_t[bytes]);
        chosen->capacity = bytes;
      }
      if (chosen == nullptr && slots_.size() < kMaxSlots) {
        chosen = std::make_shared<Slot>();
        chosen->bytes.reset(new uint8_t[bytes]);
        chosen->capacity = bytes;
        slots_.push_back(chosen);
      }
      if (chosen != nullptr) chosen->busy.store(true, std::memory_order_relaxed);
    }
    if (chosen == nullptr) {  // more calls staging at once than the pool keeps buffers for
      return std::shared_ptr<uint8_t>(new uint8_t[bytes], std::default_delete<uint8_t[]>());
    }
    uint8_t* data = chosen->bytes.get();
    return std::shared_ptr<uint8_t>(data, [slot = std::move(chosen)](uint8_t*) {
      slot->busy.store(false, std::memory_order_release);
    });
  }

 private:
  static constexpr size_t kMaxSlots = 8;

  struct Slot {
    std::unique_ptr<uint8_t[]> bytes;  // written only while busy is false, under mu_
    size_t capacity = 0;               // guarded by mu_
    // Set by Acquire (under mu_); cleared by whichever thread drops the lease's last copy.
    std::atomic<bool> busy{false};
  };

  std::mutex mu_;
  std::vector<std::shared_ptr<Slot>> slots_;  // guarded by mu_
};

namespace {

// How long a failed call waits for its abort notice to be written to the channel.
constexpr int64_t kAbortFlushMs = 1000;

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string Range(uint64_t begin, uint64_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

// Where `rank` is in `order` (Create checked that it is there).
int PositionOf(const std::vector<int>& order, int rank) {
  return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto a_begin = reinterpret_cast<uintptr_t>(a);
  auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

// ---------------------------------------------------------------------------------------------
// One call

// What a call is about; every rank must agree on all of it but the tensor name.
struct Call {
  CollectiveOp op = CollectiveOp::kAllReduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;  // reducing collectives only
  size_t count = 0;
  int root = 0;  // broadcast only
  const std::string& tensor;
  uint64_t tag = 0;
};

// Which elements a frame carries: a segment of `block`, or none (a handshake).
struct Piece {
  bool handshake = false;
  uint32_t block = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
};

// A staging buffer cut into regions of one block each.
struct Staging {
  std::shared_ptr<uint8_t> lease;
  size_t region_bytes = 0;

  uint8_t* Region(int region) const {
    return lease.get() + static_cast<size_t>(region) * region_bytes;
  }
  // A payload of `bytes` staged bytes at `data`, kept alive by the lease.
  Payload Borrow(const uint8_t* data, size_t bytes) const {
    return bytes == 0 ? Payload() : Payload::Borrow(data, bytes, lease);
  }
};

// One collective on one rank: the algorithms, then the primitives they are written in.
class RingRun {
 public:
  RingRun(const RingCollectivesOptions& options, RingCollectives::StagingPool& pool,
          const Call& call)
      : options_(options),
        pool_(pool),
        call_(call),
        world_(options.world_size),
        rank_(options.rank),
        order_(options.ring_order),
        position_(PositionOf(options.ring_order, options.rank)),
        next_(order_[static_cast<size_t>((position_ + 1) % world_)]),
        prev_(order_[static_cast<size_t>((position_ + world_ - 1) % world_)]),
        element_bytes_(std::max<size_t>(DataTypeSize(call.dtype), 1)),
        deadline_(Deadline::AfterMillis(options.timeout_ms)) {
    const size_t w = static_cast<size_t>(world_);
    const size_t segment_elements = std::max<size_t>(options.segment_bytes / element_bytes_, 1);
    // A whole buffer per frame, so at most segment_bytes.
    one_shot_ = call.op == CollectiveOp::kAllReduce && world_ > 1 && call.count > 0 &&
                call.count <= std::min(options.one_shot_max_bytes, options.segment_bytes) /
                                  element_bytes_;
    if (call.op == CollectiveOp::kBroadcast || one_shot_) {
      max_block_ = call.count;
    } else {
      max_block_ = call.count / w + (call.count % w != 0 ? 1 : 0);
    }
    segments_ = std::max<uint64_t>(
        1, max_block_ / segment_elements + (max_block_ % segment_elements != 0 ? 1 : 0));
    const uint64_t steps = static_cast<uint64_t>(world_ - 1);
    switch (call.op) {
      case CollectiveOp::kAllReduce:
        total_sends_ = (one_shot_ ? 1 : 2) * steps * segments_;
        break;
      case CollectiveOp::kReduceScatter:
      case CollectiveOp::kAllGather: total_sends_ = steps * segments_; break;
      case CollectiveOp::kBroadcast:
        total_sends_ = (next_ == call.root ? 0 : segments_) + steps;
        break;
      case CollectiveOp::kBarrier: total_sends_ = steps; break;
      case CollectiveOp::kSendRecv:
      case CollectiveOp::kAllToAll: break;  // torch point-to-point frames, never a ring call
    }
  }

  // Runs `algorithm` once the call and `arguments` (the caller's checks of its buffers) are
  // found valid. On any failure, tells the ring (see Abort).
  Status Execute(const Status& arguments, const std::function<Status()>& algorithm) {
    Status status = CheckCall();
    if (status.ok()) status = arguments;
    if (status.ok()) status = algorithm();
    if (status.ok() && world_ > 1) {
      // Everything sent must be handed on before the call returns: frames borrow the
      // caller's buffers (see "borrowing").
      Status flushed = channel().Flush(deadline_);
      if (!flushed.ok()) status = flushed.WithContext(Prefix() + ": sending to " + Worker(next_));
    }
    if (!status.ok() && world_ > 1) {
      Abort(status);
      // Frames still queued may borrow the caller's buffers, which are the caller's again
      // once we return.
      channel().CopyUnsentPayloads();
    }
    return status;
  }

  // InvalidArgument naming `name` if it is null but should hold `elements` elements.
  Status CheckBuffer(const char* name, const void* buffer, size_t elements) const {
    if (buffer == nullptr && elements > 0) {
      return InvalidArgumentError(Prefix() + ": " + name + " is null but should hold " +
                                  std::to_string(elements) + " elements");
    }
    return OkStatus();
  }

  // Input and output may share memory only where the caller places this rank's partition
  // inside the whole buffer (in place); any other overlap would corrupt the result.
  Status CheckInPlace(const uint8_t* whole, const uint8_t* part) const {
    const Partition own = Block(position_);
    if (part == whole + own.offset * element_bytes_) return OkStatus();
    if (Overlap(whole, call_.count * element_bytes_, part, own.size * element_bytes_)) {
      return InvalidArgumentError(
          Prefix() + ": input and output overlap, but not in place (this rank's partition of " +
          std::to_string(own.size) + " elements starts at element " +
          std::to_string(own.offset) + " of the whole buffer)");
    }
    return OkStatus();
  }

  std::string Prefix() const {
    std::string prefix = std::string(CollectiveOpName(call_.op)) + " tag=" + std::to_string(call_.tag);
    if (!call_.tensor.empty()) prefix += " tensor=" + call_.tensor;
    return prefix + " rank=" + std::to_string(rank_);
  }

  // The algorithms, and the words the code below uses for them.
  //
  //   ring     the W ranks in a circle, in the order ring_order gives (by default 0..W-1): r
  //            below is a rank's position in it, and the rank at position r sends only to the
  //            one at r + 1 (next) and receives only from the one at r - 1 (prev), mod W. Block
  //            numbers below are positions too, taken mod W.
  //   block    block q is the partition of the buffer of the rank at position q,
  //            PartitionOf(count, W, ring_order[q]): the part that ends up reduced on that
  //            rank in a reduce-scatter. (A broadcast has one block, the whole buffer,
  //            numbered by its root.)
  //   segment  every block is cut into the same number S of segments, PartitionOf(block size,
  //            S, k), with S just large enough that the largest block's segments hold at most
  //            segment_bytes. One message carries one segment.
  //   step     one round in which every rank sends one block to next, segment by segment, and
  //            receives one block from prev. A rank sends and receives messages in step order,
  //            segments in order within a step; the wire's `step` field numbers them so.
  //
  //   reduce-scatter, steps s = 0 .. W-2:
  //     Send block (r-s-1); RecvReduce block (r-s-2): combine prev's partial result with ours.
  //     At step 0 the block sent is our own input; at step s > 0 it is what we combined at
  //     step s-1. After step s, our combination of block (r-s-2) covers ranks r-s-2 .. r, so
  //     after step W-2 block r covers every rank: complete, and ours to keep.
  //   all-gather, steps s = W-1 .. 2W-3 of an all-reduce (0 .. W-2 alone), t = s - (W-1):
  //     Send block (r-t), complete; RecvCopy block (r-t-1), complete on prev. After the last
  //     step every block is complete on every rank.
  //   all-reduce = reduce-scatter, then all-gather.
  //   one-shot all-reduce (buffers of at most one_shot_max_bytes): every rank gathers every
  //     rank's whole buffer (steps t = 0 .. W-2: send the buffer of position r-t, ours at step
  //     0, then what prev sent at step t-1; receive that of r-t-1), then combines each block
  //     itself, in the ring's order: block b starts as position b+1's elements, then each
  //     position after it combines its own with the partial result, up to b's, which
  //     completes it. The same bits as the ring's all-reduce, in W-1 steps of latency instead
  //     of 2(W-1): what wins for small buffers, whose time is the steps'.
  //   broadcast: the root sends its buffer to next; every other rank receives it from prev
  //     and passes it on unless next is the root. Then a handshake (below), so that no rank
  //     returns before every rank has the data and agreed on the call.
  //   handshake (a barrier), steps 0 .. W-2: send an empty message at step 0, and at step j+1
  //     once prev's message of step j is in. Rank r's last message comes through W-1 hops, so
  //     every rank has entered.
  //
  //   pipelining: a received segment is combined (or copied) and sent on at once, before the
  //     next segment is received, so the channel moves segment k while this thread combines
  //     segment k+1; Send never waits (the channel queues), so every rank sends before it
  //     receives and the ring cannot deadlock. Each receive waits until the call's deadline at
  //     most.
  //   borrowing: a channel hands on a frame by the call's final Flush (on failure,
  //     CopyUnsentPayloads copies what is left), so we send straight from the caller's buffers
  //     whatever the algorithm does not write again during the call, and receive straight into
  //     them. All-reduce then needs no staging at all: it combines in place and sends from
  //     there. A block it sent is written again only by the all-gather's receive of the same
  //     block, which prev can send only once that block is complete, i.e. once our
  //     contribution went through next; next having read it means it has left our queue.
  //   staging: reduce-scatter cannot combine in place (its input is const), so what it
  //     combines at steps 1..W-2 goes to a staging buffer (one region per step, never written
  //     again during the call), reused by later calls once no frame holds it.

  Status AllReduce(uint8_t* data) {
    if (world_ == 1) return OkStatus();  // every op of one buffer is itself
    if (one_shot_) return OneShotAllReduce(data);
    const int r = position_;
    const int last_step = 2 * world_ - 3;
    RETURN_IF_ERROR(SendBlock(0, r - 1, Element(data, Block(r - 1).offset)));
    for (int s = 0; s <= world_ - 2; ++s) {
      const int b = r - s - 2;
      const bool complete = s == world_ - 2;
      for (int k = 0; k < segments(); ++k) {
        const Partition segment = Segment(b, k);
        uint8_t* mine = Element(data, segment.offset);
        // Combined in place, sent from there (see "borrowing").
        RETURN_IF_ERROR(RecvReduce(s, b, k, mine, mine, complete));
        RETURN_IF_ERROR(
            Send(s + 1, k, DataPiece(b, k), Borrowed(mine, segment.size * element_bytes_)));
      }
    }
    for (int s = world_ - 1; s <= last_step; ++s) {
      const int t = s - (world_ - 1);
      for (int k = 0; k < segments(); ++k) {
        RETURN_IF_ERROR(RecvCopy(s, r - t - 1, k, data, /*forward=*/s < last_step));
      }
    }
    return OkStatus();
  }

  Status OneShotAllReduce(uint8_t* data) {
    const int r = position_;
    const size_t bytes = call_.count * element_bytes_;
    // Regions 0 .. W-1: the buffer of the rank at each position (ours copied: we write `data`
    // at the end, while the frames that borrow it may still wait in the channel); W and W+1:
    // partial results.
    Staging staging = Stage(world_ + 2);
    std::memcpy(staging.Region(r), data, bytes);
    RETURN_IF_ERROR(Send(0, 0, OneShotPiece(r), staging.Borrow(staging.Region(r), bytes)));
    for (int t = 0; t <= world_ - 2; ++t) {
      const int q = Wrap(r - t - 1);
      const Piece piece = OneShotPiece(q);
      uint8_t* place = staging.Region(q);
      ASSIGN_OR_RETURN(RingFrame received, Recv(static_cast<uint32_t>(t), 0, piece, place));
      if (!received.data.empty() && received.data.data() != place) {
        std::memcpy(place, received.data.data(), received.data.size());
      }
      if (t < world_ - 2) {
        RETURN_IF_ERROR(Send(static_cast<uint32_t>(t + 1), 0, piece, std::move(received.data)));
      }
    }
    for (int b = 0; b < world_; ++b) {
      const Partition block = Block(b);
      if (block.size == 0) continue;
      auto elements = [&](int position) {
        return Element(staging.Region(Wrap(position)), block.offset);
      };
      const uint8_t* partial = elements(b + 1);
      for (int q = b + 2; q < b + world_; ++q) {
        uint8_t* out = staging.Region(world_ + q % 2);
        Combine(call_.dtype, call_.reduce_op, /*last=*/false, elements(q), partial, out,
                block.size, world_);
        partial = out;
      }
      Combine(call_.dtype, call_.reduce_op, /*last=*/true, elements(b), partial,
              Element(data, block.offset), block.size, world_);
    }
    return OkStatus();
  }

  Status ReduceScatter(const uint8_t* input, uint8_t* output) {
    const int r = position_;
    const Partition own = Block(r);
    if (world_ == 1) {
      if (own.size > 0 && output != input) std::memmove(output, input, own.size * element_bytes_);
      return OkStatus();
    }
    // Region s holds the block sent at step s, for s = 1 .. W-2 (step 0 sends the input).
    Staging staging = Stage(world_ - 1);
    RETURN_IF_ERROR(SendBlock(0, r - 1, Element(input, Block(r - 1).offset)));
    for (int s = 0; s <= world_ - 2; ++s) {
      const int b = r - s - 2;
      const bool complete = s == world_ - 2;  // b == r: the result goes to output
      for (int k = 0; k < segments(); ++k) {
        const Partition segment = Segment(b, k);
        const size_t in_block = (segment.offset - Block(b).offset) * element_bytes_;
        const uint8_t* mine = Element(input, segment.offset);
        if (complete) {
          RETURN_IF_ERROR(RecvReduce(s, b, k, mine, output + in_block, true));
        } else {
          uint8_t* staged = staging.Region(s + 1) + in_block;
          RETURN_IF_ERROR(RecvReduce(s, b, k, mine, staged, false));
          RETURN_IF_ERROR(Send(s + 1, k, DataPiece(b, k),
                               staging.Borrow(staged, segment.size * element_bytes_)));
        }
      }
    }
    return OkStatus();
  }

  Status AllGather(const uint8_t* input, uint8_t* output) {
    const int r = position_;
    const Partition own = Block(r);
    uint8_t* own_output = Element(output, own.offset);
    if (own.size > 0 && own_output != input) {
      std::memmove(own_output, input, own.size * element_bytes_);
    }
    if (world_ == 1) return OkStatus();
    RETURN_IF_ERROR(SendBlock(0, r, own_output));
    for (int t = 0; t <= world_ - 2; ++t) {
      for (int k = 0; k < segments(); ++k) {
        RETURN_IF_ERROR(RecvCopy(t, r - t - 1, k, output, /*forward=*/t < world_ - 2));
      }
    }
    return OkStatus();
  }

  Status Broadcast(uint8_t* data) {
    if (world_ == 1) return OkStatus();
    const int root = call_.root;
    if (rank_ == root) {
      RETURN_IF_ERROR(SendBlock(0, root, data));
    } else {
      for (int k = 0; k < segments(); ++k) {
        RETURN_IF_ERROR(RecvCopy(0, root, k, data, /*forward=*/next_ != root));
      }
    }
    return Handshake(1);
  }

  Status Handshake(uint32_t first_step) {
    if (world_ == 1) return OkStatus();
    RETURN_IF_ERROR(Send(first_step, 0, HandshakePiece(), Payload()));
    for (int j = 0; j <= world_ - 2; ++j) {
      const uint32_t step = first_step + static_cast<uint32_t>(j);
      RETURN_IF_ERROR(Recv(step, 0, HandshakePiece()).status());
      if (j < world_ - 2) RETURN_IF_ERROR(Send(step + 1, 0, HandshakePiece(), Payload()));
    }
    return OkStatus();
  }

 private:
  // ---- geometry ----

  int Wrap(int block) const { return ((block % world_) + world_) % world_; }
  int segments() const { return static_cast<int>(segments_); }

  Partition Block(int block) const {
    if (call_.op == CollectiveOp::kBroadcast) return Partition{0, call_.count};
    return PartitionOf(call_.count, world_, order_[static_cast<size_t>(Wrap(block))]);
  }

  // Segment k of `block`, in elements of the whole buffer.
  Partition Segment(int block, int k) const {
    const Partition whole = Block(block);
    const Partition part = PartitionOf(whole.size, segments(), k);
    return Partition{whole.offset + part.offset, part.size};
  }

  // The whole buffer of the rank at `position`, placed at position x count of the W buffers a
  // one-shot all-reduce gathers.
  Piece OneShotPiece(int position) const {
    return Piece{false, static_cast<uint32_t>(position),
                 static_cast<uint64_t>(position) * call_.count, call_.count};
  }

  Piece DataPiece(int block, int k) const {
    const Partition segment = Segment(block, k);
    return Piece{false, static_cast<uint32_t>(Wrap(block)), segment.offset, segment.size};
  }
  static Piece HandshakePiece() { return Piece{true, 0, 0, 0}; }

  template <typename T>
  T* Element(T* buffer, size_t index) const {
    return buffer + index * element_bytes_;
  }

  // A staging buffer of `regions` regions, each large enough for any block.
  Staging Stage(int regions) {
    Staging staging;
    staging.region_bytes = max_block_ * element_bytes_;
    staging.lease = pool_.Acquire(staging.region_bytes * static_cast<size_t>(regions));
    return staging;
  }

  RingChannel& channel() const { return *options_.channel; }

  // ---- primitives ----

  // Send: sends every segment of `block` (whose first element is at block_data) to next as
  // step `step`, borrowed (see "borrowing": the caller must not write the block again during
  // the call).
  Status SendBlock(uint32_t step, int block, const uint8_t* block_data) {
    const Partition whole = Block(block);
    for (int k = 0; k < segments(); ++k) {
      const Partition segment = Segment(block, k);
      const size_t at = (segment.offset - whole.offset) * element_bytes_;
      RETURN_IF_ERROR(Send(step, k, DataPiece(block, k),
                           Borrowed(block_data + at, segment.size * element_bytes_)));
    }
    return OkStatus();
  }

  // `bytes` of the caller's buffer at `data`, without an owner (see "borrowing").
  static Payload Borrowed(const uint8_t* data, size_t bytes) {
    return bytes == 0 ? Payload() : Payload::Borrow(data, bytes, nullptr);
  }

  // RecvReduce: receives segment k of `block` (step `step`) from prev and writes its
  // combination with `mine`, our elements of that segment, to `out` (which may be `mine`).
  // `complete`: the result covers every rank (an average divides now).
  Status RecvReduce(uint32_t step, int block, int k, const uint8_t* mine, uint8_t* out,
                    bool complete) {
    ASSIGN_OR_RETURN(RingFrame received, Recv(step, k, DataPiece(block, k)));
    Combine(call_.dtype, call_.reduce_op, complete, mine, received.data.data(), out,
            received.element_count, world_);
    return OkStatus();
  }

  // RecvCopy: receives segment k of `block` (step `step`) from prev into its place in
  // `buffer` (the whole buffer) and, if `forward`, sends it on to next as step `step` + 1
  // (from where the channel put it: `place` is not written again, see "borrowing").
  Status RecvCopy(uint32_t step, int block, int k, uint8_t* buffer, bool forward) {
    const Piece piece = DataPiece(block, k);
    uint8_t* place = Element(buffer, piece.offset);
    ASSIGN_OR_RETURN(RingFrame received, Recv(step, k, piece, place));
    if (!received.data.empty() && received.data.data() != place) {
      std::memcpy(place, received.data.data(), received.data.size());
    }
    if (forward) RETURN_IF_ERROR(Send(step + 1, k, piece, std::move(received.data)));
    return OkStatus();
  }

  // Sends `bytes`, the elements `piece` names, to next as segment k of `step`.
  Status Send(uint32_t step, int k, const Piece& piece, Payload bytes) {
    RingFrame frame = Frame(piece.handshake ? RingFrameKind::kHandshake : RingFrameKind::kData);
    frame.block = piece.block;
    frame.element_offset = piece.offset;
    frame.element_count = piece.count;
    frame.data = std::move(bytes);
    Status sent = channel().Send(std::move(frame));
    if (!sent.ok()) {
      return sent.WithContext(Prefix() + ": sending " + Where(step, k, piece) + " to " +
                              Worker(next_));
    }
    ++next_send_slot_;
    return OkStatus();
  }

  // Our next frame to next, of `kind`, with what the call is about.
  RingFrame Frame(RingFrameKind kind) const {
    RingFrame frame;
    frame.kind = kind;
    frame.tag = call_.tag;
    frame.op = call_.op;
    frame.reduce_op = call_.reduce_op;
    frame.dtype = call_.dtype;
    frame.buffer_elements = call_.count;
    frame.slot = next_send_slot_;
    return frame;
  }

  // Waits for prev's next frame, which must be `want` (segment k of `step`). `into` (if not
  // null) is where the caller will copy the elements (see RingChannel::Recv).
  StatusOr<RingFrame> Recv(uint32_t step, int k, const Piece& want, uint8_t* into = nullptr) {
    StatusOr<RingFrame> got =
        channel().Recv(call_.tag, next_recv_slot_, deadline_, into, want.count * element_bytes_);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kDeadlineExceeded && channel().failure().ok()) {
        return DeadlineExceededError(Prefix() + ": no frame from " + Worker(prev_) + " (" +
                                     Where(step, k, want) + ") within " +
                                     std::to_string(options_.timeout_ms) + " ms");
      }
      // The root cause (e.g. the coordinator's notice that a worker failed), quoted.
      return got.status().WithContext(Prefix() + ": waiting for " + Worker(prev_) + " (" +
                                      Where(step, k, want) + ")");
    }
    ++next_recv_slot_;
    RETURN_IF_ERROR(Check(*got, step, k, want));
    return got;
  }

  // Every field of `got` the algorithm relies on, against what this rank expects: a peer that
  // runs another call fails here, naming itself, before its bytes are used.
  Status Check(const RingFrame& got, uint32_t step, int k, const Piece& want) {
    const std::string from = Worker(prev_);
    auto mismatch = [&](const std::string& problem) {
      return InvalidArgumentError(Prefix() + ": the frame from " + from + " (" +
                                  Where(step, k, want) + ") " + problem);
    };
    if (got.sender_rank != prev_) {
      return mismatch("came from " + Worker(got.sender_rank) + ", not from " + from +
                      ", this rank's predecessor in the ring");
    }
    if (got.kind == RingFrameKind::kAbort) {
      received_notice_ = got.notice;
      return Status(got.notice.code, Prefix() + ": " + from + " reported a failure: " +
                                         got.notice.message);
    }
    if (got.op != call_.op) {
      return mismatch("comes from a call of " + std::string(CollectiveOpName(got.op)) +
                      "; this rank calls " + std::string(CollectiveOpName(call_.op)) +
                      ": do all ranks run the same collective under tag " +
                      std::to_string(call_.tag) + "?");
    }
    if (Reduces() && got.reduce_op != call_.reduce_op) {
      return mismatch("reduces with " + std::string(ReduceOpName(got.reduce_op)) +
                      "; this rank with " + std::string(ReduceOpName(call_.reduce_op)));
    }
    if (got.dtype != call_.dtype) {
      return mismatch("holds " + std::string(DataTypeName(got.dtype)) +
                      " elements; this rank's are " + std::string(DataTypeName(call_.dtype)));
    }
    if (got.buffer_elements != call_.count) {
      return mismatch("is for a buffer of " + std::to_string(got.buffer_elements) +
                      " elements; this rank's has " + std::to_string(call_.count));
    }
    const Piece piece{got.kind == RingFrameKind::kHandshake, got.block, got.element_offset,
                      got.element_count};
    if (piece.handshake != want.handshake ||
        (!want.handshake && (piece.block != want.block || piece.offset != want.offset ||
                             piece.count != want.count))) {
      std::string problem = "is " + Describe(piece) + ", expected " + Describe(want);
      if (call_.op == CollectiveOp::kBroadcast && !want.handshake && !piece.handshake &&
          piece.block != want.block) {
        problem += ": do all ranks broadcast from the same root? (this rank's is " +
                   Worker(call_.root) + ")";
      } else {
        problem += ": do all ranks use the same segment_bytes and one_shot_max_bytes?";
      }
      return mismatch(problem);
    }
    if (got.data.size() != want.count * element_bytes_) {
      return mismatch("carries " + std::to_string(got.data.size()) + " bytes for " +
                      std::to_string(want.count) + " " + std::string(DataTypeName(call_.dtype)) +
                      " elements");
    }
    return OkStatus();
  }

  // After a failure: tells next, which may be waiting for us, with an abort notice in the next
  // frame it will read from us. A notice we received is passed on as it is (it names the rank
  // that failed first), except to that rank itself. Then drops what peers sent under the tag.
  // Best effort: a notice that cannot be sent leaves next to its deadline.
  void Abort(const Status& status) {
    AbortNotice notice = received_notice_.value_or(
        AbortNotice{rank_, status.code(), status.message()});
    if (notice.origin != next_ && next_send_slot_ < total_sends_) {
      if (notice.message.size() > kMaxAbortMessageBytes) {
        notice.message.resize(kMaxAbortMessageBytes);
      }
      RingFrame frame = Frame(RingFrameKind::kAbort);
      frame.notice = std::move(notice);
      // Best effort, briefly: a successor that reads gets it at once.
      if (channel().Send(std::move(frame)).ok()) {
        (void)channel().Flush(Deadline::AfterMillis(kAbortFlushMs));
      }
    }
    // Frames that peers sent before they noticed would wait forever under a tag nobody takes.
    channel().Discard(call_.tag);
  }

  // Every argument the call's geometry depends on.
  Status CheckCall() const {
    if (DataTypeSize(call_.dtype) == 0) {
      return InvalidArgumentError(Prefix() + ": unknown dtype " +
                                  std::to_string(static_cast<int>(call_.dtype)));
    }
    if (Reduces() && ReduceOpName(call_.reduce_op) == "invalid") {
      return InvalidArgumentError(Prefix() + ": unknown reduce op " +
                                  std::to_string(static_cast<int>(call_.reduce_op)));
    }
    // Every rank rejects it itself, before it sends anything (as torch does: no average of
    // integers or bools).
    if (Reduces() && call_.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(call_.dtype)) {
      return InvalidArgumentError(Prefix() + ": average needs a floating-point dtype (float32, "
                                  "float64, float16 or bfloat16), not " +
                                  std::string(DataTypeName(call_.dtype)));
    }
    if (call_.count > std::numeric_limits<size_t>::max() / element_bytes_ / 2) {
      return InvalidArgumentError(Prefix() + ": count " + std::to_string(call_.count) +
                                  " is too large");
    }
    if (call_.op == CollectiveOp::kBroadcast &&
        (call_.root < 0 || call_.root >= world_)) {
      return InvalidArgumentError(Prefix() + ": root " + std::to_string(call_.root) +
                                  " is not a rank in [0, " + std::to_string(world_) + ")");
    }
    // The wire numbers a call's messages on a link with 32 bits.
    if (world_ > 1 &&
        (segments_ > static_cast<uint64_t>(INT32_MAX) ||
         total_sends_ > std::numeric_limits<uint32_t>::max())) {
      return InvalidArgumentError(
          Prefix() + ": " + std::to_string(call_.count) + " elements in segments of at most " +
          std::to_string(options_.segment_bytes) + " bytes need too many messages");
    }
    return OkStatus();
  }

  bool Reduces() const {
    return call_.op == CollectiveOp::kAllReduce ||
           call_.op == CollectiveOp::kReduceScatter;
  }

  // "step 4", or "step 4, segment 2 of 8" when blocks have several segments.
  std::string Where(uint32_t step, int k, const Piece& piece) const {
    std::string where = "step " + std::to_string(step);
    if (!piece.handshake && segments_ > 1) {
      where += ", segment " + std::to_string(k) + " of " + std::to_string(segments_);
    }
    return where;
  }

  std::string Describe(const Piece& piece) const {
    if (piece.handshake) return "a handshake without elements";
    if (call_.op == CollectiveOp::kBroadcast) {
      return "root " + Worker(static_cast<int>(piece.block)) + "'s elements " +
             Range(piece.offset, piece.count);
    }
    return "block " + std::to_string(piece.block) + " elements " +
           Range(piece.offset, piece.count);
  }

  const RingCollectivesOptions& options_;
  RingCollectives::StagingPool& pool_;
  const Call& call_;
  const int world_;
  const int rank_;
  const std::vector<int>& order_;  // the ranks in ring order (filled in by Create)
  const int position_;             // where rank_ is in order_
  const int next_;
  const int prev_;
  const size_t element_bytes_;  // 1 for an unknown dtype, which CheckCall rejects
  const Deadline deadline_;
  bool one_shot_ = false;      // an all-reduce by the one-shot algorithm
  size_t max_block_ = 0;       // elements of the largest block (one-shot: of the buffer)
  uint64_t segments_ = 1;      // S
  uint64_t total_sends_ = 0;   // frames this rank sends to next in a successful call
  uint32_t next_send_slot_ = 0;  // the slot of our next frame to next
  uint32_t next_recv_slot_ = 0;  // the slot of prev's next frame to us
  std::optional<AbortNotice> received_notice_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// RingCollectives

StatusOr<std::unique_ptr<RingCollectives>> RingCollectives::Create(
    RingCollectivesOptions options) {
  const std::string where = "ring collectives: ";
  if (options.world_size < 1) {
    return InvalidArgumentError(where + "world_size " + std::to_string(options.world_size) +
                                " is not at least 1");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(where + "rank " + std::to_string(options.rank) +
                                " is not in [0, " + std::to_string(options.world_size) + ")");
  }
  if (options.world_size > 1 && options.channel == nullptr) {
    return InvalidArgumentError(where + "channel is null");
  }
  if (options.timeout_ms <= 0) {
    return InvalidArgumentError(where + "timeout_ms " + std::to_string(options.timeout_ms) +
                                " is not positive");
  }
  if (options.world_size > 1 && options.channel->rank() != options.rank) {
    return InvalidArgumentError(where + "the channel is rank " +
                                std::to_string(options.channel->rank()) + "'s, not rank " +
                                std::to_string(options.rank) + "'s");
  }
  if (options.ring_order.empty()) {
    for (int rank = 0; rank < options.world_size; ++rank) options.ring_order.push_back(rank);
  }
  std::vector<int> sorted = options.ring_order;
  std::sort(sorted.begin(), sorted.end());
  for (int rank = 0; rank < options.world_size; ++rank) {
    if (sorted.size() != static_cast<size_t>(options.world_size) ||
        sorted[static_cast<size_t>(rank)] != rank) {
      return InvalidArgumentError(where + "ring_order does not hold each rank in [0, " +
                                  std::to_string(options.world_size) + ") once");
    }
  }
  if (options.segment_bytes < 1 || options.segment_bytes > kMaxSegmentBytes) {
    return InvalidArgumentError(where + "segment_bytes " +
                                std::to_string(options.segment_bytes) + " is not in [1, " +
                                std::to_string(kMaxSegmentBytes) + "]");
  }
  return std::unique_ptr<RingCollectives>(new RingCollectives(std::move(options)));
}

RingCollectives::RingCollectives(RingCollectivesOptions options)
    : options_(std::move(options)), staging_(std::make_unique<StagingPool>()) {}

RingCollectives::~RingCollectives() = default;

Status RingCollectives::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{CollectiveOp::kAllReduce, dtype, op, count, 0, tensor, tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(run.CheckBuffer("data", data, count),
                     [&] { return run.AllReduce(static_cast<uint8_t*>(data)); });
}

Status RingCollectives::ReduceScatter(const void* input, void* output, size_t count,
                                      DataType dtype, ReduceOp op, const std::string& tensor,
                                      uint64_t tag) {
  const Call call{CollectiveOp::kReduceScatter, dtype, op, count, 0, tensor, tag};
  RingRun run(options_, *staging_, call);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  Status arguments = run.CheckBuffer("input", input, count);
  if (arguments.ok()) {
    arguments = run.CheckBuffer("output", output, PartitionOf(count, world_size(), rank()).size);
  }
  if (arguments.ok() && DataTypeSize(dtype) != 0) arguments = run.CheckInPlace(in, out);
  return run.Execute(arguments, [&] { return run.ReduceScatter(in, out); });
}

Status RingCollectives::AllGather(const void* input, void* output, size_t count, DataType dtype,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{CollectiveOp::kAllGather, dtype, ReduceOp::kSum, count, 0, tensor, tag};
  RingRun run(options_, *staging_, call);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  Status arguments =
      run.CheckBuffer("input", input, PartitionOf(count, world_size(), rank()).size);
  if (arguments.ok()) arguments = run.CheckBuffer("output", output, count);
  if (arguments.ok() && DataTypeSize(dtype) != 0) arguments = run.CheckInPlace(out, in);
  return run.Execute(arguments, [&] { return run.AllGather(in, out); });
}

Status RingCollectives::Broadcast(void* data, size_t count, DataType dtype, int root,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{CollectiveOp::kBroadcast, dtype, ReduceOp::kSum, count, root, tensor,
                  tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(run.CheckBuffer("data", data, count),
                     [&] { return run.Broadcast(static_cast<uint8_t*>(data)); });
}

Status RingCollectives::Barrier(uint64_t tag) {
  static const std::string kNoTensor;
  const Call call{CollectiveOp::kBarrier, DataType::kFloat32, ReduceOp::kSum, 0, 0,
                  kNoTensor, tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(OkStatus(), [&] { return run.Handshake(0); });
}

}  // namespace tessera::worker
