// Numbers from JSON that a peer or a file supplies (the PS job configuration, checkpoint
// manifests), read into a C++ type only when they fit it. nlohmann's get<T>() converts with a
// static_cast, which is undefined behaviour for a value out of T's range (1e37 as a uint64_t:
// found by ps_job_config_fuzzer and checkpoint_reader_fuzzer).
//
//   ASSIGN_OR_RETURN(c.dense_elements, JsonInteger<uint64_t>(j.at("dense_elements"),
//                                                            "dense_elements"));
#ifndef TESSERA_COMMON_BASE_JSON_NUMBER_H_
#define TESSERA_COMMON_BASE_JSON_NUMBER_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace tessera {

// `value` as T when it is an integer T holds; else InvalidArgument: "WHAT is 1.5, not an
// integer in [0, 255]".
template <typename T>
StatusOr<T> JsonInteger(const nlohmann::json& value, std::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(u);
  } else if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    const bool fits_below = i >= static_cast<int64_t>(std::numeric_limits<T>::min());
    const bool fits_above =
        i < 0 || static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    if (fits_below && fits_above) return static_cast<T>(i);
  }
  return InvalidArgumentError(std::string(what) + " is " + value.dump() +
                              ", not an integer in [" +
                              std::to_string(std::numeric_limits<T>::min()) + ", " +
                              std::to_string(std::numeric_limits<T>::max()) + "]");
}

// `value` as a float when it is a finite number a float holds; else InvalidArgument.
inline StatusOr<float> JsonFloat(const nlohmann::json& value, std::string_view what) {
  if (value.is_number()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max()) {
      return static_cast<float>(d);
    }
  }
  return InvalidArgumentError(std::string(what) + " is " + value.dump() + ", not a finite float");
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_JSON_NUMBER_H_
