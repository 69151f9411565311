// Sharded checkpoints of a flat parameter buffer and its per-element optimizer state, for
// engines whose ranks own slices of it (allreduce, zero1, zero2; zero3 holds only its slices of
// the parameters too, and hsdp's first shard group writes as zero3 on its ranks would). The
// format depends neither on the world size nor on the bucket plan, so
// a checkpoint restores at any world size and into any of these modes (DeepSpeed's "universal
// checkpoint", without a conversion step):
//
//   <root>/step-000000000120/rank-<r>.ckpt   one per rank that owns elements (common/training/checkpoint.h
//                                            shard files), with the entries
//       slices  int64  [offset, size, offset, size, ...]: absolute element ranges of the flat
//                      buffer (ParameterLayout order), non-empty, in the rank's order
//       params  float  the elements of those slices, concatenated in the same order
//       state   float  their optimizer state, StateFloatsPerElement(kind) floats per element,
//                      interleaved per element (common/training/optimizer.h), in the same order
//   <root>/step-000000000120/MANIFEST.json   mode, world_size, layout fingerprint, dense_elements,
//                                            optimizer, tensors (names, shapes), files
//
// A rank that owns nothing (data parallel: every rank but 0, whose one slice [0, Ψ) stands for
// the identical replicas) writes no file; the manifest lists the files that exist. Together
// the listed shards must cover [0, Ψ) exactly once.
//
// Saving is collective: every rank writes its shard atomically, the ranks all-gather whether
// that worked and each file's size and checksum, and only then rank 0 commits the manifest and
// LATEST (and tells the others it did). A crash or a failed write anywhere before the commit
// leaves the previous checkpoint in use.
//
// Restoring reads the manifest and every shard (each rank reads them all), checks the model and
// the optimizer against the manifest, assembles the full parameters and state, checks that
// every element is covered exactly once, and hands back the slices the caller owns now (which
// need not be those that were saved).
//
// Thread-safety: the functions are thread-safe for distinct roots; the collective ones must be
// called by every rank with the same arguments except the slices and buffers.
#ifndef TESSERA_WORKER_ENGINES_SHARDED_STATE_H_
#define TESSERA_WORKER_ENGINES_SHARDED_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/training/checkpoint.h"
#include "common/training/optimizer.h"
#include "common/training/parameter_layout.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// What a sharded checkpoint is of. `layout` (not owned) must outlive the calls.
struct ShardedCheckpointSpec {
  std::string mode;  // the writer's mode name, recorded in the manifest ("zero2", ...)
  const ParameterLayout* layout = nullptr;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  // Reading: the writers' modes whose checkpoints are in this format (and restore into one
  // another): the mode registry's (worker/modes/mode_registry.h), which the engines do not
  // see, passed down. A checkpoint of any other mode is refused naming it.
  std::vector<std::string> restores_from;
};

// "rank-3.ckpt".
std::string RankShardFileName(int rank);

// The shard of `slices` (empty ones are left out). `slice_params` holds the slices' elements
// concatenated (the sum of their sizes), `slice_state` their state, `state_floats_per_element`
// floats per element in the same order; either may be null only where it addresses nothing.
CheckpointShard MakeSliceShard(const std::vector<Partition>& slices, const float* slice_params,
                               const float* slice_state, size_t state_floats_per_element);

// Collective (see above): this rank's shard of `slices` (nothing when they are all empty) into
// the step directory of `root`, then rank 0 commits. `tag` and tag + 1 must be unused by any
// concurrent collective. Every rank returns an error when any rank failed, naming that rank.
Status SaveShardedCheckpoint(const std::string& root, int64_t step,
                             const ShardedCheckpointSpec& spec,
                             const std::vector<Partition>& slices, const float* slice_params,
                             const float* slice_state, Collectives* collectives, uint64_t tag);

// Places shards' slices into full buffers and checks that each element comes exactly once.
class SliceAssembler {
 public:
  SliceAssembler(uint64_t total_elements, size_t state_floats_per_element);

  // Adds one shard read from `file` (named in errors). DataLoss naming the file for malformed
  // entries (a missing entry, an odd slices list, sizes that do not add up, a slice out of
  // range) and for a slice that overlaps elements an earlier shard (named too) already gave.
  Status Add(const std::string& file, const CheckpointShard& shard);
  // DataLoss naming `where` and the first missing range when some element came in no shard.
  Status CheckComplete(const std::string& where) const;

  std::vector<float>& params() { return params_; }
  std::vector<float>& state() { return state_; }

 private:
  const uint64_t total_;
  const size_t k_;
  std::vector<float> params_;
  std::vector<float> state_;
  std::vector<int> owner_;  // per element: index into files_, or -1
  std::vector<std::string> files_;
};

// The full parameters and optimizer state of a checkpoint.
struct AssembledState {
  CheckpointManifest manifest;
  std::vector<float> params;  // dense_elements
  std::vector<float> state;   // StateFloatsPerElement(optimizer) per element
};

// Not collective: reads and assembles the checkpoint of `step` under `root`. FailedPrecondition
// naming the step directory and what differs when it is of another mode family, another model
// (the first tensor whose name or shape differs) or another optimizer; DataLoss or NotFound
// naming the file for a missing, truncated, corrupted or malformed shard or a coverage error.
StatusOr<AssembledState> ReadShardedCheckpoint(const std::string& root, int64_t step,
                                               const ShardedCheckpointSpec& spec);

// Collective: every rank reads the checkpoint (ReadShardedCheckpoint), then copies out
//   - into `slice_params` and `slice_state` (each nullable) its `slices`, concatenated as in
//     MakeSliceShard;
//   - into `full_params` (nullable) all the parameters.
// Then the ranks agree: if any failed, every rank fails, the others naming it. `tag` must be
// unused by any concurrent collective. The outputs are unspecified after an error.
Status RestoreShardedCheckpoint(const std::string& root, int64_t step,
                                const ShardedCheckpointSpec& spec,
                                const std::vector<Partition>& slices, float* slice_params,
                                float* slice_state, float* full_params, Collectives* collectives,
                                uint64_t tag);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_SHARDED_STATE_H_
