// tessera.torch._C: the Python extension module behind tessera/torch/__init__.py, which
// registers the "tessera" backend with torch.distributed (Backend.register_backend).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "worker/torch/backend_config.h"
#include "worker/torch/fleet_presence.h"
#include "worker/torch/process_group_tessera.h"

namespace py = pybind11;

namespace tessera::worker {
namespace {

// The process's FleetPresence, made with its first group (init_process_group's world group,
// whose rank and size it registers with). Never destroyed: groups the script did not destroy
// still count into its registry while the interpreter shuts down; LeaveFleet says goodbye.
std::mutex presence_mu;
FleetPresence* presence = nullptr;  // presence_mu

FleetPresence* Presence(const BackendConfig& config, int rank, int size, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(presence_mu);
  if (presence == nullptr) {
    FleetPresenceOptions options;
    options.rank = rank;
    options.world_size = size;
    options.bind_host = config.member.bind_host;
    options.metrics_port = config.metrics_port;
    options.coordinator = config.coordinator;
    options.timeout_ms = timeout_ms;
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

// The URL of this process's /metrics, or "" (no TESSERA_METRICS_PORT, or no group yet).
std::string MetricsUrl() {
  std::lock_guard<std::mutex> lock(presence_mu);
  return presence == nullptr ? std::string() : presence->metrics_url();
}

// torch's creator: (store, rank, world_size, timeout) -> the process group. Joining waits for
// the other ranks, so the GIL is released meanwhile.
c10::intrusive_ptr<ProcessGroupTessera> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout) {
  StatusOr<BackendConfig> config = BackendConfigFrom(CurrentEnvironment());
  TORCH_CHECK(config.ok(), "tessera: ", config.status().message());
  const int64_t timeout_ms = EffectiveTimeoutMs(
      *config, std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  FleetPresence* presence = Presence(*config, rank, size, timeout_ms);
  GroupMemberOptions defaults = config->member;
  defaults.metrics = presence->metrics();
  return c10::make_intrusive<ProcessGroupTessera>(store, rank, size,
                                                  std::chrono::milliseconds(timeout_ms),
                                                  defaults, presence->backend_metrics());
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
             py::call_guard<py::gil_scoped_release>(),
             "torch.distributed's creator of a tessera process group");
  module.def("metrics_url", &tessera::worker::MetricsUrl,
             "http://HOST:PORT/metrics of this process (TESSERA_METRICS_PORT), or ''");
  py::module::import("atexit").attr("register")(
      py::cpp_function(&tessera::worker::LeaveFleet, py::call_guard<py::gil_scoped_release>()));
}
