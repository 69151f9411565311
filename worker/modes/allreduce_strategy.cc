#include "worker/modes/allreduce_strategy.h"

#include "worker/engines/allreduce_engine.h"
#include "worker/modes/ring_strategy.h"

namespace tessera::worker {
namespace {

StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyContext& context,
                                                         int zero_stage) {
  return MakeRingStrategy(
      context, [&context, zero_stage](
                   Collectives* collectives) -> StatusOr<std::unique_ptr<TrainingEngine>> {
        const ModeFlags& flags = *context.mode.flags;
        AllReduceEngineOptions options;
        options.zero_stage = zero_stage;
        options.optimizer = context.optimizer;
        options.schedule = context.schedule;
        options.bucket_bytes = static_cast<uint64_t>(flags.bucket_mb * (1 << 20));
        options.overlap = !flags.no_overlap;
        options.comm_spin_us = flags.comm_spin_us;
        options.restores_checkpoints_of = context.restores_checkpoints_of;
        ASSIGN_OR_RETURN(std::unique_ptr<AllReduceEngine> engine,
                         AllReduceEngine::Create(options, collectives,
                                                 &context.mode.runtime->metrics()));
        return std::unique_ptr<TrainingEngine>(std::move(engine));
      });
}

}  // namespace

StatusOr<std::unique_ptr<TrainingStrategy>> MakeAllReduceStrategy(const StrategyContext& context) {
  return MakeStrategy(context, /*zero_stage=*/0);
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakeZero1Strategy(const StrategyContext& context) {
  return MakeStrategy(context, /*zero_stage=*/1);
}

}  // namespace tessera::worker
