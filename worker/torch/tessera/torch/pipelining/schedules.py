"""The pipeline schedules (torch.distributed.pipelining's names and arguments, 2.6).

Every schedule runs the action order of worker/pipeline/pipeline_schedule.h, the library the
native trainer runs too, which tessera.torch._C.pipeline_schedule hands over: for this rank,
a list of (op, stage, micro-batch) with op one of
  F       the stage's forward of the micro-batch
  B       its whole backward (input and weight gradients)
  I, W    zero bubble's halves of B: the input's gradient, then the weights'
  RECV_F, SEND_F   an activation from the stage before, to the stage after (other ranks only)
  RECV_B, SEND_B   a gradient from the stage after, to the stage before
Messages between stages on one rank are handed over in memory. A step runs the list once;
the library has checked (by running it) that the ranks' lists cannot deadlock.

    stage = PipelineStage(part, stage_index=rank, num_stages=world, device="cpu")
    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=torch.nn.MSELoss())
    if rank == 0:
        schedule.step(x)                       # cut into 8 micro-batches along dim 0
    elif rank == world - 1:
        losses = []
        out = schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    optimizer.step()

Gradients accumulate into .grad. scale_grads=True divides this step's contribution by the
number of micro-batches (the loss's gradient starts at 1/M), so that a loss_fn that averages
over its micro-batch gives the gradient of the average over the batch; gradients already in
.grad before the step are left alone (torch 2.6 divides the whole .grad after the step: the
same for a program that zeroes its gradients every step).

Each step keeps its timeline: schedule.timeline lists this rank's compute actions of the last
step as (op, stage, micro_batch, start, end), op one of F, B, I, W and the times
time.perf_counter() seconds, in the order they ran; schedule.busy_s is their total and
schedule.step_s the step's wall time (on this rank, from entering step() to leaving it). So
1 - busy_s / step_s is the share of the step this rank sat idle: its bubble, waits for the
other ranks' messages included.
"""

import time

import torch
import torch.distributed as dist

from tessera.torch import _C
from tessera.torch.pipelining.failures import FailureWatch, PipelineFailure
from tessera.torch.pipelining.stage import (PipelineStage, PipeliningShapeError, _PeerFailure,
                                            _tags_fit)

__all__ = ["PipelineScheduleSingle", "PipelineScheduleMulti", "ScheduleGPipe",
           "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBH1"]

_COMPUTE = ("F", "B", "I", "W")
# The actions as failures name them.
_ACTION_WORDS = {"F": "its forward", "B": "its backward", "I": "its input-gradient backward (I)",
                 "W": "its weight-gradient backward (W)", "RECV_F": "receiving the activation",
                 "SEND_F": "sending the activation", "RECV_B": "receiving the gradient",
                 "SEND_B": "sending the gradient"}
_BACKWARD = ("B", "I", "W", "RECV_B", "SEND_B")


