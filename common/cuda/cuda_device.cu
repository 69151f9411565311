// CUDA implementation of common/cuda/cuda_device.h, compiled by nvcc (//third_party/cuda:cuda.bzl).
// cuda_device_cpu.cc serves the same header in builds without the toolkit.
//
// Every CUDA runtime call's result goes through CudaStatus (common/cuda/cuda_status.h).
#include "common/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cuda/cuda_status.h"

namespace tessera {
namespace {

// The number of devices, or the runtime's reason it cannot tell (no driver, no device).
StatusOr<int> DeviceCount() {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  return count;
}

Status CheckDeviceIndex(int index) {
  ASSIGN_OR_RETURN(int count, DeviceCount());
  if (index < 0 || index >= count) {
    return InvalidArgumentError("CUDA device index " + std::to_string(index) +
                                " out of range: this machine has " + std::to_string(count) +
                                " CUDA device(s)");
  }
  return OkStatus();
}

// Device memory for `n` floats. Free() reports the result of cudaFree; the destructor frees
// only on an early-return path, where the error being returned is the root cause and a failing
// cudaFree would merely be its consequence, so that result is dropped.
class DeviceFloats {
 public:
  DeviceFloats() = default;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() {
    if (ptr_ != nullptr) (void)CudaStatus(cudaFree(ptr_), "cudaFree");
  }

  Status Allocate(size_t n, std::string_view what) {
    const size_t bytes = n * sizeof(float);
    return CudaStatus(cudaMalloc(&ptr_, bytes),
                      "cudaMalloc(" + std::string(what) + ", " + std::to_string(bytes) + " bytes)");
  }

  Status Free(std::string_view what) {
    float* ptr = std::exchange(ptr_, nullptr);
    return CudaStatus(cudaFree(ptr), "cudaFree(" + std::string(what) + ")");
  }

  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
};

// The self-test's kernel: y = a*x + y, one grid-stride loop.
__global__ void SaxpyKernel(int n, float a, const float* x, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

constexpr int kSelfTestLength = 1 << 20;
constexpr int kThreadsPerBlock = 256;
// With x in [0, 1000) and y in [-3, 3] every a*x + y is exact in float, so the device result
// must equal the CPU one bit for bit, whether or not either side fuses the multiply-add.
constexpr float kSelfTestA = 1.5f;

// Runs the saxpy self-test on the calling thread's current device.
Status RunSaxpy() {
  const int n = kSelfTestLength;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<float> x(n), y(n), want(n), got(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = static_cast<float>(i % 7 - 3);
    want[i] = kSelfTestA * x[i] + y[i];
  }

  DeviceFloats device_x, device_y;
  RETURN_IF_ERROR(device_x.Allocate(n, "x"));
  RETURN_IF_ERROR(device_y.Allocate(n, "y"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(device_x.get(), x.data(), bytes, cudaMemcpyHostToDevice),
                             "cudaMemcpy(x, host to device)"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpy(device_y.get(), y.data(), bytes, cudaMemcpyHostToDevice),
                             "cudaMemcpy(y, host to device)"));

  const int blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  SaxpyKernel<<<blocks, kThreadsPerBlock>>>(n, kSelfTestA, device_x.get(), device_y.get());
  RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "saxpy kernel launch"));
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize(saxpy kernel)"));

  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(got.data(), device_y.get(), bytes, cudaMemcpyDeviceToHost),
                 "cudaMemcpy(y, device to host)"));
  RETURN_IF_ERROR(device_x.Free("x"));
  RETURN_IF_ERROR(device_y.Free("y"));

  int wrong = 0;
  int first_wrong = -1;
  for (int i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  if (wrong > 0) {
    return InternalError("saxpy over " + std::to_string(n) + " floats: " + std::to_string(wrong) +
                         " element(s) differ from the CPU result, first at index " +
                         std::to_string(first_wrong) + ": got " + std::to_string(got[first_wrong]) +
                         ", want " + std::to_string(want[first_wrong]));
  }
  return OkStatus();
}

Status SelfTestOnDevice(int index) {
  RETURN_IF_ERROR(CheckDeviceIndex(index));
  int previous = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(index), "cudaSetDevice(" + std::to_string(index) + ")"));
  Status test = RunSaxpy();
  Status restore =
      CudaStatus(cudaSetDevice(previous),
                 "cudaSetDevice(" + std::to_string(previous) + ", the previous device)");
  // A failed test can leave the context unusable, so restoring may fail too: the test's error
  // is the root cause and the one reported.
  return test.ok() ? restore : test;
}

}  // namespace

bool CudaCompiledIn() { return true; }

int CudaDeviceCount() {
  StatusOr<int> count = DeviceCount();
  return count.ok() ? *count : 0;
}

StatusOr<CudaDeviceInfo> QueryCudaDevice(int index) {
  RETURN_IF_ERROR(CheckDeviceIndex(index));
  cudaDeviceProp prop;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, index),
                             "cudaGetDeviceProperties(" + std::to_string(index) + ")"));
  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_memory_bytes = static_cast<uint64_t>(prop.totalGlobalMem);
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

Status CudaSelfTest(int index) {
  return SelfTestOnDevice(index).WithContext("CUDA self-test device=" + std::to_string(index));
}

}  // namespace tessera
