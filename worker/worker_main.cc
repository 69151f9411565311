// tessera-worker: a training process.
//
// Modes (--mode): the table in worker/modes/mode_registry.h names every one, with its help
// text, what it needs (servers, a coordinator) and the strategy (worker/modes/*_strategy.h)
// or job (worker/modes/job_modes.h) that runs it:
//   local     single-process training: this worker trains the model alone (the reference
//             every distributed mode is compared against). Runs standalone without
//             --coordinator, or as a fleet member (tessera-launch --workers 1 --mode local).
//   ps-sync   parameter-server training (worker/engines/ps_engine.h, server/ps/ps_service.h):
//   ps-async  the servers hold the parameters and apply the optimizer; sync (BSP), async (ASP)
//   ps-ssp    or stale-synchronous with --staleness K.
//   allreduce data parallel without servers (worker/engines/allreduce_engine.h): gradients
//             averaged by ring all-reduce in buckets that start during backward.
//   zero1     the same with the optimizer state partitioned across the workers (ZeRO stage 1);
//   zero2     + the gradients partitioned: reduce-scattered layer by layer during backward
//   zero3     + the parameters partitioned: each layer gathered just before it runs
//             (worker/engines/zero_engine.h; stages 2 and 3 run on the CPU).
//   hsdp      zero3 within each host (or --shard-group-size ranks), replicated across them
//             (worker/modes/hsdp_strategy.h; issue 44).
//   smoke     the foundation smoke job (smoke_job.h): barrier, probe push/pull through the
//             servers, verified ring all-reduces among the workers, exit.
//   bench-allreduce
//             timed ring all-reduces for `tessera-bench allreduce` (allreduce_bench_job.h).
//   bench-ps  timed push+pull steps against the servers for `tessera-bench ps`
//             (ps_bench_job.h).
// This file knows no mode by name: it asks the registry.
// Any error ends the process with that error (exit 1); it does not say goodbye, so the
// coordinator declares it failed and tells the rest of the fleet, which then fail naming it
// instead of waiting for it.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/metrics/metric_names.h"
#include "common/process/process_runtime.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/transport/rpc_endpoint.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/hosted_coordinator.h"
#include "worker/modes/mesh_links.h"
#include "worker/modes/mode_context.h"
#include "worker/modes/mode_registry.h"
#include "worker/params_file.h"
#include "worker/pipeline/pipeline_metrics.h"
#include "worker/trainer.h"
#include "worker/training_setup.h"
#include "worker/worker_flags.h"

