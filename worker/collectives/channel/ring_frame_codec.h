// The byte form of a RingFrame (common/messages/ring_frame.h) on the direct channels (TCP
// links, shared memory), which carry frames as a 64-byte header followed by a payload. (Through
// the transport, frames travel as CollectiveChunk messages instead: common/wire.)
//
// Header (bytes, host byte order: every rank of a ring runs on the same architecture):
//   0 magic u32, 4 sender rank i32, 8 tag u64, 16 slot u32, 20 block u32, 24 op u8,
//   25 reduce op u8, 26 dtype u8, 27 kind u8, 28..31 zero, 32 element offset u64,
//   40 element count u64, 48 buffer elements u64, 56 payload bytes u64.
// Payload: a data frame's elements; an abort frame's notice (origin i32, status code u32, then
//   the message's bytes); nothing for a handshake.
// The enum bytes are the enums' own numbers (CollectiveOp, ReduceOp, DataType, RingFrameKind),
// which only ever grow at the end; the header has no version of its own because the channel is
// set up through the transport, whose messages carry kWireVersion (common/wire/wire_codec.h),
// bumped with them.
//
// Decoding checks everything before anything is allocated or used: the magic, every enum's
// range, the payload size against a cap, and that the kind and the payload agree. A byte
// stream cannot be resynchronised, so a channel fails its direction on the first bad header.
//
// Thread-safety: free functions.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_FRAME_CODEC_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_FRAME_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "common/base/payload.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"

namespace tessera::worker {

inline constexpr size_t kFrameHeaderBytes = 64;

// The bytes that follow `frame`'s header: its data (a data frame), its encoded notice (an
// abort frame; a copy, owned), or nothing (a handshake).
Payload FramePayload(const RingFrame& frame);

// Writes `frame`'s header, declaring `payload_bytes` (FramePayload(frame).size()).
void EncodeFrameHeader(const RingFrame& frame, uint64_t payload_bytes, uint8_t* header);

// Decodes a header into `frame` (its data and notice stay empty) and the size of the payload
// that follows. InvalidArgument saying what is wrong: the magic, a value out of range, a
// payload over `max_payload_bytes`.
Status DecodeFrameHeader(const uint8_t* header, size_t max_payload_bytes, RingFrame* frame,
                         uint64_t* payload_bytes);

// Completes a decoded frame with its payload: a data frame's data, an abort frame's notice.
// InvalidArgument for a notice too short to hold its fields or a handshake with a payload.
Status AttachFramePayload(RingFrame* frame, Payload payload);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_RING_FRAME_CODEC_H_
