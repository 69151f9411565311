// tessera.torch._C: the Python extension module behind tessera/torch/__init__.py, which
// registers the "tessera" backend with torch.distributed (Backend.register_backend).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/base/host_port.h"
#include "common/transport/bind_address.h"
#include "common/security/job_key.h"
#include "worker/pipeline/pipeline_metrics.h"
#include "worker/torch/backend_config.h"
#include "worker/torch/block_cache.h"
#include "worker/torch/fleet_presence.h"
#include "worker/torch/fsdp_metrics.h"
#include "worker/torch/pipeline_schedule_binding.h"
#include "worker/torch/process_group_tessera.h"
#include "worker/torch/ps_client.h"

namespace py = pybind11;

namespace tessera::worker {
namespace {

// The process's metrics registry, made on first use: by the first tessera group, whose
// FleetPresence serves it, or by tessera.torch.fsdp's first call (which may come from a
// process whose groups are Gloo's, before or without any tessera group). Never destroyed, as
// the presence.
MetricsRegistry& Registry() {
  // Function-local statics: made once, thread-safely, whichever thread comes first.
  static MetricsRegistry* const registry = new MetricsRegistry();
  return *registry;
}

// FSDP's instruments in it, registered by FSDP's first call, so that only processes that use
// FSDP export tessera_fsdp_* (the dashboard shows its FSDP panel for those).
FsdpMetrics& Fsdp() {
  static FsdpMetrics* const fsdp = [] {
    StatusOr<std::unique_ptr<FsdpMetrics>> made = FsdpMetrics::Register(&Registry());
    TORCH_CHECK(made.ok(), "tessera: ", made.status().message());  // a bug: names are fixed
    return made->release();
  }();
  return *fsdp;
}

// tessera.torch.pipelining's instruments (worker/pipeline/pipeline_metrics.h) in it,
// registered by a schedule's first step, so that only pipeline ranks export
// tessera_pipeline_* (the dashboard draws its pipeline timeline from those).
PipelineMetrics& Pipeline() {
  static PipelineMetrics* const pipeline = [] {
    StatusOr<std::unique_ptr<PipelineMetrics>> made = PipelineMetrics::Register(&Registry());
    TORCH_CHECK(made.ok(), "tessera: ", made.status().message());  // a bug: names are fixed
    return made->release();
  }();
  return *pipeline;
}

// The process's FleetPresence, made with its first group (init_process_group's world group,
// whose rank and size it registers with). Never destroyed: groups the script did not destroy
// still count into its registry while the interpreter shuts down; LeaveFleet says goodbye.
std::mutex presence_mu;
FleetPresence* presence = nullptr;  // presence_mu
// A ParameterServerOptimizer registered this process with the coordinator: the presence must
// not register it again (one rank, one registration).
bool ps_registered = false;  // presence_mu

FleetPresence* Presence(const BackendConfig& config, int rank, int size, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(presence_mu);
  if (presence == nullptr) {
    FleetPresenceOptions options;
    options.rank = rank;
    options.world_size = size;
    options.bind_host = config.member.bind_host;
    options.credentials = config.member.credentials;
    if (!config.coordinator.empty()) {
      // As the fleet's own processes decide, from the coordinator's host.
      StatusOr<Credentials> fleet = CredentialsFromEnvironment(
          CurrentEnvironment(), options.bind_host,
          config.coordinator.substr(0, config.coordinator.rfind(':')));
      TORCH_CHECK(fleet.ok(), "tessera: ", fleet.status().message());
      options.credentials = *fleet;
    }
    options.metrics = config.metrics;
    options.coordinator = ps_registered ? std::string() : config.coordinator;
    options.timeout_ms = timeout_ms;
    options.registry = &Registry();
    StatusOr<std::unique_ptr<FleetPresence>> started = FleetPresence::Start(options);
    TORCH_CHECK(started.ok(), "tessera: ", started.status().message());
    presence = started->release();
  }
  return presence;
}

// At interpreter exit: a clean goodbye to the coordinator, if there is one.
void LeaveFleet() {
  std::lock_guard<std::mutex> lock(presence_mu);
  if (presence != nullptr) presence->Leave("the torch process is exiting");
}

// An uncaught exception ends the process (tessera/torch/__init__.py's hook): the coordinator
// hears why, and tells the job's other processes.
void LeaveFleetWithError(const std::string& error) {
  std::lock_guard<std::mutex> lock(presence_mu);
  if (presence != nullptr) presence->LeaveWithError(Status(StatusCode::kUnknown, error));
}

// The URL of this process's /metrics, or "" (no TESSERA_METRICS_PORT, or no group yet).
std::string MetricsUrl() {
  std::lock_guard<std::mutex> lock(presence_mu);
  return presence == nullptr ? std::string() : presence->metrics_url();
}

// tessera.torch.fsdp's instruments (fsdp_metrics.h). They run a few times per FSDP unit and
// step: a parse of a short string and a few atomic updates. A bad kind, op or value is the
// caller's bug: ValueError naming it.
template <typename T>
T Parsed(StatusOr<T> parsed) {
  if (!parsed.ok()) throw py::value_error("tessera: " + parsed.status().message());
  return *parsed;
}

void CheckSeconds(double seconds, const char* what) {
  if (!(seconds >= 0) || std::isinf(seconds)) {
    throw py::value_error(std::string("tessera: ") + what +
                          ": seconds must be finite and >= 0, got " + std::to_string(seconds));
  }
}

void FsdpAddParamBytes(std::string_view kind, int64_t delta) {
  Fsdp().AddParamBytes(Parsed(ParseFsdpParamKind(kind)), delta);
}

void FsdpObserveCollective(std::string_view op, double seconds, int64_t nbytes) {
  const FsdpCollective parsed = Parsed(ParseFsdpCollective(op));
  CheckSeconds(seconds, "fsdp_observe_collective");
  if (nbytes < 0) {
    throw py::value_error("tessera: fsdp_observe_collective: nbytes must be >= 0, got " +
                          std::to_string(nbytes));
  }
  Fsdp().ObserveCollective(parsed, seconds, static_cast<uint64_t>(nbytes));
}

void FsdpPrefetchWait(double seconds) {
  CheckSeconds(seconds, "fsdp_prefetch_wait");
  Fsdp().PrefetchWait(seconds);
}

void FsdpResetPeaks() { Fsdp().ResetPeaks(); }

void PipelineSetSchedule(int pipeline_rank, int held_bound, double bubble_formula) {
  Pipeline().SetSchedule(pipeline_rank, held_bound, bubble_formula);
}

// One finished step of a schedule: `actions` its compute actions as (op, stage, micro_batch,
// start, end) with op one of F, B, I, W and times in seconds after the step's start.
void PipelineRecordStep(double start_unix_seconds, double seconds,
                        const std::vector<std::tuple<std::string, int, int, double, double>>&
                            actions,
                        int64_t activation_bytes, int64_t gradient_bytes, int peak_held) {
  if (activation_bytes < 0 || gradient_bytes < 0) {
    throw py::value_error("tessera: pipeline_record_step: bytes sent must be >= 0");
  }
  PipelineStepRecord step;
  step.start_unix_seconds = start_unix_seconds;
  step.seconds = seconds;
  step.activation_bytes_sent = static_cast<uint64_t>(activation_bytes);
  step.gradient_bytes_sent = static_cast<uint64_t>(gradient_bytes);
  step.peak_held = peak_held;
  step.actions.reserve(actions.size());
  for (const auto& [op, stage, micro_batch, start, end] : actions) {
    TimedAction action{PipelineOp::kForward, stage, micro_batch, start, end};
    if (op == "B") {
      action.op = PipelineOp::kBackward;
    } else if (op == "I") {
      action.op = PipelineOp::kBackwardInput;
    } else if (op == "W") {
      action.op = PipelineOp::kBackwardWeight;
    } else if (op != "F") {
      throw py::value_error("tessera: pipeline_record_step: action op '" + op +
                            "' is not one of F, B, I or W");
    }
    step.actions.push_back(action);
  }
  Status recorded = Pipeline().RecordStep(step);
  if (!recorded.ok()) throw py::value_error("tessera: " + recorded.message());
}

// torch's CPU allocator with BlockCache (block_cache.h) under its large tensors: requests of at
// least min_bytes take cached blocks, smaller ones go to the allocator it replaced. Each
// DataPtr's context is its data (ATen's raw_allocate requires it), so the deleter finds a
// block by its address and hands any other to the replaced allocator's deleter. Installed once
// per process and never removed (a tensor's memory may outlive anything).
class CachingCpuAllocator final : public c10::Allocator {
 public:
  static void Install(size_t min_bytes) {
    instance = new CachingCpuAllocator(c10::GetCPUAllocator(), min_bytes);
    // Above the default allocator's priority (0), so that it takes over.
    c10::SetCPUAllocator(instance, /*priority=*/1);
  }
  static const CachingCpuAllocator* installed() { return instance; }

