// Every op of the CUDA backend against CpuBackend, the reference, on the same random inputs:
// inputs are copied to the device, the op runs on both backends, the results are copied back
// and compared element by element. Shapes include the awkward ones (1, 7, not a multiple of a
// warp or a block, 1000+). Each comparison states its tolerance and why.
//
// Without a CUDA device (or in a CPU-only build, where CudaDeviceCount() is 0) every test skips.
// The GEMM tolerances assume float32 GEMM, the default CudaBackendOptions.
#include "worker/nn/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "worker/nn/cpu/cpu_backend.h"

namespace tessera::worker {
namespace {

// |got[i] - want[i]| <= abs_tol + rel_tol * |want[i]| for every i; the failure lists how many
// elements are off and the first few.
testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& want,
                               double abs_tol, double rel_tol) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure()
           << "sizes differ: got " << got.size() << ", want " << want.size();
  }
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double w = want[i];
    const double tolerance = abs_tol + rel_tol * std::fabs(w);
    if (!(std::fabs(g - w) <= tolerance)) {
      if (bad++ < 5) {
        first << "\n  [" << i << "] got " << g << ", want " << w << " (diff " << g - w
              << ", tolerance " << tolerance << ")";
      }
    }
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first:" << first.str();
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CudaBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: " << QueryCudaDevice(0).status();
    }
    StatusOr<std::unique_ptr<ComputeBackend>> backend = CreateCudaBackend(0, CudaBackendOptions());
    ASSERT_TRUE(backend.ok()) << backend.status();
    gpu_ = std::move(backend).value();
  }

  void TearDown() override {
    if (gpu_ == nullptr) return;
    for (void* pointer : allocations_) gpu_->Free(pointer);
    gpu_->Synchronize();
  }

  // Device memory for n elements, freed in TearDown. A few MiB on a GPU that cannot be had
  // means a broken machine, not a result of this test, so it stops the binary.
  template <typename T>
  T* DeviceAlloc(size_t n) {
    StatusOr<void*> memory = gpu_->Allocate(n * sizeof(T));
    if (!memory.ok()) {
      std::fprintf(stderr, "test setup: %s\n", memory.status().ToString().c_str());
      std::abort();
    }
    allocations_.push_back(*memory);
    return static_cast<T*>(*memory);
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* device = DeviceAlloc<T>(host.size());
    gpu_->CopyToDevice(device, host.data(), host.size() * sizeof(T));
    return device;
  }

  template <typename T>
  std::vector<T> Download(const T* device, size_t n) {
    std::vector<T> host(n);
    gpu_->CopyToHost(host.data(), device, n * sizeof(T));
    return host;
  }

  std::vector<float> Normal(size_t n, float mean = 0.0f, float stddev = 1.0f) {
    std::normal_distribution<float> normal(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_);
    return v;
  }

  std::vector<int64_t> Labels(int64_t rows, int64_t classes) {
    std::uniform_int_distribution<int64_t> pick(0, classes - 1);
    std::vector<int64_t> labels(static_cast<size_t>(rows));
    for (int64_t& label : labels) label = pick(rng_);
    return labels;
  }

  std::vector<int32_t> Slots(int64_t rows, int32_t table_rows) {
    std::uniform_int_distribution<int32_t> pick(0, table_rows - 1);
    std::vector<int32_t> slots(static_cast<size_t>(rows));
    for (int32_t& slot : slots) slot = pick(rng_);
    return slots;
  }

  CpuBackend cpu_;
  std::unique_ptr<ComputeBackend> gpu_;
  std::vector<void*> allocations_;
  std::mt19937 rng_{20261121};
};

// ---- Creation and memory ----------------------------------------------------------------------

TEST_F(CudaBackendTest, NameAndBadDeviceIndex) {
  EXPECT_EQ(gpu_->name(), "cuda:0");
  EXPECT_FALSE(gpu_->host_memory());
  const int count = CudaDeviceCount();
  for (int bad : {-1, count}) {
    StatusOr<std::unique_ptr<ComputeBackend>> backend = CreateCudaBackend(bad, CudaBackendOptions());
    ASSERT_FALSE(backend.ok()) << "device " << bad;
    EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status();
    EXPECT_NE(backend.status().message().find("cuda:" + std::to_string(bad)), std::string::npos)
        << backend.status();
  }
}

