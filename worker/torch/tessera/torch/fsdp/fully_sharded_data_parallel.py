"""FullyShardedDataParallel in pure Python over any torch.distributed process group whose
backend has all-gather into one tensor, reduce-scatter of one tensor, all_reduce and broadcast
on CPU tensors (tessera; gloo through the fallbacks in collectives.py).

Words used below:
  unit         a module the auto-wrap policy wraps (or the user wraps), plus the root for what
               remains; each unit is one FullyShardedDataParallel instance.
  flat         the unit's parameters concatenated in one 1-D tensor, padded with zeros to a
               multiple of the world size ("padded" numel).
  shard        rank r's slice of the flat tensor: the nn.Parameter the optimizer sees.
  full         the gathered flat tensor. In forward the module's parameters are views of it,
               each a leaf of autograd of its own ("leaves"), whose gradients are gathered in
               the unit's flat gradient as autograd makes them. To free it, its storage is
               resized to 0 and later resized back and refilled (fairscale's trick): the views
               autograd saved in forward stay valid for backward.
"""

import contextlib
import functools
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from tessera.torch.fsdp import runtime
from tessera.torch.fsdp.api import (
    _FREED_AFTER_FORWARD, _HYBRID, BackwardPrefetch, FullStateDictConfig, MixedPrecision,
    ShardingStrategy, StateDictType, _unsupported)
from tessera.torch.fsdp.collectives import all_gather_into, all_gather_strings, reduce_scatter
from tessera.torch.fsdp.state_dict_api import StateDictMethods

__all__ = ["FullyShardedDataParallel"]


def _hybrid_pair(process_group):
    """The (shard_group, replicate_group) of a hybrid strategy's process_group argument."""
    if isinstance(process_group, (tuple, list)):
        if len(process_group) != 2:
            raise ValueError(f"tessera FSDP: a hybrid strategy's process_group is one group or "
                             f"a (shard_group, replicate_group) pair, not {len(process_group)} "
                             f"groups")
        return tuple(process_group)
    if process_group is None or process_group is dist.group.WORLD:
        from tessera.torch.fsdp.hybrid import hybrid_groups
        return hybrid_groups()
    raise ValueError("tessera FSDP: a hybrid strategy with one group shards within each host "
                     "of the default group; for another group pass its (shard_group, "
                     "replicate_group) pair (tessera.torch.hybrid_groups builds one)")


def _groups_of_mesh(device_mesh, process_group, sharding_strategy):
    """process_group as torch 2.2+ derives it from device_mesh: a 1-D mesh is the group; for
    the hybrid strategies a 2-D mesh is (replicate, shard) in that dim order, as in torch's
    _init_process_group_state_for_hybrid_shard (dim 0 across hosts, dim 1 within one)."""
    from tessera.torch.device_mesh import DeviceMesh
    if process_group is not None:
        raise ValueError("tessera FSDP: give process_group or device_mesh, not both")
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"tessera FSDP: device_mesh must be a tessera.torch.DeviceMesh "
                        f"(init_device_mesh), not {type(device_mesh).__name__}")
    if sharding_strategy in _HYBRID:
        if device_mesh.ndim != 2:
            raise ValueError(f"tessera FSDP: {sharding_strategy.name} takes a 2-D device_mesh "
                             f"(replicate, shard), not {device_mesh!r}")
        return device_mesh.get_group(1), device_mesh.get_group(0)
    if device_mesh.ndim != 1:
        raise ValueError(f"tessera FSDP: {sharding_strategy.name} takes a 1-D device_mesh, not "
                         f"{device_mesh!r}: pass the data-parallel dim, e.g. mesh['dp'] (a "
                         f"2-D mesh is for HYBRID_SHARD and _HYBRID_SHARD_ZERO2)")
    return device_mesh.get_group()


def _resize_storage(tensor, numel):
    """Resizes the storage under `tensor` to numel elements (0 frees it), keeping the storage
    object, so every view of it (those autograd saved included) sees the new memory."""
    if hasattr(tensor, "untyped_storage"):
        tensor.untyped_storage().resize_(numel * tensor.element_size())
    else:
        tensor.storage().resize_(numel)


def _cast_floating(value, dtype):
    """value with its floating-point tensors (in lists, tuples and dicts) cast to dtype."""
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floating(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: _cast_floating(item, dtype) for key, item in value.items()}
    return value


