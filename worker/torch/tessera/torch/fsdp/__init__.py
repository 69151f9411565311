"""torch.distributed.fsdp for the CPU, over any process group (tessera, gloo): a program
written for torch's FSDP runs after changing its imports to

    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from tessera.torch.fsdp.wrap import transformer_auto_wrap_policy

(torch 1.13's own torch.distributed.fsdp does not import on Debian's Python 3.11, and needs
CUDA.) What is supported and what is not yet: docs/pytorch.md, "FSDP on tessera" (issue 44).
"""

from tessera.torch.fsdp import checkpoint, wrap
from tessera.torch.fsdp.checkpoint import (
    ShardedSlice, full_state_dict_from_sharded, merge_sharded_state_dicts)
from tessera.torch.fsdp.api import (
    BackwardPrefetch, CPUOffload, FullStateDictConfig, LocalStateDictConfig, MixedPrecision,
    ShardedStateDictConfig, ShardingStrategy, StateDictType)
from tessera.torch.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
from tessera.torch.fsdp.hybrid import hybrid_groups
from tessera.torch.fsdp.native_checkpoint import (
    full_state_dict_from_checkpoint, load_sharded_checkpoint, save_sharded_checkpoint)

__all__ = ["BackwardPrefetch", "CPUOffload", "FullStateDictConfig", "FullyShardedDataParallel",
           "LocalStateDictConfig", "MixedPrecision", "ShardedSlice", "ShardedStateDictConfig",
           "ShardingStrategy", "StateDictType", "checkpoint", "full_state_dict_from_checkpoint",
           "full_state_dict_from_sharded",
           "hybrid_groups", "load_sharded_checkpoint", "merge_sharded_state_dicts",
           "save_sharded_checkpoint", "wrap"]
