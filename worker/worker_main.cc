// tessera-worker: a training process.
//
// Modes (--mode):
//   local     single-process training: this worker trains the model alone (the reference
//             every distributed mode is compared against). Runs standalone without
//             --coordinator, or as a fleet member (tessera-launch --workers 1 --mode local).
//   ps-sync   parameter-server training (worker/engines/ps_engine.h, server/ps/ps_service.h): the servers
//   ps-async  hold the parameters and apply the optimizer; sync (BSP), async (ASP) or
//   ps-ssp    stale-synchronous with --staleness K.
//   allreduce data parallel without servers (worker/engines/allreduce_engine.h): gradients averaged by
//             ring all-reduce in buckets that start during backward.
//   zero1     the same with the optimizer state partitioned across the workers (ZeRO stage 1);
//   zero2     + the gradients partitioned: reduce-scattered layer by layer during backward
//   zero3     + the parameters partitioned: each layer gathered just before it runs
//             (worker/engines/zero_engine.h; stages 2 and 3 run on the CPU).
//   smoke     the foundation smoke job (smoke_job.h): barrier, probe push/pull through the
//             servers, verified ring all-reduces among the workers, exit.
//   bench-allreduce
//             timed ring all-reduces for `tessera-bench allreduce` (allreduce_bench_job.h).
//   bench-ps  timed push+pull steps against the servers for `tessera-bench ps`
//             (ps_bench_job.h).
// Any error ends the process with that error (exit 1); it does not say goodbye, so the
// coordinator declares it failed and tells the rest of the fleet, which then fail naming it
// instead of waiting for it.
#include <malloc.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/metrics/metric_names.h"
#include "common/process/process_runtime.h"
#include "common/rendezvous/rendezvous_client.h"
#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"
#include "common/transport/rpc_endpoint.h"
#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/ring_channel_setup.h"
#include "worker/collectives/ring_collectives.h"
#include "worker/engines/allreduce_engine.h"
#include "worker/engines/local_engine.h"
#include "worker/engines/ps_engine.h"
#include "worker/engines/zero_engine.h"
#include "worker/hosted_coordinator.h"
#include "worker/jobs/allreduce_bench_job.h"
#include "worker/jobs/ps_bench_job.h"
#include "worker/jobs/smoke_job.h"
#include "worker/params_file.h"
#include "worker/trainer.h"
#include "worker/training_setup.h"
#include "worker/worker_flags.h"

namespace tessera::worker {
namespace {

// The workers' ring, from the fleet view, as every collective mode builds it. Sets
// *channel_description (if not null) to the channel it chose, as logged.
// What a worker of the fleet uses to talk to its peers: the mailbox its endpoint delivers ring
// frames to, and the bus its rendezvous client posts failures on.
struct PeerWiring {
  std::shared_ptr<FailureBus> failures;
  std::shared_ptr<CollectiveMailbox> mailbox;
};

StatusOr<std::unique_ptr<RingCollectives>> MakeRing(ProcessRuntime& runtime,
                                                    const WorkerFlags& worker_flags,
                                                    RendezvousClient& client,
                                                    const PeerWiring& wiring,
                                                    std::string* channel_description = nullptr) {
  RingChannelSetupOptions setup;
  setup.kind = worker_flags.ring_transport;
  setup.rank = client.rank();
  setup.world_size = client.view().num_workers;
  ASSIGN_OR_RETURN(setup.peer_addresses, RingPeerAddresses(client.view()));
  setup.transport = &runtime.endpoint().transport();
  setup.mailbox = wiring.mailbox;
  setup.failures = wiring.failures;
  setup.timeout_ms = runtime.config().rendezvous_timeout_ms;
  setup.segment_bytes = static_cast<size_t>(worker_flags.segment_kb) * 1024;
  setup.links_spin_us = worker_flags.ring_spin_us;
  setup.credentials = runtime.credentials();
  setup.metrics = &runtime.metrics();
  ASSIGN_OR_RETURN(ConnectedRingChannel channel, ConnectRingChannel(setup));
  TLOG(INFO) << "ring channel: " << channel.description;
  if (channel_description != nullptr) *channel_description = channel.description;
  RingCollectivesOptions ring;
  ring.rank = setup.rank;
  ring.world_size = setup.world_size;
  ring.channel = std::move(channel.channel);
  ring.ring_order = std::move(channel.order);
  ring.timeout_ms = runtime.config().request_timeout_ms;
  ring.segment_bytes = setup.segment_bytes;
  return RingCollectives::Create(ring);
}

// A stop ends a ring wait on a peer that never answers (one that hangs: the heartbeat would
// tell only after --heartbeat-timeout-ms). kStopGraceMs after the stop, the ring's failure bus
// fails with the stop, unless the ranks agreed to stop by then (every rank answered). Not with
// --checkpoint-on-sigterm, whose checkpoint a step slower than the grace would otherwise
// lose. The PS engine has its own grace.
class RingStopGrace {
 public:
  RingStopGrace(ProcessRuntime& runtime, std::shared_ptr<FailureBus> failures)
      : runtime_(runtime), failures_(std::move(failures)), watcher_([this] { Watch(); }) {}
  ~RingStopGrace() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watcher_.join();
  }
  RingStopGrace(const RingStopGrace&) = delete;
  RingStopGrace& operator=(const RingStopGrace&) = delete;

