// --mode local: this worker trains the model alone (worker/engines/local_engine.h), the
// reference every distributed mode is compared against; standalone or as a fleet member.
#ifndef TESSERA_WORKER_MODES_LOCAL_STRATEGY_H_
#define TESSERA_WORKER_MODES_LOCAL_STRATEGY_H_

#include <memory>

#include "common/base/status.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// context.mode.client may be null (standalone); it is not used.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeLocalStrategy(const StrategyContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_LOCAL_STRATEGY_H_
