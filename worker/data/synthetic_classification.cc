#include "worker/data/synthetic_classification.h"

#include <cmath>
#include <string>

namespace tessera::worker::data {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;
// Domain separators: the teacher's stream and the samples' streams must never coincide, even
// for sample indices that happen to equal a teacher-stream counter.
constexpr uint64_t kTeacherDomain = 0x7465616368657231ull;  // "teacher1"
constexpr uint64_t kSampleDomain = 0x73616d706c657331ull;   // "samples1"
constexpr size_t kMaxTeacherWeights = size_t{1} << 28;

// SplitMix64 as a stream: state advances by the golden gamma, output is the mix.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += kGoldenGamma;
    return SplitMix64Mix(state_);
  }
  // Uniform in (0, 1]: 53 random bits, never 0 so log() below is finite.
  double UniformOpenClosed() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }
  // Standard normal by Box-Muller (one of the pair; simplicity over speed).
  double Normal() {
    const double u1 = UniformOpenClosed();
    const double u2 = UniformOpenClosed();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

Status CheckAtLeast(const char* field, size_t value, size_t minimum) {
  if (value >= minimum) return OkStatus();
  return InvalidArgumentError(std::string("synthetic classification: ") + field + "=" +
                              std::to_string(value) + " must be >= " + std::to_string(minimum));
}

}  // namespace

uint64_t SplitMix64Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

StatusOr<std::unique_ptr<SyntheticClassification>> SyntheticClassification::Create(
    const SyntheticClassificationOptions& options) {
  RETURN_IF_ERROR(CheckAtLeast("feature_dim", options.feature_dim, 1));
  RETURN_IF_ERROR(CheckAtLeast("hidden_dim", options.hidden_dim, 1));
  RETURN_IF_ERROR(CheckAtLeast("num_classes", options.num_classes, 2));
  // Division-based bound so the check itself cannot overflow.
  const size_t h = options.hidden_dim;
  if (options.feature_dim > kMaxTeacherWeights / h ||
      options.num_classes > kMaxTeacherWeights / h ||
      options.feature_dim * h + options.num_classes * h > kMaxTeacherWeights) {
    return InvalidArgumentError(
        "synthetic classification: teacher of hidden_dim=" + std::to_string(h) +
        " x (feature_dim=" + std::to_string(options.feature_dim) +
        " + num_classes=" + std::to_string(options.num_classes) + ") exceeds " +
        std::to_string(kMaxTeacherWeights) + " weights");
  }
  return std::unique_ptr<SyntheticClassification>(new SyntheticClassification(options));
}

SyntheticClassification::SyntheticClassification(const SyntheticClassificationOptions& options)
    : options_(options) {
  const size_t d = options.feature_dim;
  const size_t h = options.hidden_dim;
  const size_t c = options.num_classes;
  SplitMix64 teacher(SplitMix64Mix(options.seed ^ kTeacherDomain));
  const double w1_scale = std::sqrt(2.0 / static_cast<double>(d));
  const double w2_scale = std::sqrt(1.0 / static_cast<double>(h));
  w1_.resize(h * d);
  for (double& w : w1_) w = w1_scale * teacher.Normal();
  b1_.resize(h);
  for (double& b : b1_) b = 0.1 * teacher.Normal();
  w2_.resize(c * h);
  for (double& w : w2_) w = w2_scale * teacher.Normal();
}

Status SyntheticClassification::Get(size_t index, float* features, int64_t* label) const {
  if (index >= options_.num_samples) {
    return OutOfRangeError("synthetic classification: sample index " + std::to_string(index) +
                           " >= dataset size " + std::to_string(options_.num_samples));
  }
  const size_t d = options_.feature_dim;
  const size_t h = options_.hidden_dim;
  const size_t c = options_.num_classes;
  // Mixing twice decorrelates neighbouring indices' streams and separates seeds.
  SplitMix64 sample(SplitMix64Mix(SplitMix64Mix(options_.seed ^ kSampleDomain) + index));
  std::vector<double> x(d);
  for (size_t j = 0; j < d; ++j) {
    // The label is computed from the float features the student sees, not from the double
    // draw, so it is exactly a function of what Get returns.
    features[j] = static_cast<float>(sample.Normal());
    x[j] = features[j];
  }
  std::vector<double> hidden(h);
  for (size_t k = 0; k < h; ++k) {
    double sum = b1_[k];
    const double* row = w1_.data() + k * d;
    for (size_t j = 0; j < d; ++j) sum += row[j] * x[j];
    hidden[k] = std::tanh(sum);
  }
  size_t best = 0;
  double best_logit = 0;
  for (size_t cls = 0; cls < c; ++cls) {
    double logit = 0;
    const double* row = w2_.data() + cls * h;
    for (size_t k = 0; k < h; ++k) logit += row[k] * hidden[k];
    if (cls == 0 || logit > best_logit) {
      best = cls;
      best_logit = logit;
    }
  }
  *label = static_cast<int64_t>(best);
  return OkStatus();
}

}  // namespace tessera::worker::data
