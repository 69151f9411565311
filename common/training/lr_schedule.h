// Learning-rate schedules: the lr that DenseUpdate / SparseRowUpdate get for a given step.
//
// A schedule is a pure function of (options, base_lr, step), so every process that knows the
// step (a worker, a parameter-server shard, a ZeRO rank) computes the same lr without talking.
//
// `step` is the number of optimizer updates already applied: 0 for the first update, i.e. the
// optimizer's 1-based step minus one (PyTorch's scheduler convention, last_epoch). With W =
// warmup_steps and s = step - W (the step counted from the end of warmup):
//
//   warmup     step < W:  lr = base_lr * (step + 1) / W
//              The first update already moves (base_lr / W, not 0) and update W-1, the last of
//              the warmup, uses the full base_lr.
//   kConstant  lr = base_lr
//   kStep      lr = base_lr * gamma^floor(s / step_size)       (torch StepLR after warmup)
//   kCosine    lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * min(s, D) / D)) / 2,
//              D = total_steps - W: base_lr at s = 0, min_lr at step = total_steps (after the
//              last of total_steps updates, as torch CosineAnnealingLR with T_max = D) and
//              after it.
//
// Thread-safety: pure functions.
#ifndef TESSERA_COMMON_TRAINING_LR_SCHEDULE_H_
#define TESSERA_COMMON_TRAINING_LR_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

enum class LrScheduleKind { kConstant, kStep, kCosine };

// "constant", "step", "cosine".
std::string_view LrScheduleKindName(LrScheduleKind kind);
// Inverse of LrScheduleKindName; InvalidArgument naming the value and the known names.
StatusOr<LrScheduleKind> ParseLrScheduleKind(std::string_view name);

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // >= 0; 0 = no warmup
  int64_t step_size = 0;     // kStep: > 0, multiply by gamma every step_size steps
  float gamma = 0.1f;        // kStep: in (0, 1]
  int64_t total_steps = 0;   // kCosine: > warmup_steps
  float min_lr = 0.0f;       // kCosine: in [0, base_lr]

  // "cosine warmup_steps=100 total_steps=10000 min_lr=0", for logging the effective config.
  std::string ToString() const;
};

// OK, or InvalidArgument naming the first bad field and its value, e.g.
// "lr_schedule step: step_size=0 must be > 0". Fields the kind does not use are not checked
// (they keep their defaults when unset). base_lr is the optimizer's lr, which min_lr must not
// exceed.
Status ValidateLrSchedule(const LrScheduleOptions& options, float base_lr);

// The lr for the update after `step` updates (see the file comment).
// REQUIRES: ValidateLrSchedule(options, base_lr).ok(); step >= 0.
float LearningRate(const LrScheduleOptions& options, float base_lr, int64_t step);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_LR_SCHEDULE_H_
