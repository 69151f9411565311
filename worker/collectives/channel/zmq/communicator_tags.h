// Communicator tags: how the frames of several communicators (the world and its groups, see
// worker/collectives/communicator.h) share one transport endpoint and one CollectiveMailbox
// without taking each other's frames. The mailbox matches frames by (tag, slot), so each
// communicator's frames travel under tags of its own: its id rides in the tag.
//
// A tag on the wire, by its top byte:
//   0x00-0x7f  the world's collectives: their tags exactly as the caller gave them (the native
//              engines' tags, e.g. 1 << 41 + step * 65536 + bucket, below 2^63), as before
//              there were groups, so the world's frames are what they always were.
//   0x80-0xfe  a space (below) | communicator id (bits 32-55) | a 32-bit tag in that space.
//   0xff       ring channel setup (kRingLinksSetupTag and its neighbours, ~0 - k): the world's
//              as they are (their id bits read 0xffffff, which no group gets); a group's carry
//              its id in bits 32-55.
// A group's collectives take tags below 2^32 (their callers count calls); WireTag refuses
// larger ones, naming the group.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COMMUNICATOR_TAGS_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COMMUNICATOR_TAGS_H_

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tessera::worker {

// The world's id; groups get 1 .. kMaxCommunicatorId.
inline constexpr uint32_t kWorldCommunicator = 0;
inline constexpr uint32_t kMaxCommunicatorId = 0xfffffe;

// The spaces of the top byte.
enum class TagSpace : uint8_t {
  kGroupCollective = 0x80,  // a group's collectives (the world's need no space)
  kPointToPoint = 0x81,     // Send / Recv
  kAllToAll = 0x82,         // one all-to-all per tag
  kMonitor = 0x83,          // monitored barriers: arrivals and releases
  kSetup = 0xff,            // ring channel setup
};

// A tag of `space` for communicator `id`, as it travels: the form WireTag passes on as is.
inline constexpr uint64_t SpaceTag(TagSpace space, uint32_t id, uint32_t tag) {
  return (uint64_t{static_cast<uint8_t>(space)} << 56) | (uint64_t{id & 0xffffffu} << 32) | tag;
}

// The tag communicator `id` sends and receives `tag` under (see the file comment): the world's
// tags as they are; a group's collective tag (below 2^32) in kGroupCollective, its setup tags
// with the id in bits 32-55, and a SpaceTag of its own as it is. InvalidArgument for a group's
// tag that fits none of them.
inline StatusOr<uint64_t> WireTag(uint32_t id, uint64_t tag) {
  if (id == kWorldCommunicator) return tag;
  const uint8_t top = static_cast<uint8_t>(tag >> 56);
  const uint32_t tag_id = static_cast<uint32_t>(tag >> 32) & 0xffffffu;
  if (top == static_cast<uint8_t>(TagSpace::kSetup)) {
    return (tag & 0xff000000ffffffffull) | (uint64_t{id} << 32);
  }
  if (top >= 0x80 && tag_id == id) return tag;  // a SpaceTag of this communicator
  if (tag <= 0xffffffffull) {
    return SpaceTag(TagSpace::kGroupCollective, id, static_cast<uint32_t>(tag));
  }
  return InvalidArgumentError("tag " + std::to_string(tag) + " does not fit communicator " +
                              std::to_string(id) +
                              ": a group's collectives take tags below 2^32");
}

// Whether `wire` (a tag as it travels) is one of group `id`'s. REQUIRES: id is a group's.
inline constexpr bool IsGroupsWireTag(uint32_t id, uint64_t wire) {
  return (wire >> 63) != 0 && ((wire >> 32) & 0xffffffu) == id;
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ZMQ_COMMUNICATOR_TAGS_H_
