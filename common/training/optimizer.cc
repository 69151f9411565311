#include "common/training/optimizer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

namespace tessera {
namespace {

constexpr OptimizerKind kAllKinds[] = {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                       OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                       OptimizerKind::kAdagrad};

std::string FormatFloat(float value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// Scalars that depend on the step but not on the element, computed once per call so that the
// element loops below hold nothing but arithmetic.
struct StepScalars {
  float lr = 0;
  float weight_decay = 0;
  float momentum = 0;
  float beta1 = 0;
  float beta2 = 0;
  float eps = 0;
  float adam_step_size = 0;  // lr / (1 - beta1^t)
  float adam_bc2_sqrt = 1;   // sqrt(1 - beta2^t)
  float adamw_decay = 1;     // 1 - lr*weight_decay
};

StepScalars MakeStepScalars(const OptimizerOptions& options, float lr, int64_t step) {
  StepScalars s;
  s.lr = lr;
  s.weight_decay = options.weight_decay;
  s.momentum = options.momentum;
  s.beta1 = options.beta1;
  s.beta2 = options.beta2;
  s.eps = options.eps;
  if (options.kind == OptimizerKind::kAdam || options.kind == OptimizerKind::kAdamW) {
    // In double and then rounded once, as PyTorch computes these as Python floats.
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(options.beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(options.beta2), t);
    s.adam_step_size = static_cast<float>(static_cast<double>(lr) / bc1);
    s.adam_bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    s.adamw_decay = static_cast<float>(1.0 - static_cast<double>(lr) * options.weight_decay);
  }
  return s;
}

// The element loops. Each is a template over the flags that would otherwise be branches inside
// the loop, so the compiler sees straight-line arithmetic it can vectorise. `__restrict`
// because the REQUIRES of DenseUpdate says the buffers do not overlap; without it the compiler
// adds run-time alias checks or gives up on vectorising.

template <bool kDecay>
void SgdLoop(const StepScalars& c, float* __restrict p, const float* __restrict g, size_t n) {
  const float lr = c.lr, wd = c.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kDecay) gi += wd * p[i];
    p[i] -= lr * gi;
  }
}

template <bool kDecay, bool kNesterov>
void MomentumLoop(const StepScalars& c, float* __restrict p, const float* __restrict g,
                  size_t n, float* __restrict b) {
  const float lr = c.lr, wd = c.weight_decay, mu = c.momentum;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kDecay) gi += wd * p[i];
    const float bi = mu * b[i] + gi;
    b[i] = bi;
    if constexpr (kNesterov) {
      p[i] -= lr * (gi + mu * bi);
    } else {
      p[i] -= lr * bi;
    }
  }
}

// kL2: torch.optim.Adam's weight decay (added to the gradient); AdamW decays p before the loop.
template <bool kL2>
void AdamLoop(const StepScalars& c, float* __restrict p, const float* __restrict g, size_t n,
              float* __restrict mv) {
  const float wd = c.weight_decay, b1 = c.beta1, b2 = c.beta2, eps = c.eps;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  const float step_size = c.adam_step_size, bc2_sqrt = c.adam_bc2_sqrt;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kL2) gi += wd * p[i];
    const float m = b1 * mv[2 * i] + one_minus_b1 * gi;
    const float v = b2 * mv[2 * i + 1] + one_minus_b2 * (gi * gi);
    mv[2 * i] = m;
    mv[2 * i + 1] = v;
    // PyTorch's order: denom = sqrt(v) / sqrt(bc2) + eps; p -= step_size * (m / denom).
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    p[i] -= step_size * (m / denom);
  }
}

void DecayLoop(float factor, float* __restrict p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] *= factor;
}

template <bool kDecay>
void AdagradLoop(const StepScalars& c, float* __restrict p, const float* __restrict g, size_t n,
                 float* __restrict sum) {
  const float lr = c.lr, wd = c.weight_decay, eps = c.eps;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kDecay) gi += wd * p[i];
    const float s = sum[i] + gi * gi;
    sum[i] = s;
    p[i] -= lr * (gi / (std::sqrt(s) + eps));
  }
}

