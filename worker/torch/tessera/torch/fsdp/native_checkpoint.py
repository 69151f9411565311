"""Sharded checkpoints of tessera FSDP models in the native sharded checkpoint format
(worker/engines/sharded_state.h, common/training/checkpoint.h; docs/checkpoints.md), so that
tessera-export-params consolidates them and a checkpoint saved at one world size and strategy
loads at any other, or (full_state_dict_from_checkpoint) into the plain nn.Module
(issue 44, item 3).

The mapping onto the native format:
  flat buffer  every float32 parameter of the unwrapped model, flattened and concatenated in
               the order of the FSDP units (module order), each unit's in its flat order,
               then the parameters no unit flattened (ignored modules'); the manifest's
               "tensors" list them by their original names and shapes.
  slices       a rank's part of each parameter in its shard, as absolute element ranges of
               that buffer; replicas (NO_SHARD, the other shard groups of the hybrid
               strategies) write nothing, nor do parameters no unit flattened except on rank 0.
  state        empty: optimizer "sgd" (no per-element state); the optimizer's state travels
               through full_optim_state_dict as before.
  mode         "fsdp", which tessera-export-params reads besides the mode registry's.
Buffers are not parameters of the native format: a model with persistent buffers is refused
(save them with the sharded state dict instead).

The files are written as the C++ writer writes them: each atomically (temporary file, fsync,
rename), the manifest and LATEST by rank 0 only after every rank reported its file.
"""

import json
import os
import struct

import numpy as np
import torch
import torch.distributed as dist

from tessera.torch.fsdp.checkpoint import (
    ShardedSlice, _layout, _shard_start, load_sharded_state_dict, units_with_prefix)

__all__ = ["save_sharded_checkpoint", "load_sharded_checkpoint",
           "full_state_dict_from_checkpoint"]

MODE = "fsdp"
_MAGIC = b"TSRCKPT1"
_FLOAT_KIND, _INT_KIND = 1, 2
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1


def _fnv1a(data, hash_=_FNV_OFFSET):
    for byte in data:
        hash_ = ((hash_ ^ byte) * _FNV_PRIME) & _MASK
    return hash_


def _step_directory(root, step):
    return os.path.join(root, f"step-{step:012d}")


def _write_atomically(path, data):
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(temporary, path)


def _fingerprint(tensors):
    """ParameterLayout::Fingerprint: FNV-1a over each name with its terminator, its rank and
    its dimensions as little-endian 64-bit integers."""
    hash_ = _FNV_OFFSET
    for name, shape in tensors:
        hash_ = _fnv1a(name.encode() + b"\0", hash_)
        hash_ = _fnv1a(struct.pack("<q", len(shape)) + struct.pack(f"<{len(shape)}q", *shape),
                       hash_)
    return hash_


def _is_first_replica(unit):
    from tessera.torch.fsdp.api import ShardingStrategy, _HYBRID
    if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
        return unit.rank == 0
    if unit.sharding_strategy in _HYBRID and unit._replicate_group is not None:
        return dist.get_rank(unit._replicate_group) == 0
    return True


def _entries(model):
    """(name, shape, tensor, start): every parameter of the buffer in order, with this rank's
    slice of it (tensor, possibly empty, from element start) to write."""
    for unit_prefix, unit in units_with_prefix(model):
        shard_start = _shard_start(unit)
        shard_end = shard_start + unit.flat_param.numel()
        writes = _is_first_replica(unit)
        for name, offset, shape, numel in _layout(unit):
            begin, end = max(offset, shard_start), min(offset + numel, shard_end)
            end = max(begin, end) if writes else begin
            yield (unit_prefix + name, list(shape),
                   unit.flat_param.detach()[begin - shard_start:end - shard_start],
                   begin - offset)
    for key, tensor in model._original_entries(flattened=False, model_dtypes=False):
        if not isinstance(tensor, torch.nn.Parameter):
            raise ValueError(f"tessera FSDP: save_sharded_checkpoint: '{key}' is a buffer; the "
                             f"native checkpoint format holds parameters only (use "
                             f"SHARDED_STATE_DICT for models with buffers)")
        flat = tensor.detach().reshape(-1)
        yield key, list(tensor.shape), flat if dist.get_rank() == 0 else flat[:0], 0


