// The mode registry: one table of tessera-worker's modes (--mode). Each entry names a mode,
// says what it is in --help, states as data what main and the trainer need to know about it
// (its capabilities), and either makes its training strategy (training_strategy.h) or runs
// its job (job_modes.h). --mode's validation and help, main's dispatch and the trainer's
// mode-dependent behaviour all come from here, so no code outside this folder compares a mode
// name (the engines learn which writers' checkpoints they restore from CheckpointSiblings,
// through their strategy). A new mode is a new file (its strategy, beside the others here)
// and one line in the table (mode_registry.cc).
//
// Thread-safety: the table is immutable; every function may be called from any thread.
#ifndef TESSERA_WORKER_MODES_MODE_REGISTRY_H_
#define TESSERA_WORKER_MODES_MODE_REGISTRY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/modes/job_modes.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// What main and the trainer need to know about a mode, as bits of ModeEntry::capabilities.
enum ModeCapability : uint32_t {
  // This worker trains alone, as rank 0 of 1 even as a fleet member: it runs without
  // --coordinator.
  kTrainsAlone = 1u << 0,
  // It needs parameter servers (so it cannot run in a Slurm step that hosts its own
  // coordinator and has none).
  kNeedsServers = 1u << 1,
  // Its gradient check sees the gradients reduced across the ranks, the same on every rank
  // (TrainerOptions::gradients_reduced_across_ranks).
  kReducesGradientsAcrossRanks = 1u << 2,
  // Its engine reports tessera_model_state_bytes, which the summary shows.
  kReportsModelStateBytes = 1u << 3,
  // --on-nonfinite skip cannot drop its steps when the model has embedding tables (their rows
  // go to the servers apart from the dense chunks, before the dense check).
  kCannotSkipEmbeddingSteps = 1u << 4,
  // Its checkpoints are sharded flat buffers (worker/engines/sharded_state.h): any mode with
  // this bit restores them, at any world size.
  kShardedCheckpoints = 1u << 5,
  // Its checkpoints are the parameter servers' shards: any mode with this bit restores them.
  kServerCheckpoints = 1u << 6,
  // Its strategy survives a server's loss (other replicas of its key ranges carry on): the
  // fleet client holds failure notices until the strategy's handler takes them
  // (RendezvousOptions::handlers_follow), rather than failing while the model is built.
  kSurvivesServerLoss = 1u << 7,
};

struct ModeEntry {
  std::string_view name;  // the value of --mode
  // Its part of --mode's help. Adjacent entries with the same text share it there
  // ("ps-sync, ps-async, ps-ssp: train against the parameter servers").
  std::string_view help;
  uint32_t capabilities = 0;  // ModeCapability bits
  // Exactly one of the two: a training mode's factory, or a job's body.
  StrategyFactory make_strategy = nullptr;
  JobRunner run_job = nullptr;

  bool Has(ModeCapability capability) const { return (capabilities & capability) != 0; }
  bool trains() const { return make_strategy != nullptr; }
};

// Every mode, in the order --help lists them.
const std::vector<ModeEntry>& Modes();

// The mode named `name`, or null when there is none.
const ModeEntry* FindMode(std::string_view name);

// "local, ps-sync, ...": every mode's name, in the table's order.
std::string ModeNames();

// The names of the modes with `capability`, in the table's order.
std::vector<std::string> ModeNamesWith(ModeCapability capability);

// The modes whose checkpoints `mode` restores (those of its checkpoint format: sharded or the
// servers'); empty for a mode that checks no writer (local) or writes none (the jobs).
std::vector<std::string> CheckpointSiblings(const ModeEntry& mode);

// --mode's help text: "local: train alone (...); ps-sync, ps-async, ps-ssp: train against the
// parameter servers; ...".
std::string ModesHelp();

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_MODE_REGISTRY_H_
