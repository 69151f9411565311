// The workers' ring and the strategies that train on it (allreduce, zero1-3): the ring built
// from the fleet view as every collective mode and the all-reduce benchmark build it, and a
// TrainingStrategy that owns the ring, its stop grace and an engine running on it.
//
// Thread-safety: called from the training thread.
#ifndef TESSERA_WORKER_MODES_RING_STRATEGY_H_
#define TESSERA_WORKER_MODES_RING_STRATEGY_H_

#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/engines/training_engine.h"
#include "worker/modes/mode_context.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// The workers' ring, from the fleet view (--ring-transport, --segment-kb, --ring-spin-us).
// Sets *channel_description (if not null) to the channel it chose, as logged.
// REQUIRES: context.client is not null.
StatusOr<std::unique_ptr<RingCollectives>> MakeWorkerRing(
    const ModeContext& context, std::string* channel_description = nullptr);

// Builds the engine of a ring strategy on `collectives` (which outlives it).
using RingEngineFactory =
    std::function<StatusOr<std::unique_ptr<TrainingEngine>>(Collectives* collectives)>;

// A strategy whose engine runs collectives on the workers' ring: the ring, a stop grace that
// ends a wait on a peer that never answers after a stop (not with a checkpoint on stop), and
// the engine `make_engine` builds on it. OnStopAgreed disarms the grace and sets
// *every_rank_stops.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeRingStrategy(const StrategyContext& context,
                                                            const RingEngineFactory& make_engine);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_RING_STRATEGY_H_
