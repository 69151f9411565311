// CUDA implementation of worker/nn/cuda/cuda_backend.h, compiled by nvcc (//third_party/cuda:cuda.bzl).
// cuda_backend_cpu.cc serves the same header in builds without the toolkit.
//
// Layout of this file: cuBLAS loaded at run time and its error adapter (the one place where a
// cublasStatus_t becomes a Status; CUDA runtime errors go through common/cuda/cuda_status.h),
// device-side reduction helpers, the kernels in the order of compute_backend.h, then the
// CudaBackend class that launches them on its stream.
//
// Determinism: every reduction here has a fixed shape that depends only on the op's sizes:
// column sums (SumRows, LayerNorm's dgamma/dbeta) are one thread per column adding the rows in
// order, exactly like the CPU loop; row reductions (LayerNorm, softmax) are one block per row
// whose thread count is a function of the row length, reduced by a fixed shuffle tree; the loss
// totals are one block over the per-row values. Only ScatterAddRows uses atomics.
#include "worker/nn/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "common/base/logging.h"
#include "common/base/shared_library.h"
#include "common/cuda/cuda_status.h"

namespace tessera::worker {
namespace {

// ---- cuBLAS, loaded at run time -----------------------------------------------------------------
//
// cuBLAS is dlopen'ed when the first backend is created instead of being linked: linked, the
// static TLS of libcublasLt (~92 KiB) is reserved on every thread's stack, and a thread created
// with a small fixed stack then fails to start with EINVAL (civetweb's 100 KiB /metrics threads
// did, in every worker, CPU-only runs included). TLS of a dlopen'ed library is allocated on
// demand instead. It also keeps CPU-only runs from loading ~800 MiB of GPU libraries.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

StatusOr<const CublasApi*> LoadCublas() {
  static const StatusOr<CublasApi> api = []() -> StatusOr<CublasApi> {
    ASSIGN_OR_RETURN(SharedLibrary library,
                     SharedLibrary::Open("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR),
                                         "cuBLAS"));
    CublasApi loaded;
    RETURN_IF_ERROR(library.Bind(&loaded.create, "cublasCreate_v2"));
    RETURN_IF_ERROR(library.Bind(&loaded.destroy, "cublasDestroy_v2"));
    RETURN_IF_ERROR(library.Bind(&loaded.set_stream, "cublasSetStream_v2"));
    RETURN_IF_ERROR(library.Bind(&loaded.set_math_mode, "cublasSetMathMode"));
    RETURN_IF_ERROR(library.Bind(&loaded.sgemm, "cublasSgemm_v2"));
    RETURN_IF_ERROR(library.Bind(&loaded.status_name, "cublasGetStatusName"));
    RETURN_IF_ERROR(library.Bind(&loaded.status_string, "cublasGetStatusString"));
    return loaded;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

// Only called once LoadCublas succeeded (a backend exists).
const CublasApi& Cublas() { return **LoadCublas(); }

// ---- cuBLAS error adapter -----------------------------------------------------------------------

// "cublasCreate: CUBLAS_STATUS_NOT_INITIALIZED: the library was not initialized".
Status CublasStatus(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return InternalError(std::string(call) + ": " + Cublas().status_name(status) + ": " +
                       Cublas().status_string(status));
}

// For the calls whose failure an op cannot return: the device state is unknown afterwards (a
// faulting kernel leaves the context unusable), so the process stops with the whole story.
// `error` names the call that failed.
[[noreturn]] void DieOnDeviceError(std::string_view backend, std::string_view op,
                                   const Status& error) {
  TLOG(ERROR) << backend << " " << op << ": " << error.message()
              << " (aborting: an op cannot return this error and the device state is unknown)";
  std::abort();
}

// ---- Launch shapes ------------------------------------------------------------------------------

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Elementwise kernels: grid-stride loops over at most this many blocks.
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 1 << 16;
// Column kernels: one thread per column.
constexpr int kColumnThreads = 256;
// Row kernels: one block per row, at most this many threads.
constexpr int kMaxRowThreads = 1024;
// The loss totals: one block over the per-row values.
constexpr int kLossTotalsThreads = 256;

unsigned ElementwiseBlocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(
      (n + kElementwiseThreads - 1) / kElementwiseThreads, kMaxElementwiseBlocks));
}

unsigned ColumnBlocks(int64_t cols) {
  return static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
}

// Threads per row block: a power of two from one warp to kMaxRowThreads, about four elements per
// thread. A function of the row length only, so a row's reduction order never changes.
int RowThreads(int64_t cols) {
  int threads = kWarpSize;
  while (threads < kMaxRowThreads && static_cast<int64_t>(threads) * 4 < cols) threads *= 2;
  return threads;
}

// ---- Device-side reductions ---------------------------------------------------------------------

// Sum over the block of each thread's `value`, returned to every thread. `shared` holds at least
// one T per warp. REQUIRES: blockDim.x is a multiple of kWarpSize and at most 32 warps; every
// thread of the block calls it. The order of additions is fixed by blockDim.x.
template <typename T>
__device__ T BlockSum(T value, T* shared) {
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < blockDim.x / kWarpSize ? shared[lane] : T(0);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      value += __shfl_down_sync(kFullMask, value, offset);
    }
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  const T sum = shared[0];
  __syncthreads();  // `shared` may be reused by the caller's next reduction
  return sum;
}

// Whether candidate (value, index) beats the current one for argmax: larger value, or the same
// value at a smaller index (the CPU's first maximum). index < 0 means "none yet".
__device__ bool ArgmaxBetter(float value, long long index, float candidate_value,
                             long long candidate_index) {
  if (candidate_index < 0) return false;
  if (index < 0) return true;
  return candidate_value > value || (candidate_value == value && candidate_index < index);
}

// Argmax over the block; every thread gets the result. Same REQUIRES as BlockSum.
__device__ void BlockArgmax(float* value, long long* index, float* shared_value,
                            long long* shared_index) {
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  float v = *value;
  long long i = *index;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other_v = __shfl_down_sync(kFullMask, v, offset);
    const long long other_i = __shfl_down_sync(kFullMask, i, offset);
    if (ArgmaxBetter(v, i, other_v, other_i)) {
      v = other_v;
      i = other_i;
    }
  }
  if (lane == 0) {
    shared_value[warp] = v;
    shared_index[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    const bool present = lane < blockDim.x / kWarpSize;
    v = present ? shared_value[lane] : 0.0f;
    i = present ? shared_index[lane] : -1;
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float other_v = __shfl_down_sync(kFullMask, v, offset);
      const long long other_i = __shfl_down_sync(kFullMask, i, offset);
      if (ArgmaxBetter(v, i, other_v, other_i)) {
        v = other_v;
        i = other_i;
      }
    }
    if (lane == 0) {
      shared_value[0] = v;
      shared_index[0] = i;
    }
  }
  __syncthreads();
  *value = shared_value[0];
  *index = shared_index[0];
  __syncthreads();
}

