"""torch.distributed.checkpoint for torch 1.13 (issue 46, item 5): save and load a state dict
whose tensors are sharded across ranks, resharding on load, so that a job saved with one
layout (D data-parallel replicas x P pipeline stages x T tensor-parallel ranks, with or
without FSDP) resumes with another. As in PyTorch 2.6, a program written for torch's changes

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)
to
    import tessera.torch.distributed_checkpoint as dcp
    from tessera.torch.distributed_checkpoint.state_dict import (...the same...)

and then

    state = {"model": get_model_state_dict(model),
             "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id="ckpt/step-100")        # every rank, collectively
    ...                                                    # any other layout, any world size
    state = {"model": get_model_state_dict(model),
             "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id="ckpt/step-100")        # fills state's tensors in place
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])

There is no DTensor in torch 1.13: a value that is one rank's part of a larger tensor is a
ShardedPiece (state_dict.py makes them for tensor-parallel parameters and FSDP's shards):
its `tensor` holds the elements of a box of the global tensor (`offsets`, `sizes` per dim),
or of a flat range [flat_start, flat_start + tensor.numel()) of that box's elements in row-major
order (FSDP's flat shards of a tensor-parallel slice). Any other tensor is whole (replicated:
every rank that has it holds the same values). Nested dicts are flattened to dotted keys
("model.layers.0.weight", "optim.state.layers.0.weight.momentum_buffer"); values that are not
tensors (step counts, hyperparameters) are kept as saved by the lowest rank that has them.

On disk (checkpoint_id, a directory):
  rank-<r>.pt      what rank r writes: {key: [(piece metadata, tensor), ...]} and its objects.
                   A piece that several ranks hold alike (replicas) is written once, by the
                   lowest of them, as torch's planner does.
  .metadata        JSON, written by the group's rank 0 once every rank has written its file
                   (renamed into place, so a checkpoint without it is not one): every key's
                   global shape, dtype and pieces (which file), and each file's size and
                   SHA-256.
load() checks each file against its size and checksum before it reads it, every key it needs
against the checkpoint (its shape and dtype), and that the pieces cover every element it needs;
each error names the key, the file or the first element missing. Every rank reads the files
its keys need and assembles each of those keys whole before it cuts its piece (a rank holds
one global tensor at a time beside the files it read).

save() is collective over process_group (default: the world; a process without
torch.distributed saves alone), every wait bounded by the group's timeout; load() waits for no
other rank.
"""

import hashlib
import json
import os

import torch
import torch.distributed as dist

from tessera.torch.distributed_checkpoint.state_dict import ShardedPiece

__all__ = ["ShardedPiece", "load", "save"]

_METADATA = ".metadata"
_VERSION = 1


def _is_param_groups(key, value):
    """An optimizer state dict's param_groups by parameter name (state_dict.py's form)."""
    return (key == "param_groups" and isinstance(value, list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in value))


def _flatten(state_dict, prefix="", out=None):
    """Dotted keys. An optimizer's param_groups become each parameter's hyperparameters
    ("optim.param_groups.<name>.lr"), as torch's DCP stores them, so that a layout that
    groups the parameters otherwise (a pipeline stage's optimizer holds its stage's) finds
    each one's."""
    out = {} if out is None else out
    for key, value in state_dict.items():
        if not isinstance(key, str):
            key = str(key)
        name = prefix + key
        if _is_param_groups(key, value):
            for group in value:
                for param in group["params"]:
                    for hyper, setting in group.items():
                        if hyper != "params":
                            out[f"{name}.{param}.{hyper}"] = setting
        elif isinstance(value, dict):
            _flatten(value, name + ".", out)
        else:
            out[name] = value
    return out


def _piece_of(value):
    """(global_shape, offsets, sizes, flat_start, tensor) of a tensor value."""
    if isinstance(value, ShardedPiece):
        return (tuple(value.global_shape), tuple(value.offsets), tuple(value.sizes),
                value.flat_start, value.tensor)
    shape = tuple(value.shape)
    return shape, (0,) * len(shape), shape, None, value


def _is_tensor(value):
    return isinstance(value, (torch.Tensor, ShardedPiece))


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _distributed():
    return dist.is_available() and dist.is_initialized()


