#include "worker/modes/ring_strategy.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "common/base/logging.h"
#include "worker/collectives/ring_channel_setup.h"
#include "worker/engines/ps_engine.h"  // kStopGraceMs: the ring waits as long as the PS engine
#include "worker/modes/group_tags.h"

namespace tessera::worker {
namespace {

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

// Thread-safety: the training thread only.
class RingStrategy final : public TrainingStrategy {
 public:
  explicit RingStrategy(bool* every_rank_stops) : every_rank_stops_(every_rank_stops) {}
  // The engine goes first, then the grace, then the groups and the ring the engine ran on.
  ~RingStrategy() override {
    engine_.reset();
    stop_grace_.reset();
    groups_.clear();
    mesh_.reset();
    collectives_.reset();
  }

  TrainingEngine* engine() override { return engine_.get(); }
  const DeviceMesh* mesh() const override { return mesh_.get(); }
  Collectives* world() override { return collectives_.get(); }
  void OnStopAgreed() override {
    if (stop_grace_ != nullptr) stop_grace_->Disarm();
    if (every_rank_stops_ != nullptr) *every_rank_stops_ = true;
  }

  bool* const every_rank_stops_;
  std::unique_ptr<Communicator> collectives_;
  std::unique_ptr<DeviceMesh> mesh_;                  // of collectives_, when asked for
  std::vector<std::unique_ptr<Collectives>> groups_;  // made from collectives_ (or mesh_)
  std::unique_ptr<RingStopGrace> stop_grace_;
  std::unique_ptr<TrainingEngine> engine_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeWorkerWorld(const ModeContext& context) {
  ProcessRuntime& runtime = *context.runtime;
  const ModeFlags& flags = *context.flags;
  RendezvousClient& client = *context.client;
  CommunicatorOptions world;
  world.rank = client.rank();
  world.world_size = client.view().num_workers;
  ASSIGN_OR_RETURN(world.peer_addresses, RingPeerAddresses(client.view()));
  world.transport = &runtime.endpoint().transport();
  world.mailbox = context.wiring.mailbox;
  world.failures = context.wiring.failures;
  world.ring_transport = flags.ring_transport;
  world.timeout_ms = runtime.config().request_timeout_ms;
  world.setup_timeout_ms = runtime.config().rendezvous_timeout_ms;
  world.segment_bytes = static_cast<size_t>(flags.segment_kb) * 1024;
  world.links_spin_us = flags.ring_spin_us;
  world.comm_spin_us = flags.comm_spin_us;
  world.direct_read_min_bytes = static_cast<size_t>(flags.direct_read_min_bytes);
  world.one_shot_max_bytes = static_cast<size_t>(flags.one_shot_max_bytes);
  world.credentials = runtime.credentials();
  world.metrics = &runtime.metrics();
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> communicator, Communicator::Connect(world));
  TLOG(INFO) << "ring channel: " << communicator->channel_description();
  return communicator;
}

namespace {

// The world's mesh for pipeline and tensor parallelism: its Splits' tags (hsdp's are from
// 1 << 57; the engines' below 1 << 44 and from 1 << 59).
constexpr uint64_t kMeshTag = 1ull << 56;

using MeshEngineFactory = std::function<StatusOr<std::unique_ptr<TrainingEngine>>(
    Communicator* world, DeviceMesh* mesh, std::vector<std::unique_ptr<Collectives>>* groups)>;

StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyContext& context,
                                                         const MeshEngineFactory& make_engine);

}  // namespace

StatusOr<std::unique_ptr<TrainingStrategy>> MakeRingStrategy(const StrategyContext& context,
                                                            const RingEngineFactory& make_engine) {
  return MakeStrategy(
      context,
      [&make_engine](Communicator* world, DeviceMesh* mesh,
                     std::vector<std::unique_ptr<Collectives>>* groups)
          -> StatusOr<std::unique_ptr<TrainingEngine>> {
        if (mesh == nullptr) return make_engine(world);
        auto dp = std::make_unique<GroupTags>(&mesh->along(0));
        ASSIGN_OR_RETURN(std::unique_ptr<TrainingEngine> engine, make_engine(dp.get()));
        groups->push_back(std::move(dp));
        return engine;
      });
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakeGroupedRingStrategy(
    const StrategyContext& context, const GroupedEngineFactory& make_engine) {
  if (!context.mesh_dims.empty()) {
    return InvalidArgumentError("this mode makes its own groups; it takes no pipeline or "
                                "tensor-parallel mesh");
  }
  return MakeStrategy(context,
                      [&make_engine](Communicator* world, DeviceMesh*,
                                     std::vector<std::unique_ptr<Collectives>>* groups) {
                        return make_engine(world, groups);
                      });
}

namespace {

StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyContext& context,
                                                         const MeshEngineFactory& make_engine) {
  auto strategy = std::make_unique<RingStrategy>(context.every_rank_stops);
  // A stop while the ring is set up ends its waits after the grace too.
  strategy->stop_grace_ =
      std::make_unique<RingStopGrace>(*context.mode.runtime, context.mode.wiring.failures);
  ASSIGN_OR_RETURN(strategy->collectives_, MakeWorkerWorld(context.mode));
  // With a checkpoint on stop, a step slower than the grace must not cost the checkpoint:
  // a hung peer is then left to the heartbeat (--heartbeat-timeout-ms).
  if (context.checkpoint_on_stop) strategy->stop_grace_.reset();
  if (!context.mesh_dims.empty()) {
    ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(*strategy->collectives_,
                                                         context.mesh_dims,
                                                         {"dp", "pp", "tp"}, kMeshTag));
    strategy->mesh_ = std::make_unique<DeviceMesh>(std::move(mesh));
    TLOG(INFO) << "mesh dp x pp x tp = " << context.mesh_dims[0] << " x "
               << context.mesh_dims[1] << " x " << context.mesh_dims[2] << ": this rank at ("
               << strategy->mesh_->coordinate()[0] << ", " << strategy->mesh_->coordinate()[1]
               << ", " << strategy->mesh_->coordinate()[2] << "); tp ring channel: "
               << strategy->mesh_->along(2).channel_description();
  }
  ASSIGN_OR_RETURN(strategy->engine_, make_engine(strategy->collectives_.get(),
                                                  strategy->mesh_.get(), &strategy->groups_));
  return std::unique_ptr<TrainingStrategy>(std::move(strategy));
}

}  // namespace

}  // namespace tessera::worker