// ---- Kernels ------------------------------------------------------------------------------------

#define TESSERA_GRID_STRIDE_LOOP(i, n)                                                   \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__global__ void FillKernel(int64_t n, float value, float* x) {
  TESSERA_GRID_STRIDE_LOOP(i, n) { x[i] = value; }
}

// C = beta * C, for Gemm with k == 0 (cuBLAS rejects a zero leading dimension). As in BLAS, C is
// not read when beta is 0.
__global__ void ScaleKernel(int64_t n, float beta, float* c) {
  TESSERA_GRID_STRIDE_LOOP(i, n) { c[i] = beta == 0.0f ? 0.0f : beta * c[i]; }
}

__global__ void AddRowVectorKernel(int64_t rows, int64_t cols, const float* bias, float* out) {
  TESSERA_GRID_STRIDE_LOOP(i, rows * cols) { out[i] += bias[i % cols]; }
}

// One thread per column adds the rows in order: the CPU's order, so the same float result.
__global__ void SumRowsKernel(int64_t rows, int64_t cols, const float* in, float* sums,
                              bool accumulate) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float sum = accumulate ? sums[j] : 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += in[r * cols + j];
  sums[j] = sum;
}

__global__ void ReluForwardKernel(int64_t n, const float* x, float* y) {
  TESSERA_GRID_STRIDE_LOOP(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

// dx may alias dy: each element is read and written by the same thread.
__global__ void ReluBackwardKernel(int64_t n, const float* x, const float* dy, float* dx) {
  TESSERA_GRID_STRIDE_LOOP(i, n) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
}

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)

// Phi(x) is computed as 0.5 erfc(-x / sqrt 2), equal to 0.5 (1 + erf(x / sqrt 2)) but without
// the cancellation that 1 + erf(...) suffers for negative x (the CPU backend does the same).
__global__ void GeluForwardKernel(int64_t n, const float* x, float* y) {
  TESSERA_GRID_STRIDE_LOOP(i, n) {
    const float v = x[i];
    y[i] = v * (0.5f * erfcf(-v * kInvSqrt2));
  }
}

__global__ void GeluBackwardKernel(int64_t n, const float* x, const float* dy, float* dx) {
  TESSERA_GRID_STRIDE_LOOP(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * erfcf(-v * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// One block per row: the mean, then the biased variance around it, both in double (two passes,
// as the CPU backend: a one-pass E[x^2] - E[x]^2 in float loses the variance when |mean| is
// large against the spread), then y in float.
__global__ void LayerNormForwardKernel(int64_t cols, float eps, const float* x, const float* gamma,
                                       const float* beta, float* y, float* mean, float* rstd) {
  __shared__ double shared[kWarpSize];
  const int64_t r = blockIdx.x;
  const float* x_row = x + r * cols;
  float* y_row = y + r * cols;
  const double inverse_cols = 1.0 / static_cast<double>(cols);

  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += x_row[j];
  const double mean_double = BlockSum(sum, shared) * inverse_cols;

  double squares = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double centred = x_row[j] - mean_double;
    squares += centred * centred;
  }
  const double variance = BlockSum(squares, shared) * inverse_cols;
  const float row_mean = static_cast<float>(mean_double);
  const float row_rstd = static_cast<float>(1.0 / sqrt(variance + static_cast<double>(eps)));

  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    y_row[j] = (x_row[j] - row_mean) * row_rstd * gamma[j] + beta[j];
  }
  if (threadIdx.x == 0) {
    mean[r] = row_mean;
    rstd[r] = row_rstd;
  }
}

// dgamma[j] = sum_r dy[r][j] * xhat[r][j], dbeta[j] = sum_r dy[r][j]: one thread per column,
// rows in order, in double (deterministic, and the CPU's order and precision). Runs before the
// dx kernel, which may overwrite dy.
__global__ void LayerNormParamGradKernel(int64_t rows, int64_t cols, const float* x,
                                         const float* mean, const float* rstd, const float* dy,
                                         float* dgamma, float* dbeta) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double dg = 0.0;
  double db = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float d = dy[r * cols + j];
    const float xhat = (x[r * cols + j] - mean[r]) * rstd[r];
    dg += static_cast<double>(d) * xhat;
    db += d;
  }
  dgamma[j] = static_cast<float>(dg);
  dbeta[j] = static_cast<float>(db);
}

