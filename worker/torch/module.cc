// tessera.torch._C: the Python extension module behind tessera/torch/__init__.py, which
// registers the "tessera" backend with torch.distributed (Backend.register_backend).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>

#include "worker/torch/backend_config.h"
#include "worker/torch/process_group_tessera.h"

namespace py = pybind11;

namespace tessera::worker {
namespace {

// torch's creator: (store, rank, world_size, timeout) -> the process group. Joining waits for
// the other ranks, so the GIL is released meanwhile.
c10::intrusive_ptr<ProcessGroupTessera> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout) {
  StatusOr<GroupMemberOptions> defaults = BackendOptionsFrom(CurrentEnvironment());
  TORCH_CHECK(defaults.ok(), "tessera: ", defaults.status().message());
  return c10::make_intrusive<ProcessGroupTessera>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
      *defaults);
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
}
