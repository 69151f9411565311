"""PipelineStage: one stage of a pipeline on its rank (torch.distributed.pipelining's, 2.6).

A stage wraps the piece of the model it runs (its submodule) and moves its tensors: it receives
its input activations from the stage before and its output gradients from the stage after, and
sends the others. The schedules (schedules.py) decide when; the stage knows how.

Words (worker/pipeline/pipeline_schedule.h's): stage s of S runs on rank s mod P of the
pipeline group; a micro-batch m is one of the M pieces of a step's batch; the link s is the
pair of stages (s, s + 1), over which activations go up and gradients come back.

Messages are point-to-point sends and receives on the stage's group, each with a tag unique to
its kind, link and micro-batch (_Tags), so that no two streams can be matched against each
other whatever order the ranks run them in. The first step of a schedule exchanges each link's
metadata both ways before any activation (_MetadataExchange in schedules.py): the sender's
output shapes and dtypes go up, and the receiver answers with what it expected, so a mismatch
fails both ranks at once naming both sides.
"""

import json

import torch
import torch.distributed as dist

from tessera.torch.pipelining import split_backward
from tessera.torch.pipelining.failures import PipelineFailure

__all__ = ["PipelineStage", "PipeliningShapeError"]


class PipeliningShapeError(RuntimeError):
    """Stages disagree on an activation's (or gradient's) shape or dtype (torch's name)."""


class _PeerFailure(RuntimeError):
    """The ranks of a stage pair disagree (other than on shapes), or another rank of the
    pipeline failed during the first step and said why."""


def _raise_from_peer(message):
    if message.get("kind") == "shape":
        raise PipeliningShapeError(message["error"])
    raise _PeerFailure(message["error"])


# Tags: _TAG_BASE + (kind * S + link) * M + micro-batch, below 2^31 (torch's tags are ints; a
# tessera group's tags are below 2^32). Far above the small tags programs give their own
# sends on the same group.
_TAG_BASE = 1 << 30
_ACTIVATION, _GRADIENT, _METADATA, _REPLY = range(4)
_KINDS = 4
_MAX_TAGS = (1 << 31) - 1 - _TAG_BASE


def _tags_fit(num_stages, n_microbatches):
    return _KINDS * num_stages * n_microbatches <= _MAX_TAGS


