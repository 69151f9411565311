// The workers' communicator and the strategies that train on it (allreduce, zero1-3): the
// world's Communicator (worker/collectives/communicator.h) built from the fleet view as every
// collective mode and the all-reduce benchmark build it, and a TrainingStrategy that owns it,
// its stop grace and an engine running on it.
//
// Thread-safety: called from the training thread.
#ifndef TESSERA_WORKER_MODES_RING_STRATEGY_H_
#define TESSERA_WORKER_MODES_RING_STRATEGY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/communicator.h"
#include "worker/engines/training_engine.h"
#include "worker/modes/mode_context.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// The workers' world communicator, from the fleet view (--ring-transport, --segment-kb,
// --ring-spin-us); its ring's channel is logged. REQUIRES: context.client is not null.
StatusOr<std::unique_ptr<Communicator>> MakeWorkerWorld(const ModeContext& context);

// Builds the engine of a ring strategy on `collectives` (which outlives it).
using RingEngineFactory =
    std::function<StatusOr<std::unique_ptr<TrainingEngine>>(Collectives* collectives)>;

// Builds the engine of a ring strategy on groups it makes from `world` (Split): it hands them
// to *groups, which the strategy keeps until after the engine is gone.
using GroupedEngineFactory = std::function<StatusOr<std::unique_ptr<TrainingEngine>>(
    Communicator* world, std::vector<std::unique_ptr<Collectives>>* groups)>;

// A strategy whose engine runs collectives on the workers' world: its communicator, a stop
// grace that
// ends a wait on a peer that never answers after a stop (not with a checkpoint on stop), and
// the engine `make_engine` builds on it. OnStopAgreed disarms the grace and sets
// *every_rank_stops. With context.mesh_dims, the world is first made into that mesh
// ("dp", "pp", "tp"; the strategy's mesh()) and the engine runs on its "dp" group instead
// (group_tags.h folds its tags), so that data parallelism reduces across the replicas of one
// pipeline stage and tensor slice.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeRingStrategy(const StrategyContext& context,
                                                            const RingEngineFactory& make_engine);
// The same, for an engine on groups of the world (--mode hsdp).
StatusOr<std::unique_ptr<TrainingStrategy>> MakeGroupedRingStrategy(
    const StrategyContext& context, const GroupedEngineFactory& make_engine);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_RING_STRATEGY_H_