// One block per row. With g = dy * gamma and xhat = (x - mean) * rstd:
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)).
// dx may alias dy: both row sums are complete (BlockSum synchronises) before any dx is written,
// and each element is then read and written by the same thread.
__global__ void LayerNormInputGradKernel(int64_t cols, const float* x, const float* gamma,
                                         const float* mean, const float* rstd, const float* dy,
                                         float* dx) {
  __shared__ double shared[kWarpSize];
  const int64_t r = blockIdx.x;
  const float* x_row = x + r * cols;
  const float* dy_row = dy + r * cols;
  float* dx_row = dx + r * cols;
  const float row_mean = mean[r];
  const float row_rstd = rstd[r];
  const double inverse_cols = 1.0 / static_cast<double>(cols);

  // The row sums in double, as the CPU backend.
  double sum_g = 0.0;
  double sum_g_xhat = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy_row[j] * gamma[j];
    const float xhat = (x_row[j] - row_mean) * row_rstd;
    sum_g += g;
    sum_g_xhat += static_cast<double>(g) * xhat;
  }
  const float mean_g = static_cast<float>(BlockSum(sum_g, shared) * inverse_cols);
  const float mean_g_xhat = static_cast<float>(BlockSum(sum_g_xhat, shared) * inverse_cols);

  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy_row[j] * gamma[j];
    const float xhat = (x_row[j] - row_mean) * row_rstd;
    dx_row[j] = row_rstd * (g - mean_g - xhat * mean_g_xhat);
  }
}

// One block per row: argmax (first maximum, as the CPU), the probabilities, and the row's loss
// log(sum exp(z - max)) - (z[label] - max), which stays finite for confident wrong answers.
__global__ void SoftmaxCrossEntropyKernel(int64_t classes, const float* logits,
                                          const int64_t* labels, float* probabilities,
                                          double* row_loss, int* row_correct) {
  __shared__ float shared_value[kWarpSize];
  __shared__ long long shared_index[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * classes;
  float* p = probabilities + r * classes;

  float max = 0.0f;
  long long argmax = -1;
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    if (argmax < 0 || z[j] > max) {
      max = z[j];
      argmax = j;
    }
  }
  BlockArgmax(&max, &argmax, shared_value, shared_index);

  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const float e = expf(z[j] - max);
    p[j] = e;
    sum += e;
  }
  sum = BlockSum(sum, shared_sum);
  const float inverse = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) p[j] *= inverse;

  if (threadIdx.x == 0) {
    const int64_t label = labels[r];
    row_loss[r] = log(sum) - static_cast<double>(z[label] - max);
    row_correct[r] = argmax == label ? 1 : 0;
  }
}

// dlogits = p / rows - onehot(label) / rows, computed as the CPU does: p * scale, then minus
// scale at the label (__fmul_rn keeps nvcc from fusing the two into one rounding).
__global__ void SoftmaxCrossEntropyBackwardKernel(int64_t rows, int64_t classes, float scale,
                                                  const float* probabilities,
                                                  const int64_t* labels, float* dlogits) {
  TESSERA_GRID_STRIDE_LOOP(i, rows * classes) {
    const int64_t r = i / classes;
    const int64_t j = i - r * classes;
    float d = __fmul_rn(probabilities[i], scale);
    if (j == labels[r]) d -= scale;
    dlogits[i] = d;
  }
}

