#include "worker/jobs/smoke_job.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>


#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/payload.h"
#include "common/messages/fleet_view.h"
#include "common/training/ps_job.h"
#include "common/transport/rpc_endpoint.h"
#include "worker/collectives/ring_channel_setup.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {
namespace {

// Tag of the first all-reduce round; round r uses kFirstAllReduceTag + r - 1.
constexpr uint64_t kFirstAllReduceTag = 1;
// Room left in a message for its header beside the tensor bytes.
constexpr uint64_t kHeaderAllowance = 64 * 1024;
// The probe job's "model", for the servers' checkpoint checks (it is never checkpointed).
constexpr uint64_t kProbeLayoutFingerprint = 0x736d6f6b65;  // "smoke"


std::string Millis(SteadyClock::duration elapsed) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2)
      << std::chrono::duration<double, std::milli>(elapsed).count() << " ms";
  return out.str();
}

std::string ProbeName(int rank) { return "worker" + std::to_string(rank) + ".probe"; }
float ProbeValue(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<double>(i)); }

float ReadFloat(const uint8_t* bytes, size_t index) {
  float value;  // received frames need not be aligned for float
  std::memcpy(&value, bytes + index * sizeof(float), sizeof(float));
  return value;
}

// The smoke job of one worker: its phases in the order Run() runs them. Used by one thread.
//
// The probes travel on the parameter-server protocol: worker rank 0 initialises the servers
// with a ps-async job of one chunk of --tensor-elements floats per worker, all zero, trained by
// SGD with learning rate 1; each worker pushes the negated values of its probe as the gradient
// of its own chunk, so the server's chunk becomes the probe, exactly, and the reply returns it;
// after a barrier each worker pulls every other worker's chunk and checks each value.
class SmokeJob {
 public:
  SmokeJob(ProcessRuntime& runtime, RendezvousClient& client,
           std::shared_ptr<CollectiveMailbox> mailbox, std::shared_ptr<FailureBus> failures,
           const SmokeFlags& flags)
      : runtime_(runtime),
        endpoint_(runtime.endpoint()),
        client_(client),
        mailbox_(std::move(mailbox)),
        failures_(std::move(failures)),
        view_(client.view()),
        rank_(client.rank()),
        elements_(static_cast<size_t>(flags.tensor_elements)),
        rounds_(flags.rounds),
        round_interval_ms_(flags.round_interval_ms),
        request_timeout_ms_(runtime.config().request_timeout_ms) {}

  Status Run() {
    RETURN_IF_ERROR(Barrier("start", std::nullopt, runtime_.config().rendezvous_timeout_ms));
    if (view_.OfRole(Role::kServer).empty()) {
      TLOG(INFO) << "no servers in the fleet: skipping the push/pull phase";
    } else if (elements_ == 0) {
      TLOG(INFO) << "--tensor-elements=0: no probes to push and pull";
    } else {
      RETURN_IF_ERROR(CheckMessageSize());
      ASSIGN_OR_RETURN(chunks_, PlanDenseChunks(elements_ * view_.num_workers, elements_,
                                                view_.num_servers, view_.key_space));
      if (rank_ == 0) RETURN_IF_ERROR(InitialiseServers());
      RETURN_IF_ERROR(PushProbe());
      RETURN_IF_ERROR(Barrier("pushed", Role::kWorker, request_timeout_ms_));
      RETURN_IF_ERROR(PullProbes());
    }
    for (int64_t round = 1; round <= rounds_; ++round) {
      RETURN_IF_ERROR(AllReduce(round));
      if (round < rounds_ && round_interval_ms_ > 0 &&
          runtime_.WaitForStop(Deadline::AfterMillis(round_interval_ms_))) {
        return CancelledError("stopped after all-reduce round " + std::to_string(round));
      }
    }
    return Barrier("done", Role::kWorker, request_timeout_ms_);
  }

