// Checkpoint storage shared by every mode: shard files, the per-step manifest, and LATEST.
//
//   <root>/step-000000000120/<shard>.ckpt     one per writer (a server, a local worker, a rank)
//   <root>/step-000000000120/MANIFEST.json    step, mode, layout fingerprint, placement, and
//                                             every shard's size and checksum
//   <root>/LATEST                             "120": the newest complete checkpoint
//
// Every file is written atomically (common/base/atomic_file.h); a step directory counts only once
// its manifest exists, and LATEST moves to it last, so a crash at any point leaves the
// previous checkpoint intact and in use. Old step directories are kept.
//
// A shard file ("TSRCKPT1"): magic, u32 entry count, then per entry u8 kind (1 float32,
// 2 int64), u32 name length, name, u64 element count, the elements; little-endian. Its
// checksum (FNV-1a 64 over the whole file) is in the manifest and checked before parsing.
// Errors name the file and, for a malformed file, the byte offset.
//
// Thread-safety: functions are thread-safe for distinct paths.
#ifndef TESSERA_COMMON_TRAINING_CHECKPOINT_H_
#define TESSERA_COMMON_TRAINING_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

struct CheckpointShard {
  std::map<std::string, std::vector<float>> floats;
  std::map<std::string, std::vector<int64_t>> ints;
};

struct ShardFileInfo {
  std::string file;  // name inside the step directory
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// Writes `shard` to `path`; returns its size and checksum (file = the path's base name).
StatusOr<ShardFileInfo> WriteCheckpointShard(const std::string& path, const CheckpointShard& shard);
// Reads and checks a shard: NotFound for a missing file; DataLoss naming the file for a size
// or checksum that differs from `expected`, or a malformed file (with the offset).
StatusOr<CheckpointShard> ReadCheckpointShard(const std::string& path, const ShardFileInfo& expected);

// A dense parameter as the manifest records it (so a reader can name what differs, or rebuild
// the layout without the model).
struct ManifestTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool operator==(const ManifestTensor& other) const {
    return name == other.name && shape == other.shape;
  }
};

struct CheckpointManifest {
  int64_t step = 0;
  std::string mode;                 // "local", "ps-sync", ...
  uint64_t layout_fingerprint = 0;  // ParameterLayout::Fingerprint
  uint64_t dense_elements = 0;
  int num_servers = 0;              // ps-*: the placement the shards follow
  uint64_t chunk_elements = 0;
  // Optional (written when set; older manifests lack them): the writers' world size, the
  // optimizer whose state the shards hold (OptimizerKindName), the dense tensors in layout order.
  int world_size = 0;
  std::string optimizer;
  std::vector<ManifestTensor> tensors;
  std::vector<ShardFileInfo> files;
};

// "<root>/step-000000000120".
std::string CheckpointStepDirectory(const std::string& root, int64_t step);
// Creates the step directory (mkdir -p).
Status PrepareCheckpointStep(const std::string& root, int64_t step);
// Writes the manifest into its step directory, then points LATEST at it.
Status CommitCheckpoint(const std::string& root, const CheckpointManifest& manifest);
// The step LATEST names: NotFound when the root has no checkpoint yet; DataLoss naming the
// file when LATEST is unreadable.
StatusOr<int64_t> LatestCheckpointStep(const std::string& root);
// The manifest of `step`; errors name the file.
StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& root, int64_t step);
// Reads the manifest and every file of `step`'s checkpoint and checks each file's size and
// checksum against it: OK, or the first problem, naming the file.
Status VerifyCheckpoint(const std::string& root, int64_t step);
// The steps that have a directory under `root` (step-N), newest first; empty when none.
std::vector<int64_t> CheckpointSteps(const std::string& root);
// What to do when a checkpoint under `root` cannot be restored (the one of step `failed`, or
// LATEST itself when absent), to append to that error: "; the newest checkpoint before step
// 30 that verifies is step 20: resume from it with --resume-step 20", or that none does.
std::string ResumeAdvice(const std::string& root, std::optional<int64_t> failed);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_CHECKPOINT_H_
