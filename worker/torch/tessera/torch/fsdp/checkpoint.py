"""Local and sharded state dicts of tessera's FSDP units, and the optimizer state dicts of
their flat shards keyed by the original parameters' names (issue 44).

Words used below (see fully_sharded_data_parallel.py for unit, flat, shard):
  name      a parameter's key in the unwrapped model's state dict ("layers.2.weight").
  offset    where a parameter starts in its unit's flat tensor (elements).
  slice     the part of one parameter that lies in one rank's shard: a 1-D tensor of that
            parameter's flattened elements [start, start + numel), start counted from the
            parameter's first element. A sharded state dict maps each name to this rank's
            ShardedSlice; the slices of every rank together cover the parameter, so a
            state dict saved at one world size and strategy loads at any other (each rank
            reads every rank's file: merge_sharded_state_dicts) or, consolidated
            (full_state_dict_from_sharded), into the plain model.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from tessera.torch.fsdp.collectives import all_gather_into

__all__ = ["ShardedSlice", "merge_sharded_state_dicts", "full_state_dict_from_sharded",
           "full_optim_state_dict", "shard_full_optim_state_dict",
           "scatter_full_optim_state_dict"]


@dataclass
class ShardedSlice:
    """One rank's part of one parameter: tensor holds its flattened elements
    [start, start + tensor.numel()); full_shape is the parameter's shape. world_size, rank and
    strategy say where it was saved (for the reader; loading needs only start and
    full_shape)."""
    tensor: torch.Tensor
    start: int
    full_shape: torch.Size
    world_size: int
    rank: int
    strategy: str


def _strip_wrappers(path):
    return ".".join(part for part in path.split(".") if part != "_fsdp_wrapped_module")


def units_with_prefix(model):
    """(prefix, unit) of every FSDP unit in model that has parameters, in module order; prefix
    is the unit's path in the unwrapped model with a trailing dot ("" for the root)."""
    from tessera.torch.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
    for path, m in model.named_modules():
        if isinstance(m, FullyShardedDataParallel) and m.flat_param is not None:
            path = _strip_wrappers(path)
            yield (path + "." if path else ""), m


def _layout(unit):
    """(name, offset, shape, numel) of the unit's parameters in its flat tensor."""
    offset = 0
    for name, shape, numel in zip(unit._param_names, unit._shapes, unit._numels):
        yield name, offset, shape, numel
        offset += numel


def _shard_start(unit):
    from tessera.torch.fsdp.api import ShardingStrategy
    if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
        return 0
    return unit.rank * unit._shard_numel


# -- model state dicts -----------------------------------------------------------------------

def local_state_dict(model, destination, prefix):
    """Each unit's shard as it is ("<unit prefix>flat_param"), and the other entries (buffers,
    ignored parameters) as they are."""
    for unit_prefix, unit in units_with_prefix(model):
        destination[prefix + unit_prefix + "flat_param"] = unit.flat_param.detach().clone()
    for key, tensor in model._original_entries(prefix, flattened=False):
        destination[key] = tensor.detach().clone()
    return destination


def load_local_state_dict(model, state_dict):
    with torch.no_grad():
        for unit_prefix, unit in units_with_prefix(model):
            key = unit_prefix + "flat_param"
            if key not in state_dict:
                raise RuntimeError(f"tessera FSDP: load_state_dict (LOCAL_STATE_DICT): no "
                                   f"'{key}'")
            if state_dict[key].shape != unit.flat_param.shape:
                raise RuntimeError(
                    f"tessera FSDP: load_state_dict (LOCAL_STATE_DICT): '{key}' has shape "
                    f"{list(state_dict[key].shape)}, this rank's shard "
                    f"{list(unit.flat_param.shape)}: a local state dict loads only at the "
                    f"world size and wrapping it was saved with (SHARDED_STATE_DICT reshards)")
            unit.flat_param.copy_(state_dict[key])
        _load_other_entries(model, state_dict)


def _load_other_entries(model, state_dict):
    for key, tensor in model._original_entries(flattened=False, model_dtypes=False):
        if key not in state_dict:
            raise RuntimeError(f"tessera FSDP: load_state_dict: missing key '{key}'")
        tensor.copy_(state_dict[key])