  c10::DataPtr allocate(size_t bytes) const override {
    if (bytes < min_bytes_) return small_->allocate(bytes);
    StatusOr<void*> block = cache_.Acquire(bytes);
    if (!block.ok()) throw std::bad_alloc();
    return {*block, *block, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  BlockCache::Stats stats() const { return cache_.stats(); }
  void UnmapKept() const { cache_.UnmapKept(); }
  size_t min_bytes() const { return min_bytes_; }

 private:
  CachingCpuAllocator(c10::Allocator* small, size_t min_bytes)
      : small_(small), small_deleter_(small->raw_deleter()), min_bytes_(min_bytes) {}

  static void Delete(void* data) {
    if (data == nullptr || instance->cache_.Release(data)) return;
    // raw_allocate's small blocks only; torch's default CPU allocator has a raw deleter.
    if (instance->small_deleter_ != nullptr) instance->small_deleter_(data);
  }

  static inline CachingCpuAllocator* instance = nullptr;  // leaked on purpose
  c10::Allocator* const small_;
  const c10::DeleterFnPtr small_deleter_;
  const size_t min_bytes_;
  mutable BlockCache cache_;
};

std::mutex cpu_cache_mu;

// Puts BlockCache under torch's CPU tensors of at least min_bytes; False if it already is
// (with whatever min_bytes it was given first).
bool FsdpUseBlockCache(int64_t min_bytes) {
  if (min_bytes <= 0) {
    throw py::value_error("tessera: fsdp_use_block_cache: min_bytes must be > 0, got " +
                          std::to_string(min_bytes));
  }
  std::lock_guard<std::mutex> lock(cpu_cache_mu);
  if (CachingCpuAllocator::installed() != nullptr) return false;
  CachingCpuAllocator::Install(static_cast<size_t>(min_bytes));
  return true;
}

// Returns the blocks the cache keeps to the kernel (as torch.cuda.empty_cache does for
// CUDA's); a no-op before FsdpUseBlockCache.
void FsdpEmptyBlockCache() {
  std::lock_guard<std::mutex> lock(cpu_cache_mu);
  const CachingCpuAllocator* cache = CachingCpuAllocator::installed();
  if (cache != nullptr) cache->UnmapKept();
}

// {"min_bytes", "mapped_bytes", "kept_bytes", "peak_mapped_bytes", "hits", "trimmed", "misses",
//  "unmapped"}, or None before FsdpUseBlockCache.
py::object FsdpBlockCacheStats() {
  std::lock_guard<std::mutex> lock(cpu_cache_mu);
  const CachingCpuAllocator* cache = CachingCpuAllocator::installed();
  if (cache == nullptr) return py::none();
  const BlockCache::Stats stats = cache->stats();
  py::dict out;
  out["min_bytes"] = cache->min_bytes();
  out["mapped_bytes"] = stats.mapped_bytes;
  out["kept_bytes"] = stats.kept_bytes;
  out["peak_mapped_bytes"] = stats.peak_mapped_bytes;
  out["peak_acquired_bytes"] = stats.peak_acquired_bytes;
  out["hits"] = stats.hits;
  out["trimmed"] = stats.trimmed;
  out["misses"] = stats.misses;
  out["unmapped"] = stats.unmapped;
  return out;
}

// {"held": {kind: int}, "peak": {kind: int}, "collective_seconds": {op: float},
//  "collective_count": {op: int}, "prefetch_waits": int, "prefetch_wait_seconds": float}
py::dict FsdpMetricsDict() {
  const FsdpMetrics::Snapshot read = Fsdp().Read();
  py::dict held, peak, seconds, count;
  for (size_t i = 0; i < kFsdpParamKindCount; ++i) {
    const py::str kind(std::string(FsdpParamKindName(static_cast<FsdpParamKind>(i))));
    held[kind] = read.held[i];
    peak[kind] = read.peak[i];
  }
  for (size_t i = 0; i < kFsdpCollectiveCount; ++i) {
    const py::str op(std::string(FsdpCollectiveName(static_cast<FsdpCollective>(i))));
    seconds[op] = read.collective_seconds[i];
    count[op] = read.collective_count[i];
  }
  py::dict metrics;
  metrics["held"] = held;
  metrics["peak"] = peak;
  metrics["collective_seconds"] = seconds;
  metrics["collective_count"] = count;
  metrics["prefetch_waits"] = read.prefetch_waits;
  metrics["prefetch_wait_seconds"] = read.prefetch_wait_seconds;
  return metrics;
}

// The default group's host (group_member.h), which every new_group of this process joins
// over: one endpoint and two threads whatever the number of groups.
std::mutex host_mu;
std::weak_ptr<GroupHost> world_host;  // guarded by host_mu

// torch's creator (extended API): (store, rank, world_size, timeout, global ranks: empty for
// the default group, the host of the TCPStore under `store` or "") -> the process group.
// Joining waits for the other ranks, so the GIL is released meanwhile.
c10::intrusive_ptr<ProcessGroupTessera> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout, const std::vector<int>& global_ranks,
    const std::string& store_host) {
  StatusOr<BackendConfig> config = BackendConfigFrom(CurrentEnvironment(), store_host);
  TORCH_CHECK(config.ok(), "tessera: ", config.status().message());
  const int64_t timeout_ms = EffectiveTimeoutMs(
      *config, std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  FleetPresence* presence = Presence(*config, rank, size, timeout_ms);
  GroupMemberOptions defaults = config->member;
  defaults.metrics = presence->metrics();
  if (!global_ranks.empty()) {
    // A new_group: over the default group's endpoint, if the default group is tessera's.
    std::lock_guard<std::mutex> lock(host_mu);
    defaults.host = world_host.lock();
    if (defaults.host != nullptr) defaults.global_ranks = global_ranks;
  }
  auto group = c10::make_intrusive<ProcessGroupTessera>(store, rank, size,
                                                        std::chrono::milliseconds(timeout_ms),
                                                        defaults, presence->backend_metrics());
  if (global_ranks.empty()) {
    std::lock_guard<std::mutex> lock(host_mu);
    world_host = group->host();
  }
  return group;
}

// The flat float32 CPU buffer of `what`, with `elements` floats.
float* FloatBuffer(const at::Tensor& tensor, size_t elements, const char* what) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat &&
                  tensor.is_contiguous() && static_cast<size_t>(tensor.numel()) == elements,
              "tessera: ", what, ": expected a contiguous float32 CPU tensor of ", elements,
              " elements, got ", c10::toString(tensor.scalar_type()), " on ", tensor.device(),
              " with ", tensor.numel());
  return tensor.data_ptr<float>();
}

// Keeps `tensor`'s memory alive for as long as the transport sends from it. The storage, not
// the tensor: the last reference may drop on a transport thread, and a storage's release needs
// no GIL (a tensor made in Python may).
std::shared_ptr<const void> StorageOwner(const at::Tensor& tensor) {
  return std::make_shared<const c10::Storage>(tensor.storage());
}

std::vector<int64_t> Ids(const at::Tensor& ids, const char* what) {
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1,
              "tessera: ", what, ": row ids must be a 1-d int64 CPU tensor, got ",
              c10::toString(ids.scalar_type()), " of ", ids.dim(), " dimensions on ", ids.device());
  at::Tensor dense = ids.contiguous();
  return std::vector<int64_t>(dense.data_ptr<int64_t>(), dense.data_ptr<int64_t>() + dense.numel());
}

void Check(const Status& status) {
  if (status.ok()) return;
  // Python's ValueError for what the caller passed, RuntimeError for what happened.
  if (status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kOutOfRange) {
    throw py::value_error("tessera: " + status.message());
  }
  TORCH_CHECK(false, "tessera: ", status.ToString());
}

// The Python face of PsClient (tessera/torch/ps.py wraps it).
class PyPsClient {
 public:
  explicit PyPsClient(const PsClientOptions& options) {
    std::lock_guard<std::mutex> lock(presence_mu);
    if (presence != nullptr && presence->registered()) {
      throw py::value_error(
          "tessera: this process's tessera process group already registered it with the "
          "coordinator (TESSERA_COORDINATOR); create the ParameterServerOptimizer before "
          "init_process_group, or leave TESSERA_COORDINATOR unset and pass coordinator=");
    }
    StatusOr<std::unique_ptr<PsClient>> joined = PsClient::Join(options);
    Check(joined.status());
    client_ = std::move(joined).value();
    ps_registered = true;
  }

