// Optimizer math shared by every mode: the worker in local and all-reduce training, the
// parameter server on its shards, and ZeRO ranks on their slices all call these functions, so
// the same gradients give the same parameters whichever mode applied them.
//
// Everything works on a contiguous slice of a flat float32 parameter buffer with slice-local
// state. Nothing here assumes it sees a whole tensor or a whole model: the update of element i
// depends only on params[i], grads[i] and element i's state, so updating [0, n) in one call or as
// [0, k) and [k, n) in two calls (with the matching state slices) gives bitwise the same result.
//
// Formulas (g = gradient, p = parameter, t = 1-based step, lr = the per-call learning rate;
// they follow PyTorch 1.13's torch.optim with default flags, dampening 0, maximize False,
// amsgrad False):
//
//   kSgd       g' = g + wd*p                          (L2: weight decay added to the gradient)
//              p  = p - lr*g'
//   kMomentum  g' = g + wd*p
//              b  = momentum*b + g'                   (b starts at 0, so b_1 = g', as in PyTorch)
//              d  = nesterov ? g' + momentum*b : b
//              p  = p - lr*d
//   kAdam      g' = g + wd*p                          (L2, as torch.optim.Adam)
//              m  = beta1*m + (1-beta1)*g'
//              v  = beta2*v + (1-beta2)*g'^2
//              p  = p - (lr / (1-beta1^t)) * m / (sqrt(v) / sqrt(1-beta2^t) + eps)
//   kAdamW     p  = p - lr*wd*p                       (decoupled, before the Adam update)
//              then kAdam's update with g' = g
//   kAdagrad   g' = g + wd*p
//              s  = s + g'^2                          (s starts at initial_accumulator_value)
//              p  = p - lr * g' / (sqrt(s) + eps)
//              (torch's lr_decay is not supported: use an LrSchedule instead.)
//
// State layout: StateFloatsPerElement(kind) = k floats per parameter element, interleaved, so
// element i's state is state[k*i .. k*i+k) and the state of any slice [a, b) of the parameters
// is the contiguous range state[k*a, k*b): a shard or ZeRO slice owns exactly its own state.
//   kSgd: none.  kMomentum: [b].  kAdam, kAdamW: [m, v].  kAdagrad: [s].
// Fresh state comes from InitOptimizerState (zeros, or Adagrad's initial accumulator value).
//
// Thread-safety: all functions are pure over their arguments; concurrent calls on disjoint
// parameter/state ranges are safe.
#ifndef TESSERA_COMMON_TRAINING_OPTIMIZER_H_
#define TESSERA_COMMON_TRAINING_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

enum class OptimizerKind { kSgd, kMomentum, kAdam, kAdamW, kAdagrad };

// "sgd", "momentum", "adam", "adamw", "adagrad".
std::string_view OptimizerKindName(OptimizerKind kind);
// Inverse of OptimizerKindName (case-sensitive); InvalidArgument naming the value and the
// accepted names otherwise.
StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;  // base learning rate; the schedule scales it, DenseUpdate takes the result
  float momentum = 0.9f;  // kMomentum, in [0, 1)
  bool nesterov = false;  // kMomentum only
  float beta1 = 0.9f;     // kAdam, kAdamW, in [0, 1)
  float beta2 = 0.999f;   // kAdam, kAdamW, in [0, 1)
  float eps = 1e-8f;      // kAdam, kAdamW, kAdagrad (PyTorch's Adagrad default is 1e-10), > 0
  float weight_decay = 0.0f;               // >= 0; L2 except for kAdamW (decoupled)
  float initial_accumulator_value = 0.0f;  // kAdagrad, >= 0

  // "adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0": the fields that the kind
  // uses, for logging the effective configuration.
  std::string ToString() const;
};

// PyTorch's defaults for `kind` (lr 0.01 where PyTorch has none; AdamW weight_decay 0.01,
// Adam lr 0.001, Adagrad eps 1e-10).
OptimizerOptions DefaultOptimizerOptions(OptimizerKind kind);

