// KeptFrames: the frames a ring channel has received, kept by (tag, slot) until a Recv takes
// them. Frames read while waiting for another slot, or for another concurrent call, wait here.
//
// Thread-safety: none; the channel guards it with its own lock.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_KEPT_FRAMES_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_KEPT_FRAMES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <utility>

#include "common/messages/ring_frame.h"

namespace tessera::worker {

// More kept frames than this mean frames arrive for no running collective: a channel fails
// rather than grow without bound.
inline constexpr size_t kMaxKeptFrames = 65536;

class KeptFrames {
 public:
  // Keeps `frame` under (frame.tag, frame.slot), after any kept before under the same key.
  void Keep(RingFrame frame) {
    const std::pair<uint64_t, uint32_t> key{frame.tag, frame.slot};
    frames_[key].push_back(std::move(frame));
    ++count_;
  }

  bool Has(uint64_t tag, uint32_t slot) const { return frames_.count({tag, slot}) != 0; }

  // The oldest frame kept under (tag, slot). REQUIRES: Has(tag, slot).
  RingFrame Take(uint64_t tag, uint32_t slot) {
    auto found = frames_.find({tag, slot});
    RingFrame frame = std::move(found->second.front());
    found->second.pop_front();
    if (found->second.empty()) frames_.erase(found);
    --count_;
    return frame;
  }

  // Drops every frame kept under `tag` (see RingChannel::Discard).
  void Discard(uint64_t tag) {
    for (auto it = frames_.lower_bound({tag, 0}); it != frames_.end() && it->first.first == tag;) {
      count_ -= it->second.size();
      it = frames_.erase(it);
    }
  }

  // Drops every frame whose tag `matches` (a destroyed group's).
  void DiscardIf(const std::function<bool(uint64_t tag)>& matches) {
    for (auto it = frames_.begin(); it != frames_.end();) {
      if (!matches(it->first.first)) {
        ++it;
        continue;
      }
      count_ -= it->second.size();
      it = frames_.erase(it);
    }
  }

  size_t size() const { return count_; }

 private:
  std::map<std::pair<uint64_t, uint32_t>, std::deque<RingFrame>> frames_;
  size_t count_ = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_KEPT_FRAMES_H_