def _shard_bytes(slices, params):
    """A TSRCKPT1 file (common/training/checkpoint.cc): float entries, then int entries, each
    in name order, as the C++ writer's maps order them."""
    def entry(kind, name, data, count):
        return (struct.pack("<BI", kind, len(name)) + name.encode() + struct.pack("<Q", count)
                + data)
    out = [_MAGIC, struct.pack("<I", 3),
           entry(_FLOAT_KIND, "params", params.numpy().astype("<f4").tobytes(), params.numel()),
           entry(_FLOAT_KIND, "state", b"", 0),
           entry(_INT_KIND, "slices", struct.pack(f"<{len(slices)}q", *slices), len(slices))]
    return b"".join(out)


def save_sharded_checkpoint(model, directory, step):
    """Collective: every rank writes its slices of every parameter of model (a tessera FSDP
    model) as directory/step-<step>/rank-<r>.ckpt, then rank 0 the manifest and LATEST, in the
    native sharded checkpoint format. Raises on every rank when any rank could not write."""
    tensors, slices, pieces = [], [], []
    at = 0
    for name, shape, tensor, start in _entries(model):
        if tensor.dtype != torch.float32:
            raise ValueError(f"tessera FSDP: save_sharded_checkpoint: '{name}' is "
                             f"{tensor.dtype}; the native format holds float32")
        tensors.append((name, shape))
        if tensor.numel() > 0:
            slices += [at + start, tensor.numel()]
            pieces.append(tensor.reshape(-1))
        at += torch.Size(shape).numel()
    step_directory = _step_directory(directory, step)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    report = {"ok": True, "file": None}
    try:
        os.makedirs(step_directory, exist_ok=True)
        if slices:
            data = _shard_bytes(slices, torch.cat(pieces))
            file = f"rank-{rank}.ckpt"
            _write_atomically(os.path.join(step_directory, file), data)
            report["file"] = {"file": file, "bytes": len(data), "checksum": _fnv1a(data)}
    except OSError as error:
        report = {"ok": False, "error": f"rank {rank}: {error}"}
    reports = [None] * world_size
    dist.all_gather_object(reports, report)
    failed = [r["error"] for r in reports if not r["ok"]]
    if failed:
        raise RuntimeError(f"tessera FSDP: checkpoint of step {step} in {step_directory} not "
                           f"committed: {'; '.join(failed)}")
    committed = [None]
    if rank == 0:
        manifest = {
            "format": "tessera-checkpoint-v1", "step": step, "mode": MODE,
            "layout_fingerprint": _fingerprint(tensors), "dense_elements": at,
            "num_servers": 0, "chunk_elements": 0,
            "files": [r["file"] for r in reports if r["file"] is not None],
            "world_size": world_size, "optimizer": "sgd",
            "tensors": [{"name": n, "shape": s} for n, s in tensors]}
        try:
            _write_atomically(os.path.join(step_directory, "MANIFEST.json"),
                              (json.dumps(manifest, indent=2) + "\n").encode())
            _write_atomically(os.path.join(directory, "LATEST"), f"{step}\n".encode())
        except OSError as error:
            committed = [f"rank 0 could not write the manifest: {error}"]
    dist.broadcast_object_list(committed, src=0)
    if committed[0] is not None:
        raise RuntimeError(f"tessera FSDP: checkpoint of step {step} in {step_directory} not "
                           f"committed: {committed[0]}")


class _Cursor:
    """Reads a shard file's fields; errors name the file and the byte offset."""

    def __init__(self, path, data):
        self.path, self.data, self.offset = path, data, 0

    def take(self, what, size):
        if size > len(self.data) - self.offset:
            raise RuntimeError(f"checkpoint file {self.path}: offset {self.offset}: {what} needs "
                               f"{size} bytes; the file ends first")
        piece = self.data[self.offset:self.offset + size]
        self.offset += size
        return piece


