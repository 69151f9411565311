#include "common/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <iostream>

// Set by the BUILD file from what //third_party/cuda:cuda.bzl chose for this build.
#ifndef TESSERA_TEST_EXPECT_CUDA
#error "TESSERA_TEST_EXPECT_CUDA must be defined by the BUILD file (0 or 1)"
#endif

namespace tessera {
namespace {

TEST(CudaDeviceTest, CompiledInMatchesBuild) {
  EXPECT_EQ(CudaCompiledIn(), TESSERA_TEST_EXPECT_CUDA != 0)
      << "the build chose the " << (TESSERA_TEST_EXPECT_CUDA ? "nvcc" : "CPU-only")
      << " variant of //common:cuda_device but the linked implementation disagrees";
}

TEST(CudaDeviceTest, NoDeviceIsAnErrorNotAnAbort) {
  const int count = CudaDeviceCount();
  ASSERT_GE(count, 0);
  if (count > 0) GTEST_SKIP() << count << " CUDA device(s) present";

  StatusOr<CudaDeviceInfo> info = QueryCudaDevice(0);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status();
  Status self_test = CudaSelfTest(0);
  EXPECT_EQ(self_test.code(), StatusCode::kUnavailable) << self_test;
  if (CudaCompiledIn()) {
    // The runtime's own reason, through the adapter: "cudaGetDeviceCount: cudaError...: ...".
    EXPECT_NE(info.status().message().find("cudaGetDeviceCount: cudaError"), std::string::npos)
        << info.status();
    EXPECT_NE(self_test.message().find("CUDA self-test device=0: cudaGetDeviceCount: cudaError"),
              std::string::npos)
        << self_test;
  } else {
    EXPECT_EQ(info.status().message(), "Tessera was built without CUDA (no nvcc at build time)");
    EXPECT_EQ(self_test.message(), "Tessera was built without CUDA (no nvcc at build time)");
  }
}

TEST(CudaDeviceTest, BadIndexIsRejected) {
  const int count = CudaDeviceCount();
  if (count == 0) GTEST_SKIP() << "no CUDA device: " << QueryCudaDevice(0).status();
  EXPECT_EQ(QueryCudaDevice(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QueryCudaDevice(count).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaSelfTest(count).code(), StatusCode::kInvalidArgument);
}

TEST(CudaDeviceTest, QueriesEveryDeviceAndSelfTestsDeviceZero) {
  const int count = CudaDeviceCount();
  if (count == 0) GTEST_SKIP() << "no CUDA device: " << QueryCudaDevice(0).status();

  for (int i = 0; i < count; ++i) {
    StatusOr<CudaDeviceInfo> info = QueryCudaDevice(i);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->index, i);
    EXPECT_FALSE(info->name.empty());
    EXPECT_GE(info->compute_major, 7) << info->name;
    EXPECT_GT(info->total_memory_bytes, 0u) << info->name;
    EXPECT_GT(info->multiprocessors, 0) << info->name;
    std::cout << "device " << i << ": " << info->name << ", compute " << info->compute_major << "."
              << info->compute_minor << ", " << info->multiprocessors << " SMs, "
              << (info->total_memory_bytes >> 20) << " MiB\n";
  }
  Status self_test = CudaSelfTest(0);
  EXPECT_TRUE(self_test.ok()) << self_test;
}

}  // namespace
}  // namespace tessera