  // The ranks agreed to stop: no wait is cut short from now on.
  void Disarm() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      disarmed_ = true;
    }
    cv_.notify_all();
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    // Polled: a stop request wakes the runtime's waiters, not this condition variable.
    while (!runtime_.StopRequested()) {
      if (cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return done_; })) return;
    }
    if (cv_.wait_for(lock, std::chrono::milliseconds(kStopGraceMs),
                     [this] { return done_ || disarmed_; })) {
      return;
    }
    lock.unlock();
    failures_->Fail(CancelledError(runtime_.StopReason() + ", and the ring still waited " +
                                   std::to_string(kStopGraceMs) +
                                   " ms later (a peer that does not answer)"));
  }

  ProcessRuntime& runtime_;
  const std::shared_ptr<FailureBus> failures_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;      // guarded by mu_
  bool disarmed_ = false;  // guarded by mu_
  std::thread watcher_;    // last: started once the rest is initialised
};

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
                          const OptimizerOptions& optimizer, const nlohmann::json& model_state) {
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

// Where a job that lost state can resume from: "the last checkpoint is step 20 in DIR (resume
// with --resume)", or that there is none.
std::string LastCheckpointSaying(const std::string& dir) {
  if (dir.empty()) return "no checkpoints were written (--checkpoint-dir): the job starts over";
  StatusOr<int64_t> step = LatestCheckpointStep(dir);
  if (!step.ok()) return "no checkpoint in " + dir + " yet: the job starts over";
  return "the last checkpoint is step " + std::to_string(*step) + " in " + dir +
         " (resume with --resume)";
}

// Trains in `flags.mode`: alone (local, client may be null) or as worker client->rank() of
// the fleet. Sets *every_rank_stops (if not null) when the ranks of a ring mode or of ps-sync
// agreed to stop.
Status RunTraining(ProcessRuntime& runtime, const WorkerFlags& worker_flags,
                   RendezvousClient* client, const PeerWiring& wiring,
                   bool* every_rank_stops = nullptr) {
  const TrainingFlags& flags = worker_flags.training;
  const bool local = worker_flags.mode == "local";
  const int rank = local ? 0 : client->rank();
  const int world = local ? 1 : client->view().num_workers;
  CudaBackendOptions cuda;
  cuda.allow_tf32 = runtime.config().cuda_tf32;
  ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend,
                   MakeBackend(flags.device, runtime.config().local_rank, cuda));
  ASSIGN_OR_RETURN(Datasets data, MakeDatasets(flags));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(flags, *data.train, backend.get()));
  TrainerOptions trainer = MakeTrainerOptions(flags, rank, world);
  if (trainer.on_nonfinite == NonFinitePolicy::kSkip && worker_flags.mode.rfind("ps-", 0) == 0 &&
      !model->embedding_tables().empty()) {
    // Their rows go to the servers apart from the dense chunks, before the dense check.
    return InvalidArgumentError(
        "--on-nonfinite skip cannot drop a step of a model with embedding tables in --mode " +
        worker_flags.mode + "; use error, the default");
  }
  trainer.metrics = &runtime.metrics();
  trainer.should_stop = [&runtime] { return runtime.StopRequested(); };
  ASSIGN_OR_RETURN(OptimizerOptions optimizer, MakeOptimizerOptions(flags));
  ASSIGN_OR_RETURN(LrScheduleOptions schedule,
                   MakeLrSchedule(flags, TotalSteps(trainer, data.train->size())));
  std::unique_ptr<Collectives> collectives;  // outlives the engine (declared first)
  std::unique_ptr<RingStopGrace> stop_grace;  // ring modes
  std::unique_ptr<TrainingEngine> engine;
  // Goes before the engine: the fleet client stops telling it about lost and joined servers.
  struct ForgetPeerLoss {
    RendezvousClient* client = nullptr;
    ~ForgetPeerLoss() {
      if (client == nullptr) return;
      client->SetPeerLossHandler(nullptr);
      client->SetFleetChangeHandler(nullptr);
    }
  } forget_peer_loss;
  if (local) {
    ASSIGN_OR_RETURN(engine, LocalEngine::Create(optimizer, schedule));
  } else if (worker_flags.mode == "allreduce" || worker_flags.mode == "zero1" ||
             worker_flags.mode == "zero2" || worker_flags.mode == "zero3") {
    // A stop while the ring is set up ends its waits after the grace too.
    stop_grace = std::make_unique<RingStopGrace>(runtime, wiring.failures);
    ASSIGN_OR_RETURN(collectives, MakeRing(runtime, worker_flags, *client, wiring));
    // With a checkpoint on stop, a step slower than the grace must not cost the checkpoint:
    // a hung peer is then left to the heartbeat (--heartbeat-timeout-ms).
    if (trainer.checkpoint_on_stop && !trainer.checkpoint_dir.empty()) stop_grace.reset();
    trainer.on_stop_agreed = [grace = stop_grace.get(), every_rank_stops] {
      if (grace != nullptr) grace->Disarm();
      if (every_rank_stops != nullptr) *every_rank_stops = true;
    };
    if (worker_flags.mode == "zero2" || worker_flags.mode == "zero3") {
      ZeroEngineOptions options;
      options.stage = worker_flags.mode == "zero2" ? 2 : 3;
      options.optimizer = optimizer;
      options.schedule = schedule;
      options.prefetch = !worker_flags.no_overlap;
      // A wait covers one block's collectives, each bounded by the request timeout.
      options.wait_timeout_ms = 4 * runtime.config().request_timeout_ms;
      ASSIGN_OR_RETURN(engine, ZeroEngine::Create(options, collectives.get(), &runtime.metrics()));
    } else {
      AllReduceEngineOptions options;
      options.zero_stage = worker_flags.mode == "zero1" ? 1 : 0;
      options.optimizer = optimizer;
      options.schedule = schedule;
      options.bucket_bytes = static_cast<uint64_t>(worker_flags.bucket_mb * (1 << 20));
      options.overlap = !worker_flags.no_overlap;
      ASSIGN_OR_RETURN(engine, AllReduceEngine::Create(options, collectives.get(),
                                                       &runtime.metrics()));
    }
  } else {
    PsEngineOptions options;
    ASSIGN_OR_RETURN(options.consistency, ParsePsMode(worker_flags.mode));
    options.staleness = worker_flags.staleness;
    options.chunk_elements = worker_flags.ps_chunk_elements;
    options.shared_memory = worker_flags.ps_shared_memory;
    options.optimizer = optimizer;
    options.schedule = schedule;
    options.request_timeout_ms = runtime.config().request_timeout_ms;
    options.request_resend_ms = worker_flags.ps_resend_ms;
    options.stop_requested = [&runtime] { return runtime.StopRequested(); };
    // As in the ring modes: the steps up to the agreed stop and the checkpoint must not be
    // cut short by the grace.
    options.stop_grace = !(trainer.checkpoint_on_stop && !trainer.checkpoint_dir.empty());
    if (options.consistency == PsConsistency::kSync) {
      // The servers told every worker alike (PsEngine::AgreeToStop): a plain goodbye, as the
      // ring modes say it, for a relayed stop would cut rank 0's checkpoint short.
      trainer.on_stop_agreed = [every_rank_stops] {
        if (every_rank_stops != nullptr) *every_rank_stops = true;
      };
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PsEngine> ps,
                     PsEngine::Create(options, &runtime.endpoint(), client->view(), rank,
                                      &runtime.metrics()));
    // A server's death is survived while every key range has a live replica; else the
    // failure names the lost range and where the job can resume from.
    client->SetPeerLossHandler(
        [ps = ps.get(), dir = trainer.checkpoint_dir](const FailureNotice& notice) -> Status {
          Status survived = ps->PeerLost(notice);
          if (survived.ok() || survived.message().empty()) return survived;
          return Status(survived.code(), survived.message() + "; " + LastCheckpointSaying(dir));
        });
    // A server that joined in a failed one's place gets its ranges back (ps-sync).
    client->SetFleetChangeHandler([ps = ps.get()](const FleetView& view) { ps->FleetChanged(view); });
    forget_peer_loss.client = client;
    engine = std::move(ps);
  }
  TLOG(INFO) << "training " << model->name() << " (" << model->layout().total_size()
             << " dense parameters, " << model->embedding_tables().size()
             << " embedding tables) on " << data.description << " with " << optimizer.ToString()
             << ", lr schedule " << schedule.ToString() << ", on " << backend->name() << ", mode "
             << worker_flags.mode << ", worker " << rank << " of " << world;
  std::vector<float> params;
  ASSIGN_OR_RETURN(TrainingSummary summary,
                   Train(trainer, *data.train, data.eval.get(), model.get(), backend.get(),
                         engine.get(), &params));
  // Rank 0 writes the parameters (in ps-sync and allreduce every rank has the same).
  if (!flags.save_params.empty() && rank == 0) {
    RETURN_IF_ERROR(SaveParams(flags.save_params, model->layout(), params));
  }
  TrainingFlags reported = flags;
  if (rank != 0) reported.save_params.clear();  // only rank 0 wrote them
  nlohmann::json model_state;  // null: this mode's engine does not report it
  if (worker_flags.mode == "allreduce" || worker_flags.mode.rfind("zero", 0) == 0) {
    ASSIGN_OR_RETURN(model_state, ModelStateBytes(runtime.metrics()));
  }
  std::printf("%s\n", FormatSummary(summary, reported, worker_flags.mode, rank, world, *model,
                                    *backend, data.description, optimizer, model_state)
                          .c_str());
  std::fflush(stdout);
  return OkStatus();
}

