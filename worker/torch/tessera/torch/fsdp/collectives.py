"""The collectives tessera's FSDP runs on a process group's CPU tensors, with fallbacks for
Gloo, whose torch 1.13 version has neither all-gather into one tensor nor reduce-scatter of one
tensor on the CPU (issue 44).
"""

import torch
import torch.distributed as dist


def _is_gloo(group):
    return dist.get_backend(group) == dist.Backend.GLOO


class Handle:
    """An issued collective: wait() returns once it completed (and what the fallback does
    after it is done)."""

    def __init__(self, works, then=None):
        self._works = works
        self._then = then

    def wait(self):
        for work in self._works:
            work.wait()
        self._works = []
        if self._then is not None:
            then, self._then = self._then, None
            then()


def all_gather_into(output, shard, group, async_op=False):
    """output = every rank's shard, by rank. With async_op, a Handle (the backend runs it on
    its comm thread meanwhile; shard and output must stay untouched until wait())."""
    if _is_gloo(group):
        # Gloo in torch 1.13 has no _allgather_base for CPU tensors: gather into the slices.
        work = dist.all_gather(list(output.chunk(dist.get_world_size(group))), shard,
                               group=group, async_op=async_op)
    else:
        work = dist.all_gather_into_tensor(output, shard, group=group, async_op=async_op)
    return Handle([work]) if async_op else None


def reduce_scatter(shard, full, group, async_op=False):
    """shard = the sum over ranks of this rank's slice of full; full may be overwritten. With
    async_op, a Handle, as all_gather_into's."""
    if _is_gloo(group):
        # Gloo in torch 1.13 has no _reduce_scatter_base for CPU tensors: all-reduce the whole
        # and keep this rank's slice (world size times the traffic, same result).
        work = dist.all_reduce(full, group=group, async_op=async_op)

        def keep_slice():
            shard.copy_(full.chunk(dist.get_world_size(group))[dist.get_rank(group)])
        if not async_op:
            keep_slice()
            return None
        return Handle([work], keep_slice)
    work = dist.reduce_scatter_tensor(shard, full, group=group, async_op=async_op)
    return Handle([work]) if async_op else None


def all_gather_strings(text, group):
    """Every rank's `text`, by rank (through all-gathers of fixed-size byte tensors)."""
    world = dist.get_world_size(group)
    data = torch.tensor(list(text.encode()), dtype=torch.uint8)
    lengths = torch.zeros(world, dtype=torch.int64)
    all_gather_into(lengths, torch.tensor([data.numel()], dtype=torch.int64), group)
    longest = int(lengths.max())
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    everyone = torch.zeros(world * longest, dtype=torch.uint8)
    all_gather_into(everyone, padded, group)
    return [bytes(everyone[r * longest:r * longest + int(lengths[r])].tolist()).decode()
            for r in range(world)]