// The one dispatch on kind and flags, outside every loop.
void ApplyUpdate(OptimizerKind kind, bool nesterov, const StepScalars& c, float* p,
                 const float* g, size_t n, float* state) {
  const bool decay = c.weight_decay != 0.0f;
  switch (kind) {
    case OptimizerKind::kSgd:
      decay ? SgdLoop<true>(c, p, g, n) : SgdLoop<false>(c, p, g, n);
      return;
    case OptimizerKind::kMomentum:
      if (nesterov) {
        decay ? MomentumLoop<true, true>(c, p, g, n, state)
              : MomentumLoop<false, true>(c, p, g, n, state);
      } else {
        decay ? MomentumLoop<true, false>(c, p, g, n, state)
              : MomentumLoop<false, false>(c, p, g, n, state);
      }
      return;
    case OptimizerKind::kAdam:
      decay ? AdamLoop<true>(c, p, g, n, state) : AdamLoop<false>(c, p, g, n, state);
      return;
    case OptimizerKind::kAdamW:
      // PyTorch skips the multiply when the factor is 1; so do we (it would be exact anyway).
      if (decay) DecayLoop(c.adamw_decay, p, n);
      AdamLoop<false>(c, p, g, n, state);
      return;
    case OptimizerKind::kAdagrad:
      decay ? AdagradLoop<true>(c, p, g, n, state) : AdagradLoop<false>(c, p, g, n, state);
      return;
  }
}

// "must be finite and >= 0" checks; NaN fails every comparison, so each test is written so that
// NaN lands on the error side.
Status CheckNonNegative(const OptimizerOptions& o, const char* field, float value) {
  if (std::isfinite(value) && value >= 0.0f) return OkStatus();
  return InvalidArgumentError("optimizer " + std::string(OptimizerKindName(o.kind)) + ": " +
                              field + "=" + FormatFloat(value) + " must be finite and >= 0");
}

Status CheckUnitInterval(const OptimizerOptions& o, const char* field, float value) {
  if (value >= 0.0f && value < 1.0f) return OkStatus();
  return InvalidArgumentError("optimizer " + std::string(OptimizerKindName(o.kind)) + ": " +
                              field + "=" + FormatFloat(value) + " must be in [0, 1)");
}

Status ParseFloatField(std::string_view field, std::string_view text, float* out) {
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const float value = std::strtof(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE) {
    return InvalidArgumentError(std::string(field) + "=\"" + s + "\" is not a float32 number");
  }
  *out = value;
  return OkStatus();
}

Status ParseBoolField(std::string_view field, std::string_view text, bool* out) {
  if (text == "true" || text == "1") {
    *out = true;
  } else if (text == "false" || text == "0") {
    *out = false;
  } else {
    return InvalidArgumentError(std::string(field) + "=\"" + std::string(text) +
                                "\" is not a boolean (true, false, 1, 0)");
  }
  return OkStatus();
}

Status SetField(std::string_view key, std::string_view value, OptimizerOptions* o) {
  if (key == "nesterov") return ParseBoolField(key, value, &o->nesterov);
  float* target = nullptr;
  if (key == "lr") target = &o->lr;
  if (key == "momentum") target = &o->momentum;
  if (key == "beta1") target = &o->beta1;
  if (key == "beta2") target = &o->beta2;
  if (key == "eps") target = &o->eps;
  if (key == "weight_decay") target = &o->weight_decay;
  if (key == "initial_accumulator_value") target = &o->initial_accumulator_value;
  if (target == nullptr) {
    return InvalidArgumentError("unknown field \"" + std::string(key) +
                                "\" (known: lr, momentum, nesterov, beta1, beta2, eps, "
                                "weight_decay, initial_accumulator_value)");
  }
  return ParseFloatField(key, value, target);
}

}  // namespace

std::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdagrad:
      return "adagrad";
  }
  return "unknown";
}

StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  for (OptimizerKind kind : kAllKinds) {
    if (OptimizerKindName(kind) == name) return kind;
  }
  return InvalidArgumentError("optimizer=\"" + std::string(name) +
                              "\" is unknown (known: sgd, momentum, adam, adamw, adagrad)");
}

