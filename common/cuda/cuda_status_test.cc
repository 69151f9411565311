#include "common/cuda/cuda_status.h"

#include <gtest/gtest.h>

#include <string>

// The mapping is a pure function of the error code: these run without a driver or a device.
namespace tessera {
namespace {

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaMalloc(x, 4 bytes)").ok());
}

TEST(CudaStatusTest, MessageNamesTheCallAndQuotesTheRuntime) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(x, 4194304 bytes)"),
            ResourceExhaustedError(
                "cudaMalloc(x, 4194304 bytes): cudaErrorMemoryAllocation: out of memory"));
}

TEST(CudaStatusTest, ErrorsMapToTheirCanonicalCodes) {
  const struct {
    cudaError_t error;
    StatusCode code;
  } cases[] = {
      {cudaErrorMemoryAllocation, StatusCode::kResourceExhausted},
      {cudaErrorLaunchOutOfResources, StatusCode::kResourceExhausted},
      {cudaErrorInvalidValue, StatusCode::kInvalidArgument},
      {cudaErrorInvalidDevice, StatusCode::kInvalidArgument},
      {cudaErrorInvalidDevicePointer, StatusCode::kInvalidArgument},
      {cudaErrorInvalidConfiguration, StatusCode::kInvalidArgument},
      {cudaErrorNoDevice, StatusCode::kUnavailable},
      {cudaErrorInsufficientDriver, StatusCode::kUnavailable},
      {cudaErrorStubLibrary, StatusCode::kUnavailable},
      {cudaErrorNoKernelImageForDevice, StatusCode::kFailedPrecondition},
      {cudaErrorNotSupported, StatusCode::kUnimplemented},
      {cudaErrorLaunchTimeout, StatusCode::kDeadlineExceeded},
      {cudaErrorECCUncorrectable, StatusCode::kDataLoss},
      {cudaErrorIllegalAddress, StatusCode::kInternal},
      {cudaErrorLaunchFailure, StatusCode::kInternal},
      {cudaErrorUnknown, StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    const Status status = CudaStatus(c.error, "call");
    EXPECT_EQ(status.code(), c.code) << status;
  }
}

// Every code the runtime has a name for is an error whose message names the call and the error.
TEST(CudaStatusTest, EveryErrorCodeIsAnErrorNamingItself) {
  const std::string unknown = cudaGetErrorName(static_cast<cudaError_t>(12345));
  int named = 0;
  for (int value = 1; value < 1000; ++value) {
    const auto error = static_cast<cudaError_t>(value);
    const std::string name = cudaGetErrorName(error);
    if (name == unknown) continue;
    ++named;
    const Status status = CudaStatus(error, "cudaFoo(bar)");
    EXPECT_FALSE(status.ok()) << name;
    EXPECT_EQ(status.message().rfind("cudaFoo(bar): " + name + ": ", 0), 0u) << status;
  }
  EXPECT_GT(named, 100);  // CUDA 12 and 13 name about 130
}

}  // namespace
}  // namespace tessera