// OK, or InvalidArgument naming the first bad field and its value, e.g.
// "optimizer adam: beta2=1 must be in [0, 1)". Rejects NaN and infinities everywhere, negative
// lr/weight_decay/initial_accumulator_value, momentum or betas outside [0, 1), eps <= 0, and
// nesterov with a kind other than kMomentum or with momentum 0. Values of fields the kind does
// not use are checked too: a bad value is a bug in whatever produced it.
Status ValidateOptimizerOptions(const OptimizerOptions& options);

// Parses `name` (an OptimizerKindName) and `params`, a comma- or space-separated list of
// field=value overrides of DefaultOptimizerOptions(kind), e.g. "lr=0.1,momentum=0.9,
// nesterov=true"; fields are named as in OptimizerOptions. The result is validated.
// InvalidArgument naming the unknown name, unknown field, unparsable value, or bad value.
StatusOr<OptimizerOptions> ParseOptimizerOptions(std::string_view name,
                                                 std::string_view params = "");

// Floats of optimizer state per parameter element: kSgd 0, kMomentum 1, kAdam/kAdamW 2,
// kAdagrad 1.
size_t StateFloatsPerElement(OptimizerKind kind);

// Fills `state` (StateFloatsPerElement(options.kind) * n floats) with the state of a fresh
// optimizer: zeros, or initial_accumulator_value for kAdagrad.
void InitOptimizerState(const OptimizerOptions& options, float* state, size_t n);

// One optimizer step over params[0, n) with grads[0, n) and the interleaved state described
// above. `lr` is this step's learning rate (from LearningRate(), not options.lr); `step` is the
// 1-based number of this update, used for Adam's bias correction (ignored by the others).
// REQUIRES: ValidateOptimizerOptions(options).ok(); lr >= 0; step >= 1; params, grads and state
// hold n, n and StateFloatsPerElement(options.kind)*n floats and do not overlap (null is fine
// when the count is 0).
void DenseUpdate(const OptimizerOptions& options, float lr, int64_t step, float* params,
                 const float* grads, size_t n, float* state);

// out[j] = (g[0][j] + g[1][j] + ... + g[k-1][j]) * (1 / k), the sum taken in rank order: the
// average of k workers' gradients (ps-sync), bitwise the same wherever it is taken (every copy
// of a replicated range computes it alike). One gradient is copied as it is.
// REQUIRES: k >= 1; each g[r] and out hold n floats; out may be g[0] but no other.
void AverageInRankOrder(const float* const* g, size_t k, size_t n, float* out);

// DenseUpdate with the average of k workers' gradients (AverageInRankOrder of g[0..k)),
// bitwise the same as averaging into a buffer and then updating, without the buffer: slice by
// slice, each averaged into the cache and applied at once.
// REQUIRES: as DenseUpdate and AverageInRankOrder; no g[r] overlaps params or state.
void DenseUpdateOfAverage(const OptimizerOptions& options, float lr, int64_t step, float* params,
                          const float* const* g, size_t k, size_t n, float* state);

// One optimizer step over the rows of an embedding table that a batch touched.
//   table: table_rows x dim floats, row-major. It may be a shard of a larger table: row ids are
//          relative to `table`, the caller subtracts the shard's first row.
//   row_ids[r], row_grads[r*dim .. (r+1)*dim): the gradient of row row_ids[r], r < rows.
//   state: laid out per row like the table (row i's state is the k*dim floats at
//          state + i*k*dim, k = StateFloatsPerElement), i.e. the dense layout of the whole table.
// Duplicate row ids are summed first (like PyTorch's coalesce()), in the order they appear,
// and the row is then updated once. Each touched row gets exactly DenseUpdate over that row, so
// untouched rows keep their parameters and state; in particular weight decay applies only to
// touched rows, and Adam's bias correction uses the global `step` while only the touched rows'
// moments move (the lazy semantics of torch.optim.SparseAdam, whose per-parameter step equals
// the global step when the table is updated every step).
// Returns InvalidArgument naming the position and id of a row id outside [0, table_rows),
// before anything is modified.
// REQUIRES: as DenseUpdate; row_grads holds rows*dim floats.
Status SparseRowUpdate(const OptimizerOptions& options, float lr, int64_t step, float* table,
                       size_t table_rows, size_t dim, const int64_t* row_ids,
                       const float* row_grads, size_t rows, float* state);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_OPTIMIZER_H_
