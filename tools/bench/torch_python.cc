#include "tools/bench/torch_python.h"

#include <unistd.h>

#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"

namespace tessera::tools {
namespace {

// The extension module of the package `tessera` (//worker/torch/tessera/torch:package); the
// package's parent, <runfiles>/worker/torch, goes on the children's PYTHONPATH.
constexpr char kPackageModule[] = "worker/torch/tessera/torch/_C.so";
constexpr char kPackageSuffix[] = "/tessera/torch/_C.so";

// The probe: prints one JSON line saying what imports; always exits 0.
constexpr char kProbe[] = R"(import json, sys
r = {}
try:
    import torch, torch.distributed
    r["torch"] = torch.__version__
except Exception as e:
    r["torch_error"] = "%s: %s" % (type(e).__name__, e)
if "torch" in r:
    try:
        import tessera.torch
        r["tessera"] = tessera.torch.__file__
    except Exception as e:
        r["tessera_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(r))
)";

}  // namespace

StatusOr<PythonSetup> ProbePython() {
  PythonSetup setup;
  if (access(kPython, X_OK) != 0) {
    setup.skipped = std::string(kPython) + " is missing (tools/install_deps.sh bench installs PyTorch)";
    return setup;
  }
  StatusOr<std::string> module = FindRunfile(kPackageModule);
  if (module.ok()) {
    setup.pythonpath = module->substr(0, module->size() - std::string(kPackageSuffix).size());
  }
  std::vector<std::string> argv = {"/usr/bin/env"};
  if (!setup.pythonpath.empty()) argv.push_back("PYTHONPATH=" + setup.pythonpath);
  for (const char* arg : {kPython, "-c", kProbe}) argv.push_back(arg);
  ASSIGN_OR_RETURN(ChildOutput output, RunToCompletion("python3 import probe", argv, 120'000));
  ASSIGN_OR_RETURN(nlohmann::json probe, LastJsonLine("python3 import probe", output));
  if (probe.contains("torch_error")) {
    setup.skipped = std::string(kPython) + " cannot import torch.distributed (" +
                    probe.value("torch_error", "") + "); install it with `tools/install_deps.sh bench`";
    return setup;
  }
  setup.torch_version = probe.value("torch", "");
  if (probe.contains("tessera_error")) {
    setup.skipped = std::string(kPython) + " cannot import tessera.torch (" +
                    probe.value("tessera_error", "") + ") from " +
                    (setup.pythonpath.empty() ? "its own path (no " + std::string(kPackageModule) +
                                                    " in this binary's runfiles)"
                                              : setup.pythonpath) +
                    "; build it with `bazel build //tools:tessera-bench` (its runfiles hold the "
                    "package) or install it with tools/install_python.sh";
    return setup;
  }
  setup.tessera_package = probe.value("tessera", "");
  return setup;
}

}  // namespace tessera::tools
