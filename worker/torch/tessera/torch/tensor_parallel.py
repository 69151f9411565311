"""torch.distributed.tensor.parallel for torch 1.13 (issue 46): ColwiseParallel, RowwiseParallel,
SequenceParallel and parallelize_module with PyTorch 2.6's names and semantics, on plain
tensors (no DTensor). A program written for torch's changes

    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)
    from torch.distributed.tensor import Replicate, Shard
to
    from tessera.torch.tensor_parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module, Replicate,
        Shard)

Megatron-LM's tensor parallelism over the ranks of one group (the "TP group", T ranks, this
rank's index r in it):

  column layer  (ColwiseParallel on nn.Linear): rank r holds rows [r*n/T, (r+1)*n/T) of the
                weight (n = out_features) and of the bias, takes the full input and gives its
                slice of the output's last dim. Backward all-reduces the input's gradient
                (each rank's holds only its rows' part): Megatron's "f".
  row layer     (RowwiseParallel on nn.Linear): rank r holds columns [r*k/T, (r+1)*k/T) of the
                weight (k = in_features), takes the input's slice of the last dim (what a
                column layer gives) and all-reduces its partial output in forward, adding the
                bias (whole on every rank) once, after: Megatron's "g". Backward needs no
                collective.

A column layer followed by a row layer (an MLP block, attention) thus costs one all-reduce in
forward and one in backward. On nn.Embedding, ColwiseParallel shards embedding_dim (output
sharded on the last dim, as a column layer's) and RowwiseParallel shards num_embeddings (each
rank looks up the ids in its rows, zeros the others, and the output is all-reduced).

Sequence parallelism (Megatron-SP): between the blocks each rank holds its slice of the
sequence dim. A column layer with input_layouts=Shard(1) all-gathers it before the layer (and
reduce-scatters the gradient), a row layer with output_layouts=Shard(1) reduce-scatters its
partial outputs instead of all-reducing them (and all-gathers the gradient), and the modules
between them (norms, dropout) run on the slice under SequenceParallel, their replicated
parameters' gradients all-reduced: the same traffic as the all-reduces, activations T times
smaller.

Parameters become nn.Parameters holding this rank's shard (the modules' in_features,
out_features, num_embeddings and embedding_dim keep the full layer's values), cut from the full
module's values; with src_data_rank=0 (the default, as in torch) those values are first
broadcast from the TP group's rank 0, so every rank starts from one model, the model a single
process with the same seed would build.
"""

import fnmatch
import types
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from tessera.torch.device_mesh import DeviceMesh

__all__ = ["ColwiseParallel", "ParallelStyle", "Replicate", "RowwiseParallel",
           "SequenceParallel", "Shard", "parallelize_module"]


# -- placements ---------------------------------------------------------------------------------

class Replicate:
    """torch.distributed.tensor.Replicate: every rank of the group holds the whole tensor."""

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class Shard:
    """torch.distributed.tensor.Shard(dim): the ranks of the group hold equal slices of the
    tensor along dim, in rank order."""

    def __init__(self, dim):
        self.dim = dim

    def __eq__(self, other):
        return isinstance(other, Shard) and self.dim == other.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"


def _is_last_dim_shard(placement):
    return isinstance(placement, Shard) and placement.dim == -1


# -- the collectives autograd sees --------------------------------------------------------------

def _all_reduce(tensor, group):
    # all_reduce works in place: reduce a copy, never a tensor autograd may have saved.
    tensor = tensor.contiguous().clone()
    dist.all_reduce(tensor, group=group)
    return tensor


def _check_split(tensor, dim, group, what):
    size = dist.get_world_size(group)
    if tensor.size(dim) % size:
        raise ValueError(f"tessera tensor parallel: rank {dist.get_rank()}: {what}: a tensor "
                         f"of shape {tuple(tensor.shape)} cannot be split on dim {dim} among "
                         f"the {size} ranks of the tensor-parallel group")
    return tensor.size(dim) // size


def _all_gather(tensor, dim, group):
    """The ranks' tensors concatenated along dim, in group rank order."""
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=dim)


def _local_slice(tensor, dim, group, what):
    """This rank's slice along dim (the group's ranks in order)."""
    width = _check_split(tensor, dim, group, what)
    return tensor.narrow(dim, dist.get_rank(group) * width, width).contiguous()


