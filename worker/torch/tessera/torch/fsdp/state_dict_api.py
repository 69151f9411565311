"""The state dict methods of FullyShardedDataParallel (full, local and sharded state dicts, and
the optimizer state dict functions), as torch.distributed.fsdp names them; the formats
themselves are in checkpoint.py."""

import contextlib

import torch

from tessera.torch.fsdp.api import (
    _DEFAULT_CONFIGS, StateDictType, _IncompatibleKeys, _unsupported)


class StateDictMethods:
    """Mixed into FullyShardedDataParallel."""

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type, state_dict_config=None,
                        optim_state_dict_config=None):
        """Sets the kind of state dict of every FSDP unit in module within it:
        FULL_STATE_DICT (the unwrapped model's, gathered), LOCAL_STATE_DICT (each unit's shard
        as it is, "<unit>.flat_param"; loads only where it was saved) or SHARDED_STATE_DICT
        (each parameter's slice in this rank's shard by name: tessera.torch.fsdp.checkpoint;
        loads at any world size and strategy)."""
        units = [m for m in module.modules() if isinstance(m, StateDictMethods)]
        previous = [(u._state_dict_type, u._state_dict_config) for u in units]
        StateDictMethods.set_state_dict_type(module, state_dict_type, state_dict_config,
                                                     optim_state_dict_config)
        try:
            yield
        finally:
            for u, (kind, config) in zip(units, previous):
                u._state_dict_type, u._state_dict_config = kind, config

    def _original_entries(self, prefix="", model_dtypes=True, flattened=True):
        """(key, tensor) of the unwrapped model's state dict, in its order; inside
        summon_full_params (or with flattened=False, which leaves out the parameters the units
        flattened). With model_dtypes, buffers that buffer_dtype cast are copies in the dtype
        the model had; else the buffers themselves (to load into)."""
        def walk(m, prefix):
            while isinstance(m, StateDictMethods):
                m = m._fsdp_wrapped_module
            names = getattr(m, "_tessera_fsdp_param_names", [])
            for name in names if flattened else ():
                yield prefix + name, getattr(m, name)
            for name, p in m._parameters.items():
                if p is not None and name not in names:
                    yield prefix + name, p
            dtypes = getattr(m, "_tessera_fsdp_buffer_dtypes", {})
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent_buffers_set:
                    # In the dtype the model had (buffer_dtype is for forward only).
                    yield prefix + name, (b.to(dtypes[name]) if model_dtypes and name in dtypes
                                          else b)
            for name, child in m._modules.items():
                if child is not None:
                    yield from walk(child, prefix + name + ".")
        return walk(self, prefix)

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """The state dict of the kind state_dict_type chose. FULL_STATE_DICT (the default): the
        unwrapped model's keys (loads into the plain module); a collective: every rank calls
        it; with rank0_only the others get an empty dict."""
        from tessera.torch.fsdp import checkpoint
        if destination is None:
            destination = {}
        if self._state_dict_type == StateDictType.LOCAL_STATE_DICT:
            return checkpoint.local_state_dict(self, destination, prefix)
        if self._state_dict_type == StateDictType.SHARDED_STATE_DICT:
            return checkpoint.sharded_state_dict(self, destination, prefix)
        with self.summon_full_params(writeback=False):
            if self._state_dict_config.rank0_only and self.rank != 0:
                return destination
            for key, tensor in self._original_entries(prefix):
                destination[key] = tensor.detach().clone()
        return destination

    def load_state_dict(self, state_dict, strict=True):
        """Loads a state dict of the kind state_dict_type chose: a full state dict (the
        unwrapped model's keys) on every rank; a local one saved at this rank; a sharded one
        whose values are ShardedSlices or lists of them (merge_sharded_state_dicts of the
        files every rank saved, at any world size and strategy)."""
        from tessera.torch.fsdp import checkpoint
        if self._state_dict_type == StateDictType.LOCAL_STATE_DICT:
            checkpoint.load_local_state_dict(self, state_dict)
            return _IncompatibleKeys([], [])
        if self._state_dict_type == StateDictType.SHARDED_STATE_DICT:
            checkpoint.load_sharded_state_dict(self, state_dict)
            return _IncompatibleKeys([], [])
        with self.summon_full_params(writeback=True), torch.no_grad():
            entries = dict(self._original_entries(model_dtypes=False))
            missing = [k for k in entries if k not in state_dict]
            unexpected = [k for k in state_dict if k not in entries]
            if strict and (missing or unexpected):
                raise RuntimeError(f"tessera FSDP: load_state_dict: missing keys {missing}, "
                                   f"unexpected keys {unexpected}")
            for key, tensor in entries.items():
                if key in state_dict:
                    if state_dict[key].shape != tensor.shape:
                        raise RuntimeError(f"tessera FSDP: load_state_dict: '{key}' has shape "
                                           f"{list(state_dict[key].shape)}, the model "
                                           f"{list(tensor.shape)}")
                    tensor.copy_(state_dict[key])
        return _IncompatibleKeys(missing, unexpected)

    # -- state dict types and optimizer state dicts ----------------------------------------------

    @staticmethod
    def set_state_dict_type(module, state_dict_type, state_dict_config=None,
                            optim_state_dict_config=None):
        """Sets the kind of state dict of every FSDP unit in module (state_dict_type is the
        same, within a with block)."""
        if optim_state_dict_config is not None:
            raise _unsupported("optim_state_dict_config")
        if not isinstance(state_dict_type, StateDictType):
            raise TypeError(f"tessera FSDP: state_dict_type must be a StateDictType, not "
                            f"{state_dict_type!r}")
        for u in module.modules():
            if isinstance(u, StateDictMethods):
                u._state_dict_type = state_dict_type
                u._state_dict_config = state_dict_config or _DEFAULT_CONFIGS[state_dict_type]()

    @staticmethod
    def full_optim_state_dict(model, optim, optim_input=None, rank0_only=True, group=None):
        """The optimizer's state as for the unwrapped model, keyed by parameter names (later
        torch's optim_state_dict keys; torch 1.13 keyed by parameter ids):
        tessera.torch.fsdp.checkpoint.full_optim_state_dict."""
        from tessera.torch.fsdp import checkpoint
        return checkpoint.full_optim_state_dict(model, optim, optim_input, rank0_only, group)

    @staticmethod
    def shard_full_optim_state_dict(full_optim_state_dict, model, optim_input=None):
        """This rank's optimizer state dict (for an optimizer over model.parameters()) from a
        full one saved at any world size and strategy."""
        from tessera.torch.fsdp import checkpoint
        return checkpoint.shard_full_optim_state_dict(full_optim_state_dict, model, optim_input)

    @staticmethod
    def scatter_full_optim_state_dict(full_optim_state_dict, model, optim_input=None,
                                      group=None):
        """shard_full_optim_state_dict with the full one given on rank 0 only."""
        from tessera.torch.fsdp import checkpoint
        return checkpoint.scatter_full_optim_state_dict(full_optim_state_dict, model,
                                                        optim_input, group)

    # -- not yet (issue 44) ---------------------------------------------------------------------

    @staticmethod
    def sharded_optim_state_dict(*args, **kwargs):
        raise _unsupported("FullyShardedDataParallel.sharded_optim_state_dict")

    @staticmethod
    def flatten_sharded_optim_state_dict(*args, **kwargs):
        raise _unsupported("FullyShardedDataParallel.flatten_sharded_optim_state_dict")

    @staticmethod
    def rekey_optim_state_dict(*args, **kwargs):
        raise _unsupported("FullyShardedDataParallel.rekey_optim_state_dict")

    @staticmethod
    def optim_state_dict(*args, **kwargs):
        raise _unsupported("FullyShardedDataParallel.optim_state_dict")

    @staticmethod
    def optim_state_dict_to_load(*args, **kwargs):
        raise _unsupported("FullyShardedDataParallel.optim_state_dict_to_load")
