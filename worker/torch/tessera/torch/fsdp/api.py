"""The public types of tessera.torch.fsdp, named and shaped as torch.distributed.fsdp's: the
sharding strategies, prefetch modes, mixed precision and state dict configurations."""

import enum
from collections import namedtuple
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["ShardingStrategy", "BackwardPrefetch", "MixedPrecision", "StateDictType",
           "FullStateDictConfig", "LocalStateDictConfig", "ShardedStateDictConfig", "CPUOffload"]


class ShardingStrategy(enum.Enum):
    FULL_SHARD = enum.auto()
    SHARD_GRAD_OP = enum.auto()
    NO_SHARD = enum.auto()
    HYBRID_SHARD = enum.auto()
    _HYBRID_SHARD_ZERO2 = enum.auto()


class BackwardPrefetch(enum.Enum):
    BACKWARD_PRE = enum.auto()
    BACKWARD_POST = enum.auto()


class StateDictType(enum.Enum):
    FULL_STATE_DICT = enum.auto()
    LOCAL_STATE_DICT = enum.auto()
    SHARDED_STATE_DICT = enum.auto()


@dataclass
class MixedPrecision:
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    buffer_dtype: Optional[torch.dtype] = None


@dataclass
class CPUOffload:
    offload_params: bool = False


@dataclass
class FullStateDictConfig:
    offload_to_cpu: bool = False
    rank0_only: bool = False


@dataclass
class LocalStateDictConfig:
    offload_to_cpu: bool = False


@dataclass
class ShardedStateDictConfig:
    offload_to_cpu: bool = False


_DEFAULT_CONFIGS = {StateDictType.FULL_STATE_DICT: FullStateDictConfig,
                    StateDictType.LOCAL_STATE_DICT: LocalStateDictConfig,
                    StateDictType.SHARDED_STATE_DICT: ShardedStateDictConfig}

_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
# The strategies that free a unit's full parameters after its forward (the root's excepted).
_FREED_AFTER_FORWARD = (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)


def _unsupported(argument):
    return NotImplementedError(f"tessera FSDP: {argument} is not supported yet (issue 44)")