class _PipelineSchedule:
    """What every schedule does: checks its stages, asks the library for this rank's actions,
    cuts the step's batch into micro-batches and runs the actions."""

    _KIND = None  # the library's name of the schedule

    def __init__(self, stages, n_microbatches, loss_fn, scale_grads):
        name = type(self).__name__
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"tessera.torch.pipelining: {name}: n_microbatches must be a "
                             f"positive int, got {n_microbatches!r}")
        if not stages:
            raise ValueError(f"tessera.torch.pipelining: {name}: no stages")
        for stage in stages:
            if not isinstance(stage, PipelineStage):
                raise TypeError(f"tessera.torch.pipelining: {name}: a stage is a "
                                f"{type(stage).__name__}, not a tessera.torch.pipelining."
                                f"PipelineStage")
        first = stages[0]
        for stage in stages[1:]:
            if stage.group is not first.group or stage.num_stages != first.num_stages:
                raise ValueError(f"tessera.torch.pipelining: {name}: stages {first.stage_index} "
                                 f"and {stage.stage_index} belong to different pipelines "
                                 f"(another group or another num_stages)")
        ranks, per_rank = first.group_size, len(stages)
        indices = sorted(stage.stage_index for stage in stages)
        expected = [first.group_rank + k * ranks for k in range(per_rank)]
        if first.num_stages != ranks * per_rank or indices != expected:
            raise ValueError(f"tessera.torch.pipelining: {name}: this rank ({first.group_rank} "
                             f"of {ranks}) holds stages {indices} of {first.num_stages}; the "
                             f"schedule runs {per_rank} stage(s) on each rank, stage s on rank "
                             f"s mod {ranks}, so it expects stages {expected} of "
                             f"{ranks * per_rank}")
        try:
            plan = _C.pipeline_schedule(self._KIND, ranks, n_microbatches, per_rank)
        except ValueError as e:
            raise ValueError(f"tessera.torch.pipelining: {name}: {e}") from None
        if not _tags_fit(first.num_stages, n_microbatches):
            raise ValueError(f"tessera.torch.pipelining: {name}: {first.num_stages} stages x "
                             f"{n_microbatches} micro-batches need more message tags than a "
                             f"group has")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"tessera.torch.pipelining: {name}: loss_fn is not callable")
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self.scale_grads = scale_grads
        self._has_backward = loss_fn is not None
        self._stages = sorted(stages, key=lambda stage: stage.stage_index)
        self._by_index = {stage.stage_index: stage for stage in self._stages}
        self._actions = [tuple(action) for action in plan["actions"][first.group_rank]]
        self._description = plan["description"]
        self.bubble_fraction = plan["bubble_fraction"]
        # The most micro-batches whose activations this rank should hold at once (the
        # library's simulation); peak_held is what the last step held.
        self.expected_peak_held = plan["peak_held"][first.group_rank]
        self.peak_held = 0
        # The last step's compute actions, (op, stage, micro_batch, start, end), their total
        # and the step's wall time (see the module's docstring).
        self.timeline = []
        self.busy_s = 0.0
        self.step_s = 0.0
        self._prepared = False
        self._failed = None
        self._sends = []
        self._sent_bytes = {"activation": 0, "gradient": 0}  # this step's, for the metrics
        self._metrics_schedule_set = False
        # Zero bubble: F collects what I and W need to split the backward (split_backward.py).
        self._split_backward = self._has_backward and any(a[0] == "I" for a in self._actions)
        if self._split_backward:
            _refuse_fsdp(name, stages)
        # What this rank runs (op, stage, micro-batch), for a failure to name.
        self._action = None
        for stage in self._stages:
            stage._schedule = self
            stage.clear_runtime_states()
        # How the ranks learn which stage failed (failures.py).
        self._watch = FailureWatch(first.group, first._who, self._by_index)

    @property
    def n_microbatches(self):
        return self._n_microbatches

    def __repr__(self):
        return f"{type(self).__name__}({self._description})"

    # ---- step

    def step(self, *args, target=None, losses=None, **kwargs):
        """One training step (or a forward-only one without loss_fn): on the rank of stage 0
        the batch's args (tensors cut along dim 0 into n_microbatches equal parts, other
        values passed to each), on the rank of the last stage target= (cut likewise) and
        losses= (a list that receives each micro-batch's loss); returns the last stage's
        outputs merged along dim 0 there, None elsewhere."""
        if self._failed is not None:
            raise RuntimeError(f"tessera.torch.pipelining: {type(self).__name__}: an earlier "
                               f"step failed, so the pipeline's ranks no longer agree on "
                               f"their messages: {self._failed}")
        started = time.perf_counter()
        started_unix = time.time()
        first, last = self._by_index.get(0), self._by_index.get(self._stages[0].num_stages - 1)
        self.timeline = []
        self.busy_s = self.step_s = 0.0
        for stage in self._stages:
            stage.clear_runtime_states()
            if not self._prepared:
                stage._begin_exchange()
        self.peak_held = 0
        self._sends = []
        self._sent_bytes = {"activation": 0, "gradient": 0}
        internal_losses = {}
        try:
            # Inside: a bad call on the first step reaches the ranks waiting for this one.
            if self._has_backward and not torch.is_grad_enabled():
                raise RuntimeError(f"tessera.torch.pipelining: {type(self).__name__}.step() "
                                   f"trains (it has a loss_fn) and needs gradients enabled, "
                                   f"not torch.no_grad()")
            if losses is not None and not isinstance(losses, list):
                raise TypeError(f"tessera.torch.pipelining: losses must be a list, got a "
                                f"{type(losses).__name__}")
            arg_mbs = kwarg_mbs = target_mbs = None
            if first is not None:
                arg_mbs, kwarg_mbs = self._split_inputs(args, kwargs)
            if last is not None and self._has_backward:
                if target is None:
                    raise ValueError(f"tessera.torch.pipelining: stage {last.stage_index} (the "
                                     f"last) is on this rank and computes loss_fn: step() "
                                     f"needs target=")
                target_mbs = self._split(target, "target")
            if not self._prepared:
                self._prepare(arg_mbs, kwarg_mbs)
                self._prepared = True
            self._run(arg_mbs, kwarg_mbs, target_mbs, internal_losses)
            for work in self._sends:
                work.wait()
            self.busy_s = sum(end - start for _, _, _, start, end in self.timeline)
            self.step_s = time.perf_counter() - started
            self._record_metrics(started, started_unix)
        except BaseException as e:
            self._failed = f"{type(e).__name__}: {e}"
            if not isinstance(e, (PipelineFailure, _PeerFailure)):
                # This rank's own failure: the others, waiting for it, quote this at once.
                self._watch.tell("error", *self._where_failed(e))
            if not self._prepared:
                # The other ranks wait for this one's metadata or answers: tell them why.
                for stage in self._stages:
                    stage._abandon_exchange(e)
            for stage in self._stages:
                stage.clear_runtime_states()
            raise
        finally:
            self._sends = []
        if last is None:
            return None
        if losses is not None and self._has_backward:
            losses.clear()
            losses.extend(internal_losses[m] for m in range(self._n_microbatches))
        chunks = [last.output_chunks.pop(m) for m in range(self._n_microbatches)]
        return _merge(chunks)

    def _record_metrics(self, started, started_unix):
        """The step into this process's tessera_pipeline_* series (the dashboard's pipeline
        timeline): a few dozen gauge writes."""
        if not self._metrics_schedule_set:
            _C.pipeline_set_schedule(self._stages[0].group_rank, self.expected_peak_held,
                                     self.bubble_fraction)
            self._metrics_schedule_set = True
        actions = [(op, s, m, start - started, end - started)
                   for op, s, m, start, end in self.timeline]
        _C.pipeline_record_step(started_unix, self.step_s, actions,
                                self._sent_bytes["activation"], self._sent_bytes["gradient"],
                                self.peak_held)

    def _where_failed(self, error):
        """(stage, text) of this rank's own failure `error`, for the other ranks."""
        who = self._stages[0]._who
        if self._action is None:
            stage = self._stages[0].stage_index
            where = "before its first micro-batch" + ("" if self._prepared else
                                                      " of its first step")
            return stage, f"{who(stage)} failed {where}: {type(error).__name__}: {error}"
        op, stage, m = self._action
        return stage, (f"{who(stage)} failed in {_ACTION_WORDS.get(op, op)} of micro-batch {m}: "
                       f"{type(error).__name__}: {error}")

    def _split(self, value, what):
        """`value` cut along dim 0 into n_microbatches equal parts (a tensor), or repeated."""
        m = self._n_microbatches
        if not isinstance(value, torch.Tensor):
            return [value] * m
        if value.dim() == 0 or value.shape[0] % m != 0:
            size = "a 0-d tensor" if value.dim() == 0 else f"dim 0 of size {value.shape[0]}"
            raise ValueError(f"tessera.torch.pipelining: step(): {what} has {size}, which "
                             f"does not cut into {m} equal micro-batches (every micro-batch "
                             f"has the first one's shape: the stages' messages are sized by "
                             f"it)")
        return list(torch.split(value, value.shape[0] // m))

    def _split_inputs(self, args, kwargs):
        if not args and not kwargs:
            raise ValueError(f"tessera.torch.pipelining: stage 0 is on this rank: step() "
                             f"needs the batch's input")
        columns = [self._split(a, f"argument {i}") for i, a in enumerate(args)]
        kw_columns = {k: self._split(v, f"keyword argument {k!r}") for k, v in kwargs.items()}
        arg_mbs = [tuple(c[m] for c in columns) for m in range(self._n_microbatches)]
        kwarg_mbs = [{k: c[m] for k, c in kw_columns.items()}
                     for m in range(self._n_microbatches)]
        return arg_mbs, kwarg_mbs

    # ---- the first step's metadata

    def _prepare(self, arg_mbs, kwarg_mbs):
        """Link by link, in the stages' order (each rank its own stages in increasing order,
        which cannot deadlock: a stage waits only on stages before it and on the answer of the
        next, which answers before it goes on)."""
        for stage in self._stages:
            previous = self._by_index.get(stage.stage_index - 1)
            args, kwargs = stage._exchange_inputs(
                arg_mbs[0] if stage.is_first else None,
                kwarg_mbs[0] if stage.is_first else None, previous, self._description)
            stage._exchange_outputs(args, kwargs, self._description)

    # ---- the actions

    def _run(self, arg_mbs, kwarg_mbs, target_mbs, internal_losses):
        scale = 1.0 / self._n_microbatches if self.scale_grads else 1.0
        backward = self._has_backward
        held = 0
        timeline = self.timeline
        clock = time.perf_counter
        for op, s, m in self._actions:
            if not backward and op in _BACKWARD:
                continue
            self._action = (op, s, m)
            stage = self._by_index[s]
            # Two clock reads and a tuple per compute action: microseconds against the
            # milliseconds of a stage's forward, so the timeline is always kept.
            start = clock() if op in _COMPUTE else None
            if op == "F":
                if stage.is_first:
                    output = stage._forward(m, arg_mbs[m], kwarg_mbs[m], backward)
                else:
                    output = stage._forward(m, None, None, backward)
                if stage.is_last:
                    stage.output_chunks[m] = _detach(output)
                    if backward:
                        loss = self._loss_fn(output, target_mbs[m])
                        stage._set_loss(m, loss)
                        internal_losses[m] = loss.detach()
                else:
                    after = self._by_index.get(s + 1)
                    if after is not None:
                        after._hand_over_activations(m, stage._outgoing.pop(m), backward)
                if backward:
                    held += 1
                    self.peak_held = max(self.peak_held, held)
            elif op == "B" or op == "I":
                if op == "B":
                    stage._backward(m, scale)
                    held -= 1
                else:
                    stage._backward_input(m, scale)
                before = self._by_index.get(s - 1)
                if before is not None:
                    before._hand_over_gradients(m, stage._input_grads.pop(m))
            elif op == "W":
                stage._backward_weight(m)
                held -= 1
            elif op == "RECV_F":
                stage._recv_activations(m, backward)
            elif op == "SEND_F":
                stage._send_activations(m)
            elif op == "RECV_B":
                stage._recv_gradients(m)
            elif op == "SEND_B":
                stage._send_gradients(m)
            else:
                raise RuntimeError(f"tessera.torch.pipelining: unknown action {op!r} from the "
                                   f"schedule library")
            if start is not None:
                timeline.append((op, s, m, start, clock()))
        self._action = None


def _refuse_fsdp(name, stages):
    """A zero-bubble schedule cannot run FSDP units: FSDP gathers a unit's parameters when
    its output's gradient arrives and reduces them when the parameters' own do, while W runs
    the weights' part from inside the unit, long after I; its gradients would be lost
    silently."""
    from tessera.torch.fsdp import FullyShardedDataParallel
    for stage in stages:
        for path, module in stage.submod.named_modules():
            if isinstance(module, FullyShardedDataParallel):
                raise ValueError(f"tessera.torch.pipelining: {name}: stage {stage.stage_index}'s "
                                 f"module {path or '<root>'!r} is a FullyShardedDataParallel "
                                 f"unit, which a zero-bubble schedule cannot split into I and "
                                 f"W: use Schedule1F1B (or average the gradients over the "
                                 f"data-parallel group with an all_reduce after the step)")


def _detach(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    return value


def _merge(chunks):
    """The micro-batches' outputs as one batch: tensors concatenated along dim 0, tuples and
    lists element by element (torch's default output_merge_spec)."""
    head = chunks[0]
    if isinstance(head, torch.Tensor):
        return torch.cat(chunks, dim=0) if head.dim() > 0 else torch.stack(chunks)
    if isinstance(head, (tuple, list)):
        return type(head)(_merge([c[i] for c in chunks]) for i in range(len(head)))
    return chunks


def _refuse_specs(name, args_chunk_spec, kwargs_chunk_spec, output_merge_spec):
    """torch's chunk and merge specs: only their default (dim 0) is supported."""
    for what, value in (("args_chunk_spec", args_chunk_spec),
                        ("kwargs_chunk_spec", kwargs_chunk_spec),
                        ("output_merge_spec", output_merge_spec)):
        if value is not None:
            raise NotImplementedError(f"tessera.torch.pipelining: {name}: {what} is not "
                                      f"supported: tensors are cut and merged along dim 0")


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule of one stage per rank."""

    def __init__(self, stage, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True):
        _refuse_specs(type(self).__name__, args_chunk_spec, kwargs_chunk_spec,
                      output_merge_spec)
        if isinstance(stage, (list, tuple)):
            raise TypeError(f"tessera.torch.pipelining: {type(self).__name__} runs one stage "
                            f"per rank: pass the stage, not a list (ScheduleInterleaved1F1B "
                            f"runs several)")
        super().__init__([stage], n_microbatches, loss_fn, scale_grads)
        if stage.num_stages != stage.group_size:
            raise ValueError(f"tessera.torch.pipelining: {type(self).__name__}: "
                             f"{stage.num_stages} stages over {stage.group_size} ranks; it "
                             f"runs one stage per rank")
        self._stage = stage


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank (stage s on rank s mod P)."""

    def __init__(self, stages, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True):
        _refuse_specs(type(self).__name__, args_chunk_spec, kwargs_chunk_spec,
                      output_merge_spec)
        if isinstance(stages, PipelineStage):
            stages = [stages]
        super().__init__(list(stages), n_microbatches, loss_fn, scale_grads)


class ScheduleGPipe(PipelineScheduleSingle):
    """Every forward, then every backward: holds all M micro-batches' activations."""

    _KIND = "gpipe"


class Schedule1F1B(PipelineScheduleSingle):
    """One forward, one backward: at most P - r micro-batches held on rank r. Needs
    n_microbatches >= P."""

    _KIND = "1f1b"


class ScheduleZBH1(PipelineScheduleSingle):
    """1F1B with each backward split into the input's gradient (I, which the stage before
    waits for) and the weights' (W, which nobody waits for, run later to fill the bubble:
    Qi et al. 2023, ZB-H1). I differentiates with respect to the stage's inputs and keeps the
    gradients flowing into the nodes where the weights join; W starts from those alone, so
    neither recomputes the other's part (split_backward.py). Needs n_microbatches >= P."""

    _KIND = "zb-h1"


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """1F1B over several stages per rank (Narayanan et al. 2021): the bubble shrinks about
    V-fold for V stages per rank. Needs n_microbatches a multiple of P."""

    _KIND = "interleaved"
