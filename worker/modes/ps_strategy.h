// --mode ps-sync, ps-async and ps-ssp: the parameter-server engine (worker/engines/ps_engine.h;
// the servers hold the parameters and apply the optimizer). The three are one engine with a
// consistency parameter (sync: BSP, async: ASP, ssp: stale-synchronous with --staleness K),
// so they share this file and differ in one registry line each.
#ifndef TESSERA_WORKER_MODES_PS_STRATEGY_H_
#define TESSERA_WORKER_MODES_PS_STRATEGY_H_

#include <memory>

#include "common/base/status.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// --staleness (ps-ssp), --ps-chunk-elements, --ps-shared-memory, --ps-resend-ms. The fleet
// client's peer-loss and fleet-change handlers reach the engine while the strategy lives.
// REQUIRES: context.mode.client is not null.
StatusOr<std::unique_ptr<TrainingStrategy>> MakePsSyncStrategy(const StrategyContext& context);
StatusOr<std::unique_ptr<TrainingStrategy>> MakePsAsyncStrategy(const StrategyContext& context);
StatusOr<std::unique_ptr<TrainingStrategy>> MakePsSspStrategy(const StrategyContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_PS_STRATEGY_H_
