// LocalEngine: single-process training (`--mode local`): the optimizer, applied to this
// rank's own gradients, with the learning-rate schedule. The same math the parameter server
// and the ZeRO ranks apply to their slices (common/optimizer.h).
#ifndef TESSERA_WORKER_LOCAL_ENGINE_H_
#define TESSERA_WORKER_LOCAL_ENGINE_H_

#include <vector>

#include "common/lr_schedule.h"
#include "common/optimizer.h"
#include "worker/training_engine.h"

namespace tessera::worker {

class LocalEngine final : public TrainingEngine {
 public:
  // InvalidArgument naming the field for bad optimizer or schedule options.
  static StatusOr<std::unique_ptr<LocalEngine>> Create(const OptimizerOptions& optimizer,
                                                       const LrScheduleOptions& schedule);

  std::string_view name() const override { return "local"; }
  Status Initialize(const ParameterLayout& layout, float* params) override;
  Status Step(int64_t step, float* params, float* grads) override;

  // The learning rate the last Step used.
  float last_lr() const { return last_lr_; }

 private:
  LocalEngine(const OptimizerOptions& optimizer, const LrScheduleOptions& schedule)
      : optimizer_(optimizer), schedule_(schedule) {}

  const OptimizerOptions optimizer_;
  const LrScheduleOptions schedule_;
  uint64_t size_ = 0;
  std::vector<float> state_;
  float last_lr_ = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_LOCAL_ENGINE_H_