def _as_tuple(value):
    """A stage's inputs or outputs as a tuple (torch passes a lone tensor as is)."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


def _differentiable(tensor):
    return tensor.is_floating_point() or tensor.is_complex()


class _TensorMeta:
    """What a stage says of one tensor it sends: shape, dtype, and whether a gradient comes
    back for it."""

    def __init__(self, shape, dtype, requires_grad):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.requires_grad = bool(requires_grad)

    @staticmethod
    def of(tensor):
        return _TensorMeta(tensor.shape, tensor.dtype, _differentiable(tensor))

    def to_json(self):
        return {"shape": list(self.shape), "dtype": str(self.dtype).replace("torch.", ""),
                "requires_grad": self.requires_grad}

    @staticmethod
    def from_json(value):
        dtype = getattr(torch, str(value["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise PipeliningShapeError(f"unknown dtype {value['dtype']!r} in pipeline metadata")
        return _TensorMeta(value["shape"], dtype, value["requires_grad"])

    def same_as(self, other):
        return self.shape == other.shape and self.dtype == other.dtype

    def __str__(self):
        return f"shape {self.shape} and dtype {self.dtype}"


def _metas_of(values, what, tensors_only=False):
    """The metadata of a stage's tensors; tensors_only: stage 0's inputs, which may hold other
    values too (they never travel), of which only the tensors are described."""
    metas = []
    for i, value in enumerate(_as_tuple(values)):
        if not isinstance(value, torch.Tensor):
            if tensors_only:
                continue
            raise TypeError(f"tessera.torch.pipelining: {what}[{i}] is a {type(value).__name__}"
                            ": a stage sends and receives tensors only")
        metas.append(_TensorMeta.of(value))
    return metas


def _describe_metas(metas):
    if len(metas) == 1:
        return str(metas[0])
    return "(" + "; ".join(str(m) for m in metas) + ")"


def _mismatch(metas_sent, metas_expected):
    """Why what a stage sends is not what the next expects, or ""."""
    if len(metas_sent) != len(metas_expected):
        return f"{len(metas_sent)} tensors against {len(metas_expected)}"
    for sent, expected in zip(metas_sent, metas_expected):
        if not sent.same_as(expected):
            return "shapes or dtypes differ"
    return ""


class PipelineStage:
    """One stage of a pipeline: `submodule` is stage `stage_index` of `num_stages`, run on
    `device` by this rank, which must be rank stage_index mod P of `group` (the world when
    None), P being the group's size.

    input_args / output_args: one micro-batch's inputs and outputs (tensors, real or on the
    meta device), as torch takes them; without them the shapes are inferred at the first step
    (stage 0 from its micro-batch, each next stage from the metadata the stage before sends).
    With input_args and no output_args the outputs are inferred by running the submodule on
    zeros of input_args' shapes. Either way the first step checks, link by link, that what a
    stage sends is what the next expects.

    Thread-safety: a stage is driven by its schedule, from one thread.
    """

    def __init__(self, submodule, stage_index, num_stages, device, input_args=None,
                 output_args=None, group=None):
        if not isinstance(submodule, torch.nn.Module):
            raise TypeError(f"tessera.torch.pipelining: PipelineStage: submodule is a "
                            f"{type(submodule).__name__}, not an nn.Module")
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"tessera.torch.pipelining: PipelineStage: num_stages must be a "
                             f"positive int, got {num_stages!r}")
        if not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"tessera.torch.pipelining: PipelineStage: stage_index "
                             f"{stage_index!r} is not in 0 .. {num_stages - 1}")
        if not dist.is_initialized():
            raise RuntimeError("tessera.torch.pipelining: PipelineStage needs "
                               "torch.distributed.init_process_group first")
        self.submod = submodule
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = torch.device(device)
        self.group = group
        self.group_rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        if self.group_rank < 0:
            raise ValueError(f"tessera.torch.pipelining: stage {stage_index}: this process "
                             f"(rank {dist.get_rank()}) is not a member of the group given")
        if num_stages % self.group_size != 0:
            raise ValueError(f"tessera.torch.pipelining: stage {stage_index}: {num_stages} "
                             f"stages over a group of {self.group_size} ranks: num_stages must "
                             f"be a multiple of the group's size (stage s runs on rank s mod P)")
        if stage_index % self.group_size != self.group_rank:
            raise ValueError(f"tessera.torch.pipelining: stage {stage_index} of {num_stages} "
                             f"runs on rank {stage_index % self.group_size} of the "
                             f"{self.group_size}-rank group (stage s on rank s mod P), not on "
                             f"this rank {self.group_rank}")
        self.inputs_meta = None  # [_TensorMeta], given or learnt at the first step
        self._outputs_meta = None
        self._given_inputs = input_args is not None
        if input_args is not None:
            self.inputs_meta = _metas_of(input_args, f"stage {stage_index}'s input_args")
            if output_args is None:
                output_args = self._infer_outputs(self.inputs_meta, "its input_args")
            self._outputs_meta = _metas_of(output_args, f"stage {stage_index}'s output_args")
        elif output_args is not None:
            raise ValueError(f"tessera.torch.pipelining: stage {stage_index}: output_args "
                             f"without input_args (give both, or neither to infer them at the "
                             f"first step)")
        self._schedule = None
        self.clear_runtime_states()

    # ---- what torch's stage offers

    @property
    def is_first(self):
        return self.stage_index == 0

    @property
    def is_last(self):
        return self.stage_index == self.num_stages - 1

    def get_outputs_meta(self):
        """The outputs' shapes and dtypes as meta tensors (after the first step, or at once
        with input_args)."""
        if self._outputs_meta is None:
            raise RuntimeError(f"tessera.torch.pipelining: stage {self.stage_index}: outputs "
                               f"are not known before the first step")
        return tuple(torch.empty(m.shape, dtype=m.dtype, device="meta")
                     for m in self._outputs_meta)

    def scale_grads(self, grad_scale_factor):
        """Divides the submodule's .grad by grad_scale_factor (torch's stage method; the
        schedules scale their own contribution instead, see schedules.py)."""
        if grad_scale_factor != 1:
            for p in self.submod.parameters():
                if p.grad is not None:
                    p.grad.div_(grad_scale_factor)

    def clear_runtime_states(self):
        """Forgets everything of the step running (after a step, or a failed one)."""
        self._received = {}     # m -> inputs received or handed over (leaves)
        self._outgoing = {}     # m -> detached outputs for the next stage
        self._output_grads = {}  # m -> gradients of the outputs, received or handed over
        self._input_grads = {}  # m -> gradients of the inputs, for the stage before
        self._forward_state = {}  # m -> (inputs, tensors to differentiate); held activations
        self._candidates = {}  # m -> candidate anchors of F, for I (zero bubble)
        self._weight_pending = {}  # m -> split_backward.WeightWork after I, before W
        self.output_chunks = {}  # m -> the last stage's detached outputs
        self.held = 0
        self.peak_held = 0

    # ---- addresses

    def _who(self, stage=None):
        stage = self.stage_index if stage is None else stage
        if self.group is None or self.group is dist.group.WORLD:
            return f"stage {stage} (rank {stage % self.group_size})"
        return (f"stage {stage} (rank {stage % self.group_size} of the pipeline group, world "
                f"rank {self._global_rank(stage)})")

    def _global_rank(self, stage):
        group_rank = stage % self.group_size
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def _remote(self, stage):
        return 0 <= stage < self.num_stages and stage % self.group_size != self.group_rank

    def _tag(self, kind, link, micro_batch):
        m = self._schedule.n_microbatches
        return _TAG_BASE + (kind * self.num_stages + link) * m + micro_batch

    # ---- messages

    def _send(self, tensor, stage, tag):
        work = dist.isend(tensor.detach().contiguous(), self._global_rank(stage),
                          group=self.group, tag=tag)
        self._schedule._sends.append(work)

    def _recv(self, tensor, stage, tag, what):
        peer = self._global_rank(stage)
        try:
            work = dist.irecv(tensor, peer, group=self.group, tag=tag)
            # Waits in slices, reading the other ranks' failure notices (failures.py).
            self._schedule._watch.wait(work, self.stage_index, stage, peer, what)
        except (PipelineFailure, _PeerFailure, PipeliningShapeError):
            raise
        except Exception as e:
            raise RuntimeError(f"tessera.torch.pipelining: {self._who()}: receiving {what} "
                               f"from {self._who(stage)}: {e}") from e

    def _send_json(self, value, stage, tag):
        payload = torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)
        self._send(torch.tensor([payload.numel()], dtype=torch.int64), stage, tag)
        self._send(payload, stage, tag)

    def _recv_json(self, stage, tag, what):
        size = torch.zeros(1, dtype=torch.int64)
        self._recv(size, stage, tag, what)
        if not 0 < int(size) <= 1 << 20:
            raise PipeliningShapeError(f"tessera.torch.pipelining: {self._who()}: {what} from "
                                       f"{self._who(stage)} claims {int(size)} bytes")
        payload = torch.zeros(int(size), dtype=torch.uint8)
        self._recv(payload, stage, tag, what)
        return json.loads(bytes(payload.tolist()).decode())

    # ---- the first step: shapes, link by link

    def _infer_outputs(self, metas, source):
        """The outputs of the submodule on zeros of `metas` (no gradients kept)."""
        args = [torch.zeros(m.shape, dtype=m.dtype, device=self.device) for m in metas]
        try:
            with torch.no_grad():
                return self.submod(*args)
        except Exception as e:
            raise RuntimeError(f"tessera.torch.pipelining: {self._who()}: inferring its "
                               f"outputs from {source} ({_describe_metas(metas)}) failed: "
                               f"{type(e).__name__}: {e}") from e

    def _exchange_inputs(self, first_args, first_kwargs, previous, expected_schedule):
        """Learns (and checks) the inputs of micro-batch 0: from stage 0's own micro-batch,
        from the stage before on this rank, or from the metadata the stage before sends, which
        it answers with its verdict. Sets inputs_meta; returns the args to infer the outputs
        from (stage 0: its real micro-batch)."""
        s = self.stage_index
        if self.is_first:
            metas = _metas_of(first_args, "stage 0's micro-batch 0 args", tensors_only=True)
            if self._given_inputs and _mismatch(metas, self.inputs_meta):
                raise PipeliningShapeError(
                    f"tessera.torch.pipelining: {self._who()}, micro-batch 0: the step's input "
                    f"has {_describe_metas(metas)}; the stage's input_args "
                    f"{_describe_metas(self.inputs_meta)}")
            self.inputs_meta = metas
            return first_args, first_kwargs
        if previous is not None:  # on this rank
            sent, source = previous._outputs_meta, f"{self._who(s - 1)}, on this rank,"
        else:
            tag = self._tag(_METADATA, s - 1, 0)
            message = self._recv_json(s - 1, tag, "the activations' metadata")
            if "error" in message:
                _raise_from_peer(message)
            sent = [_TensorMeta.from_json(t) for t in message["tensors"]]
            source = self._who(s - 1)
            error, kind = "", ""
            if message["schedule"] != expected_schedule:
                error = (f"tessera.torch.pipelining: {source} and {self._who()} run different "
                         f"schedules: {message['schedule']} against {expected_schedule}")
            elif self._given_inputs and _mismatch(sent, self.inputs_meta):
                error, kind = self._shape_error(sent, source), "shape"
            self._send_json({"error": error, "kind": kind} if error else {"ok": True}, s - 1,
                            self._tag(_REPLY, s - 1, 0))
            self._reply_sent = True
            if error:
                _raise_from_peer({"error": error, "kind": kind})
        if self._given_inputs and _mismatch(sent, self.inputs_meta):
            raise PipeliningShapeError(self._shape_error(sent, source))
        self.inputs_meta = sent
        return None, {}

    def _shape_error(self, sent, source):
        s = self.stage_index
        return (f"tessera.torch.pipelining: {source} -> {self._who()}, micro-batch 0: stage "
                f"{s - 1} sends an activation of {_describe_metas(sent)}; stage {s} expects "
                f"{_describe_metas(self.inputs_meta)} (its input_args)")

    def _exchange_outputs(self, args, kwargs, schedule_description):
        """Infers the outputs (unless given), and sends their metadata to a next stage on
        another rank, whose verdict it waits for: a mismatch fails both."""
        if self._outputs_meta is None or self.is_first:
            if args is not None:  # stage 0: its real micro-batch 0
                try:
                    with torch.no_grad():
                        outputs = self.submod(*args, **kwargs)
                except Exception as e:
                    raise RuntimeError(f"tessera.torch.pipelining: {self._who()}: its forward "
                                       f"on micro-batch 0 failed: {type(e).__name__}: {e}") from e
            else:
                outputs = self._infer_outputs(self.inputs_meta, "the inputs it receives")
            inferred = _metas_of(outputs, f"{self._who()}'s outputs")
            if self._outputs_meta is not None and _mismatch(inferred, self._outputs_meta):
                raise PipeliningShapeError(
                    f"tessera.torch.pipelining: {self._who()}, micro-batch 0: its forward "
                    f"returns {_describe_metas(inferred)}; its output_args say "
                    f"{_describe_metas(self._outputs_meta)}")
            self._outputs_meta = inferred
        s = self.stage_index
        if self._remote(s + 1):
            self._send_json({"tensors": [m.to_json() for m in self._outputs_meta],
                             "schedule": schedule_description}, s + 1,
                            self._tag(_METADATA, s, 0))
            self._metadata_sent = True
            reply = self._recv_json(s + 1, self._tag(_REPLY, s, 0), "the answer to its metadata")
            if "error" in reply:
                _raise_from_peer(reply)

    def _begin_exchange(self):
        self._metadata_sent = False
        self._reply_sent = False

    def _abandon_exchange(self, error):
        """After `error` on this rank during the first step: tells the neighbours on other
        ranks that still wait for this stage's metadata or answer, so they fail at once
        quoting the root cause instead of at their deadline."""
        if isinstance(error, (PipeliningShapeError, _PeerFailure)):
            message = {"error": str(error),
                       "kind": "shape" if isinstance(error, PipeliningShapeError) else ""}
        else:
            message = {"error": f"tessera.torch.pipelining: rank {self.group_rank} of the "
                                f"pipeline failed in the first step: {type(error).__name__}: "
                                f"{error}", "kind": ""}
        s = self.stage_index
        try:
            if self._remote(s + 1) and not self._metadata_sent:
                self._send_json(message, s + 1, self._tag(_METADATA, s, 0))
                self._metadata_sent = True
            if self._remote(s - 1) and not self._reply_sent:
                self._send_json(message, s - 1, self._tag(_REPLY, s - 1, 0))
                self._reply_sent = True
        except Exception:  # the root cause matters more than a failed notice
            pass

    # ---- the actions

    def _held_changed(self, delta):
        self.held += delta
        self.peak_held = max(self.peak_held, self.held)

    def _check(self, tensors, metas, what, m):
        got = _metas_of(tensors, what, tensors_only=self.is_first and metas is self.inputs_meta)
        if _mismatch(got, metas) and metas is self._outputs_meta and not self.is_last:
            s = self.stage_index
            raise PipeliningShapeError(
                f"tessera.torch.pipelining: {self._who()} -> {self._who(s + 1)}, micro-batch "
                f"{m}: stage {s}'s forward returns {_describe_metas(got)}; stage {s + 1} "
                f"expects {_describe_metas(metas)} (the first step's: micro-batches keep the "
                f"first step's shapes)")
        if _mismatch(got, metas):
            raise PipeliningShapeError(
                f"tessera.torch.pipelining: {self._who()}, micro-batch {m}: {what} "
                f"{_describe_metas(got)}; the first step's were {_describe_metas(metas)} "
                f"(micro-batches keep the first step's shapes)")

    def _recv_activations(self, m, has_backward):
        s = self.stage_index
        tag = self._tag(_ACTIVATION, s - 1, m)
        inputs = []
        for meta in self.inputs_meta:
            buffer = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
            self._recv(buffer, s - 1, tag, f"the activation of micro-batch {m}")
            inputs.append(buffer.requires_grad_(has_backward and meta.requires_grad))
        self._received[m] = tuple(inputs)

    def _hand_over_activations(self, m, outputs, has_backward):
        """The stage before, on this rank, made `outputs`: this stage's inputs, as leaves."""
        self._received[m] = tuple(
            o.detach().requires_grad_(has_backward and meta.requires_grad)
            for o, meta in zip(outputs, self.inputs_meta))

    def _send_activations(self, m):
        s = self.stage_index
        for tensor in self._outgoing.pop(m):
            self._send(tensor, s + 1, self._tag(_ACTIVATION, s, m))
            self._schedule._sent_bytes["activation"] += tensor.numel() * tensor.element_size()

    def _forward(self, m, args, kwargs, has_backward):
        """Runs micro-batch m; returns the submodule's output (the last stage's, for the
        loss). `args` are stage 0's; the others take what they received."""
        if self.is_first:
            self._check(args, self.inputs_meta, "the step's input has", m)
            inputs = ()
        else:
            inputs = self._received.pop(m)
            args, kwargs = inputs, {}
        if has_backward and self._schedule._split_backward:
            # I and W need the anchors of the weights' gradients (split_backward.py).
            with split_backward.Candidates(self.submod) as candidates:
                output = self.submod(*args, **kwargs)
            self._candidates[m] = candidates.by_node
        elif has_backward:
            output = self.submod(*args, **kwargs)
        else:
            with torch.no_grad():
                output = self.submod(*args, **kwargs)
        outputs = _as_tuple(output)
        self._check(outputs, self._outputs_meta, "its forward returns", m)
        if not self.is_last:
            self._outgoing[m] = tuple(o.detach() for o in outputs)
        if has_backward:
            self._forward_state[m] = (inputs, outputs)
            self._held_changed(1)
        return output

    def _set_loss(self, m, loss):
        """The last stage differentiates its loss, not its outputs."""
        inputs, _ = self._forward_state[m]
        self._forward_state[m] = (inputs, (loss,))

    def _recv_gradients(self, m):
        s = self.stage_index
        tag = self._tag(_GRADIENT, s, m)
        grads = []
        for meta in self._outputs_meta:
            if meta.requires_grad:
                buffer = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
                self._recv(buffer, s + 1, tag, f"the gradient of micro-batch {m}")
                grads.append(buffer)
            else:
                grads.append(None)
        self._output_grads[m] = grads

    def _hand_over_gradients(self, m, grads):
        """The stage after, on this rank, made the gradients of this stage's outputs."""
        self._output_grads[m] = list(grads)

    def _send_gradients(self, m):
        s = self.stage_index
        for grad in self._input_grads.pop(m):
            if grad is not None:
                self._send(grad, s - 1, self._tag(_GRADIENT, s - 1, m))
                self._schedule._sent_bytes["gradient"] += grad.numel() * grad.element_size()

    def _differentiated(self, m, loss_scale):
        """(tensors, their gradients) that micro-batch m's backward starts from."""
        inputs, outputs = self._forward_state.pop(m)
        if self.is_last:
            loss = outputs[0]
            return inputs, [loss], [torch.full_like(loss, loss_scale)]
        grads = self._output_grads.pop(m)
        tensors, seeds = [], []
        for output, grad in zip(outputs, grads):
            # An output that needs no gradient (made from nothing trainable) still had its
            # gradient sent: it is received and dropped.
            if grad is not None and output.requires_grad:
                tensors.append(output)
                seeds.append(grad)
        return inputs, tensors, seeds

    def _backward(self, m, loss_scale):
        """B: the input's and the weights' gradients of micro-batch m."""
        inputs, tensors, seeds = self._differentiated(m, loss_scale)
        if tensors:
            torch.autograd.backward(tensors, grad_tensors=seeds)
        if not self.is_first:
            self._input_grads[m] = self._input_grad_list(inputs, [i.grad for i in inputs])
        self._held_changed(-1)

    def _backward_input(self, m, loss_scale):
        """I (zero bubble): the input's gradient only; keeps what W needs of the graph."""
        inputs, tensors, seeds = self._differentiated(m, loss_scale)
        candidates = self._candidates.pop(m, {})
        params = [p for p in self.submod.parameters() if p.requires_grad]
        if tensors:
            grads, work = split_backward.backward_input(tensors, seeds, inputs, params,
                                                        candidates)
        else:
            grads, work = [None] * len(inputs), split_backward.WeightWork([], [], [], [])
        if not self.is_first:
            self._input_grads[m] = self._input_grad_list(inputs, grads)
        self._weight_pending[m] = work

    def _backward_weight(self, m):
        """W (zero bubble): the weights' gradients of micro-batch m, into .grad, from what I
        kept and nothing of the input side; frees the graph."""
        self._weight_pending.pop(m).run()
        self._held_changed(-1)

    def _input_grad_list(self, inputs, grads):
        """The gradients the stage before waits for: one per input that takes one (zeros for
        an input the stage did not use)."""
        return [None if not meta.requires_grad else
                (g if g is not None else torch.zeros_like(i))
                for i, g, meta in zip(inputs, grads, self.inputs_meta)]