TEST_F(CudaBackendTest, AllocateCopiesFillAndFree) {
  StatusOr<void*> none = gpu_->Allocate(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  gpu_->Free(nullptr);

  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{(1 << 20) + 3}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> host = Normal(n);
    float* a = Upload(host);
    float* b = DeviceAlloc<float>(n);
    gpu_->CopyOnDevice(b, a, n * sizeof(float));
    EXPECT_TRUE(BitIdentical(Download(b, n), host));

    // Fill writes exactly its n elements: the last one keeps its value (exact comparison).
    std::vector<float> cpu_result = host;
    cpu_.Fill(n - 1, -2.5f, cpu_result.data());
    gpu_->Fill(n - 1, -2.5f, b);
    gpu_->Fill(0, 7.0f, b);  // writes nothing
    EXPECT_TRUE(BitIdentical(Download(b, n), cpu_result));
  }
  gpu_->Synchronize();
}

TEST_F(CudaBackendTest, AllocateTooMuchIsAnErrorNamingBytesAndDeviceAndLeavesTheBackendUsable) {
  const size_t too_much = size_t{1} << 50;  // 1 PiB
  StatusOr<void*> memory = gpu_->Allocate(too_much);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), StatusCode::kResourceExhausted) << memory.status();
  EXPECT_NE(memory.status().message().find(std::to_string(too_much) + " bytes"),
            std::string::npos)
      << memory.status();
  EXPECT_NE(memory.status().message().find("cuda:0"), std::string::npos) << memory.status();

  // The failed cudaMalloc must not surface as the error of the next op.
  float* x = DeviceAlloc<float>(3);
  gpu_->Fill(3, 1.5f, x);
  EXPECT_EQ(Download(x, 3), (std::vector<float>{1.5f, 1.5f, 1.5f}));
}

// ---- Dense ops ----------------------------------------------------------------------------------

TEST_F(CudaBackendTest, GemmMatchesCpuForEveryTransposeAndShape) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 3, 5}, {1, 1000, 7},
                         {1000, 1, 33}, {1024, 1, 1}, {129, 257, 1031}, {64, 48, 100}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair<float, float>{1.0f, 0.0f}, {0.5f, 2.0f}}) {
          SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta
                                          << " tb=" << tb << " alpha=" << alpha
                                          << " beta=" << beta);
          const auto a = Normal(m * k), b = Normal(k * n), c = Normal(m * n);
          float* a_gpu = Upload(a);
          float* b_gpu = Upload(b);
          float* c_gpu = Upload(c);
          std::vector<float> want = c;
          cpu_.Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, want.data());
          gpu_->Gemm(ta, tb, m, n, k, alpha, a_gpu, b_gpu, beta, c_gpu);
          // Both accumulate k float32 products in different orders (blocking, FMA): relative
          // 1e-4 of (1 + |C|) covers k = 1031 with room (TF32 would need ~1e-2).
          EXPECT_TRUE(Close(Download(c_gpu, m * n), want, 1e-4, 1e-4));
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, GemmWithZeroInnerDimensionScalesC) {
  // op(A) op(B) is all zeros, so C = beta * C, one multiplication: exact. (cuBLAS would reject
  // the zero leading dimension; the backend scales C itself.)
  const int64_t m = 7, n = 5;
  const auto c = Normal(m * n);
  for (float beta : {0.0f, 2.0f}) {
    float* c_gpu = Upload(c);
    gpu_->Gemm(false, true, m, n, 0, 1.0f, nullptr, nullptr, beta, c_gpu);
    std::vector<float> want = c;
    cpu_.Gemm(false, true, m, n, 0, 1.0f, nullptr, nullptr, beta, want.data());
    EXPECT_TRUE(Close(Download(c_gpu, m * n), want, 0, 0)) << "beta=" << beta;
  }
}

