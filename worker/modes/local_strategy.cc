#include "worker/modes/local_strategy.h"

#include <utility>

#include "worker/engines/local_engine.h"

namespace tessera::worker {
namespace {

// Thread-safety: the training thread only.
class LocalStrategy final : public TrainingStrategy {
 public:
  explicit LocalStrategy(std::unique_ptr<LocalEngine> engine) : engine_(std::move(engine)) {}
  TrainingEngine* engine() override { return engine_.get(); }

 private:
  const std::unique_ptr<LocalEngine> engine_;
};

}  // namespace

StatusOr<std::unique_ptr<TrainingStrategy>> MakeLocalStrategy(const StrategyContext& context) {
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine,
                   LocalEngine::Create(context.optimizer, context.schedule));
  return std::unique_ptr<TrainingStrategy>(std::make_unique<LocalStrategy>(std::move(engine)));
}

}  // namespace tessera::worker
