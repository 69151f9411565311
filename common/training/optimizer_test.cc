#include "common/training/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Reference: the header's formulas, written out per element in double precision, with no
// attention to speed. The hyper-parameters are the float32 values widened to double, so the
// reference computes the same function and only the rounding differs.

struct RefState {
  std::vector<double> a;  // momentum buffer, Adam m, Adagrad sum
  std::vector<double> b;  // Adam v
};

RefState RefInit(const OptimizerOptions& o, size_t n) {
  RefState s;
  s.a.assign(n, o.kind == OptimizerKind::kAdagrad ? o.initial_accumulator_value : 0.0);
  s.b.assign(n, 0.0);
  return s;
}

void RefStep(const OptimizerOptions& o, double lr, int64_t t, std::vector<double>& p,
             const std::vector<float>& grad, RefState& s) {
  const double wd = o.weight_decay, mu = o.momentum, b1 = o.beta1, b2 = o.beta2, eps = o.eps;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    switch (o.kind) {
      case OptimizerKind::kSgd:
        g += wd * p[i];
        p[i] -= lr * g;
        break;
      case OptimizerKind::kMomentum: {
        g += wd * p[i];
        s.a[i] = mu * s.a[i] + g;
        const double d = o.nesterov ? g + mu * s.a[i] : s.a[i];
        p[i] -= lr * d;
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        if (o.kind == OptimizerKind::kAdamW) {
          p[i] -= lr * wd * p[i];
        } else {
          g += wd * p[i];
        }
        s.a[i] = b1 * s.a[i] + (1 - b1) * g;
        s.b[i] = b2 * s.b[i] + (1 - b2) * g * g;
        const double m_hat = s.a[i] / (1 - std::pow(b1, t));
        const double v_hat = s.b[i] / (1 - std::pow(b2, t));
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
        break;
      }
      case OptimizerKind::kAdagrad:
        g += wd * p[i];
        s.a[i] += g * g;
        p[i] -= lr * g / (std::sqrt(s.a[i]) + eps);
        break;
    }
  }
}

std::vector<float> RandomVector(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

OptimizerOptions Options(OptimizerKind kind, float weight_decay = 0.0f, bool nesterov = false) {
  OptimizerOptions o = DefaultOptimizerOptions(kind);
  o.lr = 0.05f;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  if (kind == OptimizerKind::kAdagrad) o.initial_accumulator_value = 0.1f;
  EXPECT_TRUE(ValidateOptimizerOptions(o).ok()) << ValidateOptimizerOptions(o);
  return o;
}

// ---------------------------------------------------------------------------------------------
// Against the reference, every kind and flag, 20 steps of random data with a varying lr.

struct Case {
  OptimizerKind kind;
  float weight_decay;
  bool nesterov;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(OptimizerKindName(info.param.kind)) +
         (info.param.weight_decay != 0 ? "_wd" : "") + (info.param.nesterov ? "_nesterov" : "");
}

class OptimizerReferenceTest : public ::testing::TestWithParam<Case> {};

// Tolerance: |float - double reference| <= 1e-6 * max(1, |reference|) for parameters and
// state. Every float op rounds with relative error <= 2^-24 ~ 6e-8. Parameters are O(1): each
// step rounds p once and adds an update of size <= lr * O(1) ~ 0.07 whose own few-ulp error is
// ~1e-8 absolute; the state (momentum buffer, m, v, Adagrad's sum) accumulates one or two
// roundings per step relative to its size. Over 20 steps that is <= ~2.4e-6 if every rounding
// went the same way and ~sqrt(20) * 1e-7 ~ 5e-7 for unbiased rounding; measured on this data:
// 5.2e-7 at most (Adagrad's sum of 20 rounded squares), 1.7e-7 for parameters. The data are
// fixed (seeded), and x86-64 float arithmetic is IEEE at every -O level, so this cannot flake.
// A wrong formula (a missing bias correction, L2 instead of decoupled decay, a missing
// momentum or Nesterov term) moves results by >= 1e-4 here. eps's placement is too small to
// see at these magnitudes; OptimizerHandTest checks it with |g| = eps.
constexpr double kRelTol = 1e-6;

void ExpectClose(const std::vector<float>& actual, const std::vector<double>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = kRelTol * std::max(1.0, std::abs(expected[i]));
    ASSERT_NEAR(actual[i], expected[i], tol) << what << "[" << i << "]";
  }
}