TEST_F(CudaBackendTest, AddRowVectorAndSumRowsMatchCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 3}, {1000, 1}, {3, 1000},
                            {1031, 65}, {0, 4}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    const auto in = Normal(rows * cols), bias = Normal(cols);
    float* out_gpu = Upload(in);
    std::vector<float> out_cpu = in;
    cpu_.AddRowVector(rows, cols, bias.data(), out_cpu.data());
    gpu_->AddRowVector(rows, cols, Upload(bias), out_gpu);
    // One float addition per element on both sides: exact.
    EXPECT_TRUE(Close(Download(out_gpu, rows * cols), out_cpu, 0, 0));

    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
      const auto start = Normal(cols);
      float* sums_gpu = Upload(start);
      std::vector<float> sums_cpu = start;
      cpu_.SumRows(rows, cols, in.data(), sums_cpu.data(), accumulate);
      gpu_->SumRows(rows, cols, Upload(in), sums_gpu, accumulate);
      // One thread per column adds the rows in order, the CPU loop's order: the same float
      // additions, so the same bits.
      EXPECT_TRUE(Close(Download(sums_gpu, cols), sums_cpu, 0, 0));
    }
  }
}

TEST_F(CudaBackendTest, CopyColumnsMatchesCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {1000, 3}, {5, 130}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    // Out of column 1 of a wider matrix into column 2 of another, wider still.
    const int64_t src_stride = cols + 3, dst_stride = cols + 5;
    const auto src = Normal(rows * src_stride);
    const auto dst = Normal(rows * dst_stride);  // the columns not copied must keep these
    float* dst_gpu = Upload(dst);
    std::vector<float> dst_cpu = dst;
    cpu_.CopyColumns(rows, cols, src.data() + 1, src_stride, dst_cpu.data() + 2, dst_stride);
    gpu_->CopyColumns(rows, cols, Upload(src) + 1, src_stride, dst_gpu + 2, dst_stride);
    EXPECT_TRUE(BitIdentical(Download(dst_gpu, dst.size()), dst_cpu));  // a copy: exact
  }
}

TEST_F(CudaBackendTest, ReluForwardAndBackwardMatchCpu) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{(1 << 20) + 3}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto x = Normal(n);
    x[0] = 0.0f;  // the kink: y = 0 and dx = 0 at exactly 0
    const auto dy = Normal(n);
    float* x_gpu = Upload(x);
    float* y_gpu = DeviceAlloc<float>(n);
    std::vector<float> y_cpu(n);
    cpu_.ReluForward(n, x.data(), y_cpu.data());
    gpu_->ReluForward(n, x_gpu, y_gpu);
    EXPECT_TRUE(BitIdentical(Download(y_gpu, n), y_cpu));  // selects values: exact

    std::vector<float> dx_cpu(n);
    cpu_.ReluBackward(n, x.data(), dy.data(), dx_cpu.data());
    float* dx_gpu = DeviceAlloc<float>(n);
    gpu_->ReluBackward(n, x_gpu, Upload(dy), dx_gpu);
    EXPECT_TRUE(BitIdentical(Download(dx_gpu, n), dx_cpu));
    float* dy_in_place = Upload(dy);  // dx aliasing dy
    gpu_->ReluBackward(n, x_gpu, dy_in_place, dy_in_place);
    EXPECT_TRUE(BitIdentical(Download(dy_in_place, n), dx_cpu));
  }
}

TEST_F(CudaBackendTest, GeluForwardAndBackwardMatchCpu) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto x = Normal(n, 0.0f, 3.0f);
    const float specials[] = {0.0f, -10.0f, 10.0f, -5.0f, 5.0f, -0.5f, 1e-4f};
    for (size_t i = 0; i < n && i < std::size(specials); ++i) x[i] = specials[i];
    const auto dy = Normal(n);
    float* x_gpu = Upload(x);

    std::vector<float> y_cpu(n);
    cpu_.GeluForward(n, x.data(), y_cpu.data());
    float* y_gpu = DeviceAlloc<float>(n);
    gpu_->GeluForward(n, x_gpu, y_gpu);
    // CUDA's erfcf/expf are within a few ulp of glibc's, and a few float operations follow:
    // 1e-5 relative, plus 1e-6 absolute for the tiny values of the negative tail.
    EXPECT_TRUE(Close(Download(y_gpu, n), y_cpu, 1e-6, 1e-5));

    std::vector<float> dx_cpu(n);
    cpu_.GeluBackward(n, x.data(), dy.data(), dx_cpu.data());
    float* dx_gpu = DeviceAlloc<float>(n);
    gpu_->GeluBackward(n, x_gpu, Upload(dy), dx_gpu);
    EXPECT_TRUE(Close(Download(dx_gpu, n), dx_cpu, 1e-6, 1e-5));
    float* dy_in_place = Upload(dy);  // dx aliasing dy
    gpu_->GeluBackward(n, x_gpu, dy_in_place, dy_in_place);
    EXPECT_TRUE(Close(Download(dy_in_place, n), dx_cpu, 1e-6, 1e-5));
  }
}

