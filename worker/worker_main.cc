// tessera-worker: a training process.
//
// Modes (--mode):
//   local   single-process training: this worker trains the model alone (the reference every
//           distributed mode is compared against). Runs standalone without --coordinator, or
//           as a fleet member (e.g. under tessera-launch --workers 1 --mode local).
//   smoke   the foundation smoke job (smoke_job.h): barrier, probe push/pull through the
//           servers, verified ring all-reduces among the workers, exit.
// Any error ends the process with that error (exit 1); it does not say goodbye, so the
// coordinator declares it failed and tells the rest of the fleet, which then fail naming it
// instead of waiting for it.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/deadline.h"
#include "common/logging.h"
#include "common/process_runtime.h"
#include "common/rendezvous_client.h"
#include "common/rpc_endpoint.h"
#include "common/status.h"
#include "worker/collective_mailbox.h"
#include "worker/local_engine.h"
#include "worker/params_file.h"
#include "worker/smoke_job.h"
#include "worker/trainer.h"
#include "worker/training_setup.h"

namespace tessera::worker {
namespace {

struct WorkerFlags {
  std::string mode = "local";
  SmokeFlags smoke;
  TrainingFlags training;
};

void AddWorkerFlags(CLI::App* app, WorkerFlags* flags) {
  app->add_option("--mode", flags->mode,
                  "local: train alone (no --coordinator needed); smoke: the fleet smoke job "
                  "(push/pull through the servers, verified all-reduces, exit)")
      ->check(CLI::Validator(
          [](std::string& mode) -> std::string {
            if (mode == "local" || mode == "smoke") return "";
            return "mode " + mode + " is not available in this version; available: local, smoke";
          },
          "MODE", "mode"))
      ->capture_default_str();
  AddTrainingFlags(app, &flags->training);
  AddSmokeFlags(app, &flags->smoke);
}

// The summary as one JSON object (--json) or one human line.
std::string FormatSummary(const TrainingSummary& s, const TrainingFlags& flags,
                          const std::string& mode, const Model& model,
                          const ComputeBackend& backend, const std::string& dataset,
                          const OptimizerOptions& optimizer) {
  if (flags.json) {
    nlohmann::json j = {
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
    };
    if (!flags.save_params.empty()) j["params_path"] = flags.save_params;
    return j.dump();
  }
  std::ostringstream line;
  line << "trained " << model.name() << " (" << model.layout().total_size() << " parameters) on "
       << dataset << " with " << optimizer.ToString() << " on " << backend.name() << ": "
       << s.steps << " steps, " << s.samples << " samples in " << s.seconds << " s ("
       << static_cast<int64_t>(s.samples_per_second) << " samples/s); final loss " << s.final_loss
       << ", eval loss " << s.eval_loss << ", eval accuracy " << s.eval_accuracy;
  if (!flags.save_params.empty()) line << "; parameters in " << flags.save_params;
  return line.str();
}

Status RunLocalTraining(ProcessRuntime& runtime, const TrainingFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend,
                   MakeBackend(flags.device, runtime.config().local_rank));
  ASSIGN_OR_RETURN(Datasets data, MakeDatasets(flags));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(flags, *data.train, backend.get()));
  TrainerOptions trainer = MakeTrainerOptions(flags, /*rank=*/0, /*world_size=*/1);
  ASSIGN_OR_RETURN(OptimizerOptions optimizer, MakeOptimizerOptions(flags));
  ASSIGN_OR_RETURN(LrScheduleOptions schedule,
                   MakeLrSchedule(flags, TotalSteps(trainer, data.train->size())));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Create(optimizer, schedule));
  TLOG(INFO) << "training " << model->name() << " (" << model->layout().total_size()
             << " dense parameters, " << model->embedding_tables().size()
             << " embedding tables) on " << data.description << " with " << optimizer.ToString()
             << ", lr schedule " << schedule.ToString() << ", on " << backend->name();
  std::vector<float> params;
  ASSIGN_OR_RETURN(TrainingSummary summary,
                   Train(trainer, *data.train, data.eval.get(), model.get(), backend.get(),
                         engine.get(), &params));
  if (!flags.save_params.empty()) {
    RETURN_IF_ERROR(SaveParams(flags.save_params, model->layout(), params));
  }
  std::printf("%s\n", FormatSummary(summary, flags, "local", *model, *backend, data.description,
                                    optimizer)
                          .c_str());
  std::fflush(stdout);
  return OkStatus();
}

Status RunWorker(ProcessRuntime& runtime, const WorkerFlags& flags) {
  if (runtime.config().coordinator.empty()) {
    if (flags.mode != "local") {
      return InvalidArgumentError("--mode " + flags.mode + " needs --coordinator (or MASTER_ADDR "
                                  "and MASTER_PORT); only --mode local runs standalone");
    }
    runtime.AnnounceReady(0);
    return RunLocalTraining(runtime, flags.training);
  }
  RpcEndpoint& endpoint = runtime.endpoint();
  // Before joining: peers may send chunks as soon as the fleet view tells them our address,
  // and a chunk without a handler would be dropped.
  auto mailbox = std::make_shared<CollectiveMailbox>();
  endpoint.SetHandler(proto::Body::CollectiveChunk, CollectiveMailbox::Handler(mailbox));

  RendezvousOptions options = RendezvousOptionsFrom(runtime.config());
  options.metrics_address = runtime.metrics_url();
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                   RendezvousClient::Join(&endpoint, options, &runtime.metrics()));
  // A failed peer (or a lost coordinator) wakes a collective waiting for chunks with the root
  // cause; pending calls and barriers are failed by the client itself.
  client->SetFailureCallback([mailbox](const Status& status) { mailbox->Fail(status); });
  SetLogIdentity("worker", client->rank());
  runtime.AnnounceReady(client->rank());

  if (flags.mode == "smoke") {
    RETURN_IF_ERROR(RunSmokeJob(runtime, *client, *mailbox, flags.smoke));
  } else {
    // The whole fleet starts together (servers wait for this barrier too).
    RETURN_IF_ERROR(client->Barrier("start", std::nullopt,
                                    runtime.config().rendezvous_timeout_ms));
    RETURN_IF_ERROR(RunLocalTraining(runtime, flags.training));
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
  CLI::App app(
      "tessera-worker: a training process. --mode local trains alone (standalone or in a "
      "fleet); the other modes join the fleet at --coordinator.");
  tessera::worker::WorkerFlags flags;
  tessera::worker::AddWorkerFlags(&app, &flags);
  return tessera::RunProcess(tessera::Role::kWorker, argc, argv, &app,
                             [&flags](tessera::ProcessRuntime& runtime) {
                               return tessera::worker::RunWorker(runtime, flags);
                             });
}
