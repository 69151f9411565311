#include "worker/modes/zero_strategy.h"

#include "worker/engines/zero_engine.h"
#include "worker/modes/ring_strategy.h"

namespace tessera::worker {
namespace {

StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyContext& context,
                                                         int stage) {
  return MakeRingStrategy(
      context,
      [&context, stage](Collectives* collectives) -> StatusOr<std::unique_ptr<TrainingEngine>> {
        ZeroEngineOptions options;
        options.stage = stage;
        options.optimizer = context.optimizer;
        options.schedule = context.schedule;
        options.prefetch = !context.mode.flags->no_overlap;
        options.comm_spin_us = context.mode.flags->comm_spin_us;
        // A wait covers one block's collectives, each bounded by the request timeout.
        options.wait_timeout_ms = 4 * context.mode.runtime->config().request_timeout_ms;
        options.restores_checkpoints_of = context.restores_checkpoints_of;
        ASSIGN_OR_RETURN(std::unique_ptr<ZeroEngine> engine,
                         ZeroEngine::Create(options, collectives,
                                            &context.mode.runtime->metrics()));
        return std::unique_ptr<TrainingEngine>(std::move(engine));
      });
}

}  // namespace

StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero2Strategy(const StrategyContext& context) {
  return MakeStrategy(context, /*stage=*/2);
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero3Strategy(const StrategyContext& context) {
  return MakeStrategy(context, /*stage=*/3);
}

}  // namespace tessera::worker