namespace tessera::worker {
namespace {

// The bytes of model state the collective engines report (tessera_model_state_bytes and
// _peak_bytes), as {"held": {kind: bytes}, "peak": {...}}, for the summary.
StatusOr<nlohmann::json> ModelStateBytes(MetricsRegistry& metrics) {
  namespace names = metric_names;
  nlohmann::json bytes;
  for (const auto& [key, metric] : {std::pair{"held", names::kModelStateBytes},
                                    std::pair{"peak", names::kModelStatePeakBytes}}) {
    ASSIGN_OR_RETURN(GaugeFamily * family,
                     metrics.RegisterGauge(metric.name, metric.help, {"kind"}));
    for (const char* kind : {"parameters", "gradients", "optimizer_state"}) {
      ASSIGN_OR_RETURN(Gauge * gauge, family->WithLabels({kind}));
      bytes[key][kind] = gauge->Value();
    }
  }
  return bytes;
}

// Both name the rank, so that the summaries of interleaved outputs (srun, mpirun) read alone.
// The summary as one JSON object (--json) or one human line.
std::string FormatSummary(const TrainingSummary& s, const TrainingFlags& flags,
                          const std::string& mode, int rank, int world_size, const Model& model,
                          const ComputeBackend& backend, const std::string& dataset,
                          const OptimizerOptions& optimizer, const nlohmann::json& model_state,
                          const nlohmann::json& parallel) {
  if (flags.json) {
    nlohmann::json j = {
        {"rank", rank},
        {"world_size", world_size},
        {"mode", mode},
        {"model", std::string(model.name())},
        {"parameters", model.layout().total_size()},
        {"embedding_tables", model.embedding_tables().size()},
        {"dataset", dataset},
        {"device", std::string(backend.name())},
        {"optimizer", optimizer.ToString()},
        {"batch_size", flags.batch_size},
        {"seed", flags.seed},
        {"steps", s.steps},
        {"samples", s.samples},
        {"final_loss", s.final_loss},
        {"eval_loss", s.eval_loss},
        {"eval_accuracy", s.eval_accuracy},
        {"seconds", s.seconds},
        {"samples_per_second", s.samples_per_second},
        {"skipped_steps", s.skipped_steps},
        {"nonfinite_check_seconds", s.nonfinite_check_seconds},
    };
    if (!flags.save_params.empty()) j["params_path"] = flags.save_params;
    if (!model_state.is_null()) j["model_state_bytes"] = model_state;
    if (!parallel.is_null()) j["parallel"] = parallel;
    return j.dump();
  }
  std::ostringstream line;
  line << "worker " << rank << " of " << world_size << ": trained " << model.name() << " (" << model.layout().total_size() << " parameters) on "
       << dataset << " with " << optimizer.ToString() << " on " << backend.name() << ": "
       << s.steps << " steps, " << s.samples << " samples in " << s.seconds << " s ("
       << static_cast<int64_t>(s.samples_per_second) << " samples/s); final loss " << s.final_loss
       << ", eval loss " << s.eval_loss << ", eval accuracy " << s.eval_accuracy;
  if (s.skipped_steps > 0) {
    line << "; " << s.skipped_steps << " steps skipped for a NaN or Inf gradient";
  }
  if (!flags.save_params.empty()) line << "; parameters in " << flags.save_params;
  return line.str();
}

// --test-exit RANK:STEP[:leave] (WorkerFlags::test_exit), parsed. rank < 0: none.
struct TestExit {
  int rank = -1;
  int64_t step = 0;
  bool leave = false;  // say goodbye first (a clean leave) instead of SIGKILL
};

StatusOr<TestExit> ParseTestExit(const std::string& text) {
  TestExit parsed;
  if (text.empty()) return parsed;
  int rank = -1;
  long long step = 0;
  char how[16] = {0};
  const int fields = std::sscanf(text.c_str(), "%d:%lld:%15s", &rank, &step, how);
  if (fields < 2 || rank < 0 || step < 1 ||
      (fields == 3 && std::string(how) != "leave")) {
    return InvalidArgumentError("--test-exit=" + text + ": expected RANK:STEP or RANK:STEP:leave "
                                "(RANK >= 0, STEP >= 1)");
  }
  parsed.rank = rank;
  parsed.step = step;
  parsed.leave = fields == 3;
  return parsed;
}

// Trains in `mode`: alone (a mode that trains alone; client may be null) or as worker
// client->rank() of the fleet. Sets *every_rank_stops (if not null) when the ranks of a mode
// that agrees on stopping (the ring modes, ps-sync) agreed to stop.
Status RunTraining(ProcessRuntime& runtime, const WorkerFlags& worker_flags, const ModeEntry& mode,
                   RendezvousClient* client, const PeerWiring& wiring,
                   bool* every_rank_stops = nullptr) {
  const TrainingFlags& flags = worker_flags.training;
  const bool alone = mode.Has(kTrainsAlone);
  const int rank = alone ? 0 : client->rank();
  const int world = alone ? 1 : client->view().num_workers;
  CudaBackendOptions cuda;
  cuda.allow_tf32 = runtime.config().cuda_tf32;
  ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend,
                   MakeBackend(flags.device, runtime.config().local_rank, cuda));
  ASSIGN_OR_RETURN(Datasets data, MakeDatasets(flags));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(flags, *data.train, backend.get()));
  ASSIGN_OR_RETURN(const ParallelShape shape, MakeParallelShape(flags, worker_flags.mode, world));
  // With pipeline or tensor parallelism the data order is the replica's: every rank of one
  // replica reads the same samples.
  TrainerOptions trainer = shape.used()
                               ? MakeTrainerOptions(flags, shape.DataRank(rank), shape.data)
                               : MakeTrainerOptions(flags, rank, world);
  if (trainer.on_nonfinite == NonFinitePolicy::kSkip && mode.Has(kCannotSkipEmbeddingSteps) &&
      !model->embedding_tables().empty()) {
    // Their rows go to the servers apart from the dense chunks, before the dense check.
    return InvalidArgumentError(
        "--on-nonfinite skip cannot drop a step of a model with embedding tables in --mode " +
        worker_flags.mode + "; use error, the default");
  }
  trainer.metrics = &runtime.metrics();
  trainer.should_stop = [&runtime] { return runtime.StopRequested(); };
  ASSIGN_OR_RETURN(const TestExit test_exit, ParseTestExit(worker_flags.test_exit));
  trainer.after_step = [client, rank, test_exit](int64_t step) {
    if (client != nullptr) client->SetStep(step);  // an elastic change names it
    if (test_exit.rank != rank || test_exit.step != step) return;
    // The coordinator records this step with the change: the periodic heartbeat may be late.
    if (client != nullptr) {
      Status sent = client->SendStep(step);
      if (!sent.ok()) TLOG(WARNING) << "--test-exit: step " << step << " not reported: " << sent;
    }
    if (test_exit.leave && client != nullptr) {
      client->Leave("left after step " + std::to_string(step) + " (--test-exit)");
      std::fflush(nullptr);
      _exit(0);
    }
    TLOG(WARNING) << "--test-exit: worker " << rank << " kills itself after step " << step;
    std::fflush(nullptr);
    raise(SIGKILL);
  };
  trainer.gradients_reduced_across_ranks = mode.Has(kReducesGradientsAcrossRanks);
  StrategyContext context;
  context.mode = {&runtime, &worker_flags.modes, client, wiring};
  context.rank = rank;
  ASSIGN_OR_RETURN(context.optimizer, MakeOptimizerOptions(flags));
  ASSIGN_OR_RETURN(context.schedule,
                   MakeLrSchedule(flags, TotalSteps(trainer, data.train->size())));
  context.checkpoint_dir = trainer.checkpoint_dir;
  context.checkpoint_on_stop = trainer.checkpoint_on_stop && !trainer.checkpoint_dir.empty();
  context.every_rank_stops = every_rank_stops;
  context.restores_checkpoints_of = CheckpointSiblings(mode);
  if (shape.used()) context.mesh_dims = {shape.data, shape.pipeline, shape.tensor};
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingStrategy> strategy, mode.make_strategy(context));
  // This rank's stages and slices replace the whole model (made above for the checks that
  // read it); the links run on the strategy's mesh and outlive nothing they serve.
  std::unique_ptr<MeshLinks> links;
  std::unique_ptr<PipelineMetrics> pipeline_metrics;  // tessera_pipeline_*, fed by the model
  PipelineMlp* pipeline = nullptr;
  if (shape.used()) {
    const DeviceMesh* mesh = strategy->mesh();
    if (mesh == nullptr) return InternalError("--mode " + worker_flags.mode + " made no mesh");
    links = std::make_unique<MeshLinks>(&mesh->along(1), &mesh->along(2));
    ASSIGN_OR_RETURN(std::unique_ptr<PipelineMlp> stages,
                     MakePipelineModel(flags, *data.train, links.get(), backend.get()));
    pipeline = stages.get();
    model = std::move(stages);
    ASSIGN_OR_RETURN(pipeline_metrics, PipelineMetrics::Register(&runtime.metrics()));
    pipeline->SetMetrics(pipeline_metrics.get());
    TLOG(INFO) << "worker " << rank << ": data-parallel replica " << shape.DataRank(rank)
               << " of " << shape.data << ", " << pipeline->Describe();
    // Checkpoints of the full model, each rank writing its part (issue 46, item 5).
    CheckpointPlacement placement;
    placement.full_layout = &pipeline->full_layout();
    placement.runs = [pipeline](uint64_t offset, uint64_t size, bool writing) {
      std::vector<CheckpointPlacement::Run> runs;
      for (const PipelineMlp::Run& run : pipeline->FullRuns(offset, size, writing)) {
        runs.push_back({run.local_offset, run.full_offset, run.size});
      }
      return runs;
    };
    placement.take_part = [pipeline](const float* full, float* local) {
      pipeline->TakePart(full, local);
    };
    placement.world = strategy->world();
    RETURN_IF_ERROR(strategy->engine()->SetCheckpointPlacement(std::move(placement)));
  }
  trainer.on_stop_agreed = [strategy = strategy.get()] { strategy->OnStopAgreed(); };
  const OptimizerOptions& optimizer = context.optimizer;
  TLOG(INFO) << "training " << model->name() << " (" << model->layout().total_size()
             << " dense parameters, " << model->embedding_tables().size()
             << " embedding tables) on " << data.description << " with " << optimizer.ToString()
             << ", lr schedule " << context.schedule.ToString() << ", on " << backend->name()
             << ", mode " << worker_flags.mode << ", worker " << rank << " of " << world;
  std::vector<float> params;
  ASSIGN_OR_RETURN(TrainingSummary summary,
                   Train(trainer, *data.train, data.eval.get(), model.get(), backend.get(),
                         strategy->engine(), &params));
  // Rank 0 writes the parameters (in ps-sync and allreduce every rank has the same); a
  // pipeline's in the full model's layout, from every stage and slice.
  nlohmann::json parallel;  // null: neither pipeline nor tensor parallelism
  if (pipeline != nullptr) {
    if (!flags.save_params.empty()) {
      std::vector<float> full;
      RETURN_IF_ERROR(pipeline->GatherFull(params.data(), &full)
                          .WithContext("gathering the parameters to save"));
      if (rank == 0) {
        RETURN_IF_ERROR(SaveParams(flags.save_params, pipeline->full_layout(), full));
      }
    }
    const DeviceMesh& mesh = *strategy->mesh();
    parallel = {{"data_parallel", shape.data},
                {"pipeline_stages", shape.pipeline},
                {"tensor_parallel", shape.tensor},
                {"coordinate", mesh.coordinate()},
                {"schedule", ScheduleKindName(pipeline->schedule().kind())},
                {"micro_batches", flags.micro_batches},
                {"virtual_stages", flags.pipeline_virtual_stages},
                {"peak_held", pipeline->peak_held()},
                {"schedule_peak_held", pipeline->schedule().peak_held(mesh.coordinate()[1])},
                {"bubble_fraction", pipeline->schedule().bubble_fraction()},
                {"stage_parameters", pipeline->layout().total_size()},
                {"full_parameters", pipeline->full_layout().total_size()}};
  } else if (!flags.save_params.empty() && rank == 0) {
    RETURN_IF_ERROR(SaveParams(flags.save_params, model->layout(), params));
  }
  TrainingFlags reported = flags;
  if (rank != 0) reported.save_params.clear();  // only rank 0 wrote them
  nlohmann::json model_state;  // null: this mode's engine does not report it
  if (mode.Has(kReportsModelStateBytes)) {
    ASSIGN_OR_RETURN(model_state, ModelStateBytes(runtime.metrics()));
  }
  std::printf("%s\n", FormatSummary(summary, reported, worker_flags.mode, rank, world, *model,
                                    *backend, data.description, optimizer, model_state,
                                    parallel)
                          .c_str());
  std::fflush(stdout);
  return OkStatus();
}

