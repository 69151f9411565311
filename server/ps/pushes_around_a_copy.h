// PushAroundACopy: the workers' side of the tests that take a range's copy for a joined server
// (DenseShard::CopyTo, SparseTables::CopyTo) while pushes are in flight, so that a copy and the
// updates forwarded after it can be checked to be one cut (and ThreadSanitizer sees CopyTo
// race the pushes' locks).
//
//   PushAroundACopy(/*workers=*/2, /*steps=*/200,
//                   [&](int rank, int64_t step) { ...push step `step` of worker `rank`... },
//                   [&] { copy = primary.CopyTo(...); });
#ifndef TESSERA_SERVER_PS_PUSHES_AROUND_A_COPY_H_
#define TESSERA_SERVER_PS_PUSHES_AROUND_A_COPY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace tessera::server {

// Runs `push(rank, step)` for steps 1, 2, ... of each of `workers` workers on a thread of its
// own, and `copy()` on this thread once half of the first `steps` pushes were made. Each worker
// pushes at least `steps` steps, and at least one that starts after `copy` returned. Returns
// once every worker has.
inline void PushAroundACopy(int workers, int64_t steps,
                            const std::function<void(int rank, int64_t step)>& push,
                            const std::function<void()>& copy) {
  std::atomic<int64_t> pushed{0};
  std::atomic<bool> copied{false};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      bool after_copy = false;
      for (int64_t step = 1; step <= steps || !after_copy; ++step) {
        after_copy = copied.load();
        push(rank, step);
        pushed.fetch_add(1);
      }
    });
  }
  while (pushed.load() < steps / 2) std::this_thread::yield();
  copy();
  copied = true;
  for (std::thread& thread : threads) thread.join();
}

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_PUSHES_AROUND_A_COPY_H_
