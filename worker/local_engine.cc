#include "worker/local_engine.h"

#include <memory>

namespace tessera::worker {

StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(const OptimizerOptions& optimizer,
                                                           const LrScheduleOptions& schedule) {
  RETURN_IF_ERROR(ValidateOptimizerOptions(optimizer));
  RETURN_IF_ERROR(ValidateLrSchedule(schedule, optimizer.lr));
  return std::unique_ptr<LocalEngine>(new LocalEngine(optimizer, schedule));
}

Status LocalEngine::Initialize(const ParameterLayout& layout, float* params) {
  size_ = layout.total_size();
  state_.assign(StateFloatsPerElement(optimizer_.kind) * size_, 0.0f);
  InitOptimizerState(optimizer_, state_.data(), size_);
  return OkStatus();
}

Status LocalEngine::Step(int64_t step, float* params, float* grads) {
  if (step < 1) return InvalidArgumentError("local engine: step " + std::to_string(step) + " < 1");
  last_lr_ = LearningRate(schedule_, optimizer_.lr, step - 1);  // after step - 1 updates
  DenseUpdate(optimizer_, last_lr_, step, params, grads, size_, state_.data());
  return OkStatus();
}

}  // namespace tessera::worker
