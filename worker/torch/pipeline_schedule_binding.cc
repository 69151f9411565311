#include "worker/torch/pipeline_schedule_binding.h"

#include <pybind11/stl.h>

#include <string>

#include "worker/pipeline/pipeline_schedule.h"

namespace py = pybind11;

namespace tessera::worker {
namespace {

const char* OpName(PipelineOp op) {
  switch (op) {
    case PipelineOp::kForward: return "F";
    case PipelineOp::kBackward: return "B";
    case PipelineOp::kBackwardInput: return "I";
    case PipelineOp::kBackwardWeight: return "W";
    case PipelineOp::kRecvActivation: return "RECV_F";
    case PipelineOp::kSendActivation: return "SEND_F";
    case PipelineOp::kRecvGradient: return "RECV_B";
    case PipelineOp::kSendGradient: return "SEND_B";
  }
  return "?";
}

py::dict PipelineScheduleDict(const std::string& kind_name, int ranks, int micro_batches,
                              int stages_per_rank) {
  StatusOr<ScheduleKind> kind = ParseScheduleKind(kind_name);
  if (!kind.ok()) throw py::value_error("tessera: " + kind.status().message());
  StatusOr<PipelineSchedule> schedule =
      PipelineSchedule::Make(*kind, {ranks, micro_batches, stages_per_rank});
  if (!schedule.ok()) {
    // InvalidArgument: a shape the schedule refuses (the caller's); anything else is a bug in
    // the library, which Make found by running the schedule.
    if (schedule.status().code() == StatusCode::kInvalidArgument) {
      throw py::value_error("tessera: " + schedule.status().message());
    }
    throw std::runtime_error("tessera: " + schedule.status().ToString());
  }
  py::list actions, peak_held;
  for (int r = 0; r < ranks; ++r) {
    py::list rank_actions;
    for (const PipelineAction& a : schedule->actions(r)) {
      rank_actions.append(py::make_tuple(OpName(a.op), a.stage, a.micro_batch));
    }
    actions.append(rank_actions);
    peak_held.append(schedule->peak_held(r));
  }
  py::dict result;
  result["actions"] = actions;
  result["bubble_fraction"] = schedule->bubble_fraction();
  result["peak_held"] = peak_held;
  result["description"] = schedule->Describe();
  return result;
}

}  // namespace

void BindPipelineSchedule(py::module_& module) {
  module.def("pipeline_schedule", &PipelineScheduleDict, py::arg("kind"), py::arg("ranks"),
             py::arg("micro_batches"), py::arg("stages_per_rank") = 1,
             "The schedule `kind` (gpipe, 1f1b, interleaved, zb-h1) for a pipeline of `ranks` "
             "ranks, `micro_batches` micro-batches and `stages_per_rank` stages per rank: "
             "{actions: [[(op, stage, micro_batch)] by rank], bubble_fraction, peak_held: "
             "[by rank], description}; ValueError for a shape it refuses");
}

}  // namespace tessera::worker