def _rank_and_size(group):
    """This rank's place in the group; (0, 1) for a process without torch.distributed, which
    saves alone (as torch's no_dist)."""
    if not _distributed():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather(value, group, size):
    if not _distributed():
        return [value]
    gathered = [None] * size
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save(state_dict, *, checkpoint_id, process_group=None):
    """Writes state_dict (every rank its own, collectively) into the directory checkpoint_id.
    Raises RuntimeError naming the rank and its error when any rank fails to write; the
    checkpoint then has no .metadata."""
    if checkpoint_id is None:
        raise ValueError("tessera.torch.distributed_checkpoint.save: checkpoint_id (a "
                         "directory) is required")
    directory = os.fspath(checkpoint_id)
    rank, size = _rank_and_size(process_group)
    flat = _flatten(state_dict)
    mine = []  # (key, global_shape, offsets, sizes, flat_start, numel, dtype)
    for key, value in flat.items():
        if _is_tensor(value):
            shape, offsets, sizes, flat_start, tensor = _piece_of(value)
            mine.append((key, shape, offsets, sizes, flat_start, tensor.numel(),
                         _dtype_name(tensor.dtype)))
    plans = _all_gather(mine, process_group, size)
    # Each piece is written by the lowest rank holding it alike; each object by the lowest rank
    # that has the key.
    writer = {}
    for r, plan in enumerate(plans):
        for entry in plan:
            writer.setdefault(entry, r)
    error = None
    payload = {"tensors": {}, "objects": {}}
    file_name = f"rank-{rank}.pt"
    try:
        os.makedirs(directory, exist_ok=True)
        for key, value in flat.items():
            if _is_tensor(value):
                shape, offsets, sizes, flat_start, tensor = _piece_of(value)
                entry = (key, shape, offsets, sizes, flat_start, tensor.numel(),
                         _dtype_name(tensor.dtype))
                if writer[entry] == rank:
                    meta = {"offsets": list(offsets), "sizes": list(sizes),
                            "flat_start": flat_start}
                    payload["tensors"].setdefault(key, []).append(
                        (meta, tensor.detach().cpu().contiguous().clone()))
            else:
                payload["objects"][key] = value
        path = os.path.join(directory, file_name)
        torch.save(payload, path + ".tmp")
        os.replace(path + ".tmp", path)
        written = (True, os.path.getsize(path), _sha256(path))
    except Exception as e:  # every rank must learn of it: no rank may write .metadata
        error = f"{type(e).__name__}: {e}"
        written = (False, 0, "")
    results = _all_gather((error, written, sorted(payload["objects"])), process_group, size)
    failed = [(r, e) for r, (e, _, _) in enumerate(results) if e is not None]
    committed = None
    if not failed and rank == 0:
        try:
            _write_metadata(directory, plans, writer, results, size)
        except Exception as e:
            committed = f"{type(e).__name__}: {e}"
    outcome = [committed]
    if _distributed():
        dist.broadcast_object_list(outcome, src=_global_rank(process_group, 0),
                                   group=process_group)
    if failed:
        r, e = failed[0]
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.save: rank {r} of {size} "
                           f"could not write its part of {directory}: {e} (no .metadata "
                           f"written: the checkpoint is incomplete)")
    if outcome[0] is not None:
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.save: rank 0 could not "
                           f"write {os.path.join(directory, _METADATA)}: {outcome[0]}")


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_process_group_ranks(group)[group_rank]


def _write_metadata(directory, plans, writer, results, size):
    keys = {}
    for entry, r in writer.items():
        key, shape, offsets, sizes, flat_start, numel, dtype = entry
        info = keys.setdefault(key, {"global_shape": list(shape), "dtype": dtype,
                                     "pieces": []})
        if info["global_shape"] != list(shape) or info["dtype"] != dtype:
            raise ValueError(f"'{key}' has global shape {info['global_shape']} ({info['dtype']})"
                             f" on one rank and {list(shape)} ({dtype}) on rank {r}")
        info["pieces"].append({"file": f"rank-{r}.pt", "offsets": list(offsets),
                               "sizes": list(sizes), "flat_start": flat_start,
                               "numel": numel})
    objects = {}
    for r, (_, _, names) in enumerate(results):
        for name in names:
            objects.setdefault(name, f"rank-{r}.pt")
    files = {f"rank-{r}.pt": {"bytes": written[1], "sha256": written[2]}
             for r, (_, written, _) in enumerate(results)}
    metadata = {"version": _VERSION, "world_size": size, "keys": keys, "objects": objects,
                "files": files}
    path = os.path.join(directory, _METADATA)
    with open(path + ".tmp", "w") as f:
        json.dump(metadata, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def _box_indices(shape, offsets, sizes, flat_start, numel):
    """The flat indices, in the global tensor of `shape`, of a piece's elements."""
    index = torch.arange(int(torch.Size(shape).numel()), dtype=torch.int64).view(shape)
    for dim, (offset, length) in enumerate(zip(offsets, sizes)):
        index = index.narrow(dim, offset, length)
    index = index.reshape(-1)
    if flat_start is not None:
        index = index[flat_start:flat_start + numel]
    return index


class _Files:
    """The checkpoint's files, each checked against .metadata and read once."""

    def __init__(self, directory, metadata):
        self.directory = directory
        self.metadata = metadata
        self.loaded = {}

    def get(self, name):
        if name not in self.loaded:
            path = os.path.join(self.directory, name)
            expected = self.metadata["files"].get(name)
            if expected is None:
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} is not "
                                   f"listed in its .metadata")
            if not os.path.exists(path):
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} is "
                                   f"missing (listed in .metadata)")
            actual = os.path.getsize(path)
            if actual != expected["bytes"]:
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} has "
                                   f"{actual} bytes, its .metadata says {expected['bytes']} "
                                   f"(truncated or replaced)")
            if _sha256(path) != expected["sha256"]:
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} does "
                                   f"not match its .metadata's SHA-256 (corrupted)")
            self.loaded[name] = torch.load(path)
        return self.loaded[name]