def _reduce_scatter(tensor, dim, group, what):
    """The sum over the ranks of their tensors, of which this rank keeps its slice along
    dim."""
    _check_split(tensor, dim, group, what)
    chunks = [c.contiguous() for c in tensor.chunk(dist.get_world_size(group), dim=dim)]
    output = torch.empty_like(chunks[0])
    dist.reduce_scatter(output, chunks, group=group)
    return output


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient over the group (Megatron's f)."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward (Megatron's g)."""

    # Its backward neither computes nor communicates: zero bubble's W may run it again
    # between a weight's node and its anchor (pipelining/split_backward.py).
    tessera_cheap_backward = True

    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """Forward all-gathers the ranks' slices along dim into the replicated tensor; backward
    keeps this rank's slice of the (replicated) gradient."""

    tessera_cheap_backward = True  # a slice: see _ReduceFromGroup

    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _local_slice(grad, ctx.dim, ctx.group, "backward of an all-gather"), None, None


class _Split(torch.autograd.Function):
    """Forward keeps this rank's slice along dim of a replicated tensor; backward all-gathers
    the slices' gradients, so every rank has the whole (replicated) gradient."""

    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _local_slice(tensor, dim, group, "the input")

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class _GatherFromSequence(torch.autograd.Function):
    """Sequence parallelism's entry to a column layer: forward all-gathers the ranks' slices
    along dim; backward reduce-scatters the gradient, each rank's holding only its columns'
    part of every position (Megatron-SP's g-bar)."""

    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return (_reduce_scatter(grad, ctx.dim, ctx.group, "backward of an all-gather"), None,
                None)


class _ReduceScatter(torch.autograd.Function):
    """Sequence parallelism's exit from a row layer: forward sums the partial outputs and
    keeps this rank's slice along dim; backward all-gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(tensor, dim, group, "the output")

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


# -- styles -------------------------------------------------------------------------------------

class ParallelStyle:
    """torch.distributed.tensor.parallel.ParallelStyle: how parallelize_module changes one
    module. Subclasses implement _apply(module, group, name, src_data_rank)."""

    def _apply(self, module, group, name, src_data_rank):
        raise NotImplementedError


def _refuse(style, name, what):
    raise NotImplementedError(f"tessera tensor parallel: {style} on '{name}': {what}")


def _check_options(style, input_layouts, output_layouts, use_local_output):
    for label, layout in (("input_layouts", input_layouts), ("output_layouts", output_layouts)):
        if layout is not None and not isinstance(layout, (Replicate, Shard)):
            raise TypeError(f"tessera tensor parallel: {style}({label}={layout!r}): a "
                            f"placement, Replicate() or Shard(dim)")
    if not use_local_output:
        raise NotImplementedError(f"tessera tensor parallel: {style}(use_local_output=False): "
                                  f"there is no DTensor here, outputs are local tensors")


def _shard_parameter(module, param_name, dim, group, src_data_rank):
    """Replaces module.<param_name> by this rank's slice along dim of its full value (first
    broadcast from the group's rank src_data_rank unless that is None)."""
    full = getattr(module, param_name)
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    data = full.detach().clone()
    if src_data_rank is not None:
        dist.broadcast(data, src=_global_rank(group, src_data_rank), group=group)
    if dim is None:
        local = data
    else:
        width = data.size(dim) // size
        local = data.narrow(dim, rank * width, width).clone()
    module.register_parameter(param_name, nn.Parameter(local, requires_grad=full.requires_grad))
    # Where the shard lies in the full tensor, for distributed_checkpoint's state dicts (which
    # find it by the module, since FSDP may flatten the parameter later).
    placements = getattr(module, "_tessera_tp_placements", None)
    if placements is None:
        placements = module._tessera_tp_placements = {}
    placements[param_name] = None if dim is None else (dim, rank, size, tuple(data.shape))


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    ranks = dist.get_process_group_ranks(group)
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"tessera tensor parallel: src_data_rank={group_rank} is not a rank "
                         f"of the tensor-parallel group of {len(ranks)} ranks")
    return ranks[group_rank]


def _check_divisible(style, name, module, attribute, size):
    value = getattr(module, attribute)
    if value % size:
        raise ValueError(f"tessera tensor parallel: {style} on '{name}' "
                         f"({type(module).__name__}): {attribute} {value} is not divisible by "
                         f"the tensor-parallel group size {size}")


def _check_embedding(style, name, module, rowwise):
    if module.max_norm is not None:
        _refuse(style, name, "nn.Embedding with max_norm (renormalizing rows needs the whole "
                             "row on one rank) is not supported")
    if rowwise and module.scale_grad_by_freq:
        _refuse(style, name, "nn.Embedding with scale_grad_by_freq is not supported")


