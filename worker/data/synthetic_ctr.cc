#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "worker/data/synthetic_classification.h"  // SplitMix64Mix

namespace tessera::worker::data {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;
// Domain separators: no two streams (teacher, permutations, embeddings, the samples' dense and
// sparse streams, the calibration's) may coincide, even where their counters happen to match.
constexpr uint64_t kTeacherDomain = 0x6374727465616368ull;      // "ctrteach"
constexpr uint64_t kPermutationDomain = 0x6374727065726d75ull;  // "ctrpermu"
constexpr uint64_t kEmbeddingDomain = 0x637472656d626564ull;    // "ctrembed"
constexpr uint64_t kDenseDomain = 0x63747264656e7365ull;        // "ctrdense"
constexpr uint64_t kSparseDomain = 0x6374727370727365ull;       // "ctrsprse"
constexpr uint64_t kCalibrationDenseDomain = 0x637472636c646e73ull;   // "ctrcldns"
constexpr uint64_t kCalibrationSparseDomain = 0x637472636c737073ull;  // "ctrclsps"

constexpr size_t kMaxCdfEntries = size_t{1} << 26;
constexpr size_t kMaxTeacherWeights = size_t{1} << 28;
constexpr size_t kCalibrationSamples = 8192;
constexpr double kTargetClickRate = 0.25;

// SplitMix64 as a stream: state advances by the golden gamma, output is the mix.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += kGoldenGamma;
    return SplitMix64Mix(state_);
  }
  // Uniform in [0, 1): 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: never 0 so log() below is finite.
  double UniformOpenClosed() { return Uniform() + 0x1.0p-53; }
  // Standard normal by Box-Muller (one of the pair; simplicity over speed).
  double Normal() {
    const double u1 = UniformOpenClosed();
    const double u2 = UniformOpenClosed();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// The seed of stream `counter` in the family `base`: mixing again decorrelates neighbouring
// counters' streams.
uint64_t StreamSeed(uint64_t base, uint64_t counter) { return SplitMix64Mix(base + counter); }

Status Invalid(const std::string& what) {
  return InvalidArgumentError("synthetic ctr: " + what);
}

Status ValidateOptions(const SyntheticCtrOptions& options) {
  if (options.field_sizes.empty()) return Invalid("field_sizes must name at least one field");
  size_t total = 0;
  for (size_t f = 0; f < options.field_sizes.size(); ++f) {
    const int64_t n = options.field_sizes[f];
    const std::string name = "field_sizes[" + std::to_string(f) + "]=" + std::to_string(n);
    if (n < 1) return Invalid(name + " must be >= 1");
    // Checked per entry before adding, so the sum cannot overflow.
    if (static_cast<uint64_t>(n) > kMaxCdfEntries - total) {
      return Invalid(name + " brings field_sizes over " + std::to_string(kMaxCdfEntries) +
                     " ids in all (one Zipf CDF entry each)");
    }
    total += static_cast<size_t>(n);
  }
  const double s = options.zipf_exponent;
  if (!std::isfinite(s) || s <= 0) {
    return Invalid("zipf_exponent=" + std::to_string(s) + " must be finite and > 0");
  }
  if (options.teacher_dim < 1) {
    return Invalid("teacher_dim=" + std::to_string(options.teacher_dim) + " must be >= 1");
  }
  // Division-based bound so the check itself cannot overflow.
  if (options.dense_dim >= kMaxTeacherWeights / options.teacher_dim) {
    return Invalid("teacher of teacher_dim=" + std::to_string(options.teacher_dim) +
                   " x (dense_dim=" + std::to_string(options.dense_dim) + " + 1) exceeds " +
                   std::to_string(kMaxTeacherWeights) + " weights");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<SyntheticCtr>> SyntheticCtr::Create(const SyntheticCtrOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  return std::unique_ptr<SyntheticCtr>(new SyntheticCtr(options));
}

SyntheticCtr::SyntheticCtr(const SyntheticCtrOptions& options)
    : options_(options),
      dense_base_(SplitMix64Mix(options.seed ^ kDenseDomain)),
      sparse_base_(SplitMix64Mix(options.seed ^ kSparseDomain)),
      embedding_base_(SplitMix64Mix(options.seed ^ kEmbeddingDomain)) {
  const size_t fields = options.field_sizes.size();
  const size_t d = options.dense_dim;
  const size_t t = options.teacher_dim;

  // Zipf CDFs: partial sums of (r + 1)^-s in rank order, then normalised. The last entry is
  // set to exactly 1 so a uniform in [0, 1) always lands on a rank.
  zipf_cdf_.resize(fields);
  for (size_t f = 0; f < fields; ++f) {
    std::vector<double>& cdf = zipf_cdf_[f];
    cdf.resize(static_cast<size_t>(options.field_sizes[f]));
    double sum = 0;
    for (size_t r = 0; r < cdf.size(); ++r) {
      sum += std::pow(static_cast<double>(r + 1), -options.zipf_exponent);
      cdf[r] = sum;
    }
    for (double& c : cdf) c /= sum;
    cdf.back() = 1.0;
  }

  // Permutations: b uniform in [0, n), a uniform in [1, n) redrawn until coprime to n (for
  // n = 1 the map is the constant 0 whatever a is). Over a sixth of [1, n) is coprime to n for
  // every n <= 2^26 (the worst is 2*3*5*...*19, at 17%), so a handful of draws suffice.
  permutation_a_.resize(fields);
  permutation_b_.resize(fields);
  const uint64_t permutation_base = SplitMix64Mix(options.seed ^ kPermutationDomain);
  for (size_t f = 0; f < fields; ++f) {
    const uint64_t n = static_cast<uint64_t>(options.field_sizes[f]);
    SplitMix64 stream(StreamSeed(permutation_base, f));
    permutation_b_[f] = stream.Next() % n;
    uint64_t a = 1;
    if (n > 1) {
      do {
        a = 1 + stream.Next() % (n - 1);
      } while (std::gcd(a, n) != 1);
    }
    permutation_a_[f] = a;
  }

  SplitMix64 teacher(SplitMix64Mix(options.seed ^ kTeacherDomain));
  const double dense_scale = d > 0 ? std::sqrt(1.0 / static_cast<double>(d)) : 0.0;
  w_dense_.resize(t * d);
  for (double& w : w_dense_) w = dense_scale * teacher.Normal();
  const double out_scale = std::sqrt(1.0 / static_cast<double>(t));
  w_out_.resize(t);
  for (double& w : w_out_) w = out_scale * teacher.Normal();

  // Bias: put the threshold between the calibration scores ranked just below and at the top
  // quarter, so a quarter of the calibration samples click. The calibration stream is
  // independent of the samples', so the bias does not depend on num_samples.
  const uint64_t calibration_dense = SplitMix64Mix(options.seed ^ kCalibrationDenseDomain);
  const uint64_t calibration_sparse = SplitMix64Mix(options.seed ^ kCalibrationSparseDomain);
  std::vector<float> x(d);
  std::vector<int64_t> ids(fields);
  std::vector<double> scores(kCalibrationSamples);
  for (size_t j = 0; j < kCalibrationSamples; ++j) {
    DrawDense(calibration_dense, j, x.data());
    DrawIds(calibration_sparse, j, ids.data());
    scores[j] = Score(x.data(), ids.data());
  }
  std::sort(scores.begin(), scores.end());
  const size_t first_click = kCalibrationSamples -
                             static_cast<size_t>(kTargetClickRate * kCalibrationSamples);
  bias_ = -0.5 * (scores[first_click - 1] + scores[first_click]);
}

Status SyntheticCtr::CheckIndex(size_t index) const {
  if (index < options_.num_samples) return OkStatus();
  return OutOfRangeError("synthetic ctr: sample index " + std::to_string(index) +
                         " >= dataset size " + std::to_string(options_.num_samples));
}

void SyntheticCtr::DrawDense(uint64_t dense_base, size_t index, float* x) const {
  SplitMix64 stream(StreamSeed(dense_base, index));
  for (size_t j = 0; j < options_.dense_dim; ++j) x[j] = static_cast<float>(stream.Normal());
}

void SyntheticCtr::DrawIds(uint64_t sparse_base, size_t index, int64_t* ids) const {
  SplitMix64 stream(StreamSeed(sparse_base, index));
  for (size_t f = 0; f < zipf_cdf_.size(); ++f) {
    const std::vector<double>& cdf = zipf_cdf_[f];
    // The first rank whose CDF exceeds u: P(rank = r) = cdf[r] - cdf[r - 1].
    const double u = stream.Uniform();
    const uint64_t rank =
        static_cast<uint64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    // a, rank < n <= 2^26, so a * rank < 2^52 cannot overflow.
    const uint64_t n = cdf.size();
    ids[f] = static_cast<int64_t>((permutation_a_[f] * rank + permutation_b_[f]) % n);
  }
}

double SyntheticCtr::Score(const float* x, const int64_t* ids) const {
  const size_t d = options_.dense_dim;
  const size_t t = options_.teacher_dim;
  const size_t fields = zipf_cdf_.size();
  std::vector<double> hidden(t, 0.0);
  // Sparse part: e_f(id) ~ N(0, 1/F) per component, drawn from (seed, f, id) on demand.
  const double embedding_scale = std::sqrt(1.0 / static_cast<double>(fields));
  for (size_t f = 0; f < fields; ++f) {
    SplitMix64 embedding(
        StreamSeed(StreamSeed(embedding_base_, f), static_cast<uint64_t>(ids[f])));
    for (size_t k = 0; k < t; ++k) hidden[k] += embedding_scale * embedding.Normal();
  }
  // Dense part: W_d · x.
  for (size_t k = 0; k < t; ++k) {
    const double* row = w_dense_.data() + k * d;
    double sum = 0;
    for (size_t j = 0; j < d; ++j) sum += row[j] * static_cast<double>(x[j]);
    hidden[k] += sum;
  }
  double score = 0;
  for (size_t k = 0; k < t; ++k) score += w_out_[k] * std::tanh(hidden[k]);
  return score;
}

double SyntheticCtr::TeacherLogit(const float* x, const int64_t* ids) const {
  return Score(x, ids) + bias_;
}

Status SyntheticCtr::Get(size_t index, float* features, int64_t* label) const {
  RETURN_IF_ERROR(CheckIndex(index));
  // The label is computed from the float features Get returns, not from the double draws, so
  // it is exactly a function of what the student sees.
  DrawDense(dense_base_, index, features);
  std::vector<int64_t> ids(zipf_cdf_.size());
  DrawIds(sparse_base_, index, ids.data());
  *label = TeacherLogit(features, ids.data()) > 0 ? 1 : 0;
  return OkStatus();
}

Status SyntheticCtr::GetSparse(size_t index, int64_t* ids) const {
  RETURN_IF_ERROR(CheckIndex(index));
  DrawIds(sparse_base_, index, ids);
  return OkStatus();
}

}  // namespace tessera::worker::data
