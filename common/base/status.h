// Status and StatusOr<T>: errors are values that carry their context.
//
// A Status is OK or an error with a canonical code and a message. Context is added as the
// error travels outwards (`status.WithContext("rank=2 peer=tcp://127.0.0.1:4000")`), so the
// message a user sees reads outermost-first: "allreduce tag=42 rank=2 peer=1: recv deadline
// exceeded after 30000 ms". Nothing in Tessera aborts on I/O; CHECK-style aborts are only for
// broken invariants (bugs).
//
// Thread-safety: a Status is a value; distinct objects may be used from distinct threads.
#ifndef TESSERA_COMMON_BASE_STATUS_H_
#define TESSERA_COMMON_BASE_STATUS_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace tessera {

// A few canonical codes (the subset of absl's that this system needs).
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "context: message". No-op on OK, and when the message
  // already begins with "context: ".
  Status WithContext(std::string_view context) const;

  // "DEADLINE_EXCEEDED: rank=1: ..." or "OK".
  std::string ToString() const;

  bool operator==(const Status& other) const {
    return code_ == other.code_ && message_ == other.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status ResourceExhaustedError(std::string message);
Status DataLossError(std::string message);
Status CancelledError(std::string message);

std::ostream& operator<<(std::ostream& os, const Status& status);

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}                // NOLINT: implicit by design
  StatusOr(T&& value) : value_(std::move(value)) {}          // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {     // NOLINT
    if (status_.ok()) status_ = InternalError("StatusOr constructed from an OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tessera

#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::tessera::Status _tessera_status = (expr);       \
    if (!_tessera_status.ok()) return _tessera_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr());` declares x or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TESSERA_STATUS_CONCAT_(_tessera_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // TESSERA_COMMON_BASE_STATUS_H_
