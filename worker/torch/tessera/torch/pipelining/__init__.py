"""Pipeline parallelism on the tessera backend: torch.distributed.pipelining's API (PyTorch
2.6), which Debian's torch 1.13 lacks. A program written for it runs after one changed import:

    from tessera.torch.pipelining import PipelineStage, Schedule1F1B   # was torch.distributed.

The schedules run the action orders of worker/pipeline/pipeline_schedule.h, the library the
native trainer runs too (schedules.py); stages send and receive over the group's
point-to-point messages (stage.py). See docs/pytorch.md, "Pipeline parallelism".
"""

from tessera.torch.pipelining.failures import PipelineFailure
from tessera.torch.pipelining.pipe import Pipe, SplitPoint, pipeline
from tessera.torch.pipelining.schedules import (PipelineScheduleMulti, PipelineScheduleSingle,
                                                Schedule1F1B, ScheduleGPipe,
                                                ScheduleInterleaved1F1B, ScheduleZBH1)
from tessera.torch.pipelining.stage import PipelineStage, PipeliningShapeError

__all__ = ["PipelineStage", "PipeliningShapeError", "PipelineFailure", "PipelineScheduleSingle",
           "PipelineScheduleMulti", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "ScheduleZBH1", "pipeline", "Pipe", "SplitPoint"]