const std::vector<std::pair<int64_t, int64_t>> kLayerNormShapes = {
    {1, 1}, {7, 3}, {1, 1000}, {1000, 7}, {33, 1031}, {3, 4099}};

TEST_F(CudaBackendTest, LayerNormForwardMatchesCpu) {
  const float eps = 1e-5f;
  for (auto [rows, cols] : kLayerNormShapes) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    // An offset mean, so a careless one-pass variance would show.
    const auto x = Normal(rows * cols, 3.0f, 2.0f);
    const auto gamma = Normal(cols, 1.0f, 0.5f), beta = Normal(cols);
    std::vector<float> y_cpu(x.size()), mean_cpu(rows), rstd_cpu(rows);
    cpu_.LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y_cpu.data(),
                          mean_cpu.data(), rstd_cpu.data());
    float* y_gpu = DeviceAlloc<float>(x.size());
    float* mean_gpu = DeviceAlloc<float>(rows);
    float* rstd_gpu = DeviceAlloc<float>(rows);
    gpu_->LayerNormForward(rows, cols, eps, Upload(x), Upload(gamma), Upload(beta), y_gpu,
                           mean_gpu, rstd_gpu);
    // Mean and variance are double sums on both sides (different orders), rounded to float:
    // equal to within an ulp or two.
    EXPECT_TRUE(Close(Download(mean_gpu, rows), mean_cpu, 1e-6, 1e-6));
    EXPECT_TRUE(Close(Download(rstd_gpu, rows), rstd_cpu, 0, 1e-6));
    // y = (x - mean) * rstd * gamma + beta in float, which nvcc may fuse: a few ulp of |y| ~ 3.
    EXPECT_TRUE(Close(Download(y_gpu, x.size()), y_cpu, 1e-5, 1e-5));
  }
}

TEST_F(CudaBackendTest, LayerNormBackwardMatchesCpu) {
  const float eps = 1e-5f;
  for (auto [rows, cols] : kLayerNormShapes) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " cols=" << cols);
    const auto x = Normal(rows * cols, 3.0f, 2.0f);
    const auto gamma = Normal(cols, 1.0f, 0.5f), beta = Normal(cols);
    const auto dy = Normal(rows * cols);
    // Both backwards get the CPU forward's mean and rstd, so only the backward is compared.
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu_.LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y.data(),
                          mean.data(), rstd.data());
    std::vector<float> dx_cpu(x.size()), dgamma_cpu(cols), dbeta_cpu(cols);
    cpu_.LayerNormBackward(rows, cols, x.data(), gamma.data(), mean.data(), rstd.data(),
                           dy.data(), dx_cpu.data(), dgamma_cpu.data(), dbeta_cpu.data());

    float* x_gpu = Upload(x);
    float* gamma_gpu = Upload(gamma);
    float* mean_gpu = Upload(mean);
    float* rstd_gpu = Upload(rstd);
    const auto garbage = Normal(cols, 100.0f);  // dgamma and dbeta are overwritten, not added to
    // Sums over rows in double on both sides: a float rounding apart. dx: row means in double
    // on both sides, then a few float operations (fusable on the GPU) scaled by rstd ~ 0.5.
    const double sums_abs = 1e-5, sums_rel = 1e-5, dx_abs = 1e-5, dx_rel = 1e-4;
    for (const char* mode : {"separate dx", "dx aliasing dy", "no dx"}) {
      SCOPED_TRACE(mode);
      float* dy_gpu = Upload(dy);
      float* dgamma_gpu = Upload(garbage);
      float* dbeta_gpu = Upload(garbage);
      float* dx_gpu = std::string(mode) == "separate dx"      ? DeviceAlloc<float>(x.size())
                      : std::string(mode) == "dx aliasing dy" ? dy_gpu
                                                              : nullptr;
      gpu_->LayerNormBackward(rows, cols, x_gpu, gamma_gpu, mean_gpu, rstd_gpu, dy_gpu, dx_gpu,
                              dgamma_gpu, dbeta_gpu);
      EXPECT_TRUE(Close(Download(dgamma_gpu, cols), dgamma_cpu, sums_abs, sums_rel));
      EXPECT_TRUE(Close(Download(dbeta_gpu, cols), dbeta_cpu, sums_abs, sums_rel));
      if (dx_gpu != nullptr) {
        EXPECT_TRUE(Close(Download(dx_gpu, x.size()), dx_cpu, dx_abs, dx_rel));
      } else {
        EXPECT_TRUE(BitIdentical(Download(dy_gpu, dy.size()), dy));  // dy untouched
      }
    }
  }
}

