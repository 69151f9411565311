#include "worker/collectives/ring_collectives.h"

#include <algorithm>
#include <atomic>
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
#include "common/wire/wire_codec.h"
#include "worker/collectives/half_float.h"

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

// ---------------------------------------------------------------------------------------------
// The wire

// The `chunk` field of messages that carry none of the buffer's elements.
constexpr uint32_t kHandshakeChunk = 0xfffffffe;  // a barrier step or a broadcast's handshake
constexpr uint32_t kAbortChunk = 0xffffffff;      // an abort notice (with dtype UInt8)
constexpr size_t kMaxNoticeBytes = 4096;
// How long a failed call waits for its abort notice to be written to a link.
constexpr int64_t kAbortFlushMs = 1000;

proto::DType WireDType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return proto::DType::Float32;
    case DataType::kFloat16: return proto::DType::Float16;
    case DataType::kBFloat16: return proto::DType::BFloat16;
  }
  return proto::DType::Float32;
}

proto::ReduceOp WireReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return proto::ReduceOp::Sum;
    case ReduceOp::kAverage: return proto::ReduceOp::Average;
    case ReduceOp::kMax: return proto::ReduceOp::Max;
    case ReduceOp::kMin: return proto::ReduceOp::Min;
  }
  return proto::ReduceOp::Sum;
}

std::string OpLabel(proto::CollectiveOp op) {
  switch (op) {
    case proto::CollectiveOp::AllReduce: return "allreduce";
    case proto::CollectiveOp::ReduceScatter: return "reducescatter";
    case proto::CollectiveOp::AllGather: return "allgather";
    case proto::CollectiveOp::Broadcast: return "broadcast";
    case proto::CollectiveOp::Barrier: return "barrier";
  }
  return "collective " + std::to_string(static_cast<int>(op));
}

std::string WireReduceOpLabel(proto::ReduceOp op) {
  switch (op) {
    case proto::ReduceOp::Sum: return "sum";
    case proto::ReduceOp::Average: return "average";
    case proto::ReduceOp::Max: return "max";
    case proto::ReduceOp::Min: return "min";
  }
  return "reduce op " + std::to_string(static_cast<int>(op));
}

std::string WireDTypeLabel(proto::DType dtype) {
  switch (dtype) {
    case proto::DType::Float32: return "float32";
    case proto::DType::Float16: return "float16";
    case proto::DType::BFloat16: return "bfloat16";
    default: break;
  }
  const char* name = proto::EnumNameDType(dtype);
  if (name != nullptr && *name != '\0') return name;
  return "dtype " + std::to_string(static_cast<int>(dtype));
}

StatusCode NoticeCode(uint64_t wire) {
  if (wire == 0 || wire > static_cast<uint64_t>(StatusCode::kDataLoss)) return StatusCode::kUnknown;
  auto code = static_cast<StatusCode>(wire);
  return StatusCodeName(code) == "UNKNOWN" ? StatusCode::kUnknown : code;
}

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string Range(uint64_t begin, uint64_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto a_begin = reinterpret_cast<uintptr_t>(a);
  auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

// ---------------------------------------------------------------------------------------------
// Element arithmetic: every dtype is combined in float32. The received side may be unaligned.

struct Float32Codec {
  static constexpr size_t kBytes = 4;
  static float Load(const uint8_t* p) {
    float value;
    std::memcpy(&value, p, kBytes);
    return value;
  }
  static void Store(uint8_t* p, float value) { std::memcpy(p, &value, kBytes); }
};

struct Float16Codec {
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, kBytes);
    return HalfToFloat(bits);
  }
  static void Store(uint8_t* p, float value) {
    const uint16_t bits = FloatToHalf(value);
    std::memcpy(p, &bits, kBytes);
  }
};

struct BFloat16Codec {
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, kBytes);
    return BFloat16ToFloat(bits);
  }
  static void Store(uint8_t* p, float value) {
    const uint16_t bits = FloatToBFloat16(value);
    std::memcpy(p, &bits, kBytes);
  }
};

// Max and min propagate NaN (like PyTorch's), so a NaN gradient is not silently dropped.
template <ReduceOp kOp>
float Apply(float a, float b) {
  if constexpr (kOp == ReduceOp::kMax) {
    return (a > b || a != a) ? a : b;
  } else if constexpr (kOp == ReduceOp::kMin) {
    return (a < b || a != a) ? a : b;
  } else {
    return a + b;  // sum; average divides once, at the end
  }
}