// One thread per row, in double as the CPU backend: e = exp(-|z|) lies in (0, 1], so neither
// the loss max(z, 0) - z*y + log1p(e) nor the sigmoid (1 / (1 + e) for z >= 0, e / (1 + e)
// below) can overflow.
__global__ void BinaryCrossEntropyKernel(int64_t rows, const float* logits, const int64_t* labels,
                                         float* probabilities, double* row_loss,
                                         int* row_correct) {
  TESSERA_GRID_STRIDE_LOOP(r, rows) {
    const double z = logits[r];
    const bool positive = labels[r] == 1;
    const double y = positive ? 1.0 : 0.0;
    const double e = exp(-fabs(z));
    probabilities[r] = static_cast<float>(z >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e));
    row_loss[r] = fmax(z, 0.0) - z * y + log1p(e);
    row_correct[r] = (z > 0.0) == positive ? 1 : 0;
  }
}

__global__ void BinaryCrossEntropyBackwardKernel(int64_t rows, float scale,
                                                 const float* probabilities,
                                                 const int64_t* labels, float* dlogits) {
  TESSERA_GRID_STRIDE_LOOP(r, rows) {
    const float label = labels[r] == 1 ? 1.0f : 0.0f;
    dlogits[r] = (probabilities[r] - label) * scale;
  }
}

struct LossTotals {
  double mean_loss;
  long long correct;
};

// One block adds the per-row losses and correct flags in a fixed order.
__global__ void LossTotalsKernel(int64_t rows, const double* row_loss, const int* row_correct,
                                 LossTotals* totals) {
  __shared__ double shared_loss[kWarpSize];
  __shared__ long long shared_correct[kWarpSize];
  double loss = 0.0;
  long long correct = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    loss += row_loss[r];
    correct += row_correct[r];
  }
  loss = BlockSum(loss, shared_loss);
  correct = BlockSum(correct, shared_correct);
  if (threadIdx.x == 0) {
    totals->mean_loss = rows > 0 ? loss / static_cast<double>(rows) : 0.0;
    totals->correct = correct;
  }
}

__global__ void GatherRowsKernel(int64_t rows, int64_t dim, const float* table,
                                 const int32_t* slots, float* out, int64_t out_stride) {
  TESSERA_GRID_STRIDE_LOOP(i, rows * dim) {
    const int64_t r = i / dim;
    const int64_t j = i - r * dim;
    out[r * out_stride + j] = table[static_cast<int64_t>(slots[r]) * dim + j];
  }
}

// Rows that share a slot race; atomicAdd makes the sum correct but its order (and so its last
// bits) unspecified, as the interface allows for a GPU.
__global__ void ScatterAddRowsKernel(int64_t rows, int64_t dim, const float* dout,
                                     int64_t in_stride, const int32_t* slots, float* table_grad) {
  TESSERA_GRID_STRIDE_LOOP(i, rows * dim) {
    const int64_t r = i / dim;
    const int64_t j = i - r * dim;
    atomicAdd(&table_grad[static_cast<int64_t>(slots[r]) * dim + j], dout[r * in_stride + j]);
  }
}

#undef TESSERA_GRID_STRIDE_LOOP

// ---- The backend --------------------------------------------------------------------------------

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend(int device, bool allow_tf32)
      : device_(device), allow_tf32_(allow_tf32), name_("cuda:" + std::to_string(device)) {}
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Creates the stream, the cuBLAS handle and the loss result buffers. Called once.
  Status Init();

  std::string_view name() const override { return name_; }
  bool host_memory() const override { return false; }

  StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* pointer) override;
  void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* device_src, size_t bytes) override;
  void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) override;
  void Fill(size_t n, float value, float* x) override;
  void Synchronize() override;

  void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) override;
  void AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) override;
  void SumRows(int64_t rows, int64_t cols, const float* in, float* sums, bool accumulate) override;
  void CopyColumns(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
                   int64_t dst_stride) override;
  void ReluForward(size_t n, const float* x, float* y) override;
  void ReluBackward(size_t n, const float* x, const float* dy, float* dx) override;
  void GeluForward(size_t n, const float* x, float* y) override;
  void GeluBackward(size_t n, const float* x, const float* dy, float* dx) override;
  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd) override;
  void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* dy, float* dx,
                         float* dgamma, float* dbeta) override;
  LossResult SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                 const int64_t* labels, float* probabilities) override;
  void SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes, const float* probabilities,
                                   const int64_t* labels, float* dlogits) override;
  LossResult BinaryCrossEntropy(int64_t rows, const float* logits, const int64_t* labels,
                                float* probabilities) override;
  void BinaryCrossEntropyBackward(int64_t rows, const float* probabilities, const int64_t* labels,
                                  float* dlogits) override;
  void GatherRows(int64_t rows, int64_t dim, const float* table, const int32_t* slots, float* out,
                  int64_t out_stride) override;
  void ScatterAddRows(int64_t rows, int64_t dim, const float* dout, int64_t in_stride,
                      const int32_t* slots, float* table_grad) override;

 private:
  // Makes the backend's device current on the calling thread for one op and restores the
  // previous one; a no-op (one cheap query) when it is current already.
  class DeviceScope {
   public:
    DeviceScope(const CudaBackend& backend, const char* op) : backend_(backend), op_(op) {
      backend_.Check(cudaGetDevice(&previous_), op_, "cudaGetDevice");
      if (previous_ != backend_.device_) {
        backend_.Check(cudaSetDevice(backend_.device_), op_, "cudaSetDevice");
        switched_ = true;
      }
    }
    ~DeviceScope() {
      if (switched_) backend_.Check(cudaSetDevice(previous_), op_, "cudaSetDevice(previous)");
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    const CudaBackend& backend_;
    const char* op_;
    int previous_ = 0;
    bool switched_ = false;
  };

  void Check(cudaError_t err, const char* op, std::string_view call) const {
    if (err != cudaSuccess) DieOnDeviceError(name_, op, CudaStatus(err, call));
  }
  void CheckCublas(cublasStatus_t status, const char* op, std::string_view call) const {
    if (status != CUBLAS_STATUS_SUCCESS) DieOnDeviceError(name_, op, CublasStatus(status, call));
  }
  // After a <<<...>>> launch: a bad configuration shows up here, a fault inside the kernel at
  // the next synchronising call.
  void CheckLaunch(const char* op, const char* kernel) const {
    Check(cudaGetLastError(), op, std::string(kernel) + " launch");
  }
  // Grid size for one block per row.
  unsigned RowBlocks(int64_t rows, const char* op) const;
  // Room for `rows` per-row losses and correct flags (grow-only; the old buffers are idle,
  // since each loss synchronises before returning).
  void ReserveLossScratch(int64_t rows, const char* op);
  // Adds up the per-row scratch on the device, copies the totals back and waits.
  LossResult FinishLoss(int64_t rows, const char* op);

  const int device_;
  const bool allow_tf32_;
  const std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // Loss scratch, used only on stream_.
  double* row_loss_ = nullptr;
  int* row_correct_ = nullptr;
  int64_t loss_capacity_ = 0;  // rows that row_loss_ and row_correct_ hold
  LossTotals* device_totals_ = nullptr;
  LossTotals* host_totals_ = nullptr;  // pinned, so the copy back is a plain DMA
};

