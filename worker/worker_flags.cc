#include "worker/worker_flags.h"

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/config/flag_checks.h"
#include "common/training/ps_job.h"
#include "worker/modes/mode_registry.h"

namespace tessera::worker {
namespace {

CLI::Validator OneOf(std::vector<std::string> values) {
  std::string joined;
  for (const auto& v : values) joined += (joined.empty() ? "" : "|") + v;
  return CLI::Validator(
      [values, joined](std::string& value) -> std::string {
        for (const auto& v : values) {
          if (value == v) return "";
        }
        return "'" + value + "' is not one of " + joined;
      },
      joined, "one of");
}

void AddTrainingFlags(CLI::App* app, TrainingFlags* f) {
  auto* model = app->add_option_group("Model");
  model->add_option("--model", f->model, "Model: mlp (classifier) or ctr (embeddings + MLP, "
                                         "for click-through data)")
      ->check(OneOf({"mlp", "ctr"}))
      ->capture_default_str();
  model->add_option("--hidden", f->hidden,
                    "Hidden widths, comma-separated (default: mlp 1024,1024; ctr 256,128)");
  model->add_option("--activation", f->activation, "relu or gelu")
      ->check(OneOf({"relu", "gelu"}))
      ->capture_default_str();
  model->add_flag("--layer-norm", f->layer_norm, "LayerNorm after every hidden Linear");
  model->add_option("--embedding-dim", f->embedding_dim, "ctr: floats per embedding row")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();

  auto* data = app->add_option_group("Data");
  data->add_option("--dataset", f->dataset,
                   "synthetic (teacher-labelled classification), synthetic-ctr (Zipf ids + "
                   "dense features), mnist (idx files in --data-path), file (TSRDATA1 file "
                   "--data-path, see docs/data-format.md)")
      ->check(OneOf({"synthetic", "synthetic-ctr", "mnist", "file"}))
      ->capture_default_str();
  data->add_option("--data-path", f->data_path,
                   "mnist: directory with train-/t10k- idx files; file: the training file");
  data->add_option("--eval-data-path", f->eval_data_path, "file: the evaluation file");
  data->add_option("--train-samples", f->train_samples, "Synthetic sets: samples")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  data->add_option("--input-dim", f->input_dim, "synthetic: features per sample")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  data->add_option("--classes", f->classes, "synthetic: classes")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();

  auto* parallel = app->add_option_group(
      "Pipeline and tensor parallelism",
      "The native mlp split across W = D x P x T workers (ranks row-major over (dp, pp, tp): "
      "a tensor-parallel group is consecutive ranks), with --mode allreduce or zero1 across "
      "the D data-parallel replicas; --batch-size is per replica (docs/allreduce.md)");
  parallel->add_option("--pipeline-stages", f->pipeline_stages,
                       "P: pipeline ranks; the mlp's layers are split into P x V stages, "
                       "balanced by multiply-adds per sample unless --pipeline-split")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  parallel->add_option("--micro-batches", f->micro_batches,
                       "M: micro-batches each replica's --batch-size is cut into")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  parallel->add_option("--pipeline-schedule", f->pipeline_schedule,
                       "gpipe, 1f1b (needs M >= P), interleaved (M a multiple of P; "
                       "--pipeline-virtual-stages) or zb-h1 (needs M >= P)")
      ->check(OneOf({"gpipe", "1f1b", "interleaved", "zb-h1"}))
      ->capture_default_str();
  parallel->add_option("--pipeline-virtual-stages", f->pipeline_virtual_stages,
                       "V: stages per pipeline rank (interleaved only)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  parallel->add_option("--pipeline-split", f->pipeline_split,
                       "Layer indices (mlp.<i>) where stages 1.. begin, comma-separated, "
                       "instead of the balanced split");
  parallel->add_option("--tensor-parallel", f->tensor_parallel,
                       "T: ranks each pair of hidden Linear layers is split across (column "
                       "then row parallel, Megatron-style)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();

  auto* train = app->add_option_group("Training");
  train->add_option("--batch-size", f->batch_size, "Samples per step, per worker")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  train->add_option("--grad-accumulation", f->grad_accumulation,
                    "Micro-batches of --batch-size per optimizer step (gradients averaged; in "
                    "allreduce mode only the last one communicates)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--steps", f->steps, "Optimizer steps (0: use --epochs)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--epochs", f->epochs, "Passes over this worker's share when --steps is 0")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--optimizer", f->optimizer, "sgd, momentum, adam, adamw or adagrad")
      ->check(OneOf({"sgd", "momentum", "adam", "adamw", "adagrad"}))
      ->capture_default_str();
  // Largest --lr, --weight-decay and --min-lr accepted: far past any that trains, and a typo
  // of a few digits too many is caught.
  constexpr double kMaxRate = 1e6;
  train->add_option_function<double>(
          "--lr", [f](const double& lr) { f->lr = lr; },
          "Learning rate (default: the optimizer's, as in PyTorch)")
      ->check(FiniteRange(0, kMaxRate));
  train->add_option("--optimizer-params", f->optimizer_params,
                    "Other optimizer fields, e.g. momentum=0.9,nesterov=true or "
                    "beta2=0.98,eps=1e-6");
  train->add_option_function<double>(
          "--weight-decay", [f](const double& decay) { f->weight_decay = decay; },
          "Weight decay (L2; decoupled for adamw); default: the optimizer's")
      ->check(FiniteRange(0, kMaxRate));
  train->add_option("--lr-schedule", f->lr_schedule, "constant, step or cosine")
      ->check(OneOf({"constant", "step", "cosine"}))
      ->capture_default_str();
  train->add_option("--warmup-steps", f->warmup_steps, "Linear warmup steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--lr-step-size", f->lr_step_size, "step schedule: steps between decays")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  train->add_option("--lr-gamma", f->lr_gamma, "step schedule: decay factor, in (0, 1]")
      ->check(FiniteRange(0, 1))
      ->capture_default_str();
  train->add_option("--min-lr", f->min_lr, "cosine schedule: final learning rate")
      ->check(FiniteRange(0, kMaxRate))
      ->capture_default_str();
  train->add_option("--seed", f->seed, "Seed of the parameters, the data order and synthetic data")
      ->check(UnsignedRange(0, UINT64_MAX))
      ->capture_default_str();
  train->add_option("--on-nonfinite", f->on_nonfinite,
                    "A NaN or Inf gradient or loss: error (stop, naming the step, rank and "
                    "tensor), skip (drop that step's update on every rank; in ps-async and "
                    "ps-ssp only this worker's) or off (no check)")
      ->check(OneOf({"error", "skip", "off"}))
      ->capture_default_str();
  // Tests only (so not in --help): makes the step's loss and gradients NaN on this rank.
  train->add_option("--inject-nonfinite-step", f->inject_nonfinite_step)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->group("");
  train->add_option("--device", f->device, "cpu, cuda or auto (cuda when a GPU is there)")
      ->check(OneOf({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  train->add_option("--log-every", f->log_every, "Progress line every N steps (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--eval-every", f->eval_every, "Evaluate every N steps (0: at the end only)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_option("--eval-samples", f->eval_samples, "Samples of the evaluation set to use")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_flag("--json", f->json, "Print the final summary as one JSON object on stdout");
  train->add_option("--save-params", f->save_params,
                    "Write the final dense parameters to PATH (raw float32) and PATH.json "
                    "(manifest); see docs/params-format.md");
  train->add_option("--checkpoint-dir", f->checkpoint_dir,
                    "Where checkpoints go (step-N/ directories, MANIFEST.json, LATEST)");
  train->add_option("--checkpoint-every", f->checkpoint_every,
                    "Checkpoint after every N steps and after the last (needs --checkpoint-dir)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  train->add_flag("--checkpoint-on-sigterm", f->checkpoint_on_sigterm,
                  "On SIGTERM or SIGINT (preemption), checkpoint the step just finished into "
                  "--checkpoint-dir before exiting (ps-sync, allreduce, zero1-3: the step all "
                  "workers agree to stop after; waits are then not cut 1 s after the signal)");
  train->add_flag("--resume", f->resume,
                  "Continue after the newest checkpoint in --checkpoint-dir (from step 1 if "
                  "there is none yet)");
  train->add_option_function<int64_t>(
          "--resume-step", [f](const int64_t& step) { f->resume_step = step; },
          "Continue after the checkpoint of step N in --checkpoint-dir instead of the newest "
          "(e.g. when the newest does not verify: the error names the newest that does)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
}

void AddSmokeFlags(CLI::App* app, SmokeFlags* flags) {
  auto* group = app->add_option_group("Smoke job (--mode smoke)");
  group->add_option("--tensor-elements", flags->tensor_elements,
                    "Float32 elements of the probe tensors and of the all-reduce")
      ->check(CLI::Range(int64_t{0}, kMaxSmokeTensorElements))
      ->capture_default_str();
  group->add_option("--rounds", flags->rounds,
                    "All-reduce rounds to run, like training steps (progress every 10)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  group->add_option("--round-interval-ms", flags->round_interval_ms,
                    "Pause between two all-reduce rounds")
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000))
      ->capture_default_str();
}

// Also the flags of --mode bench-ps (ps_bench_job.h).
void AddAllReduceBenchFlags(CLI::App* app, AllReduceBenchFlags* flags) {
  auto* group = app->add_option_group("Benchmarks (--mode bench-allreduce, bench-ps)");
  group->add_option("--bench-sizes", flags->sizes, "Buffer sizes in bytes, comma-separated")
      ->capture_default_str();
  group->add_option("--bench-warmup", flags->warmup, "Untimed all-reduces per size")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}))
      ->capture_default_str();
  group->add_option("--bench-iters", flags->iters,
                    "Timed all-reduces per size; 0: as many as fit in --bench-seconds")
      ->check(CLI::Range(int64_t{0}, kMaxBenchIters))
      ->capture_default_str();
  group->add_option("--bench-seconds", flags->seconds, "Time per size when --bench-iters is 0")
      ->check(FiniteRange(0, 3600))
      ->capture_default_str();
}

void AddWorkerFlags(CLI::App* app, WorkerFlags* flags) {
  ModeFlags* modes = &flags->modes;
  app->add_option("--mode", flags->mode, ModesHelp())
      ->check(CLI::Validator(
          [](std::string& mode) -> std::string {
            if (FindMode(mode) != nullptr) return "";
            return "mode " + mode + " is not available in this version; available: " +
                   ModeNames();
          },
          "MODE", "mode"))
      ->capture_default_str();
  AddTrainingFlags(app, &flags->training);
  auto* ps = app->add_option_group("Parameter server (--mode ps-*)");
  ps->add_option("--staleness", modes->staleness,
                 "ps-ssp: how many steps a worker may run ahead of the slowest")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  ps->add_option("--ps-chunk-elements", modes->ps_chunk_elements,
                 "Dense parameters travel and are sharded in chunks of this many floats")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 28))
      ->capture_default_str();
  ps->add_option("--ps-shared-memory", modes->ps_shared_memory,
                 "Servers on this host exchange gradients and values with this worker through "
                 "shared memory instead of sockets (false: always sockets)")
      ->capture_default_str();
  ps->add_option("--ps-resend-ms", modes->ps_resend_ms,
                 "A request to a server unanswered this long is sent again (the same request: "
                 "a server applies it once), then after twice as long, up to 8x, until "
                 "--request-timeout-ms; 0: never")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  ps->add_option("--bench-ps-mode", modes->bench_ps_mode,
                 "--mode bench-ps: the mode its steps use (ps-async: each worker's own "
                 "push+pull throughput; ps-sync: the workers' steps in lockstep, as in training; "
                 "ps-ssp: with --bench-iters only)")
      ->check(CLI::Validator(
          [](std::string& mode) -> std::string {
            StatusOr<PsConsistency> parsed = ParsePsMode(mode);
            return parsed.ok() ? "" : parsed.status().message();
          },
          "MODE", "ps mode"))
      ->capture_default_str();
  auto* ddp = app->add_option_group("All-reduce (--mode allreduce, zero1-3, hsdp)");
  ddp->add_option("--bucket-mb", modes->bucket_mb,
                  "Gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb)")
      ->check(FiniteRange(0, 4096))
      ->capture_default_str();
  ddp->add_flag("--no-overlap", modes->no_overlap,
                "allreduce, zero1: start all buckets after backward instead of during it; "
                "zero3: no prefetch of the next layer's parameters");
  ddp->add_option("--shard-group-size", modes->shard_group_size,
                  "hsdp: the workers of a shard group (ranks 0..N-1, N..2N-1, ...), which must "
                  "divide the world; 0: the workers of each host")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  ddp->add_option("--segment-kb", modes->segment_kb,
                  "Pipelining unit of the ring: the largest piece one message carries")
      ->check(CLI::Range(uint64_t{1}, uint64_t{64} << 10))
      ->capture_default_str();
  ddp->add_option("--ring-transport", modes->ring_transport,
                  "How ring segments travel: shm (shared-memory rings to the ring neighbours, "
                  "same host only; worker/collectives/channel/shm/ring_shm.h), links (direct TCP connections to them; "
                  "worker/collectives/channel/links/ring_links.h), zmq (through the process's transport and its I/O "
                  "thread), or auto (per hop: shm between neighbours that can map each other's "
                  "shared memory, i.e. on one host, links elsewhere; the ring visits each "
                  "host's workers together). Both direct channels are driven by the calling "
                  "thread. Every worker must use the same. Where every worker is on one host, "
                  "calls from --direct-read-min-bytes on bypass the ring (direct reads); the "
                  "startup log's ring channel line says so and from what size")
      ->check(CLI::IsMember({"auto", "shm", "links", "zmq"}))
      ->capture_default_str();
  ddp->add_option("--ring-spin-us", modes->ring_spin_us,
                  "With --ring-transport links: the most a waiting collective polls its socket "
                  "without sleeping (yielding the core each round) before it sleeps in poll(); "
                  "the budget within this cap adapts to how long recent waits took, and drops "
                  "to 0 while waits outlast it. 0: never spin")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  ddp->add_option("--comm-spin-us", modes->comm_spin_us,
                  "allreduce, zero1-3, hsdp: how long the communication thread, once idle, "
                  "polls for the next collective (and the training thread for a collective's "
                  "end) before it sleeps, yielding the core each round; saves a thread wake-up "
                  "per collective, at the cost of a core's time while it polls. 0: sleep at "
                  "once (best where the workers have no spare cores; "
                  "worker/collectives/spin_wait.h)")
      ->check(CLI::Range(int64_t{0}, kMaxCommSpinUs))
      ->capture_default_str();
  ddp->add_option("--direct-read-min-bytes", modes->direct_read_min_bytes,
                  "Where every worker of a communicator is on this host and the kernel allows "
                  "cross-memory attach (process_vm_readv; checked at start, a refusal is logged), "
                  "all-reduces, reduce-scatters and all-gathers of at least this many bytes read "
                  "the peers' buffers directly (one copy; worker/collectives/"
                  "direct_read_collectives.h) and smaller ones use the ring. 0: never. Every "
                  "worker must use the same")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  ddp->add_option("--one-shot-max-bytes", modes->one_shot_max_bytes,
                  "All-reduces on the ring of at most this many bytes (and at most a segment) "
                  "gather every worker's whole buffer and reduce it on each worker: the same "
                  "result in half the ring's steps, which is what small all-reduces wait for "
                  "(worker/collectives/ring_collectives.h). 0: never. Every worker must use the "
                  "same")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  AddSmokeFlags(app, &modes->smoke);
  AddAllReduceBenchFlags(app, &modes->bench);
}

}  // namespace

std::shared_ptr<CLI::App> WorkerCommandLine(WorkerFlags* flags) {
  auto app = std::make_shared<CLI::App>(
      "tessera-worker: a training process. --mode local trains alone (standalone or in a "
      "fleet); the other modes join the fleet at --coordinator.");
  AddWorkerFlags(app.get(), flags);
  // Tests only, so not in --help (see WorkerFlags::test_exit); parsed in worker_main.
  app->add_option("--test-exit", flags->test_exit)->group("");
  return app;
}

}  // namespace tessera::worker