// A fleet member's work after it joined: a job (the smoke job, a benchmark) or training. Sets
// *every_rank_stops as RunTraining does.
Status RunMember(ProcessRuntime& runtime, const WorkerFlags& flags, const ModeEntry& mode,
                 RendezvousClient& client, const PeerWiring& wiring, bool* every_rank_stops) {
  if (!mode.trains()) return mode.run_job({&runtime, &flags.modes, &client, wiring});
  // The whole fleet starts together (servers wait for this barrier too).
  RETURN_IF_ERROR(client.Barrier("start", std::nullopt, runtime.config().rendezvous_timeout_ms));
  return RunTraining(runtime, flags, mode, &client, wiring, every_rank_stops);
}

// Joins the fleet (or trains alone), runs the mode, and leaves saying how it ended.
Status RunMemberOfFleet(ProcessRuntime& runtime, const WorkerFlags& flags, const ModeEntry& mode);

Status RunWorker(ProcessRuntime& runtime, const WorkerFlags& flags) {
  // The command line accepts only the registry's modes.
  const ModeEntry* mode = FindMode(flags.mode);
  if (mode == nullptr) {
    return InvalidArgumentError("--mode " + flags.mode + " is not available in this version; "
                                "available: " + ModeNames());
  }
  // In a Slurm step given no coordinator, rank 0 hosts the rendezvous (before anyone joins).
  std::unique_ptr<HostedCoordinator> hosted;
  if (runtime.config().slurm_rendezvous) {
    if (mode->Has(kNeedsServers)) {
      return InvalidArgumentError(
          "--mode " + flags.mode + " needs parameter servers, and this Slurm step has no "
          "--coordinator (or MASTER_ADDR) to find them: start the job with srun "
          "--ntasks-per-node=1 tessera-launch --servers S --mode " + flags.mode +
          " ..., or start a fleet and give --coordinator (docs/clusters.md)");
    }
    if (runtime.config().rank == 0) {
      ASSIGN_OR_RETURN(hosted, HostedCoordinator::Start(runtime.config(), runtime.credentials()));
    }
  }
  Status outcome = RunMemberOfFleet(runtime, flags, *mode);
  if (hosted == nullptr) return outcome;
  // The others must not lose their coordinator before they are done.
  Status rendezvous = hosted->Finish([&runtime] { return runtime.StopRequested(); });
  if (outcome.ok() && !rendezvous.ok()) return rendezvous;
  return outcome;
}

