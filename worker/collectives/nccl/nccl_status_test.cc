#include "worker/collectives/nccl/nccl_status.h"

#include <gtest/gtest.h>

// The mapping is a pure function of the result: these run without libnccl, a driver or a device.
namespace tessera::worker {
namespace {

TEST(NcclStatusTest, SuccessIsOk) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "ncclAllReduce(count=10, float32, sum)", "no error", "")
                  .ok());
}

TEST(NcclStatusTest, MessageNamesTheCallTheResultAndNcclsWords) {
  EXPECT_EQ(NcclStatus(ncclRemoteError, "ncclAllReduce(count=10, float32, sum)",
                       "remote process exited or there was a network error",
                       "socket closed by 10.0.0.2<41234>"),
            UnavailableError("ncclAllReduce(count=10, float32, sum): ncclRemoteError: remote "
                             "process exited or there was a network error (NCCL: socket closed "
                             "by 10.0.0.2<41234>)"));
  EXPECT_EQ(NcclStatus(ncclInvalidArgument, "ncclBroadcast(count=4, float32, root=7)",
                       "invalid argument", ""),
            InvalidArgumentError(
                "ncclBroadcast(count=4, float32, root=7): ncclInvalidArgument: invalid argument"));
}

TEST(NcclStatusTest, EveryResultMapsToItsCanonicalCode) {
  const struct {
    ncclResult_t result;
    StatusCode code;
    const char* name;
  } cases[] = {
      {ncclUnhandledCudaError, StatusCode::kInternal, "ncclUnhandledCudaError"},
      {ncclSystemError, StatusCode::kUnavailable, "ncclSystemError"},
      {ncclInternalError, StatusCode::kInternal, "ncclInternalError"},
      {ncclInvalidArgument, StatusCode::kInvalidArgument, "ncclInvalidArgument"},
      {ncclInvalidUsage, StatusCode::kFailedPrecondition, "ncclInvalidUsage"},
      {ncclRemoteError, StatusCode::kUnavailable, "ncclRemoteError"},
      {ncclInProgress, StatusCode::kInternal, "ncclInProgress"},
  };
  for (const auto& c : cases) {
    const Status status = NcclStatus(c.result, "call", "words", "");
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_EQ(status.message(), "call: " + std::string(c.name) + ": words") << status;
  }
}

TEST(NcclStatusTest, UnknownResultIsNamedByItsNumber) {
  const Status status =
      NcclStatus(static_cast<ncclResult_t>(42), "ncclCommFinalize", "unknown result code", "");
  EXPECT_EQ(status, Status(StatusCode::kUnknown,
                           "ncclCommFinalize: ncclResult_t 42: unknown result code"));
  EXPECT_EQ(NcclStatus(ncclNumResults, "call", "words", "").code(), StatusCode::kUnknown);
}

}  // namespace
}  // namespace tessera::worker
