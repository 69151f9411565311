// RingFrame: what one rank of a ring collective sends its successor, whichever channel carries
// it (shared memory, TCP links, or the transport as a CollectiveChunk message).
//
// A frame is one of three kinds:
//   data       a segment of the buffer: elements [element_offset, +element_count) of block
//              `block`, in `dtype`, as `data`;
//   handshake  no elements: a barrier step, or a broadcast's closing handshake;
//   abort      the sender's call failed: `notice` says who failed first and why (`data` empty).
// Every kind carries what the call is about (tag, op, reduce op, dtype, the whole buffer's
// element count), so the receiver checks that both ranks run the same call before it uses a
// byte, and `slot`, the frame's number among those of the call on this link.
//
// Thread-safety: a value type; copies share the data.
#ifndef TESSERA_COMMON_MESSAGES_RING_FRAME_H_
#define TESSERA_COMMON_MESSAGES_RING_FRAME_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/data_type.h"
#include "common/base/payload.h"
#include "common/base/status.h"

namespace tessera {

// kSendRecv and kAllToAll are not ring calls: they mark the point-to-point frames of a torch
// process group (worker/torch/group_member.h), which travel on the same channels. New ops go at
// the end (the numbering is a byte of the direct channels' frame header).
enum class CollectiveOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kSendRecv,
  kAllToAll,
};

// How AllReduce and ReduceScatter combine the ranks' elements (what each means for each dtype:
// worker/collectives/collectives.h). kAverage is the sum divided by the world size, once, at the
// end; floating-point dtypes only. The numbering is part of the direct ring channels' frame
// header (a byte): new ops go at the end.
enum class ReduceOp { kSum, kAverage, kMax, kMin, kProduct };

// "allreduce", "reducescatter", "allgather", "broadcast", "barrier", "sendrecv", "alltoall"
// ("invalid" otherwise).
std::string_view CollectiveOpName(CollectiveOp op);
// "sum", "average", "max", "min", "product" ("invalid" outside the enum).
std::string_view ReduceOpName(ReduceOp op);

enum class RingFrameKind { kData, kHandshake, kAbort };
std::string_view RingFrameKindName(RingFrameKind kind);

// A failure passed around the ring unchanged, so every rank reports the root cause.
struct AbortNotice {
  int32_t origin = -1;  // the rank that failed first
  StatusCode code = StatusCode::kUnknown;
  std::string message;  // its error, which names it
};

// Abort notices longer than this are cut (they quote an error, not data).
inline constexpr size_t kMaxAbortMessageBytes = 4096;

struct RingFrame {
  RingFrameKind kind = RingFrameKind::kData;
  int32_t sender_rank = -1;
  uint64_t tag = 0;
  CollectiveOp op = CollectiveOp::kAllReduce;
  ReduceOp reduce_op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  uint64_t buffer_elements = 0;  // the whole buffer's element count on the sender
  uint32_t slot = 0;             // the frame's number among the call's frames on this link
  // The transport channel's number of the frame among those it sent this receiver (its
  // receiver drops a frame the transport delivered twice); 0 on the direct channels, which
  // cannot deliver twice.
  uint64_t sequence = 0;
  // kData: which elements `data` holds.
  uint32_t block = 0;
  uint64_t element_offset = 0;
  uint64_t element_count = 0;
  Payload data;
  // kAbort only.
  AbortNotice notice;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_RING_FRAME_H_