TEST_P(OptimizerReferenceTest, MatchesDoublePrecisionReferenceOverSteps) {
  const Case c = GetParam();
  const OptimizerOptions o = Options(c.kind, c.weight_decay, c.nesterov);
  constexpr size_t kN = 257;  // not a multiple of any vector width
  const size_t k = StateFloatsPerElement(o.kind);
  std::mt19937 rng(1234);
  std::vector<float> params = RandomVector(rng, kN, -1.0f, 1.0f);
  std::vector<double> ref_params(params.begin(), params.end());
  std::vector<float> state(k * kN);
  InitOptimizerState(o, state.data(), kN);
  RefState ref_state = RefInit(o, kN);
  for (int64_t t = 1; t <= 20; ++t) {
    const float lr = o.lr * (1.0f + 0.1f * static_cast<float>(t % 5));
    const std::vector<float> grads = RandomVector(rng, kN, -1.0f, 1.0f);
    DenseUpdate(o, lr, t, params.data(), grads.data(), kN, state.data());
    RefStep(o, lr, t, ref_params, grads, ref_state);
  }
  ExpectClose(params, ref_params, "params");
  // De-interleave the state for comparison.
  for (size_t j = 0; j < k; ++j) {
    std::vector<float> plane(kN);
    for (size_t i = 0; i < kN; ++i) plane[i] = state[k * i + j];
    ExpectClose(plane, j == 0 ? ref_state.a : ref_state.b, "state plane " + std::to_string(j));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, OptimizerReferenceTest,
    ::testing::Values(Case{OptimizerKind::kSgd, 0, false}, Case{OptimizerKind::kSgd, 0.01f, false},
                      Case{OptimizerKind::kMomentum, 0, false},
                      Case{OptimizerKind::kMomentum, 0.01f, false},
                      Case{OptimizerKind::kMomentum, 0, true},
                      Case{OptimizerKind::kMomentum, 0.01f, true},
                      Case{OptimizerKind::kAdam, 0, false}, Case{OptimizerKind::kAdam, 0.01f, false},
                      Case{OptimizerKind::kAdamW, 0, false},
                      Case{OptimizerKind::kAdamW, 0.01f, false},
                      Case{OptimizerKind::kAdagrad, 0, false},
                      Case{OptimizerKind::kAdagrad, 0.01f, false}),
    CaseName);

// ---------------------------------------------------------------------------------------------
// One step of each, computed by hand. p = 1, g = 0.5, lr = 0.1 unless stated.

float OneStep(const OptimizerOptions& o, float p, float g, std::vector<float>* state = nullptr,
              int64_t steps = 1) {
  std::vector<float> local(StateFloatsPerElement(o.kind));
  if (state == nullptr) state = &local;
  InitOptimizerState(o, state->data(), 1);
  for (int64_t t = 1; t <= steps; ++t) DenseUpdate(o, 0.1f, t, &p, &g, 1, state->data());
  return p;
}

TEST(OptimizerHandTest, Sgd) {
  OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f), 0.95f);  // 1 - 0.1*0.5
  o.weight_decay = 0.1f;
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f), 0.94f);  // 1 - 0.1*(0.5 + 0.1*1)
}

