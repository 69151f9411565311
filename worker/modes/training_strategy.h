// TrainingStrategy: one training mode, built for this worker: the engine the trainer drives
// each step (worker/engines/training_engine.h, the step seam) together with everything that
// engine runs on and must outlive it (the workers' ring, the stop grace, the fleet client's
// handlers). A strategy is made by its mode's factory in mode_registry.h; the trainer sees
// only the engine, and what it must know about the mode comes from the registry as data.
//
// Thread-safety: made and destroyed on the training thread; engine() is called from it only.
#ifndef TESSERA_WORKER_MODES_TRAINING_STRATEGY_H_
#define TESSERA_WORKER_MODES_TRAINING_STRATEGY_H_

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "worker/collectives/device_mesh.h"
#include "worker/engines/training_engine.h"
#include "worker/modes/mode_context.h"

namespace tessera::worker {

struct StrategyContext {
  ModeContext mode;
  int rank = 0;  // this worker's (0 for a mode that trains alone)
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  std::string checkpoint_dir;  // --checkpoint-dir; empty: none
  // --checkpoint-on-sigterm with a --checkpoint-dir: the steps up to an agreed stop and its
  // checkpoint must not be cut short by a stop grace.
  bool checkpoint_on_stop = false;
  // Set (when not null) once the ranks of a mode that agrees on stopping agreed to stop.
  bool* every_rank_stops = nullptr;
  // The modes whose checkpoints this one restores (mode_registry.h's CheckpointSiblings).
  std::vector<std::string> restores_checkpoints_of;
  // Pipeline and tensor parallelism (--pipeline-stages, --tensor-parallel): the world as a
  // mesh ("dp", "pp", "tp") of these dims, row-major (a tensor-parallel group is consecutive
  // ranks); the engine then runs on the "dp" group. Empty: the engine runs on the world.
  std::vector<int> mesh_dims;
};

class TrainingStrategy {
 public:
  virtual ~TrainingStrategy() = default;

  // The engine the trainer drives; owned by the strategy, valid while it lives.
  virtual TrainingEngine* engine() = 0;

  // The trainer's TrainerOptions::on_stop_agreed: every rank answered the stop. The default
  // does nothing (a mode whose ranks do not agree on stopping).
  virtual void OnStopAgreed() {}

  // The mesh made for StrategyContext::mesh_dims (valid while the strategy lives); null
  // without one.
  virtual const DeviceMesh* mesh() const { return nullptr; }
  // Every worker's communicator, for a strategy built on it (null otherwise).
  virtual Collectives* world() { return nullptr; }
};

// A mode's factory. Errors name what failed (the ring's setup, the engine's options).
using StrategyFactory = StatusOr<std::unique_ptr<TrainingStrategy>> (*)(const StrategyContext&);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_TRAINING_STRATEGY_H_
