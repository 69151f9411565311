// Finding NaN and Inf in float buffers, fast enough to run on every gradient of every step:
// one read of the buffer, vectorised, then a scan only when something was found. Where the CPU
// has AVX2 and FMA (checked at run time) every float is multiplied by zero into eight-lane
// accumulators (x * 0 is NaN exactly when x is NaN or infinite); elsewhere the exponent bits
// of every float are compared in SSE2 registers.
//
//   if (std::optional<size_t> at = FirstNonFinite(grads, n)) {
//     return InvalidArgumentError("gradient " + name + ": " + DescribeNonFinite(grads, *at));
//   }
//
// Thread-safety: plain functions.
#ifndef TESSERA_COMMON_TRAINING_NONFINITE_H_
#define TESSERA_COMMON_TRAINING_NONFINITE_H_

#include <cstddef>
#include <optional>
#include <string>

namespace tessera {

// The index of the first NaN or ±Inf among values[0, count); nullopt when all are finite.
// `values` need not be aligned.
std::optional<size_t> FirstNonFinite(const void* values, size_t count);

// FirstNonFinite with the SSE2 kernel whatever the CPU has (tests: both kernels get the same
// cases where the AVX2 one is in use).
std::optional<size_t> FirstNonFiniteSse2(const void* values, size_t count);

// "nan at element 12", "inf at element 3", "-inf at element 0".
std::string DescribeNonFinite(const void* values, size_t index);

// "nan", "inf" or "-inf" (for a finite value, its decimal form).
std::string NonFiniteName(float value);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_NONFINITE_H_