Status CudaBackend::Init() {
  int previous = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice").WithContext(name_));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) +
                                                         ")")
                      .WithContext(name_));
  Status status = [&]() -> Status {
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    RETURN_IF_ERROR(LoadCublas().status());
    RETURN_IF_ERROR(CublasStatus(Cublas().create(&cublas_), "cublasCreate"));
    RETURN_IF_ERROR(CublasStatus(Cublas().set_stream(cublas_, stream_), "cublasSetStream"));
    // CUBLAS_DEFAULT_MATH keeps float32 arithmetic (NVIDIA_TF32_OVERRIDE=1 in the environment
    // could still force TF32; the CUDA runtime reads that, not us).
    RETURN_IF_ERROR(CublasStatus(
        Cublas().set_math_mode(cublas_, allow_tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode"));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&device_totals_, sizeof(LossTotals)),
                               "cudaMalloc(loss totals)"));
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&host_totals_, sizeof(LossTotals)),
                               "cudaMallocHost(loss totals)"));
    return OkStatus();
  }();
  // The destructor releases whatever was created before a failure.
  Status restore = CudaStatus(cudaSetDevice(previous), "cudaSetDevice(previous)");
  RETURN_IF_ERROR(status.WithContext(name_));
  RETURN_IF_ERROR(restore.WithContext(name_));
  TLOG(INFO) << name_ << ": compute backend ready, GEMM in "
             << (allow_tf32_ ? "TF32 (--cuda-tf32=1)" : "float32");
  return OkStatus();
}

CudaBackend::~CudaBackend() {
  // Best effort and never aborting: a failure here follows an earlier error that was reported
  // where it happened (or the process is going down anyway).
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  auto report = [this](const Status& status) {
    if (!status.ok()) TLOG(ERROR) << name_ << " shutdown: " << status.message();
  };
  if (stream_ != nullptr) {
    report(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }
  if (row_loss_ != nullptr) report(CudaStatus(cudaFree(row_loss_), "cudaFree(row losses)"));
  if (row_correct_ != nullptr) report(CudaStatus(cudaFree(row_correct_), "cudaFree(row correct)"));
  if (device_totals_ != nullptr) {
    report(CudaStatus(cudaFree(device_totals_), "cudaFree(loss totals)"));
  }
  if (host_totals_ != nullptr) {
    report(CudaStatus(cudaFreeHost(host_totals_), "cudaFreeHost(loss totals)"));
  }
  if (cublas_ != nullptr) report(CublasStatus(Cublas().destroy(cublas_), "cublasDestroy"));
  if (stream_ != nullptr) report(CudaStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy"));
  if (switched) report(CudaStatus(cudaSetDevice(previous), "cudaSetDevice(previous)"));
}

unsigned CudaBackend::RowBlocks(int64_t rows, const char* op) const {
  if (rows > INT_MAX) {
    DieOnDeviceError(name_, op,
                     InternalError("launch: " + std::to_string(rows) +
                                   " rows exceed the grid limit"));
  }
  return static_cast<unsigned>(rows);
}

// ---- Memory ----

StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  DeviceScope scope(*this, "Allocate");
  void* pointer = nullptr;
  const cudaError_t err = cudaMalloc(&pointer, bytes);
  if (err == cudaSuccess) return pointer;
  // An allocation failure is not sticky: clear it, or the next kernel launch check would
  // report it as its own.
  (void)cudaGetLastError();
  Status failure = CudaStatus(err, name_ + ": cannot allocate " + std::to_string(bytes) +
                                        " bytes of device memory: cudaMalloc");
  if (err == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      failure = Status(failure.code(), failure.message() + " (" + std::to_string(free_bytes) +
                                           " of " + std::to_string(total_bytes) +
                                           " bytes free on the device)");
    } else {
      (void)cudaGetLastError();
    }
  }
  return failure;
}