def _for_each_tensor(value, fn):
    if torch.is_tensor(value):
        fn(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _for_each_tensor(item, fn)
    elif isinstance(value, dict):
        for item in value.values():
            _for_each_tensor(item, fn)


def _recursive_wrap(module, policy, ignored_modules, ignored_params, wrap, path):
    """torch's auto-wrap: children first, then the module itself with what its children left.
    Returns (module or its wrapper, the number of parameters now in units)."""
    numel = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not policy(module, True, numel):
        return module, 0
    wrapped_numel = 0
    for name, child in module.named_children():
        if child in ignored_modules or isinstance(child, FullyShardedDataParallel):
            continue
        child_path = f"{path}.{name}" if path else name
        new_child, child_numel = _recursive_wrap(child, policy, ignored_modules, ignored_params,
                                                 wrap, child_path)
        setattr(module, name, new_child)
        wrapped_numel += child_numel
    if path and policy(module, False, numel - wrapped_numel):
        return wrap(module, path), numel
    return module, wrapped_numel


class FullyShardedDataParallel(StateDictMethods, nn.Module):
    """torch.distributed.fsdp.FullyShardedDataParallel (later releases' semantics) for CPU
    tensors. Supported: process_group (for HYBRID_SHARD and _HYBRID_SHARD_ZERO2 one group, the
    default, to shard within each host, or a (shard_group, replicate_group) pair: see
    hybrid_groups), or instead device_mesh (tessera.torch.init_device_mesh: 1-D, or for the
    hybrid strategies 2-D (replicate, shard), as torch's), sharding_strategy (all five),
    mixed_precision, auto_wrap_policy, ignored_modules, device_id None or CPU,
    sync_module_states, no_sync(), clip_grad_norm_(), summon_full_params(), full, local and
    sharded state dicts (checkpoint.py), and the full optimizer state dict functions. Gathers
    and reduce-scatters run on the backend's comm thread (runtime.py): backward_prefetch
    (BACKWARD_PRE, the default, or BACKWARD_POST) issues the next unit's gather in backward,
    forward_prefetch=True in forward, each from the order the units ran in the first
    iteration; at most one unit is prefetched, so at most two are gathered at once whatever
    limit_all_gathers says. Other arguments that are not their default raise
    NotImplementedError (issue 44).

    mixed_precision: the shards (and the optimizer) stay in the parameters' dtype; the full
    parameters are gathered in param_dtype, floating-point inputs are cast to it, gradients are
    reduced in reduce_dtype (default param_dtype) and accumulated into the shards' .grad in
    the parameters' dtype; buffers are cast to buffer_dtype (state dicts keep their dtype).
    bfloat16 works for every module; float16 only for modules whose CPU kernels torch 1.13 has
    in float16: not nn.Linear (addmm), attention or LayerNorm, which raise torch's own
    "not implemented for 'Half'".

    Not thread-safe: one thread drives forward and backward, as with torch's.
    """

    def __init__(self, module, process_group=None, sharding_strategy=None, cpu_offload=None,
                 auto_wrap_policy=None, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision=None, ignored_modules=None, param_init_fn=None, device_id=None,
                 sync_module_states=False, forward_prefetch=False, limit_all_gathers=False,
                 use_orig_params=False, *, device_mesh=None, _unit_name=None):
        super().__init__()
        runtime.tune_malloc()
        runtime.use_block_cache()
        if sharding_strategy is None:
            sharding_strategy = ShardingStrategy.FULL_SHARD
        if not isinstance(sharding_strategy, ShardingStrategy):
            raise TypeError(f"tessera FSDP: sharding_strategy must be a ShardingStrategy, not "
                            f"{sharding_strategy!r}")
        if cpu_offload is not None and cpu_offload.offload_params:
            raise _unsupported("cpu_offload")
        if mixed_precision is not None:
            for field in ("param_dtype", "reduce_dtype", "buffer_dtype"):
                dtype = getattr(mixed_precision, field)
                if dtype not in (None, torch.float16, torch.bfloat16, torch.float32):
                    raise ValueError(f"tessera FSDP: MixedPrecision.{field}={dtype}: float16, "
                                     f"bfloat16, float32 or None")
        if device_id is not None and torch.device(device_id).type != "cpu":
            raise ValueError(f"tessera FSDP: device_id={device_id!r}: only CPU tensors are "
                             f"supported (device_id None or 'cpu')")
        if any(p.device.type not in ("cpu", "meta") for p in module.parameters()):
            raise ValueError("tessera FSDP: the module has parameters off the CPU; only CPU "
                             "tensors are supported (and meta ones, materialized on the CPU: "
                             "param_init_fn)")
        # The mesh's groups stand for process_group, once, at the outermost unit (the units
        # auto-wrap makes get the groups).
        self._device_mesh = device_mesh
        if device_mesh is not None:
            process_group = _groups_of_mesh(device_mesh, process_group, sharding_strategy)
        # Hybrid strategies: process_group becomes the (shard_group, replicate_group) pair
        # once, at the outermost unit, and the units auto-wrap makes get the pair.
        self._replicate_group = None
        if sharding_strategy in _HYBRID:
            process_group = _hybrid_pair(process_group)
            self._replicate_group = process_group[1]
            self.process_group = process_group[0]
        elif isinstance(process_group, (tuple, list)):
            raise ValueError(f"tessera FSDP: a (shard_group, replicate_group) pair is for "
                             f"HYBRID_SHARD and _HYBRID_SHARD_ZERO2, not "
                             f"{sharding_strategy.name}")
        else:
            self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.sharding_strategy = sharding_strategy
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        # Gradients are averaged over every rank that trains (as DDP does): the shard group's
        # times the replicate group's.
        self._gradient_divisor = self.world_size * (
            dist.get_world_size(self._replicate_group) if self._replicate_group else 1)
        # A unit the auto-wrap made is named by its path in the root's module; the root (or a
        # unit the user wrapped by hand) "<root>".
        self._unit_name = _unit_name or "<root>"
        self._is_root = None  # decided at the first forward (_lazy_init)
        self._sync_gradients = True
        self._state_dict_type = StateDictType.FULL_STATE_DICT
        self._state_dict_config = FullStateDictConfig()
        self._mixed_precision = mixed_precision or MixedPrecision()
        self._backward_prefetch = backward_prefetch
        self._forward_prefetch = forward_prefetch
        self._runtime = None  # the root's (runtime.py), set at the first forward
        self._gather = None   # the all-gather in flight (runtime.Issued), if any
        self._following_in_backward = None  # the unit this one's backward prefetches
        self._pre_backward_done = False
        self._gradient_shard_bytes = 0  # what the root last told the metrics
        self._full_gradient_bytes = 0   # this unit's unreduced gradient held (metrics)
        # This backward's flat gradient (see _leaf_gradient), and the unreduced one no_sync
        # keeps for the next backward.
        self._grad_accumulators = []
        self._grad_target = None
        self._grad_filled = None
        self._full_grad = None

        ignored_modules = set(ignored_modules or ())
        for m in list(ignored_modules):
            ignored_modules.update(m.modules())
        self._ignored_modules = ignored_modules
        ignored_params = {p for m in ignored_modules for p in m.parameters()}

        arguments = dict(process_group=process_group, sharding_strategy=sharding_strategy,
                         backward_prefetch=backward_prefetch, ignored_modules=ignored_modules,
                         device_id=device_id, sync_module_states=sync_module_states,
                         mixed_precision=mixed_precision, param_init_fn=param_init_fn,
                         forward_prefetch=forward_prefetch, limit_all_gathers=limit_all_gathers,
                         use_orig_params=use_orig_params)
        if auto_wrap_policy is not None:
            def wrap(child, path):
                return FullyShardedDataParallel(child, **arguments, _unit_name=path)
            _recursive_wrap(module, auto_wrap_policy, ignored_modules, ignored_params, wrap, "")
        self._fsdp_wrapped_module = module
        self._use_orig_params = use_orig_params
        self._materialize(param_init_fn)
        self._flatten(ignored_params)
        self._check_same_on_every_rank()
        # The dtype of the full parameters (forward and backward) and of the gradients'
        # reduction; the shards stay in the parameters' own dtype (the optimizer's).
        self._param_dtype = self._mixed_precision.param_dtype or self._dtype
        self._reduce_dtype = self._mixed_precision.reduce_dtype or self._param_dtype
        if sync_module_states:
            # Replicate group first: its rank 0 is on the first host, whose shard-group rank 0
            # then holds rank 0's values for the broadcast within each host.
            if self._replicate_group is not None:
                self._broadcast_from_rank0(self._replicate_group)
            self._broadcast_from_rank0(self.process_group)
        self._shard()

    # -- construction ---------------------------------------------------------------------------

    def _own_modules(self):
        """(path, module) of the wrapped modules this unit flattens: not inside a nested unit
        or an ignored module."""
        stack = [("", self._fsdp_wrapped_module)]
        while stack:
            path, m = stack.pop(0)
            if isinstance(m, FullyShardedDataParallel) or m in self._ignored_modules:
                continue
            yield path, m
            for name, child in m.named_children():
                stack.append((f"{path}.{name}" if path else name, child))

    def _materialize(self, param_init_fn):
        """Modules of this unit with parameters or buffers on the meta device get real ones on
        the CPU, unit by unit (each is sharded before the next is made), as in later torch
        releases: param_init_fn(module) for each, or else empty tensors that the module's
        reset_parameters() fills. Nested units and ignored modules are out of the tree
        meanwhile, so that a param_init_fn that recurses (torch 1.13's Module.to_empty does)
        leaves them alone."""
        def has_meta(m):
            return any(t is not None and t.is_meta
                       for t in list(m._parameters.values()) + list(m._buffers.values()))
        own = [m for _, m in self._own_modules()]
        if not any(has_meta(m) for m in own):
            return
        if param_init_fn is None:
            for path, m in self._own_modules():
                if has_meta(m) and not hasattr(m, "reset_parameters"):
                    where = f"'{path}'" if path else "the unit's own module"
                    raise ValueError(f"tessera FSDP: {where} ({type(m).__name__}) of unit "
                                     f"'{self._unit_name}' is on the meta device and has no "
                                     f"reset_parameters() to materialize it: give "
                                     f"param_init_fn")
        detached = [(m, name, child) for m in own for name, child in m._modules.items()
                    if isinstance(child, FullyShardedDataParallel)
                    or child in self._ignored_modules]
        for m, name, _ in detached:
            m._modules[name] = None
        try:
            for m in own:
                if not has_meta(m):  # real from the start, or made so with its parent
                    continue
                if param_init_fn is not None:
                    param_init_fn(m)
                    continue
                with torch.no_grad():
                    for name, p in m._parameters.items():
                        if p is not None and p.is_meta:
                            m._parameters[name] = nn.Parameter(
                                torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
                    for name, b in m._buffers.items():
                        if b is not None and b.is_meta:
                            m._buffers[name] = torch.empty_like(b, device="cpu")
                m.reset_parameters()
        finally:
            for m, name, child in detached:
                m._modules[name] = child
        for path, m in self._own_modules():
            for name, t in list(m._parameters.items()) + list(m._buffers.items()):
                if t is not None and t.device.type != "cpu":
                    where = f"{path}.{name}" if path else name
                    raise ValueError(f"tessera FSDP: '{where}' of unit '{self._unit_name}' is "
                                     f"on {t.device} after materialization; param_init_fn must "
                                     f"leave every tensor of the module it is given on the CPU")

    def _flatten(self, ignored_params):
        # _param_slots: (module, attribute, index into _params) for every reference, tied
        # parameters (one tensor under two names) included; _params: the distinct tensors.
        self._param_slots = []
        self._params = []
        self._param_names = []
        index_of = {}
        for path, m in self._own_modules():
            m._tessera_fsdp_param_names = [n for n, p in m._parameters.items()
                                           if p is not None and p not in ignored_params]
            for name in m._tessera_fsdp_param_names:
                p = m._parameters[name]
                if getattr(p, "_tessera_fsdp_flattened", False) and id(p) not in index_of:
                    raise ValueError(f"tessera FSDP: parameter '{path}.{name}' is shared with "
                                     f"another FSDP unit; tied parameters must be in one unit")
                if id(p) not in index_of:
                    index_of[id(p)] = len(self._params)
                    self._params.append(p)
                    self._param_names.append(f"{path}.{name}" if path else name)
                    p._tessera_fsdp_flattened = True
                self._param_slots.append((m, name, index_of[id(p)]))
        self._shapes = [p.shape for p in self._params]
        self._numels = [p.numel() for p in self._params]
        self._numel = sum(self._numels)
        dtypes = {p.dtype for p in self._params}
        if len(dtypes) > 1:
            raise ValueError(f"tessera FSDP: unit '{self._unit_name}' mixes parameter dtypes "
                             f"{sorted(str(d) for d in dtypes)}; one flat parameter needs one")
        self._dtype = dtypes.pop() if dtypes else torch.float32
        self._requires_grad = any(p.requires_grad for p in self._params)
        for m, name, _ in self._param_slots:
            if name in m._parameters:
                del m._parameters[name]

    def _describe(self):
        lines = [f"unit '{self._unit_name}' ({type(self._fsdp_wrapped_module).__name__})"]
        if self._unit_name == "<root>":
            count = sum(isinstance(m, FullyShardedDataParallel) for m in self.modules())
            lines[0] += f" with {count} units"
        for name, p in zip(self._param_names, self._params):
            lines.append(f"{name}\t{list(p.shape)} {str(p.dtype).replace('torch.', '')}")
        return "\n".join(lines)

    def _check_same_on_every_rank(self):
        """Fails on every rank when the ranks' units differ, naming the unit, the parameter and
        both shapes: their collectives would otherwise mismatch."""
        everyone = [d.split("\n") for d in
                    all_gather_strings(self._describe(), self.process_group)]
        mine = everyone[self.rank]
        for r, theirs in enumerate(everyone):
            if theirs == mine:
                continue
            if theirs[0] != mine[0]:
                problem = f"rank {self.rank} wraps {mine[0]} where rank {r} wraps {theirs[0]}"
            else:
                ours = dict(line.split("\t") for line in mine[1:])
                others = dict(line.split("\t") for line in theirs[1:])
                problem = next(
                    (f"parameter '{n}': rank {self.rank} has {ours.get(n, 'none')}, rank {r} "
                     f"has {others.get(n, 'none')}"
                     for n in list(ours) + list(others) if ours.get(n) != others.get(n)),
                    "parameters in a different order")
            raise ValueError(f"tessera FSDP: the ranks' models differ in {mine[0]}: {problem}")

    def _broadcast_from_rank0(self, group):
        # broadcast's src is a rank of the default group.
        get_global_rank = getattr(dist, "get_global_rank", None) or \
            dist.distributed_c10d._get_global_rank
        source = 0 if group is dist.group.WORLD else get_global_rank(group, 0)
        with torch.no_grad():
            for p in self._params:
                dist.broadcast(p.data, src=source, group=group)
            for _, m in self._own_modules():
                for b in m._buffers.values():
                    if b is not None:
                        dist.broadcast(b, src=source, group=group)

    def _shard(self):
        sharded = self.sharding_strategy != ShardingStrategy.NO_SHARD
        world = self.world_size if sharded else 1
        self._padded = math.ceil(self._numel / world) * world
        self._shard_numel = self._padded // world
        self._cast_buffers()
        if self._numel == 0:
            self.flat_param = None
            self._full = None
            return
        with torch.no_grad():
            flat = torch.zeros(self._padded, dtype=self._dtype)
            flat[:self._numel] = torch.cat([p.detach().reshape(-1) for p in self._params])
        if sharded:
            start = self.rank * self._shard_numel
            self._set_flat_param(nn.Parameter(flat[start:start + self._shard_numel].clone(),
                                              requires_grad=self._requires_grad))
            self._full = flat.to(self._param_dtype)
        elif self._param_dtype == self._dtype:
            # The shard is the whole: the full tensor shares its memory (other version counter).
            self._set_flat_param(nn.Parameter(flat, requires_grad=self._requires_grad))
            self._full = flat.data
        else:
            # NO_SHARD in lower precision: the full tensor is the shard's cast copy, made anew
            # at each forward.
            self._set_flat_param(nn.Parameter(flat, requires_grad=self._requires_grad))
            self._full = flat.to(self._param_dtype)
        self._full_is_shard = self._full.data_ptr() == self.flat_param.data_ptr()
        runtime.add_bytes("shard", self.flat_param.numel() * self.flat_param.element_size())
        self._full_bytes = self._padded * self._full.element_size()
        self._params = None  # the originals are now views of the full tensor
        self._offsets = [0]
        for numel in self._numels:
            self._offsets.append(self._offsets[-1] + numel)
        # Views for attribute access before the first forward; made before the storage is freed.
        self._set_views(self._full.data)
        self._full_gathered = True
        if not self._full_is_shard:
            runtime.add_bytes("gathered", self._full_bytes)
        self._free_full()
        if self._use_orig_params:
            self._register_orig_params()

    def _set_flat_param(self, flat_param):
        """The unit's shard: its one parameter, or with use_orig_params a plain attribute (the
        module's parameters are then the original ones, views of their slices of it)."""
        if self._use_orig_params:
            object.__setattr__(self, "flat_param", flat_param)
        else:
            self.flat_param = flat_param

    def _register_orig_params(self):
        """use_orig_params: each original parameter is registered again as a view of its slice
        of this rank's shard: 1-D (possibly empty) when sharded, its shape with NO_SHARD, as
        in later torch releases. The optimizer steps them in place in the shard."""
        start = self.rank * self._shard_numel if (
            self.sharding_strategy != ShardingStrategy.NO_SHARD) else 0
        end = start + self._shard_numel
        self._orig_params = []  # (parameter, first, last element in the shard)
        offset = 0
        for shape, numel in zip(self._shapes, self._numels):
            first, last = max(offset, start) - start, min(offset + numel, end) - start
            first, last = min(first, self._shard_numel), max(min(first, self._shard_numel), last)
            view = self.flat_param.data[first:last]
            if self.sharding_strategy == ShardingStrategy.NO_SHARD:
                view = view.view(shape)
            self._orig_params.append((nn.Parameter(view, requires_grad=self._requires_grad),
                                      first, last))
            offset += numel
        for m, name, index in self._param_slots:
            m._parameters[name] = self._orig_params[index][0]
            m.__dict__.pop(name, None)

    def _accumulate_shard_grad(self, grad):
        """Adds this backward's shard gradient to the shard's .grad (and, with
        use_orig_params, to the original parameters' .grad, views of it: what the optimizer
        zeroed or set to None there counts as zero)."""
        flat = self.flat_param
        if self._use_orig_params and flat.grad is not None:
            olds = [(p.grad, first, last) for p, first, last in self._orig_params]
            if all(old is None for old, _, _ in olds):
                flat.grad = None
            else:
                for old, first, last in olds:
                    mine = flat.grad[first:last]
                    if old is None:
                        mine.zero_()
                    elif old.data_ptr() != mine.data_ptr() or old.numel() != mine.numel():
                        mine.copy_(old.reshape(-1))
        if flat.grad is None:
            flat.grad = grad
        else:
            flat.grad.add_(grad)
        if self._use_orig_params:
            for p, first, last in self._orig_params:
                p.grad = flat.grad[first:last].view(p.shape)

    def drop_gradients(self):
        """Sets the shard's gradients (and the original parameters') to None."""
        if self.flat_param is not None:
            self.flat_param.grad = None
        for p, _, _ in getattr(self, "_orig_params", ()):
            p.grad = None

    # -- gather and free ------------------------------------------------------------------------

    def _start_gather(self):
        """Issues the all-gather of the full parameters on the comm thread (a no-op when they
        are gathered or being gathered)."""
        if self.flat_param is None or self._full_gathered or self._gather is not None:
            return
        _resize_storage(self._full, self._padded)
        runtime.add_bytes("gathered", self._full_bytes)
        with torch.no_grad():
            # Cast before the gather: the same values as casting after, in less traffic.
            shard = self.flat_param.data.to(self._param_dtype)
            if self.sharding_strategy == ShardingStrategy.NO_SHARD:
                self._full.data.copy_(shard)
                self._full_gathered = True
                return
            full = self._full.data
            phase = (runtime.BACKWARD_GATHER
                     if self._runtime is not None and self._runtime.in_backward
                     else runtime.FORWARD_GATHER)
            self._gather = runtime.Issued(
                self._runtime, self, phase, self.process_group,
                lambda: all_gather_into(full, shard, self.process_group, async_op=True),
                self._full_bytes, keep=(shard,))

    def _gather_full(self, prefetched=False):
        if self.flat_param is None or self._full_gathered:
            return
        if self._gather is None:
            prefetched = False
            self._start_gather()
        if self._gather is not None:
            gather, self._gather = self._gather, None
            gather.wait(prefetched=prefetched)
        self._full_gathered = True

    def _full_precision_full(self):
        """The gathered flat tensor in the shards' dtype: _full itself (gathered) without
        mixed precision, else a new tensor (_full stays freed)."""
        if self._param_dtype == self._dtype:
            self._gather_full()
            return self._full.data
        if self._full_is_shard or self.sharding_strategy == ShardingStrategy.NO_SHARD:
            return self.flat_param.data
        full = torch.empty(self._padded, dtype=self._dtype)
        all_gather_into(full, self.flat_param.data, self.process_group)
        return full

    def _cast_buffers(self):
        """Casts the floating-point buffers of this unit's modules to buffer_dtype, keeping
        their dtypes for the state dict."""
        dtype = self._mixed_precision.buffer_dtype
        if dtype is None:
            return
        for _, m in self._own_modules():
            m._tessera_fsdp_buffer_dtypes = {}
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point():
                    m._tessera_fsdp_buffer_dtypes[name] = b.dtype
                    m._buffers[name] = b.to(dtype)

    def _free_full(self):
        if self._full is None or self._full_is_shard:
            return
        if self._gather is not None:  # a prefetch not used: its gather must finish first
            gather, self._gather = self._gather, None
            gather.wait()
            self._full_gathered = True
        if self._full_gathered:
            runtime.add_bytes("gathered", -self._full_bytes)
        _resize_storage(self._full, 0)
        self._full_gathered = False
        if self._use_orig_params:  # the attributes are the sharded originals again
            for m, name, _ in self._param_slots:
                m.__dict__.pop(name, None)

    def _set_views(self, full, views=None):
        if views is None:
            views = [v.view(shape)
                     for v, shape in zip(full[:self._numel].split(self._numels),
                                         self._shapes)]
        for m, name, index in self._param_slots:
            # In the instance's dict: found before the module's parameters (use_orig_params
            # keeps the sharded originals registered there).
            m.__dict__[name] = views[index]

    def _set_leaves(self):
        """The module's parameters for a forward: views of the gathered full tensor, each a
        leaf of autograd whose gradient _leaf_gradient moves into the unit's flat gradient as
        soon as autograd has accumulated it. One leaf for the whole flat tensor, with the
        parameters as its views, would keep every parameter's gradient until the last one is
        made and then copy them all into one (the views' backward concatenates): a whole unit's
        gradient more at the peak of backward."""
        full = self._full.data[:self._numel]
        leaves = [v.view(shape).requires_grad_(self._requires_grad)
                  for v, shape in zip(full.split(self._numels), self._shapes)]
        # The AccumulateGrad nodes are kept here: a tensor holds its own only weakly, and a new
        # node would not have the hook.
        self._grad_accumulators = []
        if self._requires_grad and torch.is_grad_enabled():
            for index, leaf in enumerate(leaves):
                node = leaf.expand_as(leaf).grad_fn.next_functions[0][0]
                node.register_hook(functools.partial(self._leaf_gradient, index, leaf))
                self._grad_accumulators.append(node)
        self._leaves_pending = len(leaves)
        self._set_views(self._full, leaves)

    def _leaf_gradient(self, index, leaf, *unused):
        """AccumulateGrad's hook for parameter `index`: moves its gradient into this
        backward's flat gradient (added to what no_sync kept), and once every parameter's is
        in, reduces it (_post_backward). Parameters no gradient reaches leave zeros, and the
        root's end of backward reduces a unit that some never reached."""
        grad = leaf.grad
        leaf.grad = None
        if grad is None:
            return
        with torch.no_grad():
            if self._grad_target is None:
                if self._full_grad is not None:  # no_sync's sum so far: added to
                    self._grad_target, self._full_grad = self._full_grad, None
                    self._grad_filled = None
                else:
                    # The unit before's reduction has had this unit's first gradient's time to
                    # finish: its full gradient is freed before this one is made.
                    self._runtime.finish_reduction()
                    self._grad_target = torch.empty(self._padded, dtype=grad.dtype)
                    self._grad_target[self._numel:].zero_()
                    self._grad_filled = [False] * len(self._numels)
                    self._count_full_gradient(self._grad_target)
            part = self._grad_target[self._offsets[index]:self._offsets[index + 1]]
            if self._grad_filled is None:
                part.add_(grad.reshape(-1))
            else:
                part.copy_(grad.reshape(-1))
                self._grad_filled[index] = True
        del grad
        self._leaves_pending -= 1
        if self._leaves_pending == 0:
            self._post_backward()

    def _take_gradient(self):
        """This backward's flat gradient (None if none came), its unfilled parts zeroed."""
        grad, self._grad_target = self._grad_target, None
        if grad is not None and self._grad_filled is not None:
            with torch.no_grad():
                for index, filled in enumerate(self._grad_filled):
                    if not filled:
                        grad[self._offsets[index]:self._offsets[index + 1]].zero_()
        self._grad_filled = None
        return grad

    def finish_partial_gradient(self):
        """At the root's end of backward: reduces a gradient some parameters' never reached
        (they count as zero)."""
        if self._grad_target is not None:
            self._leaves_pending = 0
            self._post_backward()

    # -- forward and backward -------------------------------------------------------------------

    def _fsdp_units(self):
        return [m for m in self.modules() if isinstance(m, FullyShardedDataParallel)]

    def _lazy_init(self):
        units = self._fsdp_units()
        for unit in units:
            unit._is_root = unit is self
        runtime.Runtime(self, units)
        self._callback_queued = False

    def forward(self, *args, **kwargs):
        if self._is_root is None:
            self._lazy_init()
        if self.flat_param is not None:
            # Parameters change between forwards (the optimizer steps the shards); a gather
            # prefetched in this forward has the new ones.
            if self._gather is None:
                self._free_full()
            self._gather_full(prefetched=True)
            self._set_leaves()
        following = self._runtime.forward_started(self)
        # One gathered in an earlier forward without backward (evaluation) refreshes itself.
        if following is not None and self._forward_prefetch and not following._full_gathered:
            following._start_gather()
        if self._param_dtype != self._dtype:
            # The inputs in the parameters' dtype, as torch's FSDP casts them.
            args, kwargs = _cast_floating((args, kwargs), self._param_dtype)
        output = self._fsdp_wrapped_module(*args, **kwargs)
        # The root keeps its parameters until its backward; FULL_SHARD frees the others now.
        if self.sharding_strategy in _FREED_AFTER_FORWARD and not self._is_root:
            self._free_full()
        if torch.is_grad_enabled():
            self._pre_backward_done = False
            _for_each_tensor(output, lambda t: t.register_hook(self._pre_backward)
                             if t.requires_grad else None)
        return output

    def _pre_backward(self, grad):
        if self._pre_backward_done:  # once per backward, whichever output's gradient is first
            return grad
        self._pre_backward_done = True
        if self._is_root and not self._callback_queued:
            self._callback_queued = True
            self._runtime.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        self._gather_full(prefetched=True)
        following = self._runtime.backward_started(self)
        self._following_in_backward = following
        if following is not None and self._backward_prefetch == BackwardPrefetch.BACKWARD_PRE:
            following._start_gather()
        return grad

    def _post_backward(self):
        # The next backward gathers again: it may be another forward's, run before this one's
        # backward (a pipeline schedule runs several micro-batches' forwards first).
        self._pre_backward_done = False
        grad = self._take_gradient()
        # Freed before the reduction is issued: issuing it finishes the one before (its full
        # gradient held until then), and this unit's parameters are not needed any more.
        self._free_full()
        if grad is not None and self._sync_gradients:
            with torch.no_grad():
                # Averaged, as DDP does, in the reduction's dtype; in place (the gradient is
                # this unit's alone), so no second full-size tensor is held meanwhile.
                reduced = grad.to(self._reduce_dtype).div_(self._gradient_divisor)
            del grad
            self._reduce(reduced)
        elif grad is not None:
            # no_sync: keep the unreduced full gradient for the next synced backward.
            self._full_grad = grad
            self._count_full_gradient(grad)
        following = self._following_in_backward
        if following is not None and self._backward_prefetch == BackwardPrefetch.BACKWARD_POST:
            following._start_gather()

    def _count_full_gradient(self, grad):
        held = 0 if grad is None else grad.numel() * grad.element_size()
        runtime.add_bytes("full_gradient", held - self._full_gradient_bytes)
        self._full_gradient_bytes = held

    def _reduce(self, reduced):
        """Issues the reduction of a full gradient on the comm thread; the shard's gradient
        is accumulated once it completed (Runtime.finish_reduction)."""
        self._count_full_gradient(reduced)
        nbytes = reduced.numel() * reduced.element_size()
        if self.sharding_strategy == ShardingStrategy.NO_SHARD:
            shard_grad = reduced
            issued = runtime.Issued(
                self._runtime, self, runtime.ALL_REDUCE, self.process_group,
                lambda: dist.all_reduce(reduced, group=self.process_group, async_op=True),
                nbytes, keep=(reduced,))
        else:
            shard_grad = torch.empty(self._shard_numel, dtype=reduced.dtype)
            issued = runtime.Issued(
                self._runtime, self, runtime.REDUCE_SCATTER, self.process_group,
                lambda: reduce_scatter(shard_grad, reduced, self.process_group, async_op=True),
                nbytes, keep=(reduced, shard_grad))

        def finish():
            if reduced is not shard_grad:
                # Freed now: the backend may hold the tensor until its next op.
                _resize_storage(reduced, 0)
            self._count_full_gradient(None)
            if self._replicate_group is not None:
                runtime.Issued(
                    self._runtime, self, runtime.REPLICATE, self._replicate_group,
                    lambda: dist.all_reduce(shard_grad, group=self._replicate_group,
                                            async_op=True),
                    shard_grad.numel() * shard_grad.element_size()).wait()
            with torch.no_grad():
                self._accumulate_shard_grad(shard_grad.to(self._dtype))
        self._runtime.reduce(self, issued, finish)

    def _finish_backward(self):
        self._callback_queued = False
        self._runtime.backward_finished()

    def _name_of_shard_element(self, at):
        """'parameter' (element e of n) of element `at` of this rank's gradient shard."""
        start = self.rank * self._shard_numel if (
            self.sharding_strategy != ShardingStrategy.NO_SHARD) else 0
        element = start + at
        offset = 0
        prefix = "" if self._unit_name == "<root>" else self._unit_name + "."
        for name, numel in zip(self._param_names, self._numels):
            if element < offset + numel:
                return f"'{prefix}{name}' (element {element - offset} of {numel})"
            offset += numel
        return f"the padding of unit '{self._unit_name}' (element {element})"

    @property
    def nonfinite_skipped_steps(self):
        """The backwards whose gradients TESSERA_ON_NONFINITE=skip dropped (on the root)."""
        return self._runtime.skipped_steps if self._runtime is not None else 0

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients of the backwards inside accumulate unreduced on each rank (full size);
        the first backward after it reduces their sum."""
        units = self._fsdp_units()
        previous = [u._sync_gradients for u in units]
        for u in units:
            u._sync_gradients = False
        try:
            yield
        finally:
            for u, p in zip(units, previous):
                u._sync_gradients = p

    # -- gradients ------------------------------------------------------------------------------

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Scales every shard's gradient so that the norm of all gradients together (over all
        ranks) is at most max_norm, as torch.nn.utils.clip_grad_norm_ does on the unsharded
        model. Returns that total norm. A collective: every rank calls it."""
        norm_type = float(norm_type)
        sharded, replicated = [], []
        for u in self._fsdp_units():
            if u.flat_param is not None and u.flat_param.grad is not None:
                (replicated if u.sharding_strategy == ShardingStrategy.NO_SHARD
                 else sharded).append(u.flat_param.grad)
        # Ignored modules' parameters are replicated, as in DDP.
        for m in self._ignored_modules:
            replicated += [p.grad for p in m.parameters(recurse=False) if p.grad is not None]
        if math.isinf(norm_type):
            local = torch.tensor([max([g.abs().max().item() for g in sharded] or [0.0])],
                                 dtype=torch.float64)
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.process_group)
            total = max([local.item()] + [g.abs().max().item() for g in replicated])
        else:
            local = torch.tensor([sum(g.double().abs().pow(norm_type).sum().item()
                                      for g in sharded)], dtype=torch.float64)
            dist.all_reduce(local, group=self.process_group)
            total = local.item() + sum(g.double().abs().pow(norm_type).sum().item()
                                       for g in replicated)
            total = total ** (1.0 / norm_type)
        clip_coef = float(max_norm) / (total + 1e-6)
        if clip_coef < 1.0:
            for g in sharded + replicated:
                g.mul_(clip_coef)
        return torch.tensor(total)

    # -- full parameters and state dicts --------------------------------------------------------

    @contextlib.contextmanager
    def summon_full_params(self, writeback=True, rank0_only=False, offload_to_cpu=False,
                           with_grads=False, recurse=True):
        """Within it the wrapped modules hold their full parameters (plain tensors); with
        writeback=True changes made to them are kept (each rank keeps its shard of them)."""
        if with_grads:
            raise _unsupported("summon_full_params(with_grads=True)")
        units = self._fsdp_units() if recurse else [self]
        units = [u for u in units if u.flat_param is not None]
        fulls = []
        for u in units:
            fulls.append(u._full_precision_full())
            u._set_views(fulls[-1])
        try:
            yield
        finally:
            with torch.no_grad():
                for u, full in zip(units, fulls):
                    if writeback and full.data_ptr() != u.flat_param.data_ptr():
                        start = u.rank * u._shard_numel
                        u.flat_param.data.copy_(full[start:start + u._shard_numel])
                    u._free_full()

    @property
    def module(self):
        return self._fsdp_wrapped_module

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_fsdp_wrapped_module":
                raise
            return getattr(self._fsdp_wrapped_module, name)