 private:
  Status Barrier(const std::string& name, std::optional<Role> scope, int64_t timeout_ms) {
    if (runtime_.StopRequested()) return CancelledError("stopped before barrier '" + name + "'");
    auto started = SteadyClock::now();
    RETURN_IF_ERROR(client_.Barrier(name, scope, timeout_ms));
    TLOG(INFO) << "barrier '" << name << "' passed in " << Millis(SteadyClock::now() - started);
    return OkStatus();
  }

  Status CheckMessageSize() const {
    uint64_t bytes = elements_ * sizeof(float);
    if (bytes + kHeaderAllowance > runtime_.config().max_message_bytes) {
      return InvalidArgumentError(
          "--tensor-elements=" + std::to_string(elements_) + " makes " + std::to_string(bytes) +
          "-byte tensors, too large for --max-message-bytes=" +
          std::to_string(runtime_.config().max_message_bytes));
    }
    return OkStatus();
  }

  const std::string& ServerAddress(int server) const {
    return view_.Find(Role::kServer, server)->address;
  }

  // Chunk `worker` as a tensor, with `values` or none.
  TensorData Chunk(int worker, std::vector<float> values) const {
    const DenseChunk& chunk = chunks_[static_cast<size_t>(worker)];
    if (values.empty()) {
      return TensorData{ProbeName(worker), chunk.key, DataType::kFloat32,
                        {static_cast<int64_t>(chunk.size)}, Payload()};
    }
    return TensorData::Floats(ProbeName(worker), chunk.key, std::move(values));
  }

  // Rank 0: every server gets the probe job and zeros for the chunks it owns.
  Status InitialiseServers() {
    PsJobConfig config;
    config.consistency = PsConsistency::kAsync;
    config.num_workers = view_.num_workers;
    config.optimizer.kind = OptimizerKind::kSgd;
    config.optimizer.lr = 1.0f;
    config.dense_elements = elements_ * view_.num_workers;
    config.layout_fingerprint = kProbeLayoutFingerprint;
    config.chunk_elements = elements_;
    RETURN_IF_ERROR(ValidatePsJobConfig(config));
    const std::string json = EncodePsJobConfig(config);
    std::vector<std::shared_future<StatusOr<Envelope>>> replies;
    std::vector<std::string> what;
    for (int s = 0; s < view_.num_servers; ++s) {
      PsInitRequest init{json, {}, PsJobToken(view_)};
      for (const DenseChunk& chunk : chunks_) {
        if (chunk.server != s) continue;
        init.tensors.push_back(Chunk(static_cast<int>(chunk.index),
                                     std::vector<float>(chunk.size, 0.0f)));
      }
      what.push_back("init of server " + std::to_string(s) + " with the probes");
      replies.push_back(endpoint_.CallAsync(ServerAddress(s), std::move(init), 0,
                                            Deadline::AfterMillis(request_timeout_ms_),
                                            what.back()));
    }
    for (size_t s = 0; s < replies.size(); ++s) {
      StatusOr<Envelope> reply = replies[s].get();
      if (!reply.ok()) return reply.status();
      RETURN_IF_ERROR(TakeBody<Ack>(std::move(reply).value(), what[s]).status());
    }
    return OkStatus();
  }

  Status PushProbe() {
    if (runtime_.StopRequested()) return CancelledError("stopped before the push");
    const DenseChunk& chunk = chunks_[static_cast<size_t>(rank_)];
    std::vector<float> gradient(elements_);
    for (size_t i = 0; i < elements_; ++i) gradient[i] = -ProbeValue(rank_, i);
    PsPushPullRequest push{{}, true, PsJobToken(view_), {}};
    push.tensors.push_back(Chunk(rank_, std::move(gradient)));
    const std::string what = "push of " + ProbeName(rank_) + " to server " +
                             std::to_string(chunk.server);
    auto started = SteadyClock::now();
    ASSIGN_OR_RETURN(Envelope reply,
                     endpoint_.Call(ServerAddress(chunk.server), std::move(push), /*step=*/1,
                                    Deadline::AfterMillis(request_timeout_ms_), what));
    // The reply holds the chunk after the update: the probe itself.
    ASSIGN_OR_RETURN(uint64_t bytes, CheckProbe(rank_, what, std::move(reply)));
    TLOG(INFO) << "pushed " << bytes << " bytes to server " << chunk.server << " in "
               << Millis(SteadyClock::now() - started);
    return OkStatus();
  }

