// --mode zero2 and zero3: the ZeRO engine (worker/engines/zero_engine.h) on the workers' ring,
// with the gradients (zero2), and the parameters too (zero3), partitioned across the workers.
// (zero1 is the all-reduce engine's: allreduce_strategy.h.)
#ifndef TESSERA_WORKER_MODES_ZERO_STRATEGY_H_
#define TESSERA_WORKER_MODES_ZERO_STRATEGY_H_

#include <memory>

#include "common/base/status.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// --no-overlap (no prefetch) and the ring's flags. REQUIRES: context.mode.client is not null.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero2Strategy(const StrategyContext& context);
StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero3Strategy(const StrategyContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_ZERO_STRATEGY_H_
