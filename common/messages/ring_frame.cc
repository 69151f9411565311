#include "common/messages/ring_frame.h"

namespace tessera {

std::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "allreduce";
    case CollectiveOp::kReduceScatter: return "reducescatter";
    case CollectiveOp::kAllGather: return "allgather";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSendRecv: return "sendrecv";
    case CollectiveOp::kAllToAll: return "alltoall";
  }
  return "invalid";
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
  }
  return "invalid";
}

std::string_view RingFrameKindName(RingFrameKind kind) {
  switch (kind) {
    case RingFrameKind::kData: return "data";
    case RingFrameKind::kHandshake: return "handshake";
    case RingFrameKind::kAbort: return "abort";
  }
  return "invalid";
}

}  // namespace tessera
