// Where tessera-bench's Python children find torch and the package `tessera` (tessera-bench
// torch and ps): the package from this binary's runfiles (//worker/torch/tessera/torch:package,
// built with it) or else the interpreter's own path (tools/install_python.sh), and a probe
// that /usr/bin/python3 can import both.
#ifndef TESSERA_TOOLS_BENCH_TORCH_PYTHON_H_
#define TESSERA_TOOLS_BENCH_TORCH_PYTHON_H_

#include <string>

#include "common/base/status.h"

namespace tessera::tools {

// What the probe found.
struct PythonSetup {
  std::string pythonpath;   // empty: the interpreter's own path (an installed package)
  std::string skipped;      // non-empty: nothing can run, and why
  std::string torch_version;
  std::string tessera_package;  // tessera/torch/__init__.py as imported
};

// Runs /usr/bin/python3 once to see what imports. A setup with `skipped` set is not an error:
// the benchmark says why and skips.
StatusOr<PythonSetup> ProbePython();

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TORCH_PYTHON_H_