def load(state_dict, *, checkpoint_id, process_group=None):
    """Fills every tensor of state_dict (and each ShardedPiece's tensor) in place from the
    checkpoint in checkpoint_id, whatever layout and world size saved it; replaces non-tensor
    values by the saved ones. Keys of state_dict the checkpoint lacks, or a global shape or
    dtype that differs, raise RuntimeError naming the key; the checkpoint's other keys are
    ignored. Collective only in that every rank should call it (it waits for no other rank)."""
    if checkpoint_id is None:
        raise ValueError("tessera.torch.distributed_checkpoint.load: checkpoint_id (a "
                         "directory) is required")
    directory = os.fspath(checkpoint_id)
    path = os.path.join(directory, _METADATA)
    if not os.path.exists(path):
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} does not exist: "
                           f"not a checkpoint, or one whose save did not finish")
    with open(path) as f:
        metadata = json.load(f)
    if metadata.get("version") != _VERSION:
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {path} is of version "
                           f"{metadata.get('version')}; this reads version {_VERSION}")
    files = _Files(directory, metadata)
    _fill(state_dict, "", metadata, files, directory)


def _fill(state_dict, prefix, metadata, files, directory):
    for key in list(state_dict):
        value = state_dict[key]
        name = prefix + str(key)
        if _is_param_groups(str(key), value):
            for group in value:
                _fill_param_group(group, name, metadata, files, directory)
        elif isinstance(value, dict):
            _fill(value, name + ".", metadata, files, directory)
        elif _is_tensor(value):
            _fill_tensor(name, value, metadata, files, directory)
        else:
            source = metadata["objects"].get(name)
            if source is None:
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {directory} "
                                   f"has no '{name}'")
            state_dict[key] = files.get(source)["objects"][name]


def _fill_param_group(group, name, metadata, files, directory):
    """A group's hyperparameters from its parameters' saved ones, which must agree."""
    for hyper in [h for h in group if h != "params"]:
        settings = {}
        for param in group["params"]:
            key = f"{name}.{param}.{hyper}"
            source = metadata["objects"].get(key)
            if source is None:
                raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {directory} "
                                   f"has no '{key}'")
            settings[param] = files.get(source)["objects"][key]
        values = list(settings.values())
        if any(v != values[0] for v in values):
            raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: the parameters "
                               f"of one group here had different {hyper!r} when saved: "
                               f"{settings}")
        if values:
            group[hyper] = values[0]


def _fill_tensor(name, value, metadata, files, directory):
    info = metadata["keys"].get(name)
    if info is None:
        near = sorted(metadata["keys"])[:3]
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: {directory} has no "
                           f"tensor '{name}' (it has {len(metadata['keys'])}, e.g. {near})")
    shape, offsets, sizes, flat_start, tensor = _piece_of(value)
    if list(shape) != info["global_shape"]:
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: '{name}' is "
                           f"{info['global_shape']} in {directory} and {list(shape)} here")
    if _dtype_name(tensor.dtype) != info["dtype"]:
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: '{name}' is "
                           f"{info['dtype']} in {directory} and {_dtype_name(tensor.dtype)} "
                           f"here")
    numel = int(torch.Size(shape).numel())
    full = torch.empty(numel, dtype=tensor.dtype)
    covered = torch.zeros(numel, dtype=torch.bool)
    want = _box_indices(shape, offsets, sizes, flat_start, tensor.numel())
    for piece in info["pieces"]:
        index = _box_indices(shape, piece["offsets"], piece["sizes"], piece["flat_start"],
                             piece["numel"])
        # Only the pieces that hold something this rank wants are read.
        if not bool(torch.isin(index, want).any()):
            continue
        saved = [t for meta, t in files.get(piece["file"])["tensors"].get(name, [])
                 if meta["offsets"] == piece["offsets"] and meta["sizes"] == piece["sizes"]
                 and meta["flat_start"] == piece["flat_start"]]
        if not saved:
            raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: "
                               f"{os.path.join(directory, piece['file'])} lacks the piece of "
                               f"'{name}' its .metadata lists")
        full[index] = saved[0].reshape(-1)
        covered[index] = True
    missing = ~covered[want]
    if bool(missing.any()):
        first = int(want[int(missing.nonzero()[0])])
        raise RuntimeError(f"tessera.torch.distributed_checkpoint.load: element {first} of "
                           f"'{name}' {info['global_shape']} is in none of the "
                           f"{len(info['pieces'])} pieces of {directory}")
    with torch.no_grad():
        tensor.copy_(full[want].view(tensor.shape))
