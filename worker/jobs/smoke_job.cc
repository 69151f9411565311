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

#include <CLI/CLI.hpp>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/payload.h"
#include "common/messages/fleet_view.h"
#include "common/transport/rpc_endpoint.h"
#include "common/wire/wire_codec.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {
namespace {

// Tag of the first all-reduce round; round r uses kFirstAllReduceTag + r - 1.
constexpr uint64_t kFirstAllReduceTag = 1;
constexpr int64_t kMaxTensorElements = int64_t{1} << 28;  // 1 GiB of float32
// Room left in a message for its header beside the tensor bytes.
constexpr uint64_t kHeaderAllowance = 64 * 1024;


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
class SmokeJob {
 public:
  SmokeJob(ProcessRuntime& runtime, RendezvousClient& client, CollectiveMailbox& mailbox,
           const SmokeFlags& flags)
      : runtime_(runtime),
        endpoint_(runtime.endpoint()),
        client_(client),
        mailbox_(mailbox),
        view_(client.view()),
        rank_(client.rank()),
        elements_(static_cast<size_t>(flags.tensor_elements)),
        rounds_(flags.rounds),
        round_interval_ms_(flags.round_interval_ms),
        request_timeout_ms_(runtime.config().request_timeout_ms) {}

  Status Run() {
    RETURN_IF_ERROR(Barrier("start", std::nullopt, runtime_.config().rendezvous_timeout_ms));
    if (!view_.OfRole(Role::kServer).empty()) {
      RETURN_IF_ERROR(PushProbe());
      RETURN_IF_ERROR(Barrier("pushed", Role::kWorker, request_timeout_ms_));
      RETURN_IF_ERROR(PullProbes());
    } else {
      TLOG(INFO) << "no servers in the fleet: skipping the push/pull phase";
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

  // Worker r's probe goes to server r % S, at a key inside that server's range, so every
  // server takes part when there are at least as many workers as servers.
  StatusOr<uint64_t> ProbeKey(int rank) const {
    std::vector<const MemberInfo*> servers = view_.OfRole(Role::kServer);
    const MemberInfo* server = servers[static_cast<size_t>(rank) % servers.size()];
    uint64_t offset = static_cast<uint64_t>(rank) / servers.size();
    if (server->key_end <= server->key_begin) {
      return InternalError(server->Name() + " owns no keys in the fleet view");
    }
    return std::min(server->key_begin + offset, server->key_end - 1);
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

  Status PushProbe() {
    if (runtime_.StopRequested()) return CancelledError("stopped before the push");
    RETURN_IF_ERROR(CheckMessageSize());
    const std::string name = ProbeName(rank_);
    ASSIGN_OR_RETURN(uint64_t key, ProbeKey(rank_));
    ASSIGN_OR_RETURN(const MemberInfo* server, view_.ServerOwningKey(key));
    auto values = std::make_shared<std::vector<float>>(elements_);
    for (size_t i = 0; i < elements_; ++i) (*values)[i] = ProbeValue(rank_, i);
    const size_t bytes = elements_ * sizeof(float);

    MessageBuilder builder(proto::Role::Worker, rank_);
    int32_t frame = builder.AddPayload(Payload::Borrow(values->data(), bytes, values));
    std::vector<int64_t> shape = {static_cast<int64_t>(elements_)};
    std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
        builder.fbb(), name.c_str(), key, proto::DType::Float32, &shape, frame, 0, bytes)};
    uint64_t id = endpoint_.NextRequestId();
    auto started = SteadyClock::now();
    ASSIGN_OR_RETURN(Envelope reply,
                     endpoint_.Call(server->address,
                                    builder.Finish(proto::CreatePushRequestDirect(builder.fbb(), &metas), id),
                                    id, Deadline::AfterMillis(request_timeout_ms_),
                                    "push of " + name + " to " + server->Name()));
    if (reply.header->body_type() != proto::Body::Ack) {
      return InternalError("push of " + name + ": " + server->Name() + " answered with " +
                           std::string(BodyName(reply.header->body_type())) + ", not an Ack");
    }
    TLOG(INFO) << "pushed " << bytes << " bytes to " << server->Name() << " in "
               << Millis(SteadyClock::now() - started);
    return OkStatus();
  }

  Status PullProbes() {
    if (runtime_.StopRequested()) return CancelledError("stopped before the pulls");
    struct Pull {
      int worker;
      std::string name;
      const MemberInfo* server;
      std::shared_future<StatusOr<Envelope>> reply;
    };
    std::vector<Pull> pulls;
    auto started = SteadyClock::now();
    // All requests first, then the answers: the servers work on them concurrently.
    for (const MemberInfo* worker : view_.OfRole(Role::kWorker)) {
      if (worker->rank == rank_) continue;
      Pull pull{worker->rank, ProbeName(worker->rank), nullptr, {}};
      ASSIGN_OR_RETURN(uint64_t key, ProbeKey(worker->rank));
      ASSIGN_OR_RETURN(pull.server, view_.ServerOwningKey(key));
      MessageBuilder builder(proto::Role::Worker, rank_);
      std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
          builder.fbb(), pull.name.c_str(), key, proto::DType::Float32, nullptr, -1, 0, 0)};
      uint64_t id = endpoint_.NextRequestId();
      pull.reply = endpoint_.CallAsync(
          pull.server->address,
          builder.Finish(proto::CreatePullRequestDirect(builder.fbb(), &metas), id), id,
          Deadline::AfterMillis(request_timeout_ms_),
          "pull of " + pull.name + " from " + pull.server->Name());
      pulls.push_back(std::move(pull));
    }
    uint64_t bytes = 0;
    for (const Pull& pull : pulls) {
      const StatusOr<Envelope>& reply = pull.reply.get();
      if (!reply.ok()) return reply.status();
      ASSIGN_OR_RETURN(uint64_t checked, CheckProbe(pull.worker, pull.name, *pull.server, *reply));
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

  // Checks one PullReply holding worker `worker`'s probe; returns its byte count.
  StatusOr<uint64_t> CheckProbe(int worker, const std::string& name, const MemberInfo& server,
                                const Envelope& reply) const {
    const std::string where = "pulled " + name + " from " + server.Name();
    if (reply.header->body_type() != proto::Body::PullReply) {
      return InternalError(where + ": the answer is a " +
                           std::string(BodyName(reply.header->body_type())) + ", not a PullReply");
    }
    auto* tensors = reply.header->body_as_PullReply()->tensors();
    if (tensors == nullptr || tensors->size() != 1) {
      return DataLossError(where + ": the reply holds " +
                           std::to_string(tensors == nullptr ? 0 : tensors->size()) +
                           " tensors, expected 1");
    }
    const proto::TensorMeta& meta = *tensors->Get(0);
    if (meta.name() == nullptr || meta.name()->str() != name) {
      return DataLossError(where + ": the reply holds tensor '" +
                           (meta.name() ? meta.name()->str() : std::string()) + "'");
    }
    const uint64_t expected_bytes = elements_ * sizeof(float);
    if (meta.dtype() != proto::DType::Float32 || meta.payload() < 0 ||
        meta.byte_length() != expected_bytes) {
      return DataLossError(where + ": " + std::to_string(meta.byte_length()) + " bytes of " +
                           proto::EnumNameDType(meta.dtype()) + ", expected " +
                           std::to_string(expected_bytes) + " bytes of Float32");
    }
    const uint8_t* bytes =
        reply.message.payloads[static_cast<size_t>(meta.payload())].data() + meta.offset();
    for (size_t i = 0; i < elements_; ++i) {
      float got = ReadFloat(bytes, i);
      if (got != ProbeValue(worker, i)) {
        return DataLossError(where + ": element " + std::to_string(i) + " is " +
                             std::to_string(got) + ", expected " +
                             std::to_string(ProbeValue(worker, i)) +
                             " (the first wrong element)");
      }
    }
    return expected_bytes;
  }

  // The workers' ring, built on first use from the fleet view.
  StatusOr<RingCollectives*> Ring() {
    if (ring_ == nullptr) {
      RingCollectivesOptions options;
      options.rank = rank_;
      ASSIGN_OR_RETURN(options.peer_addresses, RingPeerAddresses(view_));
      options.world_size = static_cast<int>(options.peer_addresses.size());
      options.transport = &endpoint_.transport();
      options.mailbox = &mailbox_;
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
  CollectiveMailbox& mailbox_;
  const FleetView& view_;
  const int rank_;
  const size_t elements_;
  const int64_t rounds_;
  const int64_t round_interval_ms_;
  const int64_t request_timeout_ms_;
  std::unique_ptr<RingCollectives> ring_;  // see Ring()
};

}  // namespace

void AddSmokeFlags(CLI::App* app, SmokeFlags* flags) {
  auto* group = app->add_option_group("Smoke job (--mode smoke)");
  group->add_option("--tensor-elements", flags->tensor_elements,
                    "Float32 elements of the probe tensors and of the all-reduce")
      ->check(CLI::Range(int64_t{0}, kMaxTensorElements))
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

Status RunSmokeJob(ProcessRuntime& runtime, RendezvousClient& client, CollectiveMailbox& mailbox,
                   const SmokeFlags& flags) {
  SmokeJob job(runtime, client, mailbox, flags);
  return job.Run();
}

}  // namespace tessera::worker