  int rank() const { return client_->rank(); }
  int world_size() const { return client_->world_size(); }
  int num_servers() const { return client_->num_servers(); }
  std::string description() const {
    return client_->mode() + " with " + client_->optimizer_description() + " on " +
           std::to_string(client_->num_servers()) + " servers";
  }

  // tables: (name, rows, dim, init_seed) each.
  void Initialize(const std::vector<std::string>& names,
                  const std::vector<std::vector<int64_t>>& shapes,
                  const std::vector<std::tuple<std::string, int64_t, int64_t, uint64_t>>& tables,
                  const at::Tensor& params) {
    std::vector<EmbeddingTableSpec> specs;
    for (const auto& [name, rows, dim, seed] : tables) specs.push_back({name, rows, dim, seed});
    const size_t count = static_cast<size_t>(params.numel());
    float* data = FloatBuffer(params, count, "the parameters");
    py::gil_scoped_release release;
    Check(client_->Initialize(names, shapes, specs, data, count));
  }

  // The rows `ids` of table `table`: a new (len(ids), dim) float32 tensor.
  at::Tensor LookupRows(size_t table, const at::Tensor& ids) {
    const int64_t dim = client_->RowFloats(table);
    TORCH_CHECK(dim > 0, "tessera: lookup: no embedding table ", table);
    std::vector<int64_t> wanted = Ids(ids, "lookup");
    at::Tensor values = at::empty({static_cast<int64_t>(wanted.size()), dim},
                                  at::TensorOptions().dtype(at::kFloat));
    float* out = values.data_ptr<float>();
    py::gil_scoped_release release;
    Check(client_->LookupRows(table, wanted, out));
    return values;
  }