// ---- Losses -------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, SoftmaxCrossEntropyAndBackwardMatchCpu) {
  struct Case {
    int64_t rows, classes;
    const char* logits;  // "normal", "ties" (integers in [0, 2]: argmax ties), "huge"
  };
  for (const Case& c : {Case{1, 1, "normal"}, Case{7, 3, "normal"}, Case{1000, 7, "normal"},
                        Case{5, 1000, "normal"}, Case{3, 1031, "normal"},
                        Case{1024, 10, "normal"}, Case{1000, 7, "ties"}, Case{9, 1031, "ties"},
                        Case{64, 33, "huge"}}) {
    const int64_t rows = c.rows, classes = c.classes;
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " classes=" << classes << " logits="
                                    << c.logits);
    auto logits = Normal(rows * classes, 0.0f, 3.0f);
    if (std::string(c.logits) == "ties") {
      for (float& z : logits) z = std::fmod(std::fabs(std::round(z)), 3.0f);
    } else if (std::string(c.logits) == "huge") {
      for (float& z : logits) z *= 30.0f;  // confident wrong answers: the loss must stay finite
    }
    const auto labels = Labels(rows, classes);
    std::vector<float> p_cpu(logits.size());
    const ComputeBackend::LossResult want =
        cpu_.SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), p_cpu.data());
    int64_t* labels_gpu = Upload(labels);
    float* p_gpu = DeviceAlloc<float>(logits.size());
    const ComputeBackend::LossResult got =
        gpu_->SoftmaxCrossEntropy(rows, classes, Upload(logits), labels_gpu, p_gpu);
    // exp in float (CUDA's expf within 2 ulp of glibc's), normalised by a double sum rounded
    // to float: a few ulp.
    EXPECT_TRUE(Close(Download(p_gpu, logits.size()), p_cpu, 1e-7, 1e-5));
    // The loss sums log-sum-exp terms in double in different orders; the terms themselves differ
    // by the float exp's ulps.
    EXPECT_TRUE(std::isfinite(got.loss));
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * (1 + std::fabs(want.loss)));
    // argmax compares the same floats, first maximum on ties: exact.
    EXPECT_EQ(got.correct, want.correct);

    // The backward from the same probabilities on both sides (the CPU's): p * scale - scale at
    // the label, the same float operations, so exact up to a fused rounding (none: __fmul_rn).
    std::vector<float> d_cpu(logits.size());
    cpu_.SoftmaxCrossEntropyBackward(rows, classes, p_cpu.data(), labels.data(), d_cpu.data());
    float* d_gpu = DeviceAlloc<float>(logits.size());
    gpu_->SoftmaxCrossEntropyBackward(rows, classes, Upload(p_cpu), labels_gpu, d_gpu);
    EXPECT_TRUE(Close(Download(d_gpu, logits.size()), d_cpu, 1e-9, 1e-6));
  }
  const ComputeBackend::LossResult none =
      gpu_->SoftmaxCrossEntropy(0, 5, nullptr, nullptr, nullptr);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_EQ(none.correct, 0);
}

