// What the ring links' tests share: byte patterns, fixed job keys, and one loopback listener per
// rank, as ring channel setup makes them before the ranks swap addresses.
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_TESTING_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/security/job_key.h"
#include "worker/collectives/channel/links/ring_links.h"

namespace tessera::worker::testing {

// `bytes` bytes that differ by position and by `seed`.
inline std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  return out;
}

// A job key of 32 bytes `fill`: ranks given the same fill hold the same key.
inline JobKey KeyOf(uint8_t fill) {
  KeyBytes bytes;
  bytes.fill(fill);
  return JobKey::FromBytes(bytes);
}

struct Listeners {
  explicit Listeners(int world) {
    for (int rank = 0; rank < world; ++rank) {
      auto listener = RingLinks::Listen("127.0.0.1");
      EXPECT_TRUE(listener.ok()) << listener.status();
      addresses.push_back((*listener)->address);
      listeners.push_back(std::move(listener).value());
    }
  }
  std::vector<std::unique_ptr<RingLinks::Listener>> listeners;
  std::vector<std::string> addresses;
};

}  // namespace tessera::worker::testing

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_LINKS_RING_LINKS_TESTING_H_