// The float32 fast path of CombineAs: whole vectors of 8 elements, loaded and stored with
// memcpy (the bytes may be unaligned), each loaded before any is stored, so `out` or `copy`
// may be `mine`. Elementwise the same arithmetic as Apply, so the results are bit-identical.
// Returns how many leading elements it combined (a multiple of 8); CombineAs does the rest.
// About 2x faster than the batches through local arrays on a segment that is in cache.
using Float32x8 = float __attribute__((vector_size(32)));

template <ReduceOp kOp, bool kDivide>
size_t CombineFloat32Vectors(const uint8_t* mine, const uint8_t* theirs, uint8_t* out,
                             uint8_t* copy, size_t n, float divisor) {
  constexpr size_t kLanes = 8;
  constexpr size_t kVectorBytes = sizeof(Float32x8);
  Float32x8 divisors;
  for (size_t j = 0; j < kLanes; ++j) divisors[j] = divisor;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const size_t at = i * sizeof(float);
    Float32x8 x, y;
    std::memcpy(&x, mine + at, kVectorBytes);
    std::memcpy(&y, theirs + at, kVectorBytes);
    if constexpr (kOp == ReduceOp::kMax) {
      x = (x > y || x != x) ? x : y;
    } else if constexpr (kOp == ReduceOp::kMin) {
      x = (x < y || x != x) ? x : y;
    } else {
      x = x + y;
    }
    if constexpr (kDivide) x = x / divisors;
    std::memcpy(out + at, &x, kVectorBytes);
    if (copy != nullptr) std::memcpy(copy + at, &x, kVectorBytes);
  }
  return i;
}

// out[i] = mine[i] (op) theirs[i] for i in [0, n), divided by `divisor` if kDivide, and the
// same value to copy[i] too unless `copy` is null (one pass instead of a combine and a memcpy).
// `out` and `copy` may each be `mine` exactly, and overlap nothing else. Works in batches of
// kBatch elements through local arrays, which the compiler turns into SIMD code at -O2 (a
// plain loop over possibly aliasing byte pointers it does not).
template <typename Codec, ReduceOp kOp, bool kDivide>
void CombineAs(const uint8_t* mine, const uint8_t* theirs, uint8_t* out, uint8_t* copy, size_t n,
               float divisor) {
  constexpr size_t kBatch = 16;
  auto combine = [divisor](const uint8_t* a, const uint8_t* b, uint8_t* o, uint8_t* c,
                           size_t count) {
    float x[kBatch], y[kBatch];
    for (size_t j = 0; j < count; ++j) {
      x[j] = Codec::Load(a + j * Codec::kBytes);
      y[j] = Codec::Load(b + j * Codec::kBytes);
    }
    for (size_t j = 0; j < count; ++j) {
      x[j] = Apply<kOp>(x[j], y[j]);
      if constexpr (kDivide) x[j] /= divisor;
    }
    for (size_t j = 0; j < count; ++j) Codec::Store(o + j * Codec::kBytes, x[j]);
    if (c != nullptr) {
      for (size_t j = 0; j < count; ++j) Codec::Store(c + j * Codec::kBytes, x[j]);
    }
  };
  size_t i = 0;
  if constexpr (std::is_same_v<Codec, Float32Codec>) {
    i = CombineFloat32Vectors<kOp, kDivide>(mine, theirs, out, copy, n, divisor);
  }
  for (; i + kBatch <= n; i += kBatch) {
    const size_t at = i * Codec::kBytes;
    combine(mine + at, theirs + at, out + at, copy == nullptr ? nullptr : copy + at, kBatch);
  }
  if (i < n) {
    const size_t at = i * Codec::kBytes;
    combine(mine + at, theirs + at, out + at, copy == nullptr ? nullptr : copy + at, n - i);
  }
}

template <typename Codec>
void CombineWith(ReduceOp op, bool last, const uint8_t* mine, const uint8_t* theirs, uint8_t* out,
                 uint8_t* copy, size_t n, int world) {
  switch (op) {
    case ReduceOp::kSum:
      return CombineAs<Codec, ReduceOp::kSum, false>(mine, theirs, out, copy, n, 1);
    case ReduceOp::kAverage:
      if (last) {
        return CombineAs<Codec, ReduceOp::kSum, true>(mine, theirs, out, copy, n,
                                                     static_cast<float>(world));
      }
      return CombineAs<Codec, ReduceOp::kSum, false>(mine, theirs, out, copy, n, 1);
    case ReduceOp::kMax:
      return CombineAs<Codec, ReduceOp::kMax, false>(mine, theirs, out, copy, n, 1);
    case ReduceOp::kMin:
      return CombineAs<Codec, ReduceOp::kMin, false>(mine, theirs, out, copy, n, 1);
  }
}

