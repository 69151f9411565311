// SyntheticCtr: a learnable, fully deterministic click-through-rate set shaped like Criteo
// (dense features plus one categorical id per sparse field), labelled by a fixed random teacher.
//
//   SyntheticCtrOptions options;  // N = 100000, 13 dense features, 5 fields by default
//   options.seed = 1;
//   ASSIGN_OR_RETURN(auto dataset, SyntheticCtr::Create(options));
//   // MakeBatch fills batch.features (dense), batch.sparse_ids and batch.labels (0/1).
//
// Sample i:
//   x     = D dense values drawn i.i.d. from N(0, 1), rounded to float32;
//   id_f  = pi_f(r_f) for each field f, where the rank r_f in [0, N_f) is Zipf(s)-distributed
//           (P(r) = (r + 1)^-s / H(N_f, s), so rank 0 is the hottest) and pi_f is a fixed
//           bijection of [0, N_f) that scatters the hot ranks over the id space;
//   logit = w · tanh(sum_f e_f(id_f) + W_d · x) + bias,
//   label = 1 (click) if logit > 0, else 0   (a deterministic threshold, no label noise).
//
// The teacher: e_f(id) in R^T is drawn from N(0, 1/F) by a generator seeded from
// (seed, f, id), so it needs no table however large N_f is; W_d (T x D) ~ N(0, 1/D) and
// w (T) ~ N(0, 1/T) are drawn once from `seed`. The sparse and the dense parts thus each put
// unit variance into every pre-activation, which keeps tanh in its non-linear range. `bias` is
// calibrated in Create: minus the 75th percentile of w · tanh(...) over 8192 samples of an
// independent stream, so about 25% of samples are clicks whatever the options (measured
// 24.6-25.6% with the defaults over seeds 0-4; the test holds it in [22%, 28%]). Since the
// label is exactly a function of what Get and GetSparse return, a model can reach 100%
// accuracy in principle; ids of the cold tail are rarely seen, which is what makes it hard,
// as in real CTR data. (A logistic-regression student reaches 89% on a small configuration
// where always predicting "no click" gives 74%.)
//
// The permutation pi_f(r) = (a_f * r + b_f) mod N_f, with b_f in [0, N_f) and a_f in
// [1, N_f) coprime to N_f drawn from (seed, f): an affine map with gcd(a_f, N_f) = 1 is a
// bijection of Z/N_f, costs one multiply, and puts the hot ranks 0, 1, 2 at ids b_f,
// b_f + a_f, b_f + 2 a_f (mod N_f) instead of 0, 1, 2.
//
// Generating sample i needs only (seed, i) and the per-field tables, never samples 0..i-1. The
// dense values and the ids come from separate SplitMix64 streams seeded from (seed, i), so
// GetSparse costs O(F log N_f) (one binary search in field f's precomputed Zipf CDF per field)
// and Get O(F (T + log N_f) + D T). Our own SplitMix64 and Box-Muller make the set the same
// with every standard library; libm's tanh/log/cos/pow can move the last bits, which can flip
// a label sitting exactly on the threshold on a different libm.
//
// Memory: one double per id of every field (the Zipf CDFs), at most 2^26 in all.
//
// Thread-safety: immutable after Create; Get(), GetSparse() and TeacherLogit() may be called
// concurrently.
#ifndef TESSERA_WORKER_DATA_SYNTHETIC_CTR_H_
#define TESSERA_WORKER_DATA_SYNTHETIC_CTR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "worker/data/dataset.h"

namespace tessera::worker::data {

struct SyntheticCtrOptions {
  size_t num_samples = 100000;  // N
  size_t dense_dim = 13;        // D, >= 0 (0: sparse fields only)
  // N_f per sparse field, each >= 1, at most 2^26 in all. At least one field.
  std::vector<int64_t> field_sizes = {100000, 100000, 10000, 1000, 100};
  double zipf_exponent = 1.05;  // s, finite and > 0
  size_t teacher_dim = 8;       // T, >= 1
  uint64_t seed = 0;            // the teacher, the permutations and every sample derive from it
};

class SyntheticCtr : public Dataset {
 public:
  // Rejects (InvalidArgument, naming the field) an empty field_sizes, an entry < 1, field sizes
  // over 2^26 in all, a non-finite or non-positive zipf_exponent, teacher_dim < 1, and a
  // teacher over 2^28 weights (teacher_dim x (dense_dim + 1)).
  static StatusOr<std::unique_ptr<SyntheticCtr>> Create(const SyntheticCtrOptions& options);

  size_t size() const override { return options_.num_samples; }
  size_t feature_dim() const override { return options_.dense_dim; }
  size_t num_classes() const override { return 2; }
  // Writes the dense features and the label (0 or 1).
  Status Get(size_t index, float* features, int64_t* label) const override;

  std::vector<int64_t> sparse_field_sizes() const override { return options_.field_sizes; }
  Status GetSparse(size_t index, int64_t* ids) const override;

  // The teacher's logit for dense features x[0 .. dense_dim) and ids[0 .. fields); sample i's
  // label is TeacherLogit(its features, its ids) > 0. Lets a benchmark or a test score a model
  // against the teacher. REQUIRES: every ids[f] in [0, field_sizes[f]).
  double TeacherLogit(const float* x, const int64_t* ids) const;

  const SyntheticCtrOptions& options() const { return options_; }

 private:
  explicit SyntheticCtr(const SyntheticCtrOptions& options);

  Status CheckIndex(size_t index) const;
  // Sample `index` of the stream pair (dense_base, sparse_base): the samples use one pair, the
  // bias calibration another.
  void DrawDense(uint64_t dense_base, size_t index, float* x) const;
  void DrawIds(uint64_t sparse_base, size_t index, int64_t* ids) const;
  // w · tanh(sum_f e_f(id_f) + W_d · x), without the bias.
  double Score(const float* x, const int64_t* ids) const;

  const SyntheticCtrOptions options_;
  const uint64_t dense_base_;   // seeds sample i's dense stream with (dense_base_, i)
  const uint64_t sparse_base_;  // seeds sample i's id stream with (sparse_base_, i)
  const uint64_t embedding_base_;  // seeds e_f(id)'s stream with (embedding_base_, f, id)
  // Per field: the Zipf CDF over ranks (cdf[r] = P(rank <= r), the last entry exactly 1) and
  // the permutation's multiplier and offset.
  std::vector<std::vector<double>> zipf_cdf_;
  std::vector<uint64_t> permutation_a_;
  std::vector<uint64_t> permutation_b_;
  // The teacher, row-major, in double so labels do not depend on float rounding of sums.
  std::vector<double> w_dense_;  // teacher_dim x dense_dim
  std::vector<double> w_out_;    // teacher_dim
  double bias_ = 0;
};

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_SYNTHETIC_CTR_H_