TEST(OptimizerHandTest, Momentum) {
  OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kMomentum);  // momentum 0.9
  std::vector<float> state(1);
  // Step 1: b = 0.5, p = 0.95.  Step 2: b = 0.9*0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855.
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state, 1), 0.95f);
  EXPECT_FLOAT_EQ(state[0], 0.5f);
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state, 2), 0.855f);
  EXPECT_FLOAT_EQ(state[0], 0.95f);
  // Nesterov step 1: b = 0.5, d = 0.5 + 0.9*0.5 = 0.95, p = 1 - 0.095.
  o.nesterov = true;
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state, 1), 0.905f);
}

TEST(OptimizerHandTest, AdamFirstStepMovesByLrTimesSign) {
  OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kAdam);  // 0.9, 0.999, 1e-8
  std::vector<float> state(2);
  // Step 1: m_hat = g, v_hat = g^2, so p -= lr * g / (|g| + eps) = lr * sign(g) * 0.99999998.
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state), 0.9f);
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, -2.0f, &state), 1.1f);
  // m = (1-beta1) g, v = (1-beta2) g^2. The betas are float32: 1 - 0.999f is 0.00099998713,
  // not 0.001, which is 1.3e-5 relative and so beyond EXPECT_FLOAT_EQ's 4 ulp.
  const float one_minus_b1 = 1.0f - o.beta1, one_minus_b2 = 1.0f - o.beta2;
  EXPECT_FLOAT_EQ(state[0], one_minus_b1 * -2.0f);
  EXPECT_FLOAT_EQ(state[1], one_minus_b2 * 4.0f);
  // eps sits outside the square root: with |g| = eps the step is exactly half of lr.
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 1e-8f, &state), 1.0f - 0.05f);
  // L2 weight decay enters the moments: g' = 0.5 + 0.1*1 = 0.6.
  o.weight_decay = 0.1f;
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state), 0.9f);
  EXPECT_FLOAT_EQ(state[0], one_minus_b1 * 0.6f);
  EXPECT_FLOAT_EQ(state[1], one_minus_b2 * 0.36f);
}

TEST(OptimizerHandTest, AdamWDecaysBeforeTheUpdate) {
  OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kAdamW);
  o.weight_decay = 0.1f;
  std::vector<float> state(2);
  // p = 1 * (1 - 0.1*0.1) = 0.99, then the Adam step of lr*sign(g): 0.89. Moments see g only.
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state), 0.89f);
  EXPECT_FLOAT_EQ(state[0], (1.0f - o.beta1) * 0.5f);   // 0.05, with float32 betas
  EXPECT_FLOAT_EQ(state[1], (1.0f - o.beta2) * 0.25f);  // 0.00025, with float32 betas
}

TEST(OptimizerHandTest, Adagrad) {
  OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kAdagrad);  // eps 1e-10
  o.initial_accumulator_value = 0.1f;
  std::vector<float> state(1);
  // s = 0.1 + 0.25 = 0.35, p = 1 - 0.1 * 0.5 / sqrt(0.35) = 0.915484...
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state), static_cast<float>(1 - 0.05 / std::sqrt(0.35)));
  EXPECT_FLOAT_EQ(state[0], 0.35f);
  o.initial_accumulator_value = 0.0f;
  EXPECT_FLOAT_EQ(OneStep(o, 1.0f, 0.5f, &state), 0.9f);  // first step: lr * sign(g)
}

TEST(OptimizerHandTest, StateSizes) {
  EXPECT_EQ(StateFloatsPerElement(OptimizerKind::kSgd), 0u);
  EXPECT_EQ(StateFloatsPerElement(OptimizerKind::kMomentum), 1u);
  EXPECT_EQ(StateFloatsPerElement(OptimizerKind::kAdam), 2u);
  EXPECT_EQ(StateFloatsPerElement(OptimizerKind::kAdamW), 2u);
  EXPECT_EQ(StateFloatsPerElement(OptimizerKind::kAdagrad), 1u);
}