void CudaBackend::Free(void* pointer) {
  if (pointer == nullptr) return;
  DeviceScope scope(*this, "Free");
  Check(cudaFree(pointer), "Free", "cudaFree");
}

void CudaBackend::CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  DeviceScope scope(*this, "CopyToDevice");
  Check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
        "CopyToDevice", "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes, host to device)");
}

void CudaBackend::CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  DeviceScope scope(*this, "CopyToHost");
  if (bytes > 0) {
    Check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_),
          "CopyToHost", "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes, device to host)");
  }
  Check(cudaStreamSynchronize(stream_), "CopyToHost", "cudaStreamSynchronize");
}

void CudaBackend::CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  DeviceScope scope(*this, "CopyOnDevice");
  Check(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream_),
        "CopyOnDevice",
        "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes, device to device)");
}

void CudaBackend::Fill(size_t n, float value, float* x) {
  if (n == 0) return;
  DeviceScope scope(*this, "Fill");
  const int64_t count = static_cast<int64_t>(n);
  FillKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream_>>>(count, value, x);
  CheckLaunch("Fill", "FillKernel");
}

void CudaBackend::Synchronize() {
  DeviceScope scope(*this, "Synchronize");
  Check(cudaStreamSynchronize(stream_), "Synchronize", "cudaStreamSynchronize");
}

// ---- Dense ops ----

// Row-major C = op(A) op(B) is, read as column-major, C^T = op(B)^T op(A)^T: cuBLAS gets B first
// and A second, with the same transpose flags and the stored row-major widths as leading
// dimensions (ldb = tb ? k : n, lda = ta ? m : k, ldc = n), and produces C^T column-major,
// which is C row-major. No data is moved.
void CudaBackend::Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  DeviceScope scope(*this, "Gemm");
  if (k == 0) {  // op(A) op(B) is all zeros; cuBLAS would reject lda/ldb of 0
    ScaleKernel<<<ElementwiseBlocks(m * n), kElementwiseThreads, 0, stream_>>>(m * n, beta, c);
    CheckLaunch("Gemm", "ScaleKernel");
    return;
  }
  const std::string shape = "cublasSgemm(transpose_a=" + std::to_string(transpose_a) +
                            ", transpose_b=" + std::to_string(transpose_b) +
                            ", m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                            ", k=" + std::to_string(k) + ")";
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    DieOnDeviceError(name_, "Gemm",
                     InternalError(shape + ": a dimension exceeds cuBLAS's int range"));
  }
  const int lda = static_cast<int>(transpose_a ? m : k);
  const int ldb = static_cast<int>(transpose_b ? k : n);
  const int ldc = static_cast<int>(n);
  CheckCublas(Cublas().sgemm(cublas_, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                          transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                          static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a, lda, &beta,
                          c, ldc),
              "Gemm", shape);
}

void CudaBackend::AddRowVector(int64_t rows, int64_t cols, const float* bias, float* out) {
  if (rows == 0 || cols == 0) return;
  DeviceScope scope(*this, "AddRowVector");
  AddRowVectorKernel<<<ElementwiseBlocks(rows * cols), kElementwiseThreads, 0, stream_>>>(
      rows, cols, bias, out);
  CheckLaunch("AddRowVector", "AddRowVectorKernel");
}

void CudaBackend::SumRows(int64_t rows, int64_t cols, const float* in, float* sums,
                          bool accumulate) {
  if (cols == 0) return;
  DeviceScope scope(*this, "SumRows");
  SumRowsKernel<<<ColumnBlocks(cols), kColumnThreads, 0, stream_>>>(rows, cols, in, sums,
                                                                    accumulate);
  CheckLaunch("SumRows", "SumRowsKernel");
}

void CudaBackend::CopyColumns(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                              float* dst, int64_t dst_stride) {
  if (rows == 0 || cols == 0) return;
  DeviceScope scope(*this, "CopyColumns");
  Check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * sizeof(float), src,
                          static_cast<size_t>(src_stride) * sizeof(float),
                          static_cast<size_t>(cols) * sizeof(float), static_cast<size_t>(rows),
                          cudaMemcpyDeviceToDevice, stream_),
        "CopyColumns",
        "cudaMemcpy2DAsync(rows=" + std::to_string(rows) + ", cols=" + std::to_string(cols) +
            ", src_stride=" + std::to_string(src_stride) +
            ", dst_stride=" + std::to_string(dst_stride) + ")");
}

