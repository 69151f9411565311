"""torch.distributed.checkpoint.state_dict for torch 1.13 (issue 46, item 5): a model's and an
optimizer's state dicts keyed by the model's parameter names, whatever parallelizes it, with
each rank's part of a sharded tensor as a ShardedPiece, so that save() and load() in
tessera.torch.distributed_checkpoint reshard them:

  tensor parallel    (tessera.torch.tensor_parallel) a parameter cut along a dim is the box
                     of the global tensor this rank holds;
  FSDP               (tessera.torch.fsdp) each parameter's slice in this rank's flat shard, a
                     flat range (of the tensor-parallel box when both apply);
  pipeline stages    a stage module holds some of the model's names (pipeline() keeps them):
                     each rank saves and loads its own;
  data parallel      replicas hold the same pieces; save() writes each once.

get_model_state_dict returns the parameters themselves where it can (plain and
tensor-parallel ones), so load() fills the model in place; set_model_state_dict copies what
it could not (FSDP's shards) and is always safe to call, as in torch.

Optimizer state: for optimizers over the model's own parameters (not FSDP's flat ones), each
per-parameter tensor of the parameter's shape is sharded like the parameter (SGD's
momentum_buffer, Adam's exp_avg and exp_avg_sq), other values (Adam's step) kept as they
are; param_groups list parameter names instead of indices. With FSDP units, use FSDP's own
optimizer state dict functions (get_optimizer_state_dict refuses, saying so).
"""

from dataclasses import dataclass

import torch

__all__ = ["ShardedPiece", "get_model_state_dict", "get_optimizer_state_dict",
           "set_model_state_dict", "set_optimizer_state_dict"]


@dataclass
class ShardedPiece:
    """One rank's part of a tensor of global_shape: the box offsets[d] .. offsets[d] + sizes[d]
    along each dim d, and of that box, with flat_start None, all of it (tensor of shape
    sizes), else its elements [flat_start, flat_start + tensor.numel()) in row-major order
    (tensor 1-D)."""
    tensor: torch.Tensor
    global_shape: tuple
    offsets: tuple
    sizes: tuple
    flat_start: int = None

    def __post_init__(self):
        self.global_shape = tuple(int(d) for d in self.global_shape)
        self.offsets = tuple(int(d) for d in self.offsets)
        self.sizes = tuple(int(d) for d in self.sizes)
        dims = len(self.global_shape)
        if len(self.offsets) != dims or len(self.sizes) != dims:
            raise ValueError(f"ShardedPiece: offsets {self.offsets} and sizes {self.sizes} "
                             f"need one entry per dim of {self.global_shape}")
        for d, (o, n, g) in enumerate(zip(self.offsets, self.sizes, self.global_shape)):
            if o < 0 or n < 0 or o + n > g:
                raise ValueError(f"ShardedPiece: dim {d}: [{o}, {o + n}) is outside 0 .. {g}")
        box = int(torch.Size(self.sizes).numel())
        if self.flat_start is None:
            if tuple(self.tensor.shape) != self.sizes:
                raise ValueError(f"ShardedPiece: the tensor's shape {list(self.tensor.shape)} "
                                 f"is not the box's {list(self.sizes)}")
        elif self.flat_start < 0 or self.flat_start + self.tensor.numel() > box:
            raise ValueError(f"ShardedPiece: elements [{self.flat_start}, "
                             f"{self.flat_start + self.tensor.numel()}) are outside the box's "
                             f"{box}")


def _strip_wrappers(path):
    return ".".join(part for part in path.split(".") if part != "_fsdp_wrapped_module")


def _tp_placements(model):
    """{parameter name: (dim, rank, size, global_shape)} of the tensor-parallel parameters cut
    along a dim (tensor_parallel.py records them on their modules)."""
    placements = {}
    for path, module in model.named_modules():
        recorded = getattr(module, "_tessera_tp_placements", None)
        if not recorded:
            continue
        prefix = _strip_wrappers(path)
        prefix = prefix + "." if prefix else ""
        for name, placement in recorded.items():
            if placement is not None:
                placements[prefix + name] = placement
    return placements