// ---------------------------------------------------------------------------------------------
// Slicing: two calls over [0, cut) and [cut, n) with the matching state ranges equal one call
// over [0, n), bit for bit. This is what makes parameter-server shards and ZeRO slices agree
// with local training.

class OptimizerSliceTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerSliceTest, TwoSlicesEqualOneCallBitwise) {
  const Case c = GetParam();
  const OptimizerOptions o = Options(c.kind, c.weight_decay, c.nesterov);
  constexpr size_t kN = 1001;
  const size_t k = StateFloatsPerElement(o.kind);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{17}, size_t{500},
                     kN - 1, kN}) {
    std::mt19937 rng(99);
    std::vector<float> whole = RandomVector(rng, kN, -1.0f, 1.0f);
    std::vector<float> sliced = whole;
    std::vector<float> whole_state(k * kN), sliced_state(k * kN);
    InitOptimizerState(o, whole_state.data(), kN);
    // Each slice initialises its own state, as a shard would.
    InitOptimizerState(o, sliced_state.data(), cut);
    InitOptimizerState(o, sliced_state.data() + k * cut, kN - cut);
    for (int64_t t = 1; t <= 4; ++t) {
      const std::vector<float> g = RandomVector(rng, kN, -1.0f, 1.0f);
      DenseUpdate(o, 0.03f, t, whole.data(), g.data(), kN, whole_state.data());
      DenseUpdate(o, 0.03f, t, sliced.data(), g.data(), cut, sliced_state.data());
      DenseUpdate(o, 0.03f, t, sliced.data() + cut, g.data() + cut, kN - cut,
                  sliced_state.data() + k * cut);
    }
    EXPECT_EQ(std::memcmp(whole.data(), sliced.data(), kN * sizeof(float)), 0) << "cut=" << cut;
    if (k > 0) {  // SGD has no state, and memcmp must not get the empty vectors' nulls
      EXPECT_EQ(std::memcmp(whole_state.data(), sliced_state.data(), k * kN * sizeof(float)), 0)
          << "cut=" << cut;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OptimizerSliceTest,
                         ::testing::Values(Case{OptimizerKind::kSgd, 0.01f, false},
                                           Case{OptimizerKind::kMomentum, 0.01f, false},
                                           Case{OptimizerKind::kMomentum, 0.01f, true},
                                           Case{OptimizerKind::kAdam, 0.01f, false},
                                           Case{OptimizerKind::kAdamW, 0.01f, false},
                                           Case{OptimizerKind::kAdagrad, 0.01f, false}),
                         CaseName);

// ---------------------------------------------------------------------------------------------
// Sparse row updates.

constexpr size_t kRows = 10;
constexpr size_t kDim = 5;

struct Table {
  std::vector<float> params;
  std::vector<float> state;
};

Table MakeTable(const OptimizerOptions& o, uint32_t seed) {
  std::mt19937 rng(seed);
  Table t;
  t.params = RandomVector(rng, kRows * kDim, -1.0f, 1.0f);
  t.state.resize(StateFloatsPerElement(o.kind) * kRows * kDim);
  InitOptimizerState(o, t.state.data(), kRows * kDim);
  return t;
}

TEST(SparseRowUpdateTest, SgdEqualsDenseUpdateWithZeroGradientsElsewhere) {
  const OptimizerOptions o = Options(OptimizerKind::kSgd);
  Table sparse = MakeTable(o, 5);
  Table dense = sparse;
  const std::vector<int64_t> ids = {7, 2, 5};
  std::mt19937 rng(6);
  const std::vector<float> row_grads = RandomVector(rng, ids.size() * kDim, -1.0f, 1.0f);
  std::vector<float> dense_grads(kRows * kDim, 0.0f);
  for (size_t r = 0; r < ids.size(); ++r) {
    std::copy_n(row_grads.begin() + r * kDim, kDim, dense_grads.begin() + ids[r] * kDim);
  }
  ASSERT_TRUE(SparseRowUpdate(o, 0.1f, 1, sparse.params.data(), kRows, kDim, ids.data(),
                              row_grads.data(), ids.size(), sparse.state.data())
                  .ok());
  DenseUpdate(o, 0.1f, 1, dense.params.data(), dense_grads.data(), kRows * kDim,
              dense.state.data());
  EXPECT_EQ(sparse.params, dense.params);
}

class SparseRowKindTest : public ::testing::TestWithParam<Case> {};

// For every kind: touched rows get exactly DenseUpdate over that row; untouched rows and their
// state stay as they were (bitwise).
TEST_P(SparseRowKindTest, TouchesOnlyListedRows) {
  const OptimizerOptions o = Options(GetParam().kind, GetParam().weight_decay, GetParam().nesterov);
  const size_t k = StateFloatsPerElement(o.kind);
  Table table = MakeTable(o, 11);
  const Table before = table;
  Table expected = table;
  const std::vector<int64_t> ids = {9, 0, 4};
  std::mt19937 rng(12);
  const std::vector<float> row_grads = RandomVector(rng, ids.size() * kDim, -1.0f, 1.0f);
  ASSERT_TRUE(SparseRowUpdate(o, 0.1f, 3, table.params.data(), kRows, kDim, ids.data(),
                              row_grads.data(), ids.size(), table.state.data())
                  .ok());
  for (size_t r = 0; r < ids.size(); ++r) {
    DenseUpdate(o, 0.1f, 3, expected.params.data() + ids[r] * kDim, row_grads.data() + r * kDim,
                kDim, expected.state.data() + ids[r] * kDim * k);
  }
  EXPECT_EQ(table.params, expected.params);
  EXPECT_EQ(table.state, expected.state);
  for (size_t row = 0; row < kRows; ++row) {
    if (row == 9 || row == 0 || row == 4) continue;
    for (size_t e = 0; e < kDim; ++e) {
      EXPECT_EQ(table.params[row * kDim + e], before.params[row * kDim + e]) << "row " << row;
      for (size_t j = 0; j < k; ++j) {
        const size_t at = (row * kDim + e) * k + j;
        EXPECT_EQ(table.state[at], before.state[at]) << "row " << row;
      }
    }
  }
}

// Duplicate ids are summed (in input order) and the row is updated once: for Adam this differs
// from applying the two gradients one after the other.
TEST_P(SparseRowKindTest, DuplicateIdsAreSummedFirst) {
  const OptimizerOptions o = Options(GetParam().kind, GetParam().weight_decay, GetParam().nesterov);
  Table with_duplicates = MakeTable(o, 21);
  Table coalesced = with_duplicates;
  std::mt19937 rng(22);
  const std::vector<float> g = RandomVector(rng, 4 * kDim, -1.0f, 1.0f);
  const std::vector<int64_t> ids = {3, 1, 3, 3};
  ASSERT_TRUE(SparseRowUpdate(o, 0.1f, 2, with_duplicates.params.data(), kRows, kDim, ids.data(),
                              g.data(), ids.size(), with_duplicates.state.data())
                  .ok());
  std::vector<float> summed(2 * kDim);
  for (size_t e = 0; e < kDim; ++e) {
    summed[e] = g[kDim + e];                                    // row 1
    summed[kDim + e] = (g[e] + g[2 * kDim + e]) + g[3 * kDim + e];  // row 3, input order
  }
  const std::vector<int64_t> unique_ids = {1, 3};
  ASSERT_TRUE(SparseRowUpdate(o, 0.1f, 2, coalesced.params.data(), kRows, kDim,
                              unique_ids.data(), summed.data(), 2, coalesced.state.data())
                  .ok());
  EXPECT_EQ(with_duplicates.params, coalesced.params);
  EXPECT_EQ(with_duplicates.state, coalesced.state);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, SparseRowKindTest,
                         ::testing::Values(Case{OptimizerKind::kSgd, 0.01f, false},
                                           Case{OptimizerKind::kMomentum, 0.01f, true},
                                           Case{OptimizerKind::kAdam, 0.01f, false},
                                           Case{OptimizerKind::kAdamW, 0.01f, false},
                                           Case{OptimizerKind::kAdagrad, 0.01f, false}),
                         CaseName);

// Lazy Adam: a row first touched at global step 2 has zero moments before it and is bias-
// corrected with t = 2 (not 1), and a row not touched at step 2 keeps its moments.
TEST(SparseRowUpdateTest, AdamUsesGlobalStepAndLazyMoments) {
  const OptimizerOptions o = DefaultOptimizerOptions(OptimizerKind::kAdam);
  const size_t dim = 1;
  std::vector<float> table = {1.0f, 1.0f};
  std::vector<float> state(4, 0.0f);
  const int64_t row0 = 0, row1 = 1;
  const float g = 0.5f;
  ASSERT_TRUE(
      SparseRowUpdate(o, 0.1f, 1, table.data(), 2, dim, &row0, &g, 1, state.data()).ok());
  const std::vector<float> row0_state = {state[0], state[1]};
  const float row0_param = table[0];
  ASSERT_TRUE(
      SparseRowUpdate(o, 0.1f, 2, table.data(), 2, dim, &row1, &g, 1, state.data()).ok());
  EXPECT_EQ(table[0], row0_param);
  EXPECT_EQ(state[0], row0_state[0]);
  EXPECT_EQ(state[1], row0_state[1]);
  // Row 1: m = 0.1 g, v = 0.001 g^2, corrected with t = 2.
  const double b1 = o.beta1, b2 = o.beta2;
  const double m_hat = (1 - b1) * g / (1 - b1 * b1);
  const double v_hat = (1 - b2) * g * g / (1 - b2 * b2);
  const double expected = 1.0 - 0.1 * m_hat / (std::sqrt(v_hat) + o.eps);
  EXPECT_NEAR(table[1], expected, 1e-6);
  EXPECT_GT(std::abs(table[1] - 0.9f), 1e-3);  // not the t = 1 step of lr * sign(g)
}

TEST(SparseRowUpdateTest, RejectsOutOfRangeIdsBeforeModifyingAnything) {
  const OptimizerOptions o = Options(OptimizerKind::kMomentum);
  Table table = MakeTable(o, 31);
  const Table before = table;
  const std::vector<float> g(3 * kDim, 1.0f);
  for (int64_t bad : {int64_t{-1}, static_cast<int64_t>(kRows)}) {
    const std::vector<int64_t> ids = {2, bad, 4};
    Status s = SparseRowUpdate(o, 0.1f, 1, table.params.data(), kRows, kDim, ids.data(),
                               g.data(), ids.size(), table.state.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("row_ids[1]=" + std::to_string(bad)));
    EXPECT_THAT(s.message(), HasSubstr("[0, 10)"));
    EXPECT_EQ(table.params, before.params);
    EXPECT_EQ(table.state, before.state);
  }
}

TEST(SparseRowUpdateTest, EmptyIsANoop) {
  const OptimizerOptions o = Options(OptimizerKind::kAdam);
  Table table = MakeTable(o, 41);
  const Table before = table;
  EXPECT_TRUE(SparseRowUpdate(o, 0.1f, 1, table.params.data(), kRows, kDim, nullptr, nullptr, 0,
                              table.state.data())
                  .ok());
  EXPECT_EQ(table.params, before.params);
  DenseUpdate(o, 0.1f, 1, nullptr, nullptr, 0, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Options: parsing and validation.

// The average of k gradients is bitwise a naive sum in rank order then the scaling, for
// lengths across the blocks' edges and in place over the first gradient.
TEST(AverageInRankOrderTest, EqualsANaiveSumInRankOrderThenTheScale) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1e3f, 1e3f);
  for (size_t k : {1u, 2u, 3u, 5u}) {
    for (size_t n : {0u, 1u, 2047u, 2048u, 2049u, 5000u}) {
      std::vector<std::vector<float>> g(k, std::vector<float>(n));
      for (auto& rank : g) {
        for (float& x : rank) x = uniform(rng);
      }
      std::vector<float> expected = g[0];
      for (size_t r = 1; r < k; ++r) {
        for (size_t j = 0; j < n; ++j) expected[j] += g[r][j];
      }
      if (k > 1) {
        for (float& x : expected) x *= 1.0f / static_cast<float>(k);
      }
      std::vector<const float*> by_rank;
      for (const auto& rank : g) by_rank.push_back(rank.data());
      std::vector<float> out(n, -1.0f);
      AverageInRankOrder(by_rank.data(), k, n, out.data());
      AverageInRankOrder(by_rank.data(), k, n, g[0].data());  // in place
      if (n == 0) continue;  // memcmp must not get the empty vectors' nulls
      ASSERT_EQ(std::memcmp(out.data(), expected.data(), n * sizeof(float)), 0)
          << "k=" << k << " n=" << n;
      ASSERT_EQ(std::memcmp(g[0].data(), expected.data(), n * sizeof(float)), 0)
          << "in place, k=" << k << " n=" << n;
    }
  }
}

// Updating with the average slice by slice is bitwise averaging into a buffer, then one
// update, for every optimizer (Adam's step number included) and lengths across the slices.
TEST_P(OptimizerSliceTest, UpdateOfAnAverageEqualsTheAverageThenTheUpdate) {
  const Case c = GetParam();
  const OptimizerOptions o = Options(c.kind, c.weight_decay, c.nesterov);
  const size_t per_element = StateFloatsPerElement(o.kind);
  for (size_t k : {1u, 2u, 3u}) {
    for (size_t n : {1u, 2048u, 5001u}) {
      std::mt19937 rng(5);
      std::vector<float> buffered = RandomVector(rng, n, -1.0f, 1.0f);
      std::vector<float> fused = buffered;
      std::vector<float> buffered_state(per_element * n), fused_state(per_element * n);
      InitOptimizerState(o, buffered_state.data(), n);
      InitOptimizerState(o, fused_state.data(), n);
      for (int64_t t = 1; t <= 3; ++t) {
        std::vector<std::vector<float>> g;
        std::vector<const float*> by_rank;
        for (size_t r = 0; r < k; ++r) g.push_back(RandomVector(rng, n, -1.0f, 1.0f));
        for (const auto& rank : g) by_rank.push_back(rank.data());
        std::vector<float> average(n);
        AverageInRankOrder(by_rank.data(), k, n, average.data());
        DenseUpdate(o, 0.03f, t, buffered.data(), average.data(), n, buffered_state.data());
        DenseUpdateOfAverage(o, 0.03f, t, fused.data(), by_rank.data(), k, n,
                             fused_state.data());
      }
      EXPECT_EQ(std::memcmp(buffered.data(), fused.data(), n * sizeof(float)), 0)
          << "k=" << k << " n=" << n;
      if (per_element > 0) {
        EXPECT_EQ(std::memcmp(buffered_state.data(), fused_state.data(),
                              per_element * n * sizeof(float)),
                  0)
            << "k=" << k << " n=" << n;
      }
    }
  }
}

TEST(OptimizerOptionsTest, DefaultsAreValidAndFollowPyTorch) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                             OptimizerKind::kAdamW, OptimizerKind::kAdagrad}) {
    EXPECT_TRUE(ValidateOptimizerOptions(DefaultOptimizerOptions(kind)).ok());
    StatusOr<OptimizerKind> parsed = ParseOptimizerKind(OptimizerKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(DefaultOptimizerOptions(OptimizerKind::kAdamW).weight_decay, 1e-2f);
  EXPECT_EQ(DefaultOptimizerOptions(OptimizerKind::kAdagrad).eps, 1e-10f);
}

TEST(OptimizerOptionsTest, ParsesOverrides) {
  StatusOr<OptimizerOptions> o =
      ParseOptimizerOptions("momentum", "lr=0.5, momentum=0.8,nesterov=true weight_decay=1e-4");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->kind, OptimizerKind::kMomentum);
  EXPECT_EQ(o->lr, 0.5f);
  EXPECT_EQ(o->momentum, 0.8f);
  EXPECT_TRUE(o->nesterov);
  EXPECT_EQ(o->weight_decay, 1e-4f);
  EXPECT_EQ(o->ToString(), "momentum lr=0.5 momentum=0.8 nesterov=true weight_decay=0.0001");

  StatusOr<OptimizerOptions> adam = ParseOptimizerOptions("adam");
  ASSERT_TRUE(adam.ok());
  EXPECT_EQ(adam->ToString(), "adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0");
}