void CudaBackend::ReluForward(size_t n, const float* x, float* y) {
  if (n == 0) return;
  DeviceScope scope(*this, "ReluForward");
  const int64_t count = static_cast<int64_t>(n);
  ReluForwardKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream_>>>(count, x, y);
  CheckLaunch("ReluForward", "ReluForwardKernel");
}

void CudaBackend::ReluBackward(size_t n, const float* x, const float* dy, float* dx) {
  if (n == 0) return;
  DeviceScope scope(*this, "ReluBackward");
  const int64_t count = static_cast<int64_t>(n);
  ReluBackwardKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream_>>>(count, x, dy,
                                                                                    dx);
  CheckLaunch("ReluBackward", "ReluBackwardKernel");
}

void CudaBackend::GeluForward(size_t n, const float* x, float* y) {
  if (n == 0) return;
  DeviceScope scope(*this, "GeluForward");
  const int64_t count = static_cast<int64_t>(n);
  GeluForwardKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream_>>>(count, x, y);
  CheckLaunch("GeluForward", "GeluForwardKernel");
}

void CudaBackend::GeluBackward(size_t n, const float* x, const float* dy, float* dx) {
  if (n == 0) return;
  DeviceScope scope(*this, "GeluBackward");
  const int64_t count = static_cast<int64_t>(n);
  GeluBackwardKernel<<<ElementwiseBlocks(count), kElementwiseThreads, 0, stream_>>>(count, x, dy,
                                                                                    dx);
  CheckLaunch("GeluBackward", "GeluBackwardKernel");
}

void CudaBackend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                   const float* gamma, const float* beta, float* y, float* mean,
                                   float* rstd) {
  if (rows == 0 || cols == 0) return;
  DeviceScope scope(*this, "LayerNormForward");
  LayerNormForwardKernel<<<RowBlocks(rows, "LayerNormForward"), RowThreads(cols), 0, stream_>>>(
      cols, eps, x, gamma, beta, y, mean, rstd);
  CheckLaunch("LayerNormForward", "LayerNormForwardKernel");
}

void CudaBackend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, const float* dy,
                                    float* dx, float* dgamma, float* dbeta) {
  if (cols == 0) return;
  DeviceScope scope(*this, "LayerNormBackward");
  // dgamma and dbeta first: they read dy, which the dx kernel may overwrite (dx may alias dy).
  LayerNormParamGradKernel<<<ColumnBlocks(cols), kColumnThreads, 0, stream_>>>(
      rows, cols, x, mean, rstd, dy, dgamma, dbeta);
  CheckLaunch("LayerNormBackward", "LayerNormParamGradKernel");
  if (dx == nullptr || rows == 0) return;
  LayerNormInputGradKernel<<<RowBlocks(rows, "LayerNormBackward"), RowThreads(cols), 0,
                             stream_>>>(cols, x, gamma, mean, rstd, dy, dx);
  CheckLaunch("LayerNormBackward", "LayerNormInputGradKernel");
}

// ---- Losses ----

void CudaBackend::ReserveLossScratch(int64_t rows, const char* op) {
  if (rows <= loss_capacity_) return;
  const int64_t capacity = std::max<int64_t>(rows, 2 * loss_capacity_);
  if (row_loss_ != nullptr) Check(cudaFree(row_loss_), op, "cudaFree(row losses)");
  if (row_correct_ != nullptr) Check(cudaFree(row_correct_), op, "cudaFree(row correct)");
  row_loss_ = nullptr;
  row_correct_ = nullptr;
  loss_capacity_ = 0;
  Check(cudaMalloc(&row_loss_, static_cast<size_t>(capacity) * sizeof(double)), op,
        "cudaMalloc(row losses, " + std::to_string(capacity * sizeof(double)) + " bytes)");
  Check(cudaMalloc(&row_correct_, static_cast<size_t>(capacity) * sizeof(int)), op,
        "cudaMalloc(row correct, " + std::to_string(capacity * sizeof(int)) + " bytes)");
  loss_capacity_ = capacity;
}

ComputeBackend::LossResult CudaBackend::FinishLoss(int64_t rows, const char* op) {
  LossTotalsKernel<<<1, kLossTotalsThreads, 0, stream_>>>(rows, row_loss_, row_correct_,
                                                          device_totals_);
  CheckLaunch(op, "LossTotalsKernel");
  Check(cudaMemcpyAsync(host_totals_, device_totals_, sizeof(LossTotals), cudaMemcpyDeviceToHost,
                        stream_),
        op, "cudaMemcpyAsync(loss totals, device to host)");
  Check(cudaStreamSynchronize(stream_), op, "cudaStreamSynchronize");
  LossResult result;
  result.loss = host_totals_->mean_loss;
  result.correct = host_totals_->correct;
  return result;
}

