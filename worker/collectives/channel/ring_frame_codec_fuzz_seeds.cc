// Writes the seed corpus of ring_frame_codec_fuzzer: one data, handshake and abort frame per
// collective, as the direct channels put them on the wire (header, then payload).
//
//   cd worker/collectives/channel &&
//     bazel run :ring_frame_codec_fuzz_seeds -- $PWD/ring_frame_codec_fuzz_corpus
#include <cstdio>
#include <fstream>
#include <string>

#include "worker/collectives/channel/ring_frame_codec.h"

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::worker;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int written = 0;
  auto write = [&](const std::string& name, const RingFrame& frame) {
    const Payload payload = FramePayload(frame);
    uint8_t header[kFrameHeaderBytes];
    EncodeFrameHeader(frame, payload.size(), header);
    std::ofstream out(std::string(argv[1]) + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(payload.data()), payload.size());
    ++written;
  };
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kReduceScatter,
                          CollectiveOp::kAllGather, CollectiveOp::kBroadcast,
                          CollectiveOp::kBarrier}) {
    const std::string name(CollectiveOpName(op));
    RingFrame data;
    data.kind = RingFrameKind::kData;
    data.sender_rank = 1;
    data.tag = 7;
    data.op = op;
    data.reduce_op = ReduceOp::kSum;
    data.dtype = DataType::kFloat32;
    data.slot = 3;
    data.block = 1;
    data.element_offset = 4;
    data.element_count = 4;
    data.buffer_elements = 16;
    data.data = Payload::FromString(std::string(16, '\x3f'));
    write(name + "-data", data);
    RingFrame handshake = data;
    handshake.kind = RingFrameKind::kHandshake;
    handshake.element_count = 0;
    handshake.data = Payload();
    write(name + "-handshake", handshake);
    RingFrame abort = handshake;
    abort.kind = RingFrameKind::kAbort;
    abort.notice = AbortNotice{2, StatusCode::kUnavailable, "worker 2 failed: closed"};
    write(name + "-abort", abort);
  }
  std::printf("wrote %d seeds to %s\n", written, argv[1]);
  return 0;
}