void ExpectRejected(std::string_view name, std::string_view params, const std::string& needle) {
  StatusOr<OptimizerOptions> o = ParseOptimizerOptions(name, params);
  ASSERT_FALSE(o.ok()) << name << " " << params;
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr(needle)) << name << " " << params;
}

TEST(OptimizerOptionsTest, RejectsEveryBadValueNamingTheField) {
  ExpectRejected("rmsprop", "", "optimizer=\"rmsprop\" is unknown");
  ExpectRejected("sgd", "lr=-0.1", "lr=-0.1 must be finite and >= 0");
  ExpectRejected("sgd", "lr=nan", "lr=nan");
  ExpectRejected("sgd", "lr=inf", "lr=inf");
  ExpectRejected("momentum", "momentum=1", "momentum=1 must be in [0, 1)");
  ExpectRejected("momentum", "momentum=-0.5", "momentum=-0.5");
  ExpectRejected("adam", "beta1=1", "beta1=1 must be in [0, 1)");
  ExpectRejected("adam", "beta1=-0.1", "beta1=-0.1");
  ExpectRejected("adam", "beta2=1.5", "beta2=1.5 must be in [0, 1)");
  ExpectRejected("adam", "beta2=nan", "beta2=nan");
  ExpectRejected("adam", "eps=0", "eps=0 must be finite and > 0");
  ExpectRejected("adagrad", "eps=-1e-10", "eps=-1e-10");
  ExpectRejected("adamw", "weight_decay=-0.01", "weight_decay=-0.01 must be finite and >= 0");
  ExpectRejected("adagrad", "initial_accumulator_value=-1", "initial_accumulator_value=-1");
  ExpectRejected("adam", "nesterov=true", "nesterov=true applies only to momentum");
  ExpectRejected("momentum", "momentum=0,nesterov=true", "requires momentum > 0");
  ExpectRejected("sgd", "learning_rate=0.1", "unknown field \"learning_rate\"");
  ExpectRejected("sgd", "lr=fast", "lr=\"fast\" is not a float32 number");
  ExpectRejected("sgd", "lr=0.1x", "lr=\"0.1x\"");
  ExpectRejected("sgd", "lr=1e99", "lr=\"1e99\"");
  ExpectRejected("momentum", "nesterov=yes", "nesterov=\"yes\" is not a boolean");
  ExpectRejected("sgd", "lr", "\"lr\" is not of the form field=value");
  ExpectRejected("sgd", "lr=0.1,lr=0.2", "field \"lr\" is given twice");
  // The error says which optimizer the bad field belongs to.
  ExpectRejected("adam", "beta2=1", "optimizer adam: ");

  OptimizerOptions bad_kind;
  bad_kind.kind = static_cast<OptimizerKind>(42);
  EXPECT_THAT(ValidateOptimizerOptions(bad_kind).message(), HasSubstr("kind=42"));
}

}  // namespace
}  // namespace tessera