std::string OptimizerOptions::ToString() const {
  std::ostringstream os;
  os << OptimizerKindName(kind) << " lr=" << lr;
  switch (kind) {
    case OptimizerKind::kSgd:
      break;
    case OptimizerKind::kMomentum:
      os << " momentum=" << momentum << " nesterov=" << (nesterov ? "true" : "false");
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      os << " beta1=" << beta1 << " beta2=" << beta2 << " eps=" << eps;
      break;
    case OptimizerKind::kAdagrad:
      os << " eps=" << eps << " initial_accumulator_value=" << initial_accumulator_value;
      break;
  }
  os << " weight_decay=" << weight_decay;
  return os.str();
}

OptimizerOptions DefaultOptimizerOptions(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  switch (kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kMomentum:
      break;
    case OptimizerKind::kAdam:
      o.lr = 1e-3f;
      break;
    case OptimizerKind::kAdamW:
      o.lr = 1e-3f;
      o.weight_decay = 1e-2f;
      break;
    case OptimizerKind::kAdagrad:
      o.eps = 1e-10f;
      break;
  }
  return o;
}

Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  bool known_kind = false;
  for (OptimizerKind kind : kAllKinds) known_kind |= (kind == o.kind);
  if (!known_kind) {
    return InvalidArgumentError("optimizer kind=" + std::to_string(static_cast<int>(o.kind)) +
                                " is not an OptimizerKind");
  }
  RETURN_IF_ERROR(CheckNonNegative(o, "lr", o.lr));
  RETURN_IF_ERROR(CheckUnitInterval(o, "momentum", o.momentum));
  RETURN_IF_ERROR(CheckUnitInterval(o, "beta1", o.beta1));
  RETURN_IF_ERROR(CheckUnitInterval(o, "beta2", o.beta2));
  if (!(std::isfinite(o.eps) && o.eps > 0.0f)) {
    return InvalidArgumentError("optimizer " + std::string(OptimizerKindName(o.kind)) +
                                ": eps=" + FormatFloat(o.eps) + " must be finite and > 0");
  }
  RETURN_IF_ERROR(CheckNonNegative(o, "weight_decay", o.weight_decay));
  RETURN_IF_ERROR(CheckNonNegative(o, "initial_accumulator_value", o.initial_accumulator_value));
  if (o.nesterov && o.kind != OptimizerKind::kMomentum) {
    return InvalidArgumentError("optimizer " + std::string(OptimizerKindName(o.kind)) +
                                ": nesterov=true applies only to momentum");
  }
  if (o.nesterov && o.momentum == 0.0f) {
    // As PyTorch: Nesterov with no momentum is plain SGD and almost surely a mistake.
    return InvalidArgumentError("optimizer momentum: nesterov=true requires momentum > 0, got "
                                "momentum=0");
  }
  return OkStatus();
}

StatusOr<OptimizerOptions> ParseOptimizerOptions(std::string_view name, std::string_view params) {
  ASSIGN_OR_RETURN(OptimizerKind kind, ParseOptimizerKind(name));
  OptimizerOptions options = DefaultOptimizerOptions(kind);
  const std::string context = "optimizer " + std::string(name);
  std::vector<std::string> seen;
  size_t pos = 0;
  while (pos < params.size()) {
    const size_t end = params.find_first_of(", \t", pos);
    const std::string_view token =
        params.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? params.size() : end + 1;
    if (token.empty()) continue;
    const size_t eq = token.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError(context + ": \"" + std::string(token) +
                                  "\" is not of the form field=value");
    }
    const std::string key(token.substr(0, eq));
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return InvalidArgumentError(context + ": field \"" + key + "\" is given twice");
    }
    seen.push_back(key);
    Status status = SetField(key, token.substr(eq + 1), &options);
    if (!status.ok()) return status.WithContext(context);
  }
  RETURN_IF_ERROR(ValidateOptimizerOptions(options));
  return options;
}

size_t StateFloatsPerElement(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2;
  }
  return 0;
}

void InitOptimizerState(const OptimizerOptions& options, float* state, size_t n) {
  const float value =
      options.kind == OptimizerKind::kAdagrad ? options.initial_accumulator_value : 0.0f;
  std::fill(state, state + StateFloatsPerElement(options.kind) * n, value);
}

