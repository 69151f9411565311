#include "worker/jobs/ps_bench_job.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/role.h"
#include "common/training/parameter_layout.h"
#include "worker/engines/ps_engine.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMinIters = 5;
constexpr int64_t kMaxIters = 10000;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One size: a fresh job, warm-up, timed steps, the check, the line (see the header).
StatusOr<nlohmann::json> RunSize(RpcEndpoint* endpoint, RendezvousClient& client,
                                 MetricsRegistry* metrics, const PsBenchOptions& options,
                                 size_t bytes) {
  const FleetView& view = client.view();
  const int rank = client.rank();
  const size_t count = bytes / sizeof(float);
  const std::string size = std::to_string(bytes);
  const int64_t timeout = options.request_timeout_ms;

  // ps-sync steps wait for every worker's push: the workers must time the same steps. Without
  // --bench-iters they agree when to stop as training does (a step's pushes say whether their
  // worker has had --bench-seconds, and every reply of it answers alike; AgreeToStop).
  const bool agree = options.consistency == PsConsistency::kSync && options.flags.iters == 0;
  // ps-ssp has no agreement: a worker that timed its own number of steps and stopped would
  // hold the others' pushes more than --staleness ahead of it forever.
  if (options.consistency == PsConsistency::kSsp && options.flags.iters == 0) {
    return InvalidArgumentError(
        "--bench-ps-mode=ps-ssp needs --bench-iters N: each worker would time its own number "
        "of steps, and the slowest one's stop would hold the others' pushes forever");
  }
  std::optional<Clock::time_point> timed_start;  // set once the timed steps begin
  std::vector<double> times;
  PsEngineOptions engine_options;
  engine_options.consistency = options.consistency;
  if (agree) {
    engine_options.stop_requested = [&timed_start, &times, &options] {
      if (!timed_start.has_value()) return false;
      const auto done = static_cast<int64_t>(times.size());
      return done >= kMaxIters ||
             (done >= kMinIters && SecondsSince(*timed_start) >= options.flags.seconds);
    };
    engine_options.stop_grace = false;  // the steps finish; only the count is agreed
  }
  engine_options.chunk_elements = options.chunk_elements;
  engine_options.shared_memory = options.shared_memory;
  engine_options.request_timeout_ms = timeout;
  ASSIGN_OR_RETURN(engine_options.optimizer, ParseOptimizerOptions("sgd", "lr=0"));
  ASSIGN_OR_RETURN(std::unique_ptr<PsEngine> engine,
                   PsEngine::Create(engine_options, endpoint, view, rank, metrics));
  ParameterLayout layout;
  RETURN_IF_ERROR(layout.Add("bench" + size, {static_cast<int64_t>(count)}).status());
  // The gradients are sent without a copy, as the trainer's are (SetGradientOwner).
  auto grads_owner = std::make_shared<std::vector<float>>(count, 1.0f);
  std::vector<float>& grads = *grads_owner;
  engine->SetGradientOwner(grads_owner);
  std::vector<float> params(count);
  for (size_t i = 0; i < count; ++i) params[i] = static_cast<float>(i % 1000);
  const std::vector<float> initial = params;
  if (rank != 0) std::fill(params.begin(), params.end(), -1.0f);

  // Rank 0 replaces the previous size's job only once every rank is done with it, and the
  // others pull only once it has.
  RETURN_IF_ERROR(client.Barrier("bench-ps " + size, Role::kWorker, timeout));
  if (rank == 0) RETURN_IF_ERROR(engine->Initialize(layout, {}, params.data()));
  RETURN_IF_ERROR(client.Barrier("bench-ps init " + size, Role::kWorker, timeout));
  if (rank != 0) RETURN_IF_ERROR(engine->Initialize(layout, {}, params.data()));

  int64_t step = 0;
  const auto warm_start = Clock::now();
  for (int64_t i = 0; i < options.flags.warmup; ++i) {
    RETURN_IF_ERROR(engine->Step(++step, params.data(), grads.data(), {}));
  }
  const double warm_mean =
      options.flags.warmup == 0
          ? 0.0
          : SecondsSince(warm_start) / static_cast<double>(options.flags.warmup);
  int64_t iters = options.flags.iters;
  if (iters == 0) {
    iters = warm_mean > 0 ? static_cast<int64_t>(options.flags.seconds / warm_mean) : kMaxIters;
    iters = std::clamp(iters, kMinIters, kMaxIters);
  }
  RETURN_IF_ERROR(client.Barrier("bench-ps timed " + size, Role::kWorker, timeout));
  timed_start = Clock::now();
  while (agree || static_cast<int64_t>(times.size()) < iters) {
    const auto start = Clock::now();
    RETURN_IF_ERROR(engine->Step(++step, params.data(), grads.data(), {}));
    times.push_back(SecondsSince(start));
    if (agree) {
      ASSIGN_OR_RETURN(bool stop, engine->AgreeToStop(step, /*stop=*/false));
      if (stop) break;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (params[i] != initial[i]) {
      return DataLossError("bench-ps of " + size + " bytes, worker " + std::to_string(rank) +
                           ": element " + std::to_string(i) + " came back as " +
                           std::to_string(params[i]) + ", expected " + std::to_string(initial[i]));
    }
  }
  // The engine's requests per step: one per group of a server's chunks.
  ASSIGN_OR_RETURN(
      std::vector<DenseChunk> chunks,
      PlanDenseChunks(count, options.chunk_elements, view.num_servers, view.key_space));
  std::vector<int64_t> per_server(static_cast<size_t>(view.num_servers), 0);
  for (const DenseChunk& chunk : chunks) ++per_server[static_cast<size_t>(chunk.server)];
  int64_t requests = 0;
  for (int64_t n : per_server) {
    requests += (n + engine_options.chunks_per_request - 1) / engine_options.chunks_per_request;
  }
  double total = 0;
  for (double t : times) total += t;
  return nlohmann::json{{"bench", "ps"},
                        {"system", "tessera"},
                        {"mode", PsModeName(options.consistency)},
                        {"rank", rank},
                        {"workers", view.num_workers},
                        {"servers", view.num_servers},
                        {"bytes", bytes},
                        {"requests_per_step", requests},
                        {"iters", static_cast<int64_t>(times.size())},
                        {"median_s", BenchMedian(times)},
                        {"mean_s", total / static_cast<double>(times.size())},
                        {"min_s", *std::min_element(times.begin(), times.end())}};
}

}  // namespace

Status RunPsBench(RpcEndpoint* endpoint, RendezvousClient& client, MetricsRegistry* metrics,
                  const PsBenchOptions& options,
                  const std::function<void(const std::string&)>& print) {
  if (client.view().num_servers < 1) {
    return InvalidArgumentError("--mode bench-ps needs parameter servers (--servers N)");
  }
  ASSIGN_OR_RETURN(std::vector<size_t> sizes, ParseBenchSizes(options.flags.sizes));
  for (size_t bytes : sizes) {
    ASSIGN_OR_RETURN(nlohmann::json line, RunSize(endpoint, client, metrics, options, bytes));
    print(line.dump());
  }
  return OkStatus();
}

}  // namespace tessera::worker