  Status PullProbes() {
    if (runtime_.StopRequested()) return CancelledError("stopped before the pulls");
    struct Pull {
      int worker;
      std::string what;
      std::shared_future<StatusOr<Envelope>> reply;
    };
    std::vector<Pull> pulls;
    auto started = SteadyClock::now();
    // All requests first, then the answers: the servers work on them concurrently.
    for (int worker = 0; worker < view_.num_workers; ++worker) {
      if (worker == rank_) continue;
      const DenseChunk& chunk = chunks_[static_cast<size_t>(worker)];
      PsPushPullRequest pull{{}, false, PsJobToken(view_), {}};
      pull.tensors.push_back(Chunk(worker, {}));
      Pull p{worker, "pull of " + ProbeName(worker) + " from server " +
                         std::to_string(chunk.server), {}};
      p.reply = endpoint_.CallAsync(ServerAddress(chunk.server), std::move(pull), /*step=*/1,
                                    Deadline::AfterMillis(request_timeout_ms_), p.what);
      pulls.push_back(std::move(p));
    }
    uint64_t bytes = 0;
    for (Pull& pull : pulls) {
      StatusOr<Envelope> reply = pull.reply.get();
      if (!reply.ok()) return reply.status();
      ASSIGN_OR_RETURN(uint64_t checked, CheckProbe(pull.worker, pull.what, std::move(reply).value()));
      bytes += checked;
    }
    if (pulls.empty()) {
      TLOG(INFO) << "no other worker's probe to pull";
      return OkStatus();
    }
    TLOG(INFO) << "pulled " << pulls.size() << " probe tensors (" << bytes << " bytes) in "
               << Millis(SteadyClock::now() - started) << "; every value is correct";
    return OkStatus();
  }

  // Checks a reply holding worker `worker`'s probe; returns its byte count.
  StatusOr<uint64_t> CheckProbe(int worker, const std::string& what, Envelope reply) const {
    ASSIGN_OR_RETURN(PsPushPullReply values, TakeBody<PsPushPullReply>(std::move(reply), what));
    if (values.tensors.size() != 1) {
      return DataLossError(what + ": the reply holds " + std::to_string(values.tensors.size()) +
                           " tensors, expected 1");
    }
    const TensorData& tensor = values.tensors[0];
    const uint64_t expected_bytes = elements_ * sizeof(float);
    if (tensor.key != chunks_[static_cast<size_t>(worker)].key ||
        tensor.dtype != DataType::kFloat32 || tensor.bytes.size() != expected_bytes) {
      return DataLossError(what + ": the reply holds key " + std::to_string(tensor.key) + " with " +
                           std::to_string(tensor.bytes.size()) + " bytes of " +
                           std::string(DataTypeName(tensor.dtype)) + ", expected " +
                           std::to_string(expected_bytes) + " bytes of float32");
    }
    for (size_t i = 0; i < elements_; ++i) {
      float got = ReadFloat(tensor.bytes.data(), i);
      if (got != ProbeValue(worker, i)) {
        return DataLossError(what + ": element " + std::to_string(i) + " is " +
                             std::to_string(got) + ", expected " +
                             std::to_string(ProbeValue(worker, i)) +
                             " (the first wrong element)");
      }
    }
    return expected_bytes;
  }