ComputeBackend::LossResult CudaBackend::SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                                            const float* logits,
                                                            const int64_t* labels,
                                                            float* probabilities) {
  DeviceScope scope(*this, "SoftmaxCrossEntropy");
  if (rows == 0 || classes == 0) {
    Check(cudaStreamSynchronize(stream_), "SoftmaxCrossEntropy", "cudaStreamSynchronize");
    return LossResult{};
  }
  ReserveLossScratch(rows, "SoftmaxCrossEntropy");
  SoftmaxCrossEntropyKernel<<<RowBlocks(rows, "SoftmaxCrossEntropy"), RowThreads(classes), 0,
                              stream_>>>(classes, logits, labels, probabilities, row_loss_,
                                         row_correct_);
  CheckLaunch("SoftmaxCrossEntropy", "SoftmaxCrossEntropyKernel");
  return FinishLoss(rows, "SoftmaxCrossEntropy");
}

void CudaBackend::SoftmaxCrossEntropyBackward(int64_t rows, int64_t classes,
                                              const float* probabilities, const int64_t* labels,
                                              float* dlogits) {
  if (rows == 0 || classes == 0) return;
  DeviceScope scope(*this, "SoftmaxCrossEntropyBackward");
  const float scale = 1.0f / static_cast<float>(rows);
  SoftmaxCrossEntropyBackwardKernel<<<ElementwiseBlocks(rows * classes), kElementwiseThreads, 0,
                                      stream_>>>(rows, classes, scale, probabilities, labels,
                                                 dlogits);
  CheckLaunch("SoftmaxCrossEntropyBackward", "SoftmaxCrossEntropyBackwardKernel");
}

ComputeBackend::LossResult CudaBackend::BinaryCrossEntropy(int64_t rows, const float* logits,
                                                           const int64_t* labels,
                                                           float* probabilities) {
  DeviceScope scope(*this, "BinaryCrossEntropy");
  if (rows == 0) {
    Check(cudaStreamSynchronize(stream_), "BinaryCrossEntropy", "cudaStreamSynchronize");
    return LossResult{};
  }
  ReserveLossScratch(rows, "BinaryCrossEntropy");
  BinaryCrossEntropyKernel<<<ElementwiseBlocks(rows), kElementwiseThreads, 0, stream_>>>(
      rows, logits, labels, probabilities, row_loss_, row_correct_);
  CheckLaunch("BinaryCrossEntropy", "BinaryCrossEntropyKernel");
  return FinishLoss(rows, "BinaryCrossEntropy");
}

void CudaBackend::BinaryCrossEntropyBackward(int64_t rows, const float* probabilities,
                                             const int64_t* labels, float* dlogits) {
  if (rows == 0) return;
  DeviceScope scope(*this, "BinaryCrossEntropyBackward");
  const float scale = 1.0f / static_cast<float>(rows);
  BinaryCrossEntropyBackwardKernel<<<ElementwiseBlocks(rows), kElementwiseThreads, 0, stream_>>>(
      rows, scale, probabilities, labels, dlogits);
  CheckLaunch("BinaryCrossEntropyBackward", "BinaryCrossEntropyBackwardKernel");
}

// ---- Embeddings ----

void CudaBackend::GatherRows(int64_t rows, int64_t dim, const float* table, const int32_t* slots,
                             float* out, int64_t out_stride) {
  if (rows == 0 || dim == 0) return;
  DeviceScope scope(*this, "GatherRows");
  GatherRowsKernel<<<ElementwiseBlocks(rows * dim), kElementwiseThreads, 0, stream_>>>(
      rows, dim, table, slots, out, out_stride);
  CheckLaunch("GatherRows", "GatherRowsKernel");
}

void CudaBackend::ScatterAddRows(int64_t rows, int64_t dim, const float* dout, int64_t in_stride,
                                 const int32_t* slots, float* table_grad) {
  if (rows == 0 || dim == 0) return;
  DeviceScope scope(*this, "ScatterAddRows");
  ScatterAddRowsKernel<<<ElementwiseBlocks(rows * dim), kElementwiseThreads, 0, stream_>>>(
      rows, dim, dout, in_stride, slots, table_grad);
  CheckLaunch("ScatterAddRows", "ScatterAddRowsKernel");
}

}  // namespace

StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(int device,
                                                            const CudaBackendOptions& options) {
  const std::string name = "cuda:" + std::to_string(device);
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount").WithContext(name));
  if (count == 0) {
    return UnavailableError(name + ": cudaGetDeviceCount: the CUDA runtime reports no device");
  }
  if (device < 0 || device >= count) {
    return InvalidArgumentError(name + ": CUDA device index " + std::to_string(device) +
                                " out of range: this machine has " + std::to_string(count) +
                                " CUDA device(s)");
  }
  auto backend = std::make_unique<CudaBackend>(device, options.allow_tf32);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

}  // namespace tessera::worker
