#include "common/base/status.h"

namespace tessera {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kDataLoss: return "DATA_LOSS";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
  if (code_ == StatusCode::kOk) message_.clear();
}

Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  // Added once: a layer that names what it waited for and its caller that names the same
  // call (an RPC's `what`, then the engine's) would otherwise repeat it.
  if (message_.size() > context.size() && message_.compare(0, context.size(), context) == 0 &&
      message_.compare(context.size(), 2, ": ") == 0) {
    return *this;
  }
  std::string message(context);
  message += ": ";
  message += message_;
  return Status(code_, std::move(message));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

std::ostream& operator<<(std::ostream& os, const Status& status) {
  return os << status.ToString();
}

Status InvalidArgumentError(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status DeadlineExceededError(std::string m) { return Status(StatusCode::kDeadlineExceeded, std::move(m)); }
Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status AlreadyExistsError(std::string m) { return Status(StatusCode::kAlreadyExists, std::move(m)); }
Status FailedPreconditionError(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
Status AbortedError(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status OutOfRangeError(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status UnimplementedError(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
Status UnavailableError(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status CancelledError(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }

}  // namespace tessera