// `last`: this combination completes the reduction over every rank (average divides now).
// `copy`: null, or a second destination for the result (see CombineAs).
void Combine(DataType dtype, ReduceOp op, bool last, const uint8_t* mine, const uint8_t* theirs,
             uint8_t* out, uint8_t* copy, size_t n, int world) {
  switch (dtype) {
    case DataType::kFloat32:
      return CombineWith<Float32Codec>(op, last, mine, theirs, out, copy, n, world);
    case DataType::kFloat16:
      return CombineWith<Float16Codec>(op, last, mine, theirs, out, copy, n, world);
    case DataType::kBFloat16:
      return CombineWith<BFloat16Codec>(op, last, mine, theirs, out, copy, n, world);
  }
}

// ---------------------------------------------------------------------------------------------
// One call

// What a call is about; every rank must agree on all of it but the tensor name.
struct Call {
  proto::CollectiveOp op = proto::CollectiveOp::AllReduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;  // reducing collectives only
  size_t count = 0;
  int root = 0;  // broadcast only
  const std::string& tensor;
  uint64_t tag = 0;
};

// Which elements a message carries: segment of `block` (the chunk field on the wire), or a
// handshake with no elements.
struct Piece {
  uint32_t chunk = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
};

// A failure reported by a peer, passed on around the ring unchanged.
struct AbortNotice {
  int origin = -1;  // the rank that failed first
  StatusCode code = StatusCode::kUnknown;
  std::string message;  // its error, which names it
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
        next_((options.rank + 1) % options.world_size),
        prev_((options.rank + options.world_size - 1) % options.world_size),
        element_bytes_(std::max<size_t>(DataTypeSize(call.dtype), 1)),
        deadline_(Deadline::AfterMillis(options.timeout_ms)),
        borrows_(options.links != nullptr && options.world_size > 1) {
    const size_t w = static_cast<size_t>(world_);
    const size_t segment_elements = std::max<size_t>(options.segment_bytes / element_bytes_, 1);
    if (call.op == proto::CollectiveOp::Broadcast) {
      max_block_ = call.count;
    } else {
      max_block_ = call.count / w + (call.count % w != 0 ? 1 : 0);
    }
    segments_ = std::max<uint64_t>(
        1, max_block_ / segment_elements + (max_block_ % segment_elements != 0 ? 1 : 0));
    const uint64_t steps = static_cast<uint64_t>(world_ - 1);
    switch (call.op) {
      case proto::CollectiveOp::AllReduce: total_sends_ = 2 * steps * segments_; break;
      case proto::CollectiveOp::ReduceScatter:
      case proto::CollectiveOp::AllGather: total_sends_ = steps * segments_; break;
      case proto::CollectiveOp::Broadcast:
        total_sends_ = (next_ == call.root ? 0 : segments_) + steps;
        break;
      case proto::CollectiveOp::Barrier: total_sends_ = steps; break;
    }
  }