def _read_shard(path, expected):
    """{name: values} of a shard file, checked against the manifest's size and checksum first
    (as ReadCheckpointShard does)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != expected["bytes"]:
        raise RuntimeError(f"checkpoint file {path} has {len(data)} bytes; its manifest says "
                           f"{expected['bytes']} (truncated or replaced)")
    if _fnv1a(data) != expected["checksum"]:
        raise RuntimeError(f"checkpoint file {path} does not match its manifest's checksum "
                           f"(corrupted)")
    cursor = _Cursor(path, data)
    if cursor.take("magic", 8) != _MAGIC:
        raise RuntimeError(f"checkpoint file {path}: offset 0: not a TSRCKPT1 file")
    entries = {}
    for e in range(struct.unpack("<I", cursor.take("entry count", 4))[0]):
        kind, length = struct.unpack("<BI", cursor.take(f"entry {e} kind and name length", 5))
        name = cursor.take(f"entry {e} name", length).decode()
        count = struct.unpack("<Q", cursor.take(f"entry {e} element count", 8))[0]
        if kind not in (_FLOAT_KIND, _INT_KIND):
            raise RuntimeError(f"checkpoint file {path}: offset {cursor.offset}: entry {e} has "
                               f"kind {kind}")
        size = 4 if kind == _FLOAT_KIND else 8
        values = cursor.take(f"entry {e} data", count * size)
        if kind == _INT_KIND:
            entries[name] = list(struct.unpack(f"<{count}q", values))
        else:  # (frombuffer refuses an empty buffer)
            entries[name] = torch.from_numpy(np.frombuffer(values, dtype="<f4").copy())
    for name in ("slices", "params"):
        if name not in entries:
            raise RuntimeError(f"checkpoint file {path}: no '{name}' entry")
    return entries


def _read_slices(directory, step):
    """(manifest path, {name: [ShardedSlice]}) of the checkpoint of step (None: LATEST)."""
    if step is None:
        with open(os.path.join(directory, "LATEST")) as f:
            step = int(f.read())
    step_directory = _step_directory(directory, step)
    manifest_path = os.path.join(step_directory, "MANIFEST.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    if manifest.get("format") != "tessera-checkpoint-v1" or manifest.get("mode") != MODE:
        raise RuntimeError(f"tessera FSDP: {manifest_path} is not a checkpoint of "
                           f"save_sharded_checkpoint (mode {manifest.get('mode')!r})")
    # Where each parameter starts in the buffer, to cut the files' slices back into names.
    starts, at = [], 0
    for tensor in manifest["tensors"]:
        starts.append((at, tensor["name"], torch.Size(tensor["shape"])))
        at += torch.Size(tensor["shape"]).numel()
    state_dict = {}
    for file in manifest["files"]:
        path = os.path.join(step_directory, file["file"])
        entries = _read_shard(path, file)
        ranges, params, read = entries["slices"], entries["params"], 0
        for offset, size in zip(ranges[0::2], ranges[1::2]):
            for begin, name, shape in starts:
                lo, hi = max(offset, begin), min(offset + size, begin + shape.numel())
                if lo < hi:
                    state_dict.setdefault(name, []).append(ShardedSlice(
                        tensor=params[read + lo - offset:read + hi - offset], start=lo - begin,
                        full_shape=shape, world_size=manifest["world_size"], rank=-1,
                        strategy=MODE))
            read += size
    return manifest_path, state_dict


def full_state_dict_from_checkpoint(directory, step=None):
    """The full state dict (for the plain nn.Module) of the checkpoint of step (default:
    LATEST) under directory, written by save_sharded_checkpoint; errors as
    load_sharded_checkpoint's, and ValueError naming a parameter the files do not cover."""
    _, state_dict = _read_slices(directory, step)
    full = {}
    for name, pieces in state_dict.items():
        shape = pieces[0].full_shape
        pieces = sorted(pieces, key=lambda piece: piece.start)
        flat = torch.cat([piece.tensor for piece in pieces])
        if flat.numel() != shape.numel():
            raise ValueError(f"tessera FSDP: the checkpoint in {directory} holds {flat.numel()} "
                             f"of the {shape.numel()} elements of '{name}'")
        full[name] = flat.view(shape)
    return full


def load_sharded_checkpoint(model, directory, step=None):
    """Fills this rank's shards of model (a tessera FSDP model, any world size and strategy)
    from the checkpoint of step (default: LATEST) under directory, written by
    save_sharded_checkpoint. Not collective: every rank reads every file. Raises RuntimeError
    naming the file for a missing, truncated or corrupted one (the checksum), and the
    parameter for one the checkpoint lacks or has in another shape."""
    _, state_dict = _read_slices(directory, step)
    # The parameters no unit flattened load whole (load_sharded_state_dict copies them).
    for key, tensor in model._original_entries(flattened=False, model_dtypes=False):
        if key in state_dict:
            pieces = sorted(state_dict[key], key=lambda piece: piece.start)
            state_dict[key] = torch.cat([p.tensor for p in pieces]).view(tensor.shape)
    load_sharded_state_dict(model, state_dict)