TEST_F(CudaBackendTest, BinaryCrossEntropyAndBackwardMatchCpu) {
  for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows));
    auto logits = Normal(rows, 0.0f, 3.0f);
    const float specials[] = {0.0f, 50.0f, -50.0f, 100.0f, -100.0f, 1e-6f};
    for (int64_t i = 0; i < rows && i < static_cast<int64_t>(std::size(specials)); ++i) {
      logits[i] = specials[i];
    }
    const auto labels = Labels(rows, 2);
    std::vector<float> p_cpu(rows);
    const ComputeBackend::LossResult want =
        cpu_.BinaryCrossEntropy(rows, logits.data(), labels.data(), p_cpu.data());
    int64_t* labels_gpu = Upload(labels);
    float* p_gpu = DeviceAlloc<float>(rows);
    const ComputeBackend::LossResult got =
        gpu_->BinaryCrossEntropy(rows, Upload(logits), labels_gpu, p_gpu);
    // Both compute in double and round the probability to float once: at most an ulp apart
    // (CUDA's double exp/log1p are within an ulp or two of glibc's).
    EXPECT_TRUE(Close(Download(p_gpu, rows), p_cpu, 1e-30, 1e-6));
    // Double terms summed in different orders.
    EXPECT_NEAR(got.loss, want.loss, 1e-9 * (1 + std::fabs(want.loss)));
    EXPECT_EQ(got.correct, want.correct);  // compares z with 0: exact

    std::vector<float> d_cpu(rows);
    cpu_.BinaryCrossEntropyBackward(rows, p_cpu.data(), labels.data(), d_cpu.data());
    float* d_gpu = DeviceAlloc<float>(rows);
    gpu_->BinaryCrossEntropyBackward(rows, Upload(p_cpu), labels_gpu, d_gpu);
    // (p - y) * scale: the same two float operations, exact up to a fused rounding.
    EXPECT_TRUE(Close(Download(d_gpu, rows), d_cpu, 1e-12, 1e-6));
  }
  const ComputeBackend::LossResult none = gpu_->BinaryCrossEntropy(0, nullptr, nullptr, nullptr);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_EQ(none.correct, 0);
}

// ---- Embeddings ---------------------------------------------------------------------------------

TEST_F(CudaBackendTest, GatherRowsMatchesCpu) {
  for (auto [rows, dim, table_rows] :
       {std::tuple<int64_t, int64_t, int32_t>{1, 1, 1}, {7, 7, 5}, {1000, 3, 300},
        {9, 130, 2}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " dim=" << dim
                                    << " table_rows=" << table_rows);
    const int64_t out_stride = dim + 4;
    const auto table = Normal(table_rows * dim);
    const auto slots = Slots(rows, table_rows);
    const auto out = Normal(rows * out_stride);  // the columns past dim must keep these
    std::vector<float> out_cpu = out;
    cpu_.GatherRows(rows, dim, table.data(), slots.data(), out_cpu.data(), out_stride);
    float* out_gpu = Upload(out);
    gpu_->GatherRows(rows, dim, Upload(table), Upload(slots), out_gpu, out_stride);
    EXPECT_TRUE(BitIdentical(Download(out_gpu, out.size()), out_cpu));  // a copy: exact
  }
}

