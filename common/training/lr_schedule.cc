#include "common/training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tessera {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::string Prefix(const LrScheduleOptions& o) {
  return "lr_schedule " + std::string(LrScheduleKindName(o.kind)) + ": ";
}

std::string FormatFloat(float value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

}  // namespace

std::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kStep:
      return "step";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "unknown";
}

StatusOr<LrScheduleKind> ParseLrScheduleKind(std::string_view name) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kConstant, LrScheduleKind::kStep, LrScheduleKind::kCosine}) {
    if (LrScheduleKindName(kind) == name) return kind;
  }
  return InvalidArgumentError("lr_schedule=\"" + std::string(name) +
                              "\" is unknown (known: constant, step, cosine)");
}

std::string LrScheduleOptions::ToString() const {
  std::ostringstream os;
  os << LrScheduleKindName(kind) << " warmup_steps=" << warmup_steps;
  if (kind == LrScheduleKind::kStep) os << " step_size=" << step_size << " gamma=" << gamma;
  if (kind == LrScheduleKind::kCosine) os << " total_steps=" << total_steps << " min_lr=" << min_lr;
  return os.str();
}

Status ValidateLrSchedule(const LrScheduleOptions& o, float base_lr) {
  if (LrScheduleKindName(o.kind) == "unknown") {
    return InvalidArgumentError("lr_schedule kind=" + std::to_string(static_cast<int>(o.kind)) +
                                " is not an LrScheduleKind");
  }
  if (!(std::isfinite(base_lr) && base_lr >= 0.0f)) {
    return InvalidArgumentError(Prefix(o) + "base lr=" + FormatFloat(base_lr) +
                                " must be finite and >= 0");
  }
  if (o.warmup_steps < 0) {
    return InvalidArgumentError(Prefix(o) + "warmup_steps=" + std::to_string(o.warmup_steps) +
                                " must be >= 0");
  }
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      break;
    case LrScheduleKind::kStep:
      if (o.step_size <= 0) {
        return InvalidArgumentError(Prefix(o) + "step_size=" + std::to_string(o.step_size) +
                                    " must be > 0");
      }
      if (!(o.gamma > 0.0f && o.gamma <= 1.0f)) {
        return InvalidArgumentError(Prefix(o) + "gamma=" + FormatFloat(o.gamma) +
                                    " must be in (0, 1]");
      }
      break;
    case LrScheduleKind::kCosine:
      if (o.total_steps <= o.warmup_steps) {
        return InvalidArgumentError(Prefix(o) + "total_steps=" + std::to_string(o.total_steps) +
                                    " must be > warmup_steps=" + std::to_string(o.warmup_steps));
      }
      if (!(o.min_lr >= 0.0f && o.min_lr <= base_lr)) {
        return InvalidArgumentError(Prefix(o) + "min_lr=" + FormatFloat(o.min_lr) +
                                    " must be in [0, base lr=" + FormatFloat(base_lr) + "]");
      }
      break;
  }
  return OkStatus();
}

float LearningRate(const LrScheduleOptions& o, float base_lr, int64_t step) {
  // In double, rounded once at the end, so that the lr is the float nearest the formula.
  const double base = base_lr;
  if (step < o.warmup_steps) {
    return static_cast<float>(base * static_cast<double>(step + 1) /
                              static_cast<double>(o.warmup_steps));
  }
  const int64_t s = step - o.warmup_steps;
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      return base_lr;
    case LrScheduleKind::kStep:
      return static_cast<float>(
          base * std::pow(static_cast<double>(o.gamma), static_cast<double>(s / o.step_size)));
    case LrScheduleKind::kCosine: {
      const int64_t decay_steps = o.total_steps - o.warmup_steps;
      const double progress =
          static_cast<double>(std::min(s, decay_steps)) / static_cast<double>(decay_steps);
      const double min_lr = o.min_lr;
      return static_cast<float>(min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(kPi * progress)));
    }
  }
  return base_lr;
}

}  // namespace tessera
