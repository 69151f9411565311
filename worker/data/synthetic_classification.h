// SyntheticClassification: a learnable, fully deterministic classification set, labelled by a
// fixed random teacher network.
//
//   SyntheticClassificationOptions options;  // N = 60000, D = 784, C = 10 by default
//   options.seed = 1;
//   ASSIGN_OR_RETURN(auto dataset, SyntheticClassification::Create(options));
//
// Sample i:
//   x = D values drawn i.i.d. from N(0, 1) by a generator seeded from (seed, i) with SplitMix64,
//   label = argmax_c (W2 · tanh(W1 · x + b1))_c   (the first maximum on ties),
// where the teacher's W1 (H x D), b1 (H), W2 (C x H) are drawn once from `seed`
// (W1 ~ N(0, 2/D) so tanh works in its non-linear range, b1 ~ N(0, 0.1^2), W2 ~ N(0, 1/H)).
// x is rounded to float32 before the teacher sees it, so the label is exactly a function of
// the features Get returns. A linear model learns most of it; an MLP can learn all of it.
//
// Generating sample i needs only (seed, i) and the teacher, never samples 0..i-1, so any rank
// can read any sample in O(H * (D + C)). The normal draws come from our own SplitMix64 and
// Box-Muller (std::normal_distribution's algorithm is unspecified), so the set is the same with
// every standard library; it depends on libm's tanh/log/cos only in the last bits, which can
// flip a label that sits exactly on a decision boundary on a different libm.
//
// Thread-safety: immutable after Create; Get() may be called concurrently.
#ifndef TESSERA_WORKER_DATA_SYNTHETIC_CLASSIFICATION_H_
#define TESSERA_WORKER_DATA_SYNTHETIC_CLASSIFICATION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "worker/data/dataset.h"

namespace tessera::worker::data {

struct SyntheticClassificationOptions {
  size_t num_samples = 60000;  // N
  size_t feature_dim = 784;    // D, >= 1
  size_t num_classes = 10;     // C, >= 2
  size_t hidden_dim = 64;      // H, the teacher's hidden width, >= 1
  uint64_t seed = 0;           // the teacher and every sample derive from it
};

class SyntheticClassification : public Dataset {
 public:
  // Rejects (InvalidArgument, naming the field) feature_dim, hidden_dim < 1, num_classes < 2,
  // and a teacher larger than 2^28 weights (a typo'd width would otherwise eat memory).
  static StatusOr<std::unique_ptr<SyntheticClassification>> Create(
      const SyntheticClassificationOptions& options);

  size_t size() const override { return options_.num_samples; }
  size_t feature_dim() const override { return options_.feature_dim; }
  size_t num_classes() const override { return options_.num_classes; }
  Status Get(size_t index, float* features, int64_t* label) const override;

  const SyntheticClassificationOptions& options() const { return options_; }

 private:
  explicit SyntheticClassification(const SyntheticClassificationOptions& options);

  const SyntheticClassificationOptions options_;
  // The teacher, row-major. Computed in double so the labels do not depend on float rounding
  // of intermediate sums.
  std::vector<double> w1_;  // hidden_dim x feature_dim
  std::vector<double> b1_;  // hidden_dim
  std::vector<double> w2_;  // num_classes x hidden_dim
};

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer. Exposed
// so the seeding scheme is visible and testable.
uint64_t SplitMix64Mix(uint64_t x);

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_SYNTHETIC_CLASSIFICATION_H_