void DenseUpdate(const OptimizerOptions& options, float lr, int64_t step, float* params,
                 const float* grads, size_t n, float* state) {
  if (n == 0) return;
  ApplyUpdate(options.kind, options.nesterov, MakeStepScalars(options, lr, step), params, grads,
              n, state);
}

void AverageInRankOrder(const float* const* g, size_t k, size_t n, float* out) {
  if (n == 0) return;
  if (k == 1) {
    if (out != g[0]) std::memcpy(out, g[0], n * sizeof(float));
    return;
  }
  // Block by block, so the partial sums stay in the cache while every rank's slice is added;
  // per element the operations and their order are those of a sum then a scaling.
  const float scale = 1.0f / static_cast<float>(k);
  constexpr size_t kBlock = 2048;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    float* o = out + begin;
    const size_t m = end - begin;
    const float* first = g[0] + begin;
    const float* second = g[1] + begin;
    for (size_t j = 0; j < m; ++j) o[j] = first[j] + second[j];
    for (size_t r = 2; r < k; ++r) {
      const float* next = g[r] + begin;
      for (size_t j = 0; j < m; ++j) o[j] += next[j];
    }
    for (size_t j = 0; j < m; ++j) o[j] *= scale;
  }
}

void DenseUpdateOfAverage(const OptimizerOptions& options, float lr, int64_t step, float* params,
                          const float* const* g, size_t k, size_t n, float* state) {
  if (k == 1) return DenseUpdate(options, lr, step, params, g[0], n, state);
  // Slices give the same bits as one call (optimizer_test: TwoSlicesEqualOneCallBitwise).
  constexpr size_t kSlice = 2048;
  const size_t per_element = StateFloatsPerElement(options.kind);
  float average[kSlice];
  std::vector<const float*> slice(k);
  for (size_t begin = 0; begin < n; begin += kSlice) {
    const size_t m = std::min(kSlice, n - begin);
    for (size_t r = 0; r < k; ++r) slice[r] = g[r] + begin;
    AverageInRankOrder(slice.data(), k, m, average);
    DenseUpdate(options, lr, step, params + begin, average, m,
                state == nullptr ? nullptr : state + per_element * begin);
  }
}

Status SparseRowUpdate(const OptimizerOptions& options, float lr, int64_t step, float* table,
                       size_t table_rows, size_t dim, const int64_t* row_ids,
                       const float* row_grads, size_t rows, float* state) {
  // Check every id before touching anything, so a bad request leaves the table as it was.
  for (size_t r = 0; r < rows; ++r) {
    if (row_ids[r] < 0 || static_cast<uint64_t>(row_ids[r]) >= table_rows) {
      return InvalidArgumentError("sparse update: row_ids[" + std::to_string(r) + "]=" +
                                  std::to_string(row_ids[r]) + " is outside the table's rows [0, " +
                                  std::to_string(table_rows) + ")");
    }
  }
  if (rows == 0 || dim == 0) return OkStatus();
  const StepScalars scalars = MakeStepScalars(options, lr, step);
  const size_t k = StateFloatsPerElement(options.kind);

  // Coalesce: group equal ids, keeping each group's positions in input order (stable sort) so
  // that the sum, and hence the result, does not depend on the sort's internals.
  std::vector<size_t> order(rows);
  for (size_t r = 0; r < rows; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [row_ids](size_t a, size_t b) { return row_ids[a] < row_ids[b]; });
  std::vector<float> summed;
  for (size_t first = 0; first < rows;) {
    const int64_t id = row_ids[order[first]];
    size_t last = first + 1;
    while (last < rows && row_ids[order[last]] == id) ++last;
    const float* grad = row_grads + order[first] * dim;
    if (last - first > 1) {
      summed.assign(grad, grad + dim);
      for (size_t j = first + 1; j < last; ++j) {
        const float* more = row_grads + order[j] * dim;
        for (size_t e = 0; e < dim; ++e) summed[e] += more[e];
      }
      grad = summed.data();
    }
    const size_t row = static_cast<size_t>(id);
    ApplyUpdate(options.kind, options.nesterov, scalars, table + row * dim, grad, dim,
                state == nullptr ? nullptr : state + row * dim * k);
    first = last;
  }
  return OkStatus();
}

}  // namespace tessera