def _mark(module, style, name):
    if any(hasattr(m, "_tessera_fsdp_param_names") for m in module.modules()):
        raise ValueError(f"tessera tensor parallel: '{name}' is already inside a "
                         f"FullyShardedDataParallel unit: apply parallelize_module first, "
                         f"then wrap the model in FSDP (as with torch's)")
    if getattr(module, "_tessera_tp_style", None) is not None:
        raise ValueError(f"tessera tensor parallel: '{name}' is already parallelized "
                         f"({module._tessera_tp_style}); a module takes one style")
    module._tessera_tp_style = style


def _ids(input, layout, group):
    """An embedding's ids as every rank gives them (Replicate()) or all-gathered along their
    sharded dim (they carry no gradient)."""
    return input if layout == Replicate() else _all_gather(input, layout.dim, group)


class ColwiseParallel(ParallelStyle):
    """torch.distributed.tensor.parallel.ColwiseParallel: shards nn.Linear's output features
    (the weight's rows and the bias) or nn.Embedding's embedding_dim across the group.

    input_layouts: Replicate() (the default): every rank gives the whole input; or Shard(d)
    (sequence parallelism: each rank gives its slice along d, all-gathered before the layer,
    the gradient reduce-scattered back). output_layouts: Shard(-1) (the default): the output
    is this rank's slice of the last dim, as a following RowwiseParallel wants it; or
    Replicate(): all-gathered into the whole output on every rank. use_local_output must be
    True (outputs are plain tensors). Other layouts raise NotImplementedError.
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__()
        _check_options("ColwiseParallel", input_layouts, output_layouts, use_local_output)
        self.input_layouts = (input_layouts or Replicate(),)
        self.output_layouts = (output_layouts or Shard(-1),)
        self.use_local_output = use_local_output

    def __repr__(self):
        return (f"ColwiseParallel(input_layouts={self.input_layouts[0]}, "
                f"output_layouts={self.output_layouts[0]})")

    def _apply(self, module, group, name, src_data_rank):
        style = "ColwiseParallel"
        input_layout = self.input_layouts[0]
        gather = self.output_layouts[0] == Replicate()
        if not gather and not _is_last_dim_shard(self.output_layouts[0]):
            _refuse(style, name, f"output_layouts={self.output_layouts[0]} is not supported "
                                 f"(Shard(-1) or Replicate())")
        size = dist.get_world_size(group)

        def finish(output):
            return _Gather.apply(output, -1, group) if gather else output

        if isinstance(module, nn.Linear):
            _check_divisible(style, name, module, "out_features", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 0, group, src_data_rank)
            if module.bias is not None:
                _shard_parameter(module, "bias", 0, group, src_data_rank)

            def forward(self_, input):
                if input_layout == Replicate():
                    input = _CopyToGroup.apply(input, group)
                else:
                    input = _GatherFromSequence.apply(input, input_layout.dim, group)
                return finish(F.linear(input, self_.weight, self_.bias))
        elif isinstance(module, nn.Embedding):
            _check_embedding(style, name, module, rowwise=False)
            _check_divisible(style, name, module, "embedding_dim", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 1, group, src_data_rank)

            def forward(self_, input):
                output = F.embedding(_ids(input, input_layout, group), self_.weight,
                                     self_.padding_idx, None, 2.0, self_.scale_grad_by_freq,
                                     self_.sparse)
                return finish(output)
        else:
            _refuse(style, name, f"{type(module).__name__} is not supported (nn.Linear and "
                                 f"nn.Embedding are)")
        module.forward = types.MethodType(forward, module)
        return module


class RowwiseParallel(ParallelStyle):
    """torch.distributed.tensor.parallel.RowwiseParallel: shards nn.Linear's input features
    (the weight's columns; the bias stays whole) or nn.Embedding's num_embeddings across the
    group, and sums the ranks' partial outputs.

    input_layouts: for nn.Linear Shard(-1) (the default: this rank's slice of the last dim, as
    a ColwiseParallel layer gives it) or Replicate() (every rank gives the whole input and
    keeps its slice); for nn.Embedding Replicate() (the ids) or Shard(d) (ids all-gathered
    along d first; torch's default Shard(-1) does that). output_layouts: Replicate() (the
    default: all-reduced), or Shard(d) for a dim d other than the last (sequence parallelism:
    reduce-scattered along d; the bias is then added to each rank's slice and its gradient
    all-reduced). use_local_output must be True. Other layouts raise NotImplementedError.
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__()
        _check_options("RowwiseParallel", input_layouts, output_layouts, use_local_output)
        self.input_layouts = (input_layouts or Shard(-1),)
        self.output_layouts = (output_layouts or Replicate(),)
        self.use_local_output = use_local_output

    def __repr__(self):
        return (f"RowwiseParallel(input_layouts={self.input_layouts[0]}, "
                f"output_layouts={self.output_layouts[0]})")

    def _apply(self, module, group, name, src_data_rank):
        style = "RowwiseParallel"
        input_layout, output_layout = self.input_layouts[0], self.output_layouts[0]
        if _is_last_dim_shard(output_layout):
            _refuse(style, name, "output_layouts=Shard(-1) is not supported (Replicate() or "
                                 "Shard(d) of another dim)")
        size = dist.get_world_size(group)

        def finish(partial, bias):
            """The sum of the ranks' partial outputs in the output layout, plus the bias
            (whole on every rank: added once, after the sum)."""
            if output_layout == Replicate():
                output = _ReduceFromGroup.apply(partial, group)
                return output + bias if bias is not None else output
            dim = output_layout.dim % partial.ndim
            if dim == partial.ndim - 1:
                raise ValueError(f"tessera tensor parallel: RowwiseParallel on '{name}': "
                                 f"output_layouts={output_layout} is the last dim of the "
                                 f"output of shape {tuple(partial.shape)}; shard another dim")
            output = _ReduceScatter.apply(partial, dim, group)
            # Each rank adds the bias to its slice only: its gradient is the sum over ranks.
            return output + _CopyToGroup.apply(bias, group) if bias is not None else output

        if isinstance(module, nn.Linear):
            if input_layout != Replicate() and not _is_last_dim_shard(input_layout):
                _refuse(style, name, f"input_layouts={input_layout} is not supported for "
                                     f"nn.Linear (Shard(-1) or Replicate())")
            _check_divisible(style, name, module, "in_features", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 1, group, src_data_rank)
            if module.bias is not None:
                _shard_parameter(module, "bias", None, group, src_data_rank)

            def forward(self_, input):
                if input_layout == Replicate():
                    input = _Split.apply(input, -1, group)
                elif input.size(-1) != self_.weight.size(1):
                    raise ValueError(
                        f"tessera tensor parallel: RowwiseParallel on '{name}': rank "
                        f"{dist.get_rank()}: the input of shape {tuple(input.shape)} is not "
                        f"this rank's slice of the last dim (expected "
                        f"{self_.weight.size(1)} = in_features {self_.in_features} / {size})")
                return finish(F.linear(input, self_.weight), self_.bias)
        elif isinstance(module, nn.Embedding):
            _check_embedding(style, name, module, rowwise=True)
            _check_divisible(style, name, module, "num_embeddings", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 0, group, src_data_rank)
            rows = module.num_embeddings // size
            first = dist.get_rank(group) * rows
            padding_idx = module.padding_idx
            local_padding = (padding_idx - first if padding_idx is not None
                             and first <= padding_idx < first + rows else None)

            def forward(self_, input):
                input = _ids(input, input_layout, group)
                # Ids outside this rank's rows look up row 0 and are zeroed: the sum then
                # holds exactly one rank's row at each position.
                outside = (input < first) | (input >= first + rows)
                local = (input - first).masked_fill(outside, 0)
                output = F.embedding(local, self_.weight, local_padding, None, 2.0, False,
                                     self_.sparse)
                return finish(output.masked_fill(outside.unsqueeze(-1), 0.0), None)
        else:
            _refuse(style, name, f"{type(module).__name__} is not supported (nn.Linear and "
                                 f"nn.Embedding are)")
        module.forward = types.MethodType(forward, module)
        return module


class SequenceParallel(ParallelStyle):
    """torch.distributed.tensor.parallel.SequenceParallel: the module (nn.LayerNorm,
    nn.Dropout, an RMSNorm, ...) runs unchanged on each rank's slice of the sequence dim
    (its input is that slice, as a RowwiseParallel with output_layouts=Shard(sequence_dim)
    gives it), with its parameters replicated: every rank starts from the group's rank 0's
    values (src_data_rank; torch assumes equal ones), and each parameter's gradient, each rank
    having only its positions' part, is all-reduced over the group in backward (through the
    module's forward, so that it holds under FullyShardedDataParallel too). Outputs are
    local tensors whatever use_local_output says (there is no DTensor here).
    """

    def __init__(self, *, sequence_dim=1, use_local_output=False):
        super().__init__()
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def __repr__(self):
        return f"SequenceParallel(sequence_dim={self.sequence_dim})"

    def _apply(self, module, group, name, src_data_rank):
        _mark(module, self, name)
        if src_data_rank is not None:
            with torch.no_grad():
                for param in module.parameters():
                    dist.broadcast(param.data, src=_global_rank(group, src_data_rank),
                                   group=group)
        inner = module.forward
        slots = [(m, param_name) for m in module.modules()
                 for param_name, param in m._parameters.items() if param is not None]

        def forward(self_, *args, **kwargs):
            # For the forward's length each parameter is seen through _CopyToGroup, whose
            # backward all-reduces its gradient. Done here rather than by hooks on the
            # parameters, so that it holds for whatever tensor stands for a parameter at the
            # time: FullyShardedDataParallel replaces them by views of its gathered flat
            # parameter, held in _parameters or (flattened) in the module's __dict__.
            swapped = []
            if torch.is_grad_enabled():
                for m, param_name in slots:
                    where = m._parameters if param_name in m._parameters else m.__dict__
                    param = where.get(param_name)
                    if torch.is_tensor(param) and param.requires_grad:
                        where[param_name] = _CopyToGroup.apply(param, group)
                        swapped.append((where, param_name, param))
            try:
                return inner(*args, **kwargs)
            finally:
                for where, param_name, param in swapped:
                    where[param_name] = param

        module.forward = types.MethodType(forward, module)
        return module


# -- parallelize_module -------------------------------------------------------------------------

def _tp_group(device_mesh):
    if isinstance(device_mesh, DeviceMesh):
        if device_mesh.ndim != 1:
            raise ValueError(f"tessera tensor parallel: parallelize_module takes a 1-D "
                             f"DeviceMesh, not {device_mesh!r}: pass its tensor-parallel "
                             f"dim, e.g. mesh['tp']")
        return device_mesh.get_group()
    if isinstance(device_mesh, dist.ProcessGroup):
        if dist.get_rank(device_mesh) < 0:
            raise ValueError(f"tessera tensor parallel: rank {dist.get_rank()} is not a member "
                             f"of the process group given as device_mesh")
        return device_mesh
    raise TypeError(f"tessera tensor parallel: device_mesh must be a 1-D DeviceMesh or a "
                    f"ProcessGroup, not {type(device_mesh).__name__}")


def _matches(module, path):
    """(fully qualified name, module) of the submodules `path` names, `*` and other fnmatch
    patterns matching one name each (as in torch)."""
    found = [("", module)]
    for atom in path.split("."):
        found = [(f"{prefix}.{child_name}" if prefix else child_name, child)
                 for prefix, parent in found
                 for child_name, child in parent.named_children()
                 if fnmatch.fnmatch(child_name, atom)]
    return found


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0):
    """torch.distributed.tensor.parallel.parallelize_module: applies parallelize_plan (a
    ParallelStyle for `module` itself, or a dict from submodule names to styles, where `*`
    in a name matches any one name: "layers.*.mlp.fc1") to the module in place and returns it.
    device_mesh: a 1-D DeviceMesh (the tensor-parallel dim of a larger one: mesh["tp"]) or a
    ProcessGroup. src_data_rank: the group rank whose full values every rank's shards are cut
    from (default 0, as torch's; None: each rank cuts its own). A collective of the group:
    each rank calls it with the same plan on the same model.

    Unlike torch's, a plan entry that names no submodule raises ValueError (a typo would
    otherwise leave the layer whole and silently replicate its work)."""
    if device_mesh is None:
        raise ValueError("tessera tensor parallel: parallelize_module needs device_mesh (a "
                         "1-D DeviceMesh or a ProcessGroup; there is no current-mesh context)")
    group = _tp_group(device_mesh)
    if parallelize_plan is None:
        warnings.warn("tessera tensor parallel: no parallelize_plan given: the module is left "
                      "as it is")
        return module
    if src_data_rank is not None:
        _global_rank(group, src_data_rank)  # refuses a rank outside the group
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, group, "<root>", src_data_rank)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"tessera tensor parallel: parallelize_plan must be a ParallelStyle or "
                        f"a dict of submodule names to ParallelStyles, not "
                        f"{type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"tessera tensor parallel: parallelize_plan key {path!r}: a "
                             f"non-empty submodule name")
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"tessera tensor parallel: parallelize_plan['{path}'] is "
                            f"{type(style).__name__}, not a ParallelStyle")
        matches = _matches(module, path)
        if not matches:
            raise ValueError(f"tessera tensor parallel: parallelize_plan['{path}'] names no "
                             f"submodule of {type(module).__name__}")
        for name, submodule in matches:
            style._apply(submodule, group, name, src_data_rank)
    return module
