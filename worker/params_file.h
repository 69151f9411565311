// The --save-params format: a model's dense parameters as one file of raw little-endian
// float32 values in layout order, plus PATH.json, a manifest of {name, shape, offset} per
// parameter (offsets in floats). Specified in docs/params-format.md. Every mode writes the same
// format, so runs in different modes can be compared value by value (tessera-compare-params).
//
// Both files are written atomically: to a temporary file in the same directory, fsync, rename.
#ifndef TESSERA_WORKER_PARAMS_FILE_H_
#define TESSERA_WORKER_PARAMS_FILE_H_

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/training/parameter_layout.h"

namespace tessera::worker {

// Writes `params` (layout.total_size() floats) to `path` and the manifest to `path`.json.
// Errors name the file and the failing system call.
Status SaveParams(const std::string& path, const ParameterLayout& layout,
                  const std::vector<float>& params);

struct LoadedParams {
  ParameterLayout layout;
  std::vector<float> values;
};

// Reads a file pair written by SaveParams. Errors name the file and what is wrong (a missing
// file, a manifest that does not parse, a data file whose size does not match the manifest).
StatusOr<LoadedParams> LoadParams(const std::string& path);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PARAMS_FILE_H_
