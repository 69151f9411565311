"""torch.distributed.tensor.parallel for torch 1.13 (issue 46): ColwiseParallel, RowwiseParallel
and parallelize_module with PyTorch 2.6's names and semantics, on plain tensors (no DTensor).
A program written for torch's changes

    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)
    from torch.distributed.tensor import Replicate, Shard
to
    from tessera.torch.tensor_parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module, Replicate, Shard)

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

__all__ = ["ColwiseParallel", "ParallelStyle", "Replicate", "RowwiseParallel", "Shard",
           "parallelize_module"]


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


def _all_gather_last_dim(tensor, group):
    size = dist.get_world_size(group)
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=-1)


def _local_last_dim(tensor, group):
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    width = tensor.size(-1)
    if width % size:
        raise ValueError(f"tessera tensor parallel: rank {dist.get_rank()}: a tensor of shape "
                         f"{tuple(tensor.shape)} cannot be split on its last dim among the "
                         f"{size} ranks of the tensor-parallel group")
    return tensor.narrow(-1, rank * (width // size), width // size).contiguous()


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

    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherLastDim(torch.autograd.Function):
    """Forward all-gathers the ranks' slices along the last dim; backward keeps this rank's
    slice of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather_last_dim(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _local_last_dim(grad, ctx.group), None


class _SplitLastDim(torch.autograd.Function):
    """Forward keeps this rank's slice of a replicated tensor's last dim; backward all-gathers
    the slices' gradients, so every rank has the whole (replicated) gradient."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _local_last_dim(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last_dim(grad, ctx.group), None


# -- styles -------------------------------------------------------------------------------------

class ParallelStyle:
    """torch.distributed.tensor.parallel.ParallelStyle: how parallelize_module changes one
    module. Subclasses implement _apply(module, group, name, src_data_rank)."""

    src_data_rank = 0

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


def _shard_parameter(module, param_name, dim, group, name, style, src_data_rank):
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
    if getattr(module, "_tessera_tp_style", None) is not None:
        raise ValueError(f"tessera tensor parallel: '{name}' is already parallelized "
                         f"({module._tessera_tp_style}); a module takes one style")
    module._tessera_tp_style = style


class ColwiseParallel(ParallelStyle):
    """torch.distributed.tensor.parallel.ColwiseParallel: shards nn.Linear's output features
    (the weight's rows and the bias) or nn.Embedding's embedding_dim across the group.

    input_layouts: Replicate() (the default): every rank gives the whole input. output_layouts:
    Shard(-1) (the default): the output is this rank's slice of the last dim, as a following
    RowwiseParallel wants it; or Replicate(): all-gathered into the whole output on every rank.
    use_local_output must be True (outputs are plain tensors). Other layouts raise
    NotImplementedError.
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
        if self.input_layouts[0] != Replicate():
            _refuse(style, name, f"input_layouts={self.input_layouts[0]} is not supported "
                                 f"(Replicate() only)")
        gather = self.output_layouts[0] == Replicate()
        if not gather and not _is_last_dim_shard(self.output_layouts[0]):
            _refuse(style, name, f"output_layouts={self.output_layouts[0]} is not supported "
                                 f"(Shard(-1) or Replicate())")
        size = dist.get_world_size(group)
        if isinstance(module, nn.Linear):
            _check_divisible(style, name, module, "out_features", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 0, group, name, style, src_data_rank)
            if module.bias is not None:
                _shard_parameter(module, "bias", 0, group, name, style, src_data_rank)

            def forward(self_, input):
                output = F.linear(_CopyToGroup.apply(input, group), self_.weight, self_.bias)
                return _GatherLastDim.apply(output, group) if gather else output
        elif isinstance(module, nn.Embedding):
            _check_embedding(style, name, module, rowwise=False)
            _check_divisible(style, name, module, "embedding_dim", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 1, group, name, style, src_data_rank)

            def forward(self_, input):
                # The ids carry no gradient: no collective before the lookup.
                output = F.embedding(input, self_.weight, self_.padding_idx, None, 2.0,
                                     self_.scale_grad_by_freq, self_.sparse)
                return _GatherLastDim.apply(output, group) if gather else output
        else:
            _refuse(style, name, f"{type(module).__name__} is not supported (nn.Linear and "
                                 f"nn.Embedding are)")
        module.forward = types.MethodType(forward, module)
        return module


class RowwiseParallel(ParallelStyle):
    """torch.distributed.tensor.parallel.RowwiseParallel: shards nn.Linear's input features
    (the weight's columns; the bias stays whole) or nn.Embedding's num_embeddings across the
    group, and all-reduces the output.

    input_layouts: for nn.Linear Shard(-1) (the default: this rank's slice of the last dim, as
    a ColwiseParallel layer gives it) or Replicate() (every rank gives the whole input and
    keeps its slice); for nn.Embedding Replicate() (the ids; torch's default Shard(-1)
    all-gathers them along their last dim first). output_layouts: Replicate() (the default).
    use_local_output must be True. Other layouts raise NotImplementedError.
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
        if self.output_layouts[0] != Replicate():
            _refuse(style, name, f"output_layouts={self.output_layouts[0]} is not supported "
                                 f"(Replicate() only)")
        replicated_input = self.input_layouts[0] == Replicate()
        if not replicated_input and not _is_last_dim_shard(self.input_layouts[0]):
            _refuse(style, name, f"input_layouts={self.input_layouts[0]} is not supported "
                                 f"(Shard(-1) or Replicate())")
        size = dist.get_world_size(group)
        if isinstance(module, nn.Linear):
            _check_divisible(style, name, module, "in_features", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 1, group, name, style, src_data_rank)
            if module.bias is not None:
                _shard_parameter(module, "bias", None, group, name, style, src_data_rank)

            def forward(self_, input):
                if replicated_input:
                    input = _SplitLastDim.apply(input, group)
                elif input.size(-1) != self_.weight.size(1):
                    raise ValueError(
                        f"tessera tensor parallel: RowwiseParallel on '{name}': rank "
                        f"{dist.get_rank()}: the input of shape {tuple(input.shape)} is not "
                        f"this rank's slice of the last dim (expected "
                        f"{self_.weight.size(1)} = in_features {self_.in_features} / {size})")
                output = _ReduceFromGroup.apply(F.linear(input, self_.weight), group)
                # The bias is whole on every rank: added once, after the sum.
                return output + self_.bias if self_.bias is not None else output
        elif isinstance(module, nn.Embedding):
            _check_embedding(style, name, module, rowwise=True)
            _check_divisible(style, name, module, "num_embeddings", size)
            _mark(module, self, name)
            _shard_parameter(module, "weight", 0, group, name, style, src_data_rank)
            rows = module.num_embeddings // size
            first = dist.get_rank(group) * rows
            padding_idx = module.padding_idx
            local_padding = (padding_idx - first if padding_idx is not None
                             and first <= padding_idx < first + rows else None)

            def forward(self_, input):
                if not replicated_input:
                    input = _all_gather_last_dim(input, group)
                # Ids outside this rank's rows look up row 0 and are zeroed: the all-reduce
                # then adds exactly one rank's row to each position.
                outside = (input < first) | (input >= first + rows)
                local = (input - first).masked_fill(outside, 0)
                output = F.embedding(local, self_.weight, local_padding, None, 2.0, False,
                                     self_.sparse)
                output = output.masked_fill(outside.unsqueeze(-1), 0.0)
                return _ReduceFromGroup.apply(output, group)
        else:
            _refuse(style, name, f"{type(module).__name__} is not supported (nn.Linear and "
                                 f"nn.Embedding are)")
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