  // grads[offset, offset + size) of update `step` are final (a backward hook).
  void GradientsReady(int64_t step, const at::Tensor& grads, uint64_t offset, uint64_t size) {
    float* g = FloatBuffer(grads, static_cast<size_t>(grads.numel()), "the gradients");
    std::shared_ptr<const void> owner = StorageOwner(grads);
    py::gil_scoped_release release;
    Check(client_->GradientsReady(step, g, std::move(owner), offset, size));
  }

  // sparse: per table (distinct row ids, their (n, dim) gradients).
  void Step(int64_t step, const at::Tensor& params, const at::Tensor& grads,
            const std::vector<std::pair<at::Tensor, at::Tensor>>& sparse) {
    TORCH_CHECK(params.numel() == grads.numel(), "tessera: step: ", params.numel(),
                " parameters but ", grads.numel(), " gradients");
    float* p = FloatBuffer(params, static_cast<size_t>(params.numel()), "the parameters");
    float* g = FloatBuffer(grads, static_cast<size_t>(grads.numel()), "the gradients");
    std::vector<SparseRows> rows(sparse.size());
    for (size_t t = 0; t < sparse.size(); ++t) {
      rows[t].ids = Ids(sparse[t].first, "step");
      at::Tensor row_grads = sparse[t].second.contiguous();
      TORCH_CHECK(row_grads.device().is_cpu() && row_grads.scalar_type() == at::kFloat,
                  "tessera: step: the row gradients of embedding table ", t,
                  " must be float32 on the CPU");
      rows[t].grads.assign(row_grads.data_ptr<float>(),
                           row_grads.data_ptr<float>() + row_grads.numel());
    }
    std::shared_ptr<const void> owner = StorageOwner(grads);
    py::gil_scoped_release release;
    Check(client_->Step(step, p, g, std::move(owner), rows));
  }