  // The workers' ring through the transport, built on first use from the fleet view.
  StatusOr<RingCollectives*> Ring() {
    if (ring_ == nullptr) {
      RingChannelSetupOptions setup;
      setup.kind = "zmq";
      setup.rank = rank_;
      ASSIGN_OR_RETURN(setup.peer_addresses, RingPeerAddresses(view_));
      setup.world_size = static_cast<int>(setup.peer_addresses.size());
      setup.transport = &endpoint_.transport();
      setup.mailbox = mailbox_;
      setup.failures = failures_;
      ASSIGN_OR_RETURN(ConnectedRingChannel channel, ConnectRingChannel(setup));
      RingCollectivesOptions options;
      options.rank = rank_;
      options.world_size = setup.world_size;
      options.channel = std::move(channel.channel);
      options.ring_order = std::move(channel.order);
      options.timeout_ms = request_timeout_ms_;
      ASSIGN_OR_RETURN(ring_, RingCollectives::Create(std::move(options)));
    }
    return ring_.get();
  }

  // Round r of the all-reduce; each round has its own tag, so chunks of consecutive rounds
  // cannot be mistaken for each other.
  Status AllReduce(int64_t round) {
    if (runtime_.StopRequested()) return CancelledError("stopped before the all-reduce");
    const uint64_t tag = kFirstAllReduceTag + static_cast<uint64_t>(round) - 1;
    ASSIGN_OR_RETURN(RingCollectives * ring, Ring());
    const int world = ring->world_size();
    std::vector<float> buffer(elements_);
    for (size_t i = 0; i < elements_; ++i) buffer[i] = static_cast<float>(rank_ + 1 + static_cast<double>(i));
    auto started = SteadyClock::now();
    RETURN_IF_ERROR(ring->AllReduce(buffer.data(), buffer.size(), DataType::kFloat32,
                                    ReduceOp::kSum, "probe", tag));
    auto elapsed = SteadyClock::now() - started;
    // Closed form: sum over ranks r of (r + 1 + i) = W(W + 1)/2 + W i. Every input and every
    // partial sum is rounded to float at most once, so the result is within 2W rounding steps
    // (W * 2^-23 relative) of it; exact while the values stay below 2^24.
    for (size_t i = 0; i < elements_; ++i) {
      double expected = world * (world + 1) / 2.0 + static_cast<double>(world) * static_cast<double>(i);
      double tolerance = expected * world * std::ldexp(1.0, -23);
      if (std::fabs(buffer[i] - expected) > tolerance) {
        return DataLossError("allreduce tag=" + std::to_string(tag) + " rank=" +
                             std::to_string(rank_) + ": element " + std::to_string(i) + " is " +
                             std::to_string(buffer[i]) + ", expected " +
                             std::to_string(expected) + " (the first wrong element)");
      }
    }
    if (round == 1 || round % 10 == 0 || round == rounds_) {
      TLOG(INFO) << "all-reduce round " << round << " of " << rounds_ << ": "
                 << elements_ * sizeof(float) << " bytes among " << world << " workers in "
                 << Millis(elapsed) << "; every value is correct";
    }
    return OkStatus();
  }

  ProcessRuntime& runtime_;
  RpcEndpoint& endpoint_;
  RendezvousClient& client_;
  const std::shared_ptr<CollectiveMailbox> mailbox_;
  const std::shared_ptr<FailureBus> failures_;
  const FleetView& view_;
  const int rank_;
  const size_t elements_;
  const int64_t rounds_;
  const int64_t round_interval_ms_;
  const int64_t request_timeout_ms_;
  std::vector<DenseChunk> chunks_;  // chunk w is worker w's probe
  std::unique_ptr<RingCollectives> ring_;  // see Ring()
};

}  // namespace

Status RunSmokeJob(ProcessRuntime& runtime, RendezvousClient& client,
                   std::shared_ptr<CollectiveMailbox> mailbox,
                   std::shared_ptr<FailureBus> failures, const SmokeFlags& flags) {
  SmokeJob job(runtime, client, std::move(mailbox), std::move(failures), flags);
  return job.Run();
}

}  // namespace tessera::worker