def sharded_state_dict(model, destination, prefix):
    """Each parameter's slice in this rank's shard (ShardedSlice, possibly empty) by name, and
    the other entries whole."""
    for unit_prefix, unit in units_with_prefix(model):
        shard_start = _shard_start(unit)
        shard_end = shard_start + unit.flat_param.numel()
        for name, offset, shape, numel in _layout(unit):
            begin, end = max(offset, shard_start), min(offset + numel, shard_end)
            end = max(begin, end)
            tensor = unit.flat_param.detach()[begin - shard_start:end - shard_start].clone()
            destination[prefix + unit_prefix + name] = ShardedSlice(
                tensor=tensor, start=begin - offset if end > begin else 0,
                full_shape=torch.Size(shape), world_size=unit.world_size, rank=unit.rank,
                strategy=unit.sharding_strategy.name)
    for key, tensor in model._original_entries(prefix, flattened=False):
        destination[key] = tensor.detach().clone()
    return destination


def merge_sharded_state_dicts(state_dicts):
    """One state dict from the sharded state dicts of every rank that saved (in any order):
    each parameter's name maps to the list of its slices; other entries are taken from the
    first."""
    merged = {}
    for state_dict in state_dicts:
        for key, value in state_dict.items():
            if isinstance(value, ShardedSlice):
                merged.setdefault(key, []).append(value)
            else:
                merged.setdefault(key, value)
    return merged


def _slices(value):
    return value if isinstance(value, list) else [value]


def full_state_dict_from_sharded(state_dicts):
    """The full state dict (loads into the plain nn.Module) from the sharded state dicts of
    every rank that saved. Raises ValueError naming the parameter and the first element no
    slice covers."""
    full = {}
    for key, value in merge_sharded_state_dicts(state_dicts).items():
        if not isinstance(value, list):
            full[key] = value
            continue
        shape = value[0].full_shape
        flat = torch.empty(shape.numel(), dtype=value[0].tensor.dtype)
        covered = torch.zeros(shape.numel(), dtype=torch.bool)
        for piece in value:
            end = piece.start + piece.tensor.numel()
            flat[piece.start:end] = piece.tensor
            covered[piece.start:end] = True
        if not bool(covered.all()):
            first = int((~covered).nonzero()[0])
            raise ValueError(f"tessera FSDP: '{key}': element {first} of {shape.numel()} is in "
                             f"none of the {len(value)} slices given; pass every rank's "
                             f"sharded state dict")
        full[key] = flat.view(shape)
    return full


def load_sharded_state_dict(model, state_dict):
    """Fills this rank's shards from a sharded state dict whose values are one ShardedSlice or
    a list of them (merge_sharded_state_dicts) per parameter."""
    with torch.no_grad():
        for unit_prefix, unit in units_with_prefix(model):
            shard_start = _shard_start(unit)
            shard_end = shard_start + unit.flat_param.numel()
            for name, offset, shape, numel in _layout(unit):
                key = unit_prefix + name
                if key not in state_dict:
                    raise RuntimeError(f"tessera FSDP: load_state_dict (SHARDED_STATE_DICT): "
                                       f"missing key '{key}'")
                # The elements of this parameter this rank holds, counted from its start.
                want_begin = max(offset, shard_start) - offset
                want_end = max(min(offset + numel, shard_end) - offset, want_begin)
                filled = torch.zeros(want_end - want_begin, dtype=torch.bool)
                for piece in _slices(state_dict[key]):
                    if torch.Size(piece.full_shape) != torch.Size(shape):
                        raise RuntimeError(
                            f"tessera FSDP: load_state_dict (SHARDED_STATE_DICT): '{key}' was "
                            f"saved with shape {list(piece.full_shape)}, the model has "
                            f"{list(shape)}")
                    begin = max(piece.start, want_begin)
                    end = min(piece.start + piece.tensor.numel(), want_end)
                    if end <= begin:
                        continue
                    target = offset + begin - shard_start
                    unit.flat_param[target:target + end - begin] = \
                        piece.tensor[begin - piece.start:end - piece.start]
                    filled[begin - want_begin:end - want_begin] = True
                if not bool(filled.all()):
                    first = want_begin + int((~filled).nonzero()[0])
                    raise RuntimeError(
                        f"tessera FSDP: load_state_dict (SHARDED_STATE_DICT): '{key}': element "
                        f"{first}, which this rank holds, is in none of the slices given; load "
                        f"every saved rank's slices (merge_sharded_state_dicts)")
        _load_other_entries(model, state_dict)