// A fleet member's work after it joined: the smoke job, a benchmark or training. Sets
// *every_rank_stops as RunTraining does.
Status RunMember(ProcessRuntime& runtime, const WorkerFlags& flags, RendezvousClient& client,
                 const PeerWiring& wiring, bool* every_rank_stops) {
  if (flags.mode == "smoke") {
    return RunSmokeJob(runtime, client, wiring.mailbox, wiring.failures, flags.smoke);
  }
  // The whole fleet starts together (servers wait for this barrier too).
  RETURN_IF_ERROR(client.Barrier("start", std::nullopt, runtime.config().rendezvous_timeout_ms));
  const auto print_line = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  if (flags.mode == "bench-allreduce") {
    std::string channel;
    ASSIGN_OR_RETURN(std::unique_ptr<RingCollectives> ring,
                     MakeRing(runtime, flags, client, wiring, &channel));
    // For tessera-bench, which runs the workers at --log-level warning.
    if (client.rank() == 0) {
      print_line(nlohmann::json({{"bench", "ring_channel"}, {"channel", channel}}).dump());
    }
    return RunAllReduceBench(*ring, flags.bench, print_line);
  }
  if (flags.mode == "bench-ps") {
    PsBenchOptions bench;
    bench.flags = flags.bench;
    bench.chunk_elements = flags.ps_chunk_elements;
    bench.shared_memory = flags.ps_shared_memory;
    ASSIGN_OR_RETURN(bench.consistency, ParsePsMode(flags.bench_ps_mode));
    bench.request_timeout_ms = runtime.config().request_timeout_ms;
    return RunPsBench(&runtime.endpoint(), client, &runtime.metrics(), bench, print_line);
  }
  return RunTraining(runtime, flags, &client, wiring, every_rank_stops);
}

