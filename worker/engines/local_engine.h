// LocalEngine: single-process training (`--mode local`): the optimizer, applied to this
// rank's own gradients, with the learning-rate schedule. The same math the parameter server
// and the ZeRO ranks apply to their slices (common/training/optimizer.h).
#ifndef TESSERA_WORKER_ENGINES_LOCAL_ENGINE_H_
#define TESSERA_WORKER_ENGINES_LOCAL_ENGINE_H_

#include <memory>
#include <vector>

#include "common/training/embedding_table.h"

#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "worker/engines/training_engine.h"

namespace tessera::worker {

class LocalEngine final : public TrainingEngine {
 public:
  // InvalidArgument naming the field for bad optimizer or schedule options.
  static StatusOr<std::unique_ptr<LocalEngine>> Create(const OptimizerOptions& optimizer,
                                                       const LrScheduleOptions& schedule);

  std::string_view name() const override { return "local"; }
  // Holds every embedding table whole (rows created on first touch).
  Status Initialize(const ParameterLayout& layout, const std::vector<EmbeddingTableSpec>& tables,
                    float* params) override;
  Status LookupRows(size_t table, const std::vector<int64_t>& ids, float* values) override;
  // The gradient check runs on each layer's gradients as backward reports them (while they
  // are in cache); Step applies its verdict, or checks them all when backward reported none.
  void OnBackwardStart(int64_t step, float* grads) override;
  void OnGradientsReady(uint64_t offset, uint64_t size) override;
  Status Step(int64_t step, float* params, float* grads,
              const std::vector<SparseRows>& sparse) override;
  // One shard, "local.ckpt": "params", "optimizer_state", and per table "<name>.ids",
  // "<name>.values", "<name>.state".
  Status SaveCheckpoint(const std::string& root, int64_t step, const float* params) override;
  Status RestoreCheckpoint(const std::string& root, int64_t step, float* params) override;

  // The learning rate the last Step used.
  float last_lr() const { return last_lr_; }

 private:
  LocalEngine(const OptimizerOptions& optimizer, const LrScheduleOptions& schedule)
      : optimizer_(optimizer), schedule_(schedule) {}

  const OptimizerOptions optimizer_;
  const LrScheduleOptions schedule_;
  uint64_t size_ = 0;
  uint64_t fingerprint_ = 0;  // of the layout
  std::vector<float> state_;
  std::vector<std::unique_ptr<EmbeddingTable>> tables_;
  float last_lr_ = 0;
  // The current step's early checks (OnGradientsReady): how many floats were checked, and the
  // first verdict that was not "go on".
  int64_t early_step_ = 0;  // 0: none this step
  const float* early_grads_ = nullptr;
  uint64_t early_checked_ = 0;
  StatusOr<bool> early_verdict_ = true;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_LOCAL_ENGINE_H_
