// tessera-export-params: consolidates a sharded checkpoint (worker/engines/sharded_state.h) of
// --mode allreduce, zero1, zero2, zero3 or hsdp, or of tessera.torch.fsdp.save_sharded_checkpoint
// (mode "fsdp"), into one --save-params file (docs/params-format.md), without the model or a
// fleet: the manifest names every tensor and its shape, and the shards together hold every
// parameter exactly once.
//
//   tessera-export-params --checkpoint-dir D [--step N] --out params.bin
//
// --step defaults to the newest complete checkpoint (D/LATEST). Errors name the file and what
// is wrong (a missing, truncated or corrupted shard, a coverage gap or overlap).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/training/checkpoint.h"
#include "common/training/optimizer.h"
#include "common/training/parameter_layout.h"
#include "worker/engines/sharded_state.h"
#include "worker/modes/mode_registry.h"
#include "worker/params_file.h"

namespace tessera::tools {
namespace {

struct ExportConfig {
  std::string checkpoint_dir;
  std::optional<int64_t> step;  // absent: LATEST
  std::string out;
};

Status Export(const ExportConfig& config) {
  int64_t step = 0;
  if (config.step) {
    step = *config.step;
  } else {
    ASSIGN_OR_RETURN(step, LatestCheckpointStep(config.checkpoint_dir));
  }
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(config.checkpoint_dir, step));
  const std::string where = CheckpointStepDirectory(config.checkpoint_dir, step) + "/MANIFEST.json";
  // The modes' own, and the Python FSDP writer's, which is no --mode of the worker.
  std::vector<std::string> sharded = worker::ModeNamesWith(worker::kShardedCheckpoints);
  sharded.push_back("fsdp");
  if (std::find(sharded.begin(), sharded.end(), manifest.mode) == sharded.end()) {
    std::string modes;
    for (const std::string& mode : sharded) modes += (modes.empty() ? "" : ", ") + mode;
    return FailedPreconditionError(where + ": a checkpoint of --mode " + manifest.mode +
                                   "; this tool reads those of " + modes);
  }
  if (manifest.tensors.empty()) {
    return FailedPreconditionError(where + " lists no tensors (written before they were recorded)");
  }
  ParameterLayout layout;
  for (const ManifestTensor& tensor : manifest.tensors) {
    RETURN_IF_ERROR(layout.Add(tensor.name, tensor.shape).status().WithContext(where));
  }
  ASSIGN_OR_RETURN(OptimizerKind optimizer, ParseOptimizerKind(manifest.optimizer));
  const worker::ShardedCheckpointSpec spec{manifest.mode, &layout, optimizer, sharded};
  ASSIGN_OR_RETURN(worker::AssembledState state,
                   worker::ReadShardedCheckpoint(config.checkpoint_dir, step, spec));
  RETURN_IF_ERROR(worker::SaveParams(config.out, layout, state.params));
  std::cout << "step " << step << " of " << config.checkpoint_dir << " (" << manifest.mode << ", "
            << manifest.world_size << " ranks, " << manifest.files.size() << " shards): "
            << layout.total_size() << " parameters in " << config.out << "\n";
  return OkStatus();
}

int Main(int argc, char** argv) {
  ExportConfig config;
  CLI::App app("Consolidates a sharded checkpoint into a --save-params file",
               "tessera-export-params");
  app.add_option("--checkpoint-dir", config.checkpoint_dir, "The --checkpoint-dir of the run")
      ->required();
  app.add_option_function<int64_t>(
         "--step", [&config](const int64_t& step) { config.step = step; },
         "Which checkpoint (default: the newest, LATEST)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--out", config.out, "The params file to write (and OUT.json)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    int status = app.exit(error);
    return status == 0 ? 0 : 2;
  }
  Status status = Export(config);
  if (!status.ok()) {
    std::cerr << "tessera-export-params: " << status << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessera::tools

int main(int argc, char** argv) { return tessera::tools::Main(argc, argv); }