  // Runs `algorithm` once the call and `arguments` (the caller's checks of its buffers) are
  // found valid. On any failure, tells the ring (see Abort).
  Status Execute(const Status& arguments, const std::function<Status()>& algorithm) {
    Status status = CheckCall();
    if (status.ok()) status = arguments;
    if (status.ok()) status = algorithm();
    if (status.ok() && options_.links != nullptr && world_ > 1) {
      // Everything sent must be on the wire before the call returns: nobody else writes it.
      Status flushed = options_.links->Flush(deadline_);
      if (!flushed.ok()) status = flushed.WithContext(Prefix() + ": sending to " + Worker(next_));
    }
    if (!status.ok()) {
      Abort(status);
      // Frames still queued may borrow the caller's buffers, which are the caller's again
      // once we return.
      if (borrows_) options_.links->CopyUnsentPayloads();
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
    const Partition own = Block(rank_);
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
    std::string prefix = OpLabel(call_.op) + " tag=" + std::to_string(call_.tag);
    if (!call_.tensor.empty()) prefix += " tensor=" + call_.tensor;
    return prefix + " rank=" + std::to_string(rank_);
  }

  // The algorithms, and the words the code below uses for them.
  //
  //   ring     the W ranks in a circle: rank r sends only to next = (r + 1) mod W and receives
  //            only from prev = (r - 1) mod W. Block numbers below are taken mod W.
  //   block    block q is rank q's partition of the buffer, PartitionOf(count, W, q): the part
  //            that ends up reduced on rank q in a reduce-scatter. (A broadcast has one block,
  //            the whole buffer, numbered by its root.)
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
  //   broadcast: the root sends its buffer to next; every other rank receives it from prev
  //     and passes it on unless next is the root. Then a handshake (below), so that no rank
  //     returns before every rank has the data and agreed on the call.
  //   handshake (a barrier), steps 0 .. W-2: send an empty message at step 0, and at step j+1
  //     once prev's message of step j is in. Rank r's last message comes through W-1 hops, so
  //     every rank has entered.
  //
  //   pipelining: a received segment is combined (or copied) and sent on at once, before the
  //     next segment is received, so the transport's I/O thread sends segment k and receives
  //     segment k+1 while this thread combines; Send never waits (the transport queues), so
  //     every rank sends before it receives and the ring cannot deadlock. Each receive waits
  //     until the call's deadline at most.
  //   staging: over the transport, what we send from our own buffers is copied into a staging
  //     buffer first (its regions, one block each, are never written again during the call),
  //     because ZeroMQ may still hold a frame after a later step overwrote the buffer, or
  //     after we returned. Received segments are passed on as they are, without a copy.
  //   borrowing: over links, frames are on the wire once the call's final Flush succeeds (on
  //     failure, CopyUnsentPayloads copies what is left), so we send straight from the
  //     caller's buffers whatever the algorithm does not write again during the call, and
  //     receive straight into them. All-reduce then needs no staging at all: it combines in
  //     place and sends from there. A block it sent is written again only by the all-gather's
  //     receive of the same block, which prev can send only once that block is complete, i.e.
  //     once our contribution went through next; next having read it means it has left our
  //     queue. Reduce-scatter stages what it combines at steps 1..W-2 (its input is const).

  Status AllReduce(uint8_t* data) {
    if (world_ == 1) return OkStatus();  // every op of one buffer is itself
    const int r = rank_;
    const int last_step = 2 * world_ - 3;
    // Region s holds the block sent at step s, for s = 0 .. W-1 (none when borrowing).
    Staging staging = Stage(borrows_ ? 0 : world_);
    RETURN_IF_ERROR(SendBlock(0, r - 1, Element(data, Block(r - 1).offset), staging, 0));
    for (int s = 0; s <= world_ - 2; ++s) {
      const int b = r - s - 2;
      const bool complete = s == world_ - 2;
      for (int k = 0; k < segments(); ++k) {
        const Partition segment = Segment(b, k);
        const size_t bytes = segment.size * element_bytes_;
        uint8_t* mine = Element(data, segment.offset);
        if (borrows_) {  // combined in place, sent from there
          RETURN_IF_ERROR(RecvReduce(s, b, k, mine, mine, nullptr, complete));
          RETURN_IF_ERROR(Send(s + 1, k, DataPiece(b, k), Borrowed(mine, bytes)));
          continue;
        }
        uint8_t* staged =
            staging.Region(s + 1) + (segment.offset - Block(b).offset) * element_bytes_;
        // Complete: the result goes to staging (to send) and, in the same pass, to data.
        RETURN_IF_ERROR(RecvReduce(s, b, k, mine, staged, complete ? mine : nullptr, complete));
        RETURN_IF_ERROR(Send(s + 1, k, DataPiece(b, k), staging.Borrow(staged, bytes)));
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

  Status ReduceScatter(const uint8_t* input, uint8_t* output) {
    const int r = rank_;
    const Partition own = Block(r);
    if (world_ == 1) {
      if (own.size > 0 && output != input) std::memmove(output, input, own.size * element_bytes_);
      return OkStatus();
    }
    // Region s holds the block sent at step s, for s = 0 .. W-2.
    Staging staging = Stage(world_ - 1);
    RETURN_IF_ERROR(SendBlock(0, r - 1, Element(input, Block(r - 1).offset), staging, 0));
    for (int s = 0; s <= world_ - 2; ++s) {
      const int b = r - s - 2;
      const bool complete = s == world_ - 2;  // b == r: the result goes to output
      for (int k = 0; k < segments(); ++k) {
        const Partition segment = Segment(b, k);
        const size_t in_block = (segment.offset - Block(b).offset) * element_bytes_;
        const uint8_t* mine = Element(input, segment.offset);
        if (complete) {
          RETURN_IF_ERROR(RecvReduce(s, b, k, mine, output + in_block, nullptr, true));
        } else {
          uint8_t* staged = staging.Region(s + 1) + in_block;
          RETURN_IF_ERROR(RecvReduce(s, b, k, mine, staged, nullptr, false));
          RETURN_IF_ERROR(Send(s + 1, k, DataPiece(b, k),
                               staging.Borrow(staged, segment.size * element_bytes_)));
        }
      }
    }
    return OkStatus();
  }

  Status AllGather(const uint8_t* input, uint8_t* output) {
    const int r = rank_;
    const Partition own = Block(r);
    uint8_t* own_output = Element(output, own.offset);
    if (own.size > 0 && own_output != input) {
      std::memmove(own_output, input, own.size * element_bytes_);
    }
    if (world_ == 1) return OkStatus();
    Staging staging = Stage(borrows_ ? 0 : 1);
    RETURN_IF_ERROR(SendBlock(0, r, own_output, staging, 0));
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
      Staging staging = Stage(borrows_ ? 0 : 1);
      RETURN_IF_ERROR(SendBlock(0, root, data, staging, 0));
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
    if (call_.op == proto::CollectiveOp::Broadcast) return Partition{0, call_.count};
    return PartitionOf(call_.count, world_, Wrap(block));
  }

  // Segment k of `block`, in elements of the whole buffer.
  Partition Segment(int block, int k) const {
    const Partition whole = Block(block);
    const Partition part = PartitionOf(whole.size, segments(), k);
    return Partition{whole.offset + part.offset, part.size};
  }

  Piece DataPiece(int block, int k) const {
    const Partition segment = Segment(block, k);
    return Piece{static_cast<uint32_t>(Wrap(block)), segment.offset, segment.size};
  }
  static Piece HandshakePiece() { return Piece{kHandshakeChunk, 0, 0}; }

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

  // ---- primitives ----

  // Send: sends every segment of `block` (whose first element is at block_data) to next as
  // step `step`: borrowed when borrowing (see "borrowing" above: the caller must not write
  // the block again during the call), otherwise staged in region `region` first.
  Status SendBlock(uint32_t step, int block, const uint8_t* block_data, const Staging& staging,
                   int region) {
    const Partition whole = Block(block);
    for (int k = 0; k < segments(); ++k) {
      const Partition segment = Segment(block, k);
      const size_t at = (segment.offset - whole.offset) * element_bytes_;
      const size_t bytes = segment.size * element_bytes_;
      if (borrows_) {
        RETURN_IF_ERROR(Send(step, k, DataPiece(block, k), Borrowed(block_data + at, bytes)));
        continue;
      }
      uint8_t* staged = staging.Region(region);
      if (bytes > 0) std::memcpy(staged + at, block_data + at, bytes);
      RETURN_IF_ERROR(Send(step, k, DataPiece(block, k), staging.Borrow(staged + at, bytes)));
    }
    return OkStatus();
  }

  // `bytes` of the caller's buffer at `data`, without an owner (links only: see "borrowing").
  static Payload Borrowed(const uint8_t* data, size_t bytes) {
    return bytes == 0 ? Payload() : Payload::Borrow(data, bytes, nullptr);
  }

  // RecvReduce: receives segment k of `block` (step `step`) from prev and writes its
  // combination with `mine`, our elements of that segment, to `out` (which may be `mine`), and
  // to `copy` too unless it is null. `complete`: the result covers every rank (an average
  // divides now).
  Status RecvReduce(uint32_t step, int block, int k, const uint8_t* mine, uint8_t* out,
                    uint8_t* copy, bool complete) {
    ASSIGN_OR_RETURN(ReceivedChunk received, Recv(step, k, DataPiece(block, k)));
    Combine(call_.dtype, call_.reduce_op, complete, mine, received.data.data(), out, copy,
            received.element_count, world_);
    return OkStatus();
  }

  // RecvCopy: receives segment k of `block` (step `step`) from prev into its place in
  // `buffer` (the whole buffer) and, if `forward`, sends it on to next as step `step` + 1.
  Status RecvCopy(uint32_t step, int block, int k, uint8_t* buffer, bool forward) {
    const Piece piece = DataPiece(block, k);
    uint8_t* place = Element(buffer, piece.offset);
    // When forwarding over the transport, not: a queued frame must not borrow the caller's
    // buffer. Over links it may (see "borrowing": `place` is not written again).
    ASSIGN_OR_RETURN(ReceivedChunk received,
                     Recv(step, k, piece, forward && !borrows_ ? nullptr : place));
    if (!received.data.empty() && received.data.data() != place) {
      std::memcpy(place, received.data.data(), received.data.size());
    }
    if (forward) RETURN_IF_ERROR(Send(step + 1, k, piece, std::move(received.data)));
    return OkStatus();
  }

  // Sends `bytes`, the elements `piece` names, to next as segment k of `step`.
  Status Send(uint32_t step, int k, const Piece& piece, Payload bytes) {
    if (options_.links != nullptr) {
      Status sent = options_.links->Send(Frame(next_send_slot_, piece, std::move(bytes)));
      if (!sent.ok()) {
        return sent.WithContext(Prefix() + ": sending " + Where(step, k, piece) + " to " +
                                Worker(next_));
      }
      ++next_send_slot_;
      return OkStatus();
    }
    const uint64_t byte_length = bytes.size();
    MessageBuilder builder(proto::Role::Worker, rank_);
    const int32_t frame = bytes.empty() ? -1 : builder.AddPayload(std::move(bytes));
    std::vector<int64_t> shape = {static_cast<int64_t>(piece.count)};
    auto data = proto::CreateTensorMetaDirect(builder.fbb(), call_.tensor.c_str(), 0,
                                              WireDType(call_.dtype), &shape, frame, 0,
                                              byte_length);
    auto body = proto::CreateCollectiveChunk(
        builder.fbb(), call_.tag, call_.op, WireReduceOp(call_.reduce_op), next_send_slot_,
        piece.chunk, WireDType(call_.dtype), piece.offset, piece.count, call_.count, data);
    const std::string& address = options_.peer_addresses[static_cast<size_t>(next_)];
    Status sent = options_.transport->Send(address, builder.Finish(body, /*request_id=*/0));
    if (!sent.ok()) {
      return sent.WithContext(Prefix() + ": sending " + Where(step, k, piece) + " to " +
                              Worker(next_) + " at " + address);
    }
    ++next_send_slot_;
    return OkStatus();
  }

  // A message for the links: the same fields as a CollectiveChunk's.
  ReceivedChunk Frame(uint32_t slot, const Piece& piece, Payload bytes) const {
    ReceivedChunk frame;
    frame.sender_role = proto::Role::Worker;
    frame.sender_rank = rank_;
    frame.tag = call_.tag;
    frame.op = call_.op;
    frame.reduce_op = WireReduceOp(call_.reduce_op);
    frame.step = slot;
    frame.chunk = piece.chunk;
    frame.dtype = WireDType(call_.dtype);
    frame.element_offset = piece.offset;
    frame.element_count = piece.count;
    frame.fingerprint = call_.count;
    frame.data = std::move(bytes);
    return frame;
  }

  // Waits for prev's next message, which must be `want` (segment k of `step`). Over links,
  // `into` (if not null) is where the caller will copy the elements (see RingLinks::Recv).
  StatusOr<ReceivedChunk> Recv(uint32_t step, int k, const Piece& want, uint8_t* into = nullptr) {
    StatusOr<ReceivedChunk> popped =
        options_.links != nullptr
            ? options_.links->Recv(call_.tag, next_recv_slot_, deadline_, into,
                                   want.count * element_bytes_)
            : options_.mailbox->Pop(call_.tag, next_recv_slot_, deadline_);
    if (!popped.ok()) {
      const Status failure = options_.links != nullptr ? options_.links->failure()
                                                       : options_.mailbox->failure();
      if (popped.status().code() == StatusCode::kDeadlineExceeded && failure.ok()) {
        return DeadlineExceededError(Prefix() + ": no chunk from " + Worker(prev_) + " (" +
                                     Where(step, k, want) + ") within " +
                                     std::to_string(options_.timeout_ms) + " ms");
      }
      // The root cause (e.g. the coordinator's notice that a worker failed), quoted.
      return popped.status().WithContext(Prefix() + ": waiting for " + Worker(prev_) + " (" +
                                         Where(step, k, want) + ")");
    }
    ++next_recv_slot_;
    RETURN_IF_ERROR(Check(*popped, step, k, want));
    return popped;
  }

  // Every field of `got` the algorithm relies on, against what this rank expects: a peer that
  // runs another call fails here, naming itself, before its bytes are used.
  Status Check(const ReceivedChunk& got, uint32_t step, int k, const Piece& want) {
    const std::string from = Worker(prev_);
    auto mismatch = [&](const std::string& problem) {
      return InvalidArgumentError(Prefix() + ": the chunk from " + from + " (" +
                                  Where(step, k, want) + ") " + problem);
    };
    if (got.sender_role != proto::Role::Worker || got.sender_rank != prev_) {
      return mismatch("came from " + std::string(RoleLabel(got.sender_role)) + " " +
                      std::to_string(got.sender_rank) + ", not from " + from +
                      ", this rank's predecessor in the ring");
    }
    if (got.chunk == kAbortChunk && got.dtype == proto::DType::UInt8) {
      AbortNotice notice;
      notice.origin = static_cast<int>(std::min<uint64_t>(got.fingerprint, INT32_MAX));
      notice.code = NoticeCode(got.element_offset);
      if (!got.data.empty()) {
        notice.message.assign(reinterpret_cast<const char*>(got.data.data()), got.data.size());
      }
      received_notice_ = notice;
      return Status(notice.code, Prefix() + ": " + from + " reported a failure: " +
                                     notice.message);
    }
    if (got.op != call_.op) {
      return mismatch("comes from a call of " + OpLabel(got.op) + "; this rank calls " +
                      OpLabel(call_.op) + ": do all ranks run the same collective under tag " +
                      std::to_string(call_.tag) + "?");
    }
    if (Reduces() && got.reduce_op != WireReduceOp(call_.reduce_op)) {
      return mismatch("reduces with " + WireReduceOpLabel(got.reduce_op) + "; this rank with " +
                      std::string(ReduceOpName(call_.reduce_op)));
    }
    if (got.dtype != WireDType(call_.dtype)) {
      return mismatch("holds " + WireDTypeLabel(got.dtype) + " elements; this rank's are " +
                      std::string(DataTypeName(call_.dtype)));
    }
    if (got.fingerprint != call_.count) {
      return mismatch("is for a buffer of " + std::to_string(got.fingerprint) +
                      " elements; this rank's has " + std::to_string(call_.count));
    }
    if (got.chunk != want.chunk || got.element_offset != want.offset ||
        got.element_count != want.count) {
      const Piece piece{got.chunk, got.element_offset, got.element_count};
      std::string problem = "is " + Describe(piece) + ", expected " + Describe(want);
      if (call_.op == proto::CollectiveOp::Broadcast && got.chunk != want.chunk) {
        problem += ": do all ranks broadcast from the same root? (this rank's is " +
                   Worker(call_.root) + ")";
      } else {
        problem += ": do all ranks use the same segment_bytes?";
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
  // message it will read from us. A notice we received is passed on as it is (it names the
  // rank that failed first), except to that rank itself. Then drops what peers sent under the
  // tag. Best effort: a notice that cannot be sent leaves next to its deadline.
  void Abort(const Status& status) {
    if (world_ == 1) return;
    AbortNotice notice = received_notice_.value_or(
        AbortNotice{rank_, status.code(), status.message()});
    if (notice.origin != next_ && next_send_slot_ < total_sends_) {
      if (notice.message.size() > kMaxNoticeBytes) notice.message.resize(kMaxNoticeBytes);
      if (options_.links != nullptr) {
        const Piece piece{kAbortChunk, static_cast<uint64_t>(notice.code),
                          notice.message.size()};
        ReceivedChunk frame = Frame(next_send_slot_, piece,
                                    notice.message.empty() ? Payload()
                                                           : Payload::FromString(notice.message));
        frame.dtype = proto::DType::UInt8;
        frame.fingerprint = static_cast<uint64_t>(notice.origin);
        // Best effort, briefly: a successor that reads gets it at once.
        if (options_.links->Send(std::move(frame)).ok()) {
          (void)options_.links->Flush(Deadline::AfterMillis(kAbortFlushMs));
        }
      } else {
        MessageBuilder builder(proto::Role::Worker, rank_);
        const int32_t frame = notice.message.empty()
                                  ? -1
                                  : builder.AddPayload(Payload::FromString(notice.message));
        std::vector<int64_t> shape = {static_cast<int64_t>(notice.message.size())};
        auto data = proto::CreateTensorMetaDirect(builder.fbb(), call_.tensor.c_str(), 0,
                                                  proto::DType::UInt8, &shape, frame, 0,
                                                  notice.message.size());
        auto body = proto::CreateCollectiveChunk(
            builder.fbb(), call_.tag, call_.op, WireReduceOp(call_.reduce_op), next_send_slot_,
            kAbortChunk, proto::DType::UInt8, static_cast<uint64_t>(notice.code),
            notice.message.size(), static_cast<uint64_t>(notice.origin), data);
        const std::string& address = options_.peer_addresses[static_cast<size_t>(next_)];
        (void)options_.transport->Send(address, builder.Finish(body, /*request_id=*/0));
      }
    }
    // Chunks that peers sent before they noticed would wait forever under a tag nobody pops.
    if (options_.links != nullptr) {
      options_.links->Discard(call_.tag);
    } else {
      options_.mailbox->Discard(call_.tag);
    }
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
    if (call_.count > std::numeric_limits<size_t>::max() / element_bytes_ / 2) {
      return InvalidArgumentError(Prefix() + ": count " + std::to_string(call_.count) +
                                  " is too large");
    }
    if (call_.op == proto::CollectiveOp::Broadcast &&
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
    return call_.op == proto::CollectiveOp::AllReduce ||
           call_.op == proto::CollectiveOp::ReduceScatter;
  }

  // "step 4", or "step 4, segment 2 of 8" when blocks have several segments.
  std::string Where(uint32_t step, int k, const Piece& piece) const {
    std::string where = "step " + std::to_string(step);
    if (piece.chunk != kHandshakeChunk && segments_ > 1) {
      where += ", segment " + std::to_string(k) + " of " + std::to_string(segments_);
    }
    return where;
  }

  std::string Describe(const Piece& piece) const {
    if (piece.chunk == kHandshakeChunk) return "a handshake without elements";
    if (call_.op == proto::CollectiveOp::Broadcast) {
      return "root " + Worker(static_cast<int>(piece.chunk)) + "'s elements " +
             Range(piece.offset, piece.count);
    }
    return "block " + std::to_string(piece.chunk) + " elements " +
           Range(piece.offset, piece.count);
  }

  const RingCollectivesOptions& options_;
  RingCollectives::StagingPool& pool_;
  const Call& call_;
  const int world_;
  const int rank_;
  const int next_;
  const int prev_;
  const size_t element_bytes_;  // 1 for an unknown dtype, which CheckCall rejects
  const Deadline deadline_;
  // Over links: sends borrow the caller's buffers instead of staging (see "borrowing").
  const bool borrows_;
  size_t max_block_ = 0;       // elements of the largest block
  uint64_t segments_ = 1;      // S
  uint64_t total_sends_ = 0;   // messages this rank sends to next in a successful call
  uint32_t next_send_slot_ = 0;  // the wire `step` of our next message to next
  uint32_t next_recv_slot_ = 0;  // the wire `step` of prev's next message to us
  std::optional<AbortNotice> received_notice_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// RingCollectives

StatusOr<std::vector<std::string>> RingPeerAddresses(const FleetView& view) {
  std::vector<const MemberInfo*> workers = view.OfRole(Role::kWorker);
  std::vector<std::string> addresses;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i]->rank != static_cast<int>(i)) {
      return InternalError("the fleet view's worker ranks are not 0.." +
                           std::to_string(workers.size() - 1) + ": found " +
                           workers[i]->Name() + " at position " + std::to_string(i));
    }
    addresses.push_back(workers[i]->address);
  }
  return addresses;
}

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
  if (options.peer_addresses.size() != static_cast<size_t>(options.world_size)) {
    return InvalidArgumentError(where + "peer_addresses holds " +
                                std::to_string(options.peer_addresses.size()) +
                                " addresses for a world_size of " +
                                std::to_string(options.world_size));
  }
  if (options.world_size > 1 && options.transport == nullptr) {
    return InvalidArgumentError(where + "transport is null");
  }
  if (options.world_size > 1 && options.mailbox == nullptr) {
    return InvalidArgumentError(where + "mailbox is null");
  }
  if (options.timeout_ms <= 0) {
    return InvalidArgumentError(where + "timeout_ms " + std::to_string(options.timeout_ms) +
                                " is not positive");
  }
  if (options.links != nullptr && options.world_size > 1 &&
      options.links->rank() != options.rank) {
    return InvalidArgumentError(where + "links are rank " + std::to_string(options.links->rank()) +
                                "'s, not rank " + std::to_string(options.rank) + "'s");
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
  const Call call{proto::CollectiveOp::AllReduce, dtype, op, count, 0, tensor, tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(run.CheckBuffer("data", data, count),
                     [&] { return run.AllReduce(static_cast<uint8_t*>(data)); });
}

Status RingCollectives::ReduceScatter(const void* input, void* output, size_t count,
                                      DataType dtype, ReduceOp op, const std::string& tensor,
                                      uint64_t tag) {
  const Call call{proto::CollectiveOp::ReduceScatter, dtype, op, count, 0, tensor, tag};
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
  const Call call{proto::CollectiveOp::AllGather, dtype, ReduceOp::kSum, count, 0, tensor, tag};
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
  const Call call{proto::CollectiveOp::Broadcast, dtype, ReduceOp::kSum, count, root, tensor,
                  tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(run.CheckBuffer("data", data, count),
                     [&] { return run.Broadcast(static_cast<uint8_t*>(data)); });
}

Status RingCollectives::Barrier(uint64_t tag) {
  static const std::string kNoTensor;
  const Call call{proto::CollectiveOp::Barrier, DataType::kFloat32, ReduceOp::kSum, 0, 0,
                  kNoTensor, tag};
  RingRun run(options_, *staging_, call);
  return run.Execute(OkStatus(), [&] { return run.Handshake(0); });
}

}  // namespace tessera::worker