# -- optimizer state dicts -------------------------------------------------------------------

def _names_of_parameters(model):
    """{parameter: name or unit}: each unit's flat_param maps to (its prefix, the unit), with
    use_orig_params each original parameter to (prefix, unit, its index in the unit), any
    other parameter (ignored modules') to its name in the unwrapped model."""
    owners = {}
    for prefix, unit in units_with_prefix(model):
        owners[id(unit.flat_param)] = (prefix, unit)
        for j, (p, _, _) in enumerate(getattr(unit, "_orig_params", ())):
            owners[id(p)] = (prefix, unit, j)
    names = {}
    for path, p in model.named_parameters():
        names[id(p)] = owners.get(id(p), _strip_wrappers(path))
    return names


def _unit_state_of_orig_params(unit, state_of):
    """use_orig_params: the unit's state as if its optimizer had stepped the shard: each
    per-parameter tensor of the original parameters (state_of(p)) laid into a shard-shaped
    one at the parameter's slice (zeros where a parameter has none, and in the padding);
    other values (steps) from the first parameter that has them."""
    flat = {}
    for p, first, last in unit._orig_params:
        for key, value in (state_of(p) or {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == last - first:
                if key not in flat:
                    flat[key] = torch.zeros(unit.flat_param.numel(), dtype=value.dtype)
                flat[key][first:last] = value.reshape(-1)
            elif key not in flat:
                flat[key] = value
    return flat


def _is_sharded_state(value, flat_param):
    return torch.is_tensor(value) and value.shape == flat_param.shape and value.dim() == 1


def full_optim_state_dict(model, optim, optim_input=None, rank0_only=True, group=None):
    """The optimizer's state dict as for the unwrapped model, keyed by parameter names:
    {"state": {name: {key: value}}, "param_groups": [{..., "params": [names]}]}. Per-parameter
    tensors shaped like the shard (momentum, Adam's moments) are gathered and cut into each
    parameter's shape; other values (steps) are copied to every parameter of the unit. A
    collective: every rank calls it; with rank0_only the others get {}."""
    if optim_input is not None:
        raise NotImplementedError("tessera FSDP: full_optim_state_dict(optim_input=...) is not "
                                  "supported: the optimizer's own parameters are used (issue 44)")
    saved = optim.state_dict()
    params = [p for g in optim.param_groups for p in g["params"]]
    index_of = {id(p): index for index, p in enumerate(params)}
    names = _names_of_parameters(model)
    state, groups, done = {}, [], set()
    for index, p in enumerate(params):
        owner = names.get(id(p))
        if owner is None:
            raise ValueError("tessera FSDP: full_optim_state_dict: the optimizer has a "
                             "parameter that is not the model's")
        values = saved["state"].get(index, {})
        if isinstance(owner, str):
            state[owner] = {k: v.clone() if torch.is_tensor(v) else v for k, v in values.items()}
            continue
        prefix, unit = owner[:2]
        if len(owner) == 3:  # use_orig_params: the unit's parameters at once
            if id(unit) in done:
                continue
            done.add(id(unit))
            values = _unit_state_of_orig_params(
                unit, lambda q: saved["state"].get(index_of.get(id(q))))
        gathered = {}
        for key in sorted(values):
            value = values[key]
            if _is_sharded_state(value, unit.flat_param):
                gathered[key] = _gather_flat(unit, value)
        for name, offset, shape, numel in _layout(unit):
            entry = {}
            for key, value in values.items():
                if key in gathered:
                    entry[key] = gathered[key][offset:offset + numel].view(shape).clone()
                else:
                    entry[key] = value.clone() if torch.is_tensor(value) else value
            state[prefix + name] = entry
    for group_state, group_params in zip(saved["param_groups"], optim.param_groups):
        group_names = []
        for p in group_params["params"]:
            owner = names[id(p)]
            if isinstance(owner, str):
                group_names.append(owner)
            elif len(owner) == 3:
                group_names.append(owner[0] + owner[1]._param_names[owner[2]])
            else:
                group_names += [owner[0] + name for name in owner[1]._param_names]
        groups.append({**{k: v for k, v in group_state.items() if k != "params"},
                       "params": group_names})
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    if rank0_only and rank != 0:
        return {}
    return {"state": state, "param_groups": groups}


def _gather_flat(unit, shard_value):
    from tessera.torch.fsdp.api import ShardingStrategy
    if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
        return shard_value.detach()
    full = torch.empty(unit._padded, dtype=shard_value.dtype)
    all_gather_into(full, shard_value.detach().contiguous(), unit.process_group)
    return full


def shard_full_optim_state_dict(full_osd, model, optim_input=None):
    """The state dict for this rank's optimizer over model.parameters() (in that order) from
    a full optimizer state dict (full_optim_state_dict's, from any world size and strategy):
    each unit's per-parameter tensors are flattened, padded with zeros and cut to this rank's
    shard; other values are taken from the unit's first parameter."""
    if optim_input is not None:
        raise NotImplementedError("tessera FSDP: shard_full_optim_state_dict(optim_input=...) "
                                  "is not supported: model.parameters() order is used (issue 44)")
    names = _names_of_parameters(model)
    full_state = full_osd["state"]
    state, index_of_name, sharded_units = {}, {}, {}
    for index, p in enumerate(model.parameters()):
        owner = names[id(p)]
        if isinstance(owner, str):
            index_of_name[owner] = index
            if owner in full_state:
                state[index] = {k: v.clone() if torch.is_tensor(v) else v
                                for k, v in full_state[owner].items()}
            continue
        prefix, unit = owner[:2]
        layout = list(_layout(unit))
        if len(owner) == 3:  # use_orig_params: this parameter's slice of the unit's shard
            index_of_name[prefix + layout[owner[2]][0]] = index
            if id(unit) not in sharded_units:
                sharded_units[id(unit)] = _shard_unit_state(unit, layout, prefix, full_state)
            orig, first, last = unit._orig_params[owner[2]]
            values = sharded_units[id(unit)]
            if values is not None:
                state[index] = {k: v[first:last].view(orig.shape).clone()
                                if torch.is_tensor(v) and v.dim() > 0 else v
                                for k, v in values.items()}
            continue
        for name, *_ in layout:
            index_of_name[prefix + name] = index
        sharded = _shard_unit_state(unit, layout, prefix, full_state)
        if sharded is not None:
            state[index] = sharded
    groups = []
    for group in full_osd["param_groups"]:
        indices = []
        for name in group["params"]:
            if name not in index_of_name:
                raise ValueError(f"tessera FSDP: shard_full_optim_state_dict: parameter "
                                 f"'{name}' is not in the model")
            if index_of_name[name] not in indices:
                indices.append(index_of_name[name])
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": indices})
    return {"state": state, "param_groups": groups}


def _shard_unit_state(unit, layout, prefix, full_state):
    """This rank's shard of a unit's state from the full state of its parameters (None when
    none of them has any)."""
    entries = [full_state.get(prefix + name) for name, *_ in layout]
    if all(e is None for e in entries):
        return None
    if any(e is None for e in entries):
        missing = [prefix + name for (name, *_), e in zip(layout, entries) if e is None]
        raise ValueError(f"tessera FSDP: shard_full_optim_state_dict: no state for "
                         f"{missing}, but for other parameters of their unit")
    shard_start = _shard_start(unit)
    sharded = {}
    for key, first in entries[0].items():
        if torch.is_tensor(first) and first.shape == layout[0][2] and first.dim() > 0:
            flat = torch.zeros(unit._padded, dtype=first.dtype)
            for (name, offset, shape, numel), entry in zip(layout, entries):
                flat[offset:offset + numel] = entry[key].reshape(-1)
            sharded[key] = flat[shard_start:shard_start + unit.flat_param.numel()].clone()
        else:
            sharded[key] = first.clone() if torch.is_tensor(first) else first
    return sharded


def scatter_full_optim_state_dict(full_osd, model, optim_input=None, group=None):
    """shard_full_optim_state_dict with full_osd given on rank 0 only (None elsewhere): rank 0
    broadcasts it to the group's ranks. A collective: every rank calls it."""
    get_global_rank = getattr(dist, "get_global_rank", None) or \
        dist.distributed_c10d._get_global_rank
    source = 0 if group is None or group is dist.group.WORLD else get_global_rank(group, 0)
    box = [full_osd]
    dist.broadcast_object_list(box, src=source, group=group)
    return shard_full_optim_state_dict(box[0], model, optim_input)
