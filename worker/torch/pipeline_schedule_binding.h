// tessera.torch._C.pipeline_schedule: worker/pipeline/pipeline_schedule.h's schedules for
// tessera.torch.pipelining, so that the Python schedules run the very action orders the native
// trainer runs (one library, two front ends).
#ifndef TESSERA_WORKER_TORCH_PIPELINE_SCHEDULE_BINDING_H_
#define TESSERA_WORKER_TORCH_PIPELINE_SCHEDULE_BINDING_H_

#include <pybind11/pybind11.h>

namespace tessera::worker {

// Adds pipeline_schedule(kind, ranks, micro_batches, stages_per_rank=1) to `module`: a dict
// {"actions": [[(op, stage, micro_batch), ...] by rank], "bubble_fraction": float,
//  "peak_held": [int by rank], "description": str}, op one of F B I W SEND_F RECV_F SEND_B
// RECV_B (torch's words). ValueError with PipelineSchedule::Make's message for a kind or shape
// it refuses.
void BindPipelineSchedule(pybind11::module_& module);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_PIPELINE_SCHEDULE_BINDING_H_