def _box(placement, local_shape):
    """(global_shape, offsets, sizes) of a tensor-parallel parameter's local shard."""
    dim, rank, size, global_shape = placement
    offsets = [0] * len(global_shape)
    offsets[dim] = rank * (global_shape[dim] // size)
    return tuple(global_shape), tuple(offsets), tuple(local_shape)


def _fsdp_units(model):
    from tessera.torch.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
    return [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]


def _piece(tensor, name, placements):
    placement = placements.get(name)
    if placement is None:
        return tensor
    shape, offsets, sizes = _box(placement, tuple(tensor.shape))
    return ShardedPiece(tensor, shape, offsets, sizes)


def get_model_state_dict(model, *, submodules=None, options=None):
    """The model's state dict by the unwrapped model's names: plain parameters and buffers as
    the model's own tensors (detached), tensor-parallel ones as ShardedPieces of them, FSDP's
    as ShardedPieces of copies of this rank's slices."""
    if submodules is not None or options is not None:
        raise NotImplementedError("tessera.torch.distributed_checkpoint: get_model_state_dict "
                                  "takes no submodules or options here")
    placements = _tp_placements(model)
    units = _fsdp_units(model)
    if not units:
        # state_dict()'s tensors are detached but share the parameters' storage.
        return {name: _piece(tensor, name, placements)
                for name, tensor in model.state_dict().items()}
    from tessera.torch.fsdp import FullyShardedDataParallel, StateDictType
    from tessera.torch.fsdp.checkpoint import ShardedSlice
    result = {}
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        for name, value in model.state_dict().items():
            if not isinstance(value, ShardedSlice):
                result[name] = _piece(value, name, placements)
                continue
            local_shape = tuple(value.full_shape)
            placement = placements.get(name)
            if placement is None:
                shape, offsets, sizes = local_shape, (0,) * len(local_shape), local_shape
            else:
                shape, offsets, sizes = _box(placement, local_shape)
            result[name] = ShardedPiece(value.tensor, shape, offsets, sizes, value.start)
    return result


def set_model_state_dict(model, model_state_dict, *, options=None, strict=True):
    """Loads model_state_dict (get_model_state_dict's form, as load() filled it) into model.
    The tensors that are the model's own were filled in place; this copies the rest."""
    if options is not None:
        raise NotImplementedError("tessera.torch.distributed_checkpoint: set_model_state_dict "
                                  "takes no options here")
    units = _fsdp_units(model)
    local = {name: value.tensor if isinstance(value, ShardedPiece) else value
             for name, value in model_state_dict.items()}
    if not units:
        with torch.no_grad():
            return model.load_state_dict(local, strict=strict)
    from tessera.torch.fsdp import FullyShardedDataParallel, StateDictType
    from tessera.torch.fsdp.checkpoint import ShardedSlice
    sharded = {}
    for name, value in model_state_dict.items():
        if isinstance(value, ShardedPiece) and value.flat_start is not None:
            sharded[name] = ShardedSlice(value.tensor, value.flat_start, torch.Size(value.sizes),
                                         0, 0, "")
        else:
            sharded[name] = local[name]
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return model.load_state_dict(sharded)


def _names_of(model):
    names = {}
    for name, param in model.named_parameters():
        names[param] = _strip_wrappers(name)
    return names


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None):
    """{"state": {parameter name: {key: value}}, "param_groups": [{..., "params": [names]}]}
    for an optimizer (or a list of them) over model's parameters; each state tensor of its
    parameter's shape is sharded like the parameter."""
    if submodules is not None or options is not None:
        raise NotImplementedError("tessera.torch.distributed_checkpoint: "
                                  "get_optimizer_state_dict takes no submodules or options "
                                  "here")
    if _fsdp_units(model):
        raise NotImplementedError(
            "tessera.torch.distributed_checkpoint: get_optimizer_state_dict with FSDP units: "
            "their optimizers step flat shards; use FullyShardedDataParallel."
            "full_optim_state_dict / scatter_full_optim_state_dict (tessera.torch.fsdp)")
    placements = _tp_placements(model)
    names = _names_of(model)
    state, groups = {}, []
    for optimizer in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
        for group in optimizer.param_groups:
            group_names = []
            for param in group["params"]:
                if param not in names:
                    raise ValueError("tessera.torch.distributed_checkpoint: the optimizer "
                                     "holds a parameter that is not the model's")
                name = names[param]
                group_names.append(name)
                per_param = {}
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor) and value.shape == param.shape \
                            and value.dim() > 0:
                        per_param[key] = _piece(value, name, placements)
                    else:
                        per_param[key] = value
                if per_param:
                    state[name] = per_param
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": group_names})
    return {"state": state, "param_groups": groups}


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None):
    """Loads get_optimizer_state_dict's form (as load() filled it) into the optimizer(s):
    state by parameter name, hyperparameters by group."""
    if options is not None:
        raise NotImplementedError("tessera.torch.distributed_checkpoint: "
                                  "set_optimizer_state_dict takes no options here")
    names = _names_of(model)
    saved_groups = optim_state_dict["param_groups"]
    index = 0
    for optimizer in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
        converted_groups, converted_state = [], {}
        for group in optimizer.param_groups:
            if index >= len(saved_groups):
                raise ValueError(f"tessera.torch.distributed_checkpoint: the state dict has "
                                 f"{len(saved_groups)} parameter groups, the optimizers more")
            saved = saved_groups[index]
            index += 1
            group_names = [names[p] for p in group["params"]]
            if list(saved["params"]) != group_names:
                raise ValueError(f"tessera.torch.distributed_checkpoint: parameter group "
                                 f"{index - 1} holds {group_names} here and {saved['params']} "
                                 f"in the state dict given")
            ids = list(range(len(converted_state), len(converted_state) + len(group_names)))
            for i, name in zip(ids, group_names):
                if name in optim_state_dict["state"]:
                    converted_state[i] = {
                        k: v.tensor if isinstance(v, ShardedPiece) else v
                        for k, v in optim_state_dict["state"][name].items()}
            converted_groups.append({**{k: v for k, v in saved.items() if k != "params"},
                                     "params": ids})
        optimizer.load_state_dict({"state": converted_state, "param_groups": converted_groups})