Status RunMemberOfFleet(ProcessRuntime& runtime, const WorkerFlags& flags, const ModeEntry& mode) {
  if (runtime.config().coordinator.empty()) {
    if (!mode.Has(kTrainsAlone)) {
      return InvalidArgumentError("--mode " + flags.mode + " needs --coordinator (or MASTER_ADDR "
                                  "and MASTER_PORT); only --mode local runs standalone");
    }
    runtime.AnnounceReady(0);
    return RunTraining(runtime, flags, mode, nullptr, PeerWiring());
  }
  RpcEndpoint& endpoint = runtime.endpoint();
  // Before joining: peers may send ring frames as soon as the fleet view tells them our
  // address, and a frame without a handler would be dropped.
  PeerWiring wiring;
  wiring.failures = std::make_shared<FailureBus>();
  wiring.mailbox = std::make_shared<CollectiveMailbox>(wiring.failures);
  endpoint.SetHandler(MessageType::kRingFrame, CollectiveMailbox::Handler(wiring.mailbox));

  RendezvousOptions options = RendezvousOptionsFrom(runtime.config());
  options.metrics_address = runtime.metrics_url();
  options.stop_requested = [&runtime] { return runtime.StopRequested(); };
  options.handlers_follow = mode.Has(kSurvivesServerLoss);
  // Elastic jobs (--min-workers): only the parameter-server modes go on without a worker.
  options.membership_changes_are_fatal = !mode.Has(kNeedsServers);
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                   RendezvousClient::Join(&endpoint, options, &runtime.metrics()));
  // A failed peer (or a lost coordinator) wakes a collective waiting for frames with the root
  // cause; pending calls and barriers are failed by the client itself.
  client->SetFailureCallback(
      [failures = wiring.failures](const Status& status) { failures->Fail(status); });
  SetLogIdentity("worker", client->rank());
  runtime.AnnounceReady(client->rank());
  bool every_rank_stops = false;
  Status outcome = RunMember(runtime, flags, mode, *client, wiring, &every_rank_stops);
  if (!outcome.ok()) {
    // An error is the root cause the others hear at once; a stop is said as such (the
    // coordinator reports a stop, not a crash). A stop the ring's ranks agreed on is every
    // rank's already: a plain goodbye, for a relay could cut a peer's last read of the
    // agreement short.
    const std::string stop_reason =
        runtime.StopRequested() ? runtime.StopReason() : outcome.message();
    if (every_rank_stops && outcome.code() == StatusCode::kCancelled) {
      client->Leave(stop_reason);
    } else if (runtime.StopRequested() || outcome.code() == StatusCode::kCancelled) {
      client->LeaveStopped(stop_reason);
      // Asked to stop: that is why it ends, even when a wait was cut short by another
      // process's stop relayed on the way (exit 128 + the signal, not 1).
      if (outcome.code() != StatusCode::kCancelled) {
        return CancelledError(stop_reason + " (" + outcome.message() + ")");
      }
    } else {
      client->LeaveWithError(outcome);
    }
    return outcome;
  }
  double linger = runtime.config().linger_seconds;
  if (linger > 0) {
    // Still a member while lingering: the coordinator shows it alive, and a failure elsewhere
    // is logged, but the job's result stands.
    TLOG(INFO) << "finished; lingering " << linger << " s (--linger) for a last scrape of "
               << runtime.metrics_url();
    runtime.WaitForStop(Deadline::AfterMillis(static_cast<int64_t>(linger * 1000)));
  }
  client->Leave("finished");
  return OkStatus();
}

}  // namespace
}  // namespace tessera::worker

int main(int argc, char** argv) {
  // ZeroMQ allocates a fresh buffer for every message it receives (each ring segment, 256 KiB
  // by default), and we free it a few hundred microseconds later. With glibc's defaults those
  // buffers come from mmap or from a heap top that is trimmed back on every free, so every
  // segment faults its pages in again: ~8% of the CPU of a 16 MiB all-reduce at np=2, and
  // 1 MiB all-reduces ~1.4x slower. Keep buffers below 32 MiB on the heap and keep up to
  // 256 MiB of freed heap for reuse instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  tessera::worker::WorkerFlags flags;
  std::shared_ptr<CLI::App> command_line = tessera::worker::WorkerCommandLine(&flags);
  return tessera::RunProcess(tessera::Role::kWorker, argc, argv, command_line.get(),
                             [&flags](tessera::ProcessRuntime& runtime) {
                               return tessera::worker::RunWorker(runtime, flags);
                             });
}
