// Trainer: the training loop of one worker, the same for every mode.
//
//   for step in 1..steps:
//     batch   <- this rank's next `batch_size` samples (DistributedSampler order, by epoch)
//     rows    <- engine.LookupRows(...)         for a model with embedding tables
//     forward + backward on the batch (gradients into the flat gradient buffer, or, for an
//     engine that partitions the parameters (ZeRO 2-3), layer by layer into its storage);
//     with accumulation, once per micro-batch (summed here, or by such an engine itself);
//     each layer first waits for its parameters (engine.AwaitParameters: zero1 gathers them
//     while the forward runs)
//     engine.Step(step, params, grads, rows)   <- where the mode plugs in
//     every `log_every` steps: a progress line; every `eval_every` steps: evaluation;
//     every `checkpoint_every` steps: engine.SaveCheckpoint
// With `resume`, the engine restores the newest checkpoint (or `resume_step`'s) and the loop
// continues after its step, with the data order exactly as if it had never stopped. A
// checkpoint that does not verify fails naming the file, and the error names the newest
// earlier checkpoint that does.
// Progress goes to the log; the summary is returned for the binary to print (and as JSON).
// On a GPU backend the model runs on device copies of the parameters and gradients; the
// engine always sees host memory (the trainer copies gradients down after backward and
// parameters up after the step, and reports all gradients ready at once).
//
// Thread-safety: one thread.
#ifndef TESSERA_WORKER_TRAINER_H_
#define TESSERA_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "worker/data/dataset.h"
#include "worker/engines/training_engine.h"
#include "worker/nn/compute_backend.h"
#include "worker/nn/model.h"

namespace tessera::worker {

// What a NaN or Inf in the gradients does (--on-nonfinite).
enum class NonFinitePolicy {
  kError,  // stop, naming the step, the rank and the tensor
  kSkip,   // drop the step's update on every rank (modes whose ranks see the same gradients)
  kOff,    // no check (to measure what the check costs)
};
StatusOr<NonFinitePolicy> ParseNonFinitePolicy(const std::string& text);

struct TrainerOptions {
  int64_t batch_size = 64;   // per worker and micro-batch
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step (gradients averaged)
  int64_t steps = 100;       // 0: derive from epochs
  int64_t epochs = 0;        // used when steps is 0: epochs * ceil(per-rank samples / batch)
  uint64_t seed = 0;         // parameter init and data order
  int rank = 0;
  int world_size = 1;
  int64_t log_every = 10;    // 0: no progress lines
  int64_t eval_every = 0;    // 0: evaluate only at the end
  int64_t eval_samples = 1024;  // evaluated samples of the eval set (its first ones)
  std::string checkpoint_dir;     // common/training/checkpoint.h layout; empty: no checkpoints
  int64_t checkpoint_every = 0;   // > 0: save after every N steps and after the last
  bool resume = false;            // continue after the newest checkpoint in checkpoint_dir
                                  // (from step 1 when there is none yet)
  std::optional<int64_t> resume_step;  // continue after this step's checkpoint instead (it
                                       // must exist); implies resume
  MetricsRegistry* metrics = nullptr;  // training metrics (metric_names.h) when set
  // Polled after every step: true ends training with Cancelled (a signal, preemption). With
  // checkpoint_on_stop (and checkpoint_dir), the finished step is checkpointed first.
  std::function<bool()> should_stop;
  // Called after every step, once its parameters are in, with the step (before should_stop).
  // May be empty. (An elastic job's worker: its heartbeats carry the step; tests exit here.)
  std::function<void(int64_t step)> after_step;
  // Called once the ranks agreed to stop (every rank answered: none hangs), before the
  // checkpoint on stop. May be empty.
  std::function<void()> on_stop_agreed;
  bool checkpoint_on_stop = false;
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kError;
  // The engine's gradient check sees the gradients reduced across the ranks (allreduce,
  // zero1-3: the mode registry's kReducesGradientsAcrossRanks), so a NaN or Inf it reports
  // may be any rank's, and the error says so.
  bool gradients_reduced_across_ranks = false;
  // Tests: from this step on (0: never) one feature of this rank's first sample is NaN, so
  // that the step's loss and gradients are.
  int64_t inject_nonfinite_step = 0;
};

struct TrainingSummary {
  int64_t first_step = 1;       // > 1 after resuming from a checkpoint
  int64_t steps = 0;            // the last step (global numbering)
  int64_t samples = 0;          // trained on by this rank
  int64_t skipped_steps = 0;    // dropped for a NaN or Inf gradient (--on-nonfinite skip)
  double nonfinite_check_seconds = 0;  // spent scanning gradients for NaN and Inf
  double final_loss = 0;        // mean training loss of the last step
  double eval_loss = 0;
  double eval_accuracy = 0;
  double seconds = 0;
  double samples_per_second = 0;
};

// The steps Train runs: options.steps, or when that is 0, options.epochs passes over this
// rank's share of a training set of `train_size` samples (the last batch of an epoch may
// borrow from the next).
int64_t TotalSteps(const TrainerOptions& options, size_t train_size);

// Trains `model` (whose ops run on `backend`) with `params` (host memory, initialised here
// from options.seed, then handed to the engine; the final parameters on return). `eval` may be
// null. Errors name the step and the engine.
StatusOr<TrainingSummary> Train(const TrainerOptions& options, const data::Dataset& train,
                                const data::Dataset* eval, Model* model, ComputeBackend* backend,
                                TrainingEngine* engine, std::vector<float>* params);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TRAINER_H_