// Joins the fleet (or trains alone), runs the mode, and leaves saying how it ended.
Status RunMemberOfFleet(ProcessRuntime& runtime, const WorkerFlags& flags);

Status RunWorker(ProcessRuntime& runtime, const WorkerFlags& flags) {
  // In a Slurm step given no coordinator, rank 0 hosts the rendezvous (before anyone joins).
  std::unique_ptr<HostedCoordinator> hosted;
  if (runtime.config().slurm_rendezvous) {
    const bool needs_servers =
        flags.mode.rfind("ps-", 0) == 0 || flags.mode == "smoke" || flags.mode == "bench-ps";
    if (needs_servers) {
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
  Status outcome = RunMemberOfFleet(runtime, flags);
  if (hosted == nullptr) return outcome;
  // The others must not lose their coordinator before they are done.
  Status rendezvous = hosted->Finish([&runtime] { return runtime.StopRequested(); });
  if (outcome.ok() && !rendezvous.ok()) return rendezvous;
  return outcome;
}

Status RunMemberOfFleet(ProcessRuntime& runtime, const WorkerFlags& flags) {
  if (runtime.config().coordinator.empty()) {
    if (flags.mode != "local") {
      return InvalidArgumentError("--mode " + flags.mode + " needs --coordinator (or MASTER_ADDR "
                                  "and MASTER_PORT); only --mode local runs standalone");
    }
    runtime.AnnounceReady(0);
    return RunTraining(runtime, flags, nullptr, PeerWiring());
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
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                   RendezvousClient::Join(&endpoint, options, &runtime.metrics()));
  // A failed peer (or a lost coordinator) wakes a collective waiting for frames with the root
  // cause; pending calls and barriers are failed by the client itself.
  client->SetFailureCallback(
      [failures = wiring.failures](const Status& status) { failures->Fail(status); });
  SetLogIdentity("worker", client->rank());
  runtime.AnnounceReady(client->rank());
  bool every_rank_stops = false;
  Status outcome = RunMember(runtime, flags, *client, wiring, &every_rank_stops);
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
