// SpinUntil: the "spin" half of a spin-then-wait. A thread about to sleep on a condition
// variable (or a future) first polls for what it waits for, for at most spin_us, because the
// wake-up that ends a sleep costs microseconds, and tens of them when the core has gone idle
// (issue 45 put the comm thread's hand-off at ~17 us per op), where a poll costs nanoseconds.
// Each round yields the core, so that on a host with more runnable threads than cores the
// spinner gives way to the others.
//
//   if (!SpinUntil([&] { return signals_.load() != seen; }, spin_us)) cv_.wait(lock, ...);
//
// Thread-safety: `ready` is called on the calling thread only; it must be safe to call without
// the lock that guards what it reads (an atomic, a future's wait_for(0)).
#ifndef TESSERA_WORKER_COLLECTIVES_SPIN_WAIT_H_
#define TESSERA_WORKER_COLLECTIVES_SPIN_WAIT_H_

#include <chrono>
#include <cstdint>
#include <thread>

namespace tessera::worker {

// The default of CommThread's and CommPool's spin_us, tessera-worker --comm-spin-us and
// TESSERA_COMM_SPIN_US: 0, never spin. Measured on the 2-core VMs (docs/benchmarks.md, issue
// 45): DDP on tessera over Gloo (tessera-bench torch, MLP, 2 ranks) was 1.35-1.53x with 0 and
// 1.39-1.55x with 20, 50 or 200 us, i.e. no gain beyond the noise; a 4 KiB all-reduce gained
// ~1.3 us (11.3 -> 10.0 us) and sometimes lost 4-6 us. There each rank has a training thread and
// a comm thread, twice as many busy threads as cores, and a comm thread that spins takes the
// core its training thread needs; and a wake-up costs ~0.5 us at the median (2 us in all).
// On hosts with cores to spare, 20-50 us removes the slow wake-ups (p90 55 -> 1.5 us) without
// costing compute: measure there before raising it.
inline constexpr int64_t kDefaultCommSpinUs = 0;
// The largest spin_us the flags and the environment accept: 1 s. A longer spin is no longer a
// spin-then-wait but a busy core.
inline constexpr int64_t kMaxCommSpinUs = 1000000;

// Polls `ready` until it returns true (true) or spin_us have passed (false: the caller
// sleeps). Never polls past spin_us; spin_us <= 0 polls once.
template <typename Ready>
bool SpinUntil(Ready&& ready, int64_t spin_us) {
  if (ready()) return true;
  if (spin_us <= 0) return false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  do {
    std::this_thread::yield();
    if (ready()) return true;
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_SPIN_WAIT_H_