TEST_F(CudaBackendTest, ScatterAddRowsMatchesCpu) {
  for (auto [rows, dim, table_rows] :
       {std::tuple<int64_t, int64_t, int32_t>{1, 1, 1}, {7, 7, 5}, {1000, 3, 300},
        {1000, 130, 1}, {9, 130, 2}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " dim=" << dim
                                    << " table_rows=" << table_rows);
    const int64_t in_stride = dim + 2;
    const auto dout = Normal(rows * in_stride);
    const auto slots = Slots(rows, table_rows);
    const auto grad = Normal(table_rows * dim);
    std::vector<float> grad_cpu = grad;
    cpu_.ScatterAddRows(rows, dim, dout.data(), in_stride, slots.data(), grad_cpu.data());
    float* grad_gpu = Upload(grad);
    gpu_->ScatterAddRows(rows, dim, Upload(dout), in_stride, Upload(slots), grad_gpu);
    const std::vector<float> got = Download(grad_gpu, grad.size());
    // Atomics add a slot's rows in any order: each side is within (adds) * 2^-24 * sum|terms| of
    // the exact sum, so compare against 1e-5 of the sum of absolute terms (up to 1000 adds).
    std::vector<double> magnitude(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) magnitude[i] = std::fabs(grad[i]);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < dim; ++j) {
        magnitude[slots[r] * dim + j] += std::fabs(dout[r * in_stride + j]);
      }
    }
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(got[i] - grad_cpu[i]) <= 1e-5 * (1 + magnitude[i]))) {
        if (bad++ < 5) {
          ADD_FAILURE() << "[" << i << "] got " << got[i] << ", want " << grad_cpu[i];
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// ---- Determinism --------------------------------------------------------------------------------

// Every op but ScatterAddRows promises the same bits on every run (cuda_backend.h); the ones
// with reductions are the ones that could break it.
TEST_F(CudaBackendTest, ReductionsAreBitwiseReproducible) {
  const int64_t rows = 1031, cols = 1000;
  const auto x = Normal(rows * cols, 3.0f, 2.0f);
  const auto gamma = Normal(cols), beta = Normal(cols), dy = Normal(rows * cols);
  const auto labels = Labels(rows, cols);
  float* x_gpu = Upload(x);
  float* gamma_gpu = Upload(gamma);
  float* beta_gpu = Upload(beta);
  float* dy_gpu = Upload(dy);
  int64_t* labels_gpu = Upload(labels);
  float* y_gpu = DeviceAlloc<float>(x.size());
  float* mean_gpu = DeviceAlloc<float>(rows);
  float* rstd_gpu = DeviceAlloc<float>(rows);
  float* dx_gpu = DeviceAlloc<float>(x.size());
  float* dgamma_gpu = DeviceAlloc<float>(cols);
  float* dbeta_gpu = DeviceAlloc<float>(cols);
  float* sums_gpu = DeviceAlloc<float>(cols);
  float* p_gpu = DeviceAlloc<float>(x.size());

  struct Run {
    std::vector<float> sums, y, mean, rstd, dx, dgamma, dbeta, p;
    double loss = 0;
    int64_t correct = 0;
  };
  auto run = [&]() {
    Run out;
    gpu_->SumRows(rows, cols, x_gpu, sums_gpu, false);
    gpu_->LayerNormForward(rows, cols, 1e-5f, x_gpu, gamma_gpu, beta_gpu, y_gpu, mean_gpu,
                           rstd_gpu);
    gpu_->LayerNormBackward(rows, cols, x_gpu, gamma_gpu, mean_gpu, rstd_gpu, dy_gpu, dx_gpu,
                            dgamma_gpu, dbeta_gpu);
    const ComputeBackend::LossResult loss =
        gpu_->SoftmaxCrossEntropy(rows, cols, x_gpu, labels_gpu, p_gpu);
    out.loss = loss.loss;
    out.correct = loss.correct;
    out.sums = Download(sums_gpu, cols);
    out.y = Download(y_gpu, x.size());
    out.mean = Download(mean_gpu, rows);
    out.rstd = Download(rstd_gpu, rows);
    out.dx = Download(dx_gpu, x.size());
    out.dgamma = Download(dgamma_gpu, cols);
    out.dbeta = Download(dbeta_gpu, cols);
    out.p = Download(p_gpu, x.size());
    return out;
  };
  const Run first = run();
  const Run second = run();
  EXPECT_TRUE(BitIdentical(first.sums, second.sums));
  EXPECT_TRUE(BitIdentical(first.y, second.y));
  EXPECT_TRUE(BitIdentical(first.mean, second.mean));
  EXPECT_TRUE(BitIdentical(first.rstd, second.rstd));
  EXPECT_TRUE(BitIdentical(first.dx, second.dx));
  EXPECT_TRUE(BitIdentical(first.dgamma, second.dgamma));
  EXPECT_TRUE(BitIdentical(first.dbeta, second.dbeta));
  EXPECT_TRUE(BitIdentical(first.p, second.p));
  EXPECT_EQ(std::memcmp(&first.loss, &second.loss, sizeof(double)), 0)
      << first.loss << " vs " << second.loss;
  EXPECT_EQ(first.correct, second.correct);
}

}  // namespace
}  // namespace tessera::worker
