// AdaptiveSpin: how long a thread that waits for a ring neighbour keeps polling without
// sleeping, adapted to how long its recent waits actually took.
//
//   AdaptiveSpin spin(/*cap_us=*/200);
//   const auto spin_until = start + std::chrono::microseconds(spin.budget_us());
//   ... poll without sleeping until spin_until (yielding the core each round), then sleep ...
//   spin.Record(waited_us);  // how long the wait took, spinning and sleeping together
//
// Why: a thread that sleeps in poll() pays a wake-up of ~20-25 us per message on the 2-core
// machines (docs/benchmarks.md, "ring links"), 2-5x the whole message time at 4 KiB. Spinning
// for a fixed time wins on an idle machine but, under contention, burns the core the peer
// needs. The policy below spins only while spinning pays: after a wait that ended within the
// cap (so spinning could have caught it) the budget is twice that wait; after a wait longer
// than the cap it halves, down to 0, so a long or contended wait costs little CPU. The waits'
// own durations bring it back once they are short again.
//
// Thread-safety: none; the owner guards it (RingLinks keeps one per direction under its mutex).
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_ADAPTIVE_SPIN_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_ADAPTIVE_SPIN_H_

#include <cstdint>

namespace tessera::worker {

// A budget below this is not worth a round of polling; it becomes 0.
inline constexpr int64_t kMinSpinBudgetUs = 4;

// The spin budget after a wait of `waited_us` spun for up to `budget_us` (the policy above):
//   cap_us <= 0                     -> 0 (spinning disabled)
//   waited_us <= budget_us          -> budget_us (the spin caught it: keep)
//   budget_us < waited_us <= cap_us -> min(cap_us, 2 * waited_us) (spinning would have caught it)
//   waited_us > cap_us              -> budget_us / 2, or 0 below kMinSpinBudgetUs
// The result is always in [0, cap_us].
inline int64_t NextSpinBudgetUs(int64_t budget_us, int64_t waited_us, int64_t cap_us) {
  if (cap_us <= 0) return 0;
  if (budget_us > cap_us) budget_us = cap_us;
  if (budget_us < 0) budget_us = 0;
  if (waited_us <= budget_us) return budget_us;
  if (waited_us <= cap_us) return waited_us > cap_us / 2 ? cap_us : 2 * waited_us;
  const int64_t halved = budget_us / 2;
  return halved < kMinSpinBudgetUs ? 0 : halved;
}

class AdaptiveSpin {
 public:
  // Starts at the cap: the first waits spin, and the policy learns from them.
  explicit AdaptiveSpin(int64_t cap_us)
      : cap_us_(cap_us > 0 ? cap_us : 0), budget_us_(cap_us_) {}

  int64_t cap_us() const { return cap_us_; }
  int64_t budget_us() const { return budget_us_; }

  void Record(int64_t waited_us) {
    budget_us_ = NextSpinBudgetUs(budget_us_, waited_us, cap_us_);
  }

 private:
  const int64_t cap_us_;
  int64_t budget_us_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_ADAPTIVE_SPIN_H_