  void SaveCheckpoint(const std::string& root, int64_t step) {
    py::gil_scoped_release release;
    Check(client_->SaveCheckpoint(root, step));
  }

  int64_t RestoreCheckpoint(const std::string& root, int64_t step, const at::Tensor& params) {
    float* p = FloatBuffer(params, static_cast<size_t>(params.numel()), "the parameters");
    py::gil_scoped_release release;
    StatusOr<int64_t> restored = client_->RestoreCheckpoint(root, step, p);
    Check(restored.status());
    return *restored;
  }

  std::string MetricsText() const { return client_->MetricsText(); }

  void Leave(const std::string& reason) {
    py::gil_scoped_release release;
    client_->Leave(reason);
  }

  void LeaveWithError(const std::string& error) {
    py::gil_scoped_release release;
    client_->LeaveWithError(Status(StatusCode::kUnknown, error));
  }

 private:
  std::unique_ptr<PsClient> client_;
};

PsClientOptions MakePsClientOptions(const std::string& coordinator, int rank, int world_size,
                                    const std::string& mode, int64_t staleness,
                                    const std::string& optimizer,
                                    const std::string& optimizer_params,
                                    const std::string& lr_schedule, int64_t warmup_steps,
                                    int64_t lr_step_size, double lr_gamma, int64_t total_steps,
                                    double min_lr, uint64_t chunk_elements,
                                    double timeout_s, const std::string& bind_host,
                                    bool shared_memory) {
  PsClientOptions options;
  options.coordinator = coordinator;
  options.rank = rank;
  options.world_size = world_size;
  options.mode = mode;
  options.staleness = staleness;
  options.optimizer = optimizer;
  options.optimizer_params = optimizer_params;
  StatusOr<LrScheduleKind> kind = ParseLrScheduleKind(lr_schedule);
  Check(kind.status());
  options.schedule.kind = *kind;
  options.schedule.warmup_steps = warmup_steps;
  options.schedule.step_size = lr_step_size;
  options.schedule.gamma = static_cast<float>(lr_gamma);
  options.schedule.total_steps = total_steps;
  options.schedule.min_lr = static_cast<float>(min_lr);
  options.chunk_elements = chunk_elements;
  options.shared_memory = shared_memory;
  if (!(timeout_s > 0)) throw py::value_error("tessera: timeout must be positive");
  const int64_t timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  options.rendezvous_timeout_ms = timeout_ms;
  options.request_timeout_ms = timeout_ms;
  // As --bind-host: "auto" is the local end of the route to the coordinator.
  StatusOr<std::pair<std::string, int>> coordinator_host = ParseHostPort(coordinator);
  Check(coordinator_host.status());
  StatusOr<BindAddress> bind = ResolveBindAddress(bind_host, coordinator_host->first);
  Check(bind.status());
  options.bind_host = bind->advertise;
  StatusOr<Credentials> credentials =
      CredentialsFromEnvironment(CurrentEnvironment(), options.bind_host, coordinator_host->first);
  Check(credentials.status());
  options.credentials = *credentials;
  return options;
}

}  // namespace
}  // namespace tessera::worker

