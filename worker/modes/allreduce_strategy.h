// --mode allreduce and zero1: the all-reduce engine (worker/engines/allreduce_engine.h) on the
// workers' ring; zero1 is the same engine with the optimizer state partitioned (ZeRO stage 1).
#ifndef TESSERA_WORKER_MODES_ALLREDUCE_STRATEGY_H_
#define TESSERA_WORKER_MODES_ALLREDUCE_STRATEGY_H_

#include <memory>

#include "common/base/status.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// --bucket-mb, --no-overlap and the ring's flags. REQUIRES: context.mode.client is not null.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeAllReduceStrategy(const StrategyContext& context);
StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero1Strategy(const StrategyContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_ALLREDUCE_STRATEGY_H_
