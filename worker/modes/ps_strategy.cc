#include "worker/modes/ps_strategy.h"

#include <string>
#include <utility>

#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"
#include "worker/engines/ps_engine.h"

namespace tessera::worker {
namespace {

// Where a job that lost state can resume from: "the last checkpoint is step 20 in DIR (resume
// with --resume)", or that there is none.
std::string LastCheckpointSaying(const std::string& dir) {
  if (dir.empty()) return "no checkpoints were written (--checkpoint-dir): the job starts over";
  StatusOr<int64_t> step = LatestCheckpointStep(dir);
  if (!step.ok()) return "no checkpoint in " + dir + " yet: the job starts over";
  return "the last checkpoint is step " + std::to_string(*step) + " in " + dir +
         " (resume with --resume)";
}

// Thread-safety: the training thread only; the handlers it installs run on the fleet
// client's thread and end when it is destroyed.
class PsStrategy final : public TrainingStrategy {
 public:
  PsStrategy(std::unique_ptr<PsEngine> engine, RendezvousClient* client, bool agrees_to_stop,
             bool* every_rank_stops)
      : engine_(std::move(engine)), client_(client), agrees_to_stop_(agrees_to_stop),
        every_rank_stops_(every_rank_stops) {}
  // Before the engine goes: the fleet client stops telling it about lost and joined servers.
  ~PsStrategy() override {
    client_->SetPeerLossHandler(nullptr);
    client_->SetFleetChangeHandler(nullptr);
  }

  TrainingEngine* engine() override { return engine_.get(); }
  void OnStopAgreed() override {
    if (agrees_to_stop_ && every_rank_stops_ != nullptr) *every_rank_stops_ = true;
  }

 private:
  const std::unique_ptr<PsEngine> engine_;
  RendezvousClient* const client_;
  const bool agrees_to_stop_;
  bool* const every_rank_stops_;
};

StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyContext& context,
                                                         PsConsistency consistency) {
  ProcessRuntime& runtime = *context.mode.runtime;
  const ModeFlags& flags = *context.mode.flags;
  RendezvousClient* client = context.mode.client;
  PsEngineOptions options;
  options.consistency = consistency;
  options.staleness = flags.staleness;
  options.chunk_elements = flags.ps_chunk_elements;
  options.shared_memory = flags.ps_shared_memory;
  options.optimizer = context.optimizer;
  options.schedule = context.schedule;
  options.request_timeout_ms = runtime.config().request_timeout_ms;
  options.request_resend_ms = flags.ps_resend_ms;
  options.stop_requested = [&runtime] { return runtime.StopRequested(); };
  // As in the ring modes: the steps up to the agreed stop and the checkpoint must not be
  // cut short by the grace.
  options.stop_grace = !context.checkpoint_on_stop;
  options.restores_checkpoints_of = context.restores_checkpoints_of;
  ASSIGN_OR_RETURN(std::unique_ptr<PsEngine> ps,
                   PsEngine::Create(options, &runtime.endpoint(), client->view(), context.rank,
                                    &runtime.metrics()));
  // A server's death is survived while every key range has a live replica; else the
  // failure names the lost range and where the job can resume from.
  client->SetPeerLossHandler(
      [ps = ps.get(), dir = context.checkpoint_dir](const FailureNotice& notice) -> Status {
        Status survived = ps->PeerLost(notice);
        if (survived.ok() || survived.message().empty()) return survived;
        return Status(survived.code(), survived.message() + "; " + LastCheckpointSaying(dir));
      });
  // A server that joined in a failed one's place gets its ranges back (ps-sync).
  client->SetFleetChangeHandler([ps = ps.get()](const FleetView& view) { ps->FleetChanged(view); });
  // In ps-sync the servers told every worker alike (PsEngine::AgreeToStop): a plain goodbye,
  // as the ring modes say it, for a relayed stop would cut rank 0's checkpoint short.
  const bool agrees_to_stop = consistency == PsConsistency::kSync;
  return std::unique_ptr<TrainingStrategy>(std::make_unique<PsStrategy>(
      std::move(ps), client, agrees_to_stop, context.every_rank_stops));
}

}  // namespace

StatusOr<std::unique_ptr<TrainingStrategy>> MakePsSyncStrategy(const StrategyContext& context) {
  return MakeStrategy(context, PsConsistency::kSync);
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakePsAsyncStrategy(const StrategyContext& context) {
  return MakeStrategy(context, PsConsistency::kAsync);
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakePsSspStrategy(const StrategyContext& context) {
  return MakeStrategy(context, PsConsistency::kSsp);
}

}  // namespace tessera::worker