PYBIND11_MODULE(_C, module) {
  module.doc() = "Tessera's torch.distributed backend (import tessera.torch to register it)";
  // Torch's ProcessGroup type, so that an instance of ours is one to torch.distributed.
  py::object process_group =
      py::module::import("torch._C._distributed_c10d").attr("ProcessGroup");
  py::class_<tessera::worker::ProcessGroupTessera,
             c10::intrusive_ptr<tessera::worker::ProcessGroupTessera>>(
      module, "ProcessGroupTessera", process_group)
      .def_property_readonly("channel",
                             &tessera::worker::ProcessGroupTessera::channel_description,
                             "How the group's ring travels: shm, links or zmq, and why");
  module.def("create_process_group", &tessera::worker::CreateProcessGroup, py::arg("store"),
             py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
             py::arg("global_ranks"), py::arg("store_host"),
             py::call_guard<py::gil_scoped_release>(),
             "torch.distributed's creator of a tessera process group");
  module.def(
      "write_key_file",
      [](const std::string& path) {
        tessera::Status written = tessera::WriteKeyFile(path, tessera::JobKey::Generate());
        if (!written.ok()) throw std::runtime_error("tessera: " + written.message());
      },
      py::arg("path"), "Writes a new job key to a new file at `path` (mode 0600)");
  module.def("metrics_url", &tessera::worker::MetricsUrl,
             "http://HOST:PORT/metrics of this process (TESSERA_METRICS_PORT), or ''");
  module.def("fsdp_add_param_bytes", &tessera::worker::FsdpAddParamBytes, py::arg("kind"),
             py::arg("delta"),
             "Adds delta bytes (negative: freed) to what FSDP holds of kind (shard, gathered, "
             "gradient_shard, full_gradient) and raises its peak when exceeded");
  module.def("fsdp_observe_collective", &tessera::worker::FsdpObserveCollective, py::arg("op"),
             py::arg("seconds"), py::arg("nbytes"),
             "One FSDP collective (all_gather, reduce_scatter, all_reduce) of nbytes bytes, "
             "seconds from issue to completion");
  module.def("fsdp_prefetch_wait", &tessera::worker::FsdpPrefetchWait, py::arg("seconds"),
             "FSDP waited seconds for a prefetched all-gather that had not finished");
  module.def("fsdp_reset_peaks", &tessera::worker::FsdpResetPeaks,
             "Sets each kind's peak bytes to what is held now");
  module.def("fsdp_metrics", &tessera::worker::FsdpMetricsDict,
             "FSDP's instruments: {held, peak: {kind: int}, collective_seconds: {op: float}, "
             "collective_count: {op: int}, prefetch_waits: int, prefetch_wait_seconds: float}");
  module.def("pipeline_set_schedule", &tessera::worker::PipelineSetSchedule,
             py::arg("pipeline_rank"), py::arg("held_bound"), py::arg("bubble_formula"),
             "What the pipeline schedule says of this rank, for tessera_pipeline_*");
  module.def("pipeline_record_step", &tessera::worker::PipelineRecordStep,
             py::arg("start_unix_seconds"), py::arg("seconds"), py::arg("actions"),
             py::arg("activation_bytes"), py::arg("gradient_bytes"), py::arg("peak_held"),
             "One finished pipeline step: its compute actions as (op, stage, micro_batch, "
             "start, end) in seconds after its start, bytes sent and micro-batches held");
  module.def("fsdp_use_block_cache", &tessera::worker::FsdpUseBlockCache, py::arg("min_bytes"),
             "Puts a cache of mapped blocks under torch's CPU tensors of min_bytes or more "
             "(block_cache.h); False if one is there already");
  module.def("fsdp_empty_block_cache", &tessera::worker::FsdpEmptyBlockCache,
             "Unmaps the blocks the CPU block cache keeps for reuse");
  module.def("fsdp_block_cache_stats", &tessera::worker::FsdpBlockCacheStats,
             "The block cache's counters (mapped, kept and peak bytes, hits, misses, "
             "unmapped), or None without one");
  module.def("leave_fleet_with_error", &tessera::worker::LeaveFleetWithError, py::arg("error"),
             py::call_guard<py::gil_scoped_release>(),
             "Tells the coordinator (if any) this process is failing with `error`");
  using tessera::worker::PyPsClient;
  py::class_<PyPsClient>(module, "PsClient",
                         "A worker of a parameter-server job (tessera.torch.ps wraps it)")
      .def(py::init([](const std::string& coordinator, int rank, int world_size,
                       const std::string& mode, int64_t staleness, const std::string& optimizer,
                       const std::string& optimizer_params, const std::string& lr_schedule,
                       int64_t warmup_steps, int64_t lr_step_size, double lr_gamma,
                       int64_t total_steps, double min_lr, uint64_t chunk_elements,
                       double timeout_s, const std::string& bind_host, bool shared_memory) {
             tessera::worker::PsClientOptions options = tessera::worker::MakePsClientOptions(
                 coordinator, rank, world_size, mode, staleness, optimizer, optimizer_params,
                 lr_schedule, warmup_steps, lr_step_size, lr_gamma, total_steps, min_lr,
                 chunk_elements, timeout_s, bind_host, shared_memory);
             py::gil_scoped_release release;  // joining waits for the job's other workers
             return std::make_unique<PyPsClient>(options);
           }),
           py::arg("coordinator"), py::arg("rank"), py::arg("world_size"), py::arg("mode"),
           py::arg("staleness"), py::arg("optimizer"), py::arg("optimizer_params"),
           py::arg("lr_schedule"), py::arg("warmup_steps"), py::arg("lr_step_size"),
           py::arg("lr_gamma"), py::arg("total_steps"), py::arg("min_lr"),
           py::arg("chunk_elements"), py::arg("timeout_s"), py::arg("bind_host"),
           py::arg("shared_memory") = true)
      .def_property_readonly("rank", &PyPsClient::rank)
      .def_property_readonly("world_size", &PyPsClient::world_size)
      .def_property_readonly("num_servers", &PyPsClient::num_servers)
      .def_property_readonly("description", &PyPsClient::description)
      .def("initialize", &PyPsClient::Initialize, py::arg("names"), py::arg("shapes"),
           py::arg("tables"), py::arg("params"))
      .def("lookup_rows", &PyPsClient::LookupRows, py::arg("table"), py::arg("ids"))
      .def("gradients_ready", &PyPsClient::GradientsReady, py::arg("step"), py::arg("grads"),
           py::arg("offset"), py::arg("size"))
      .def("step", &PyPsClient::Step, py::arg("step"), py::arg("params"), py::arg("grads"),
           py::arg("sparse"))
      .def("save_checkpoint", &PyPsClient::SaveCheckpoint, py::arg("root"), py::arg("step"))
      .def("restore_checkpoint", &PyPsClient::RestoreCheckpoint, py::arg("root"),
           py::arg("step"), py::arg("params"))
      .def("metrics_text", &PyPsClient::MetricsText)
      .def("leave", &PyPsClient::Leave, py::arg("reason"))
      .def("leave_with_error", &PyPsClient::LeaveWithError, py::arg("error"));
  tessera::worker::BindPipelineSchedule(module);
  py::module::import("atexit").attr("register")(
      py::cpp_function(&tessera::worker::LeaveFleet, py::call_guard<py::gil_scoped_release>()));
}
