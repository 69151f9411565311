"""hybrid_groups: the (shard_group, replicate_group) pair of HYBRID_SHARD and
_HYBRID_SHARD_ZERO2 (issue 44).

Words used below:
  host             the ranks whose hostnames are equal (socket.gethostname()), or, with an
                   explicit shard_size, each block of shard_size consecutive ranks.
  shard group      the ranks of one host: parameters are sharded and gathered among them.
  replicate group  the ranks with the same index in their host's shard group, one per host:
                   their shards are equal, and their gradients are all-reduced among them.
"""

import socket

import torch.distributed as dist

from tessera.torch.fsdp.collectives import all_gather_strings

__all__ = ["hybrid_groups"]


def _hosts_by_name():
    """The default group's ranks grouped by hostname, in the order of their first rank."""
    names = all_gather_strings(socket.gethostname(), dist.group.WORLD)
    hosts = {}
    for rank, name in enumerate(names):
        hosts.setdefault(name, []).append(rank)
    return list(hosts.values())


def _layout(world_size, shard_size, hosts=None):
    """(shard groups, replicate groups) as lists of ranks of the default group; raises
    ValueError naming the sizes when the layout does not divide the world."""
    if shard_size is not None:
        if not isinstance(shard_size, int) or shard_size < 1 or world_size % shard_size:
            raise ValueError(f"tessera FSDP: hybrid_groups(shard_size={shard_size!r}): the world "
                             f"size {world_size} is not a multiple of the shard size "
                             f"{shard_size}; every host must hold the same number of ranks")
        hosts = [list(range(start, start + shard_size))
                 for start in range(0, world_size, shard_size)]
    sizes = sorted({len(ranks) for ranks in hosts})
    if len(sizes) != 1:
        counts = ", ".join(f"{len(ranks)} (ranks {ranks})" for ranks in hosts)
        raise ValueError(f"tessera FSDP: hybrid_groups(): the world size {world_size} does not "
                         f"divide into equal hosts: {len(hosts)} hosts hold {counts} ranks; "
                         f"give shard_size to choose the layout")
    replicate = [[ranks[i] for ranks in hosts] for i in range(sizes[0])]
    return hosts, replicate


def hybrid_groups(shard_size=None, backend=None):
    """(shard_group, replicate_group) of this rank for HYBRID_SHARD: with shard_size None the
    ranks of each host (by hostname) shard and the hosts replicate; with shard_size, blocks of
    shard_size consecutive ranks of the default group are the "hosts" (also the way to
    emulate several hosts on one machine, and to choose the layout where hostnames do not tell
    it, e.g. network namespaces sharing one hostname). Raises ValueError when the layout does
    not divide the world. backend: the groups' (dist.new_group's; None: the default group's).
    A collective of the default group: every rank calls it, creating every group in the same
    order (dist.new_group requires it)."""
    world_size = dist.get_world_size()
    hosts = _hosts_by_name() if shard_size is None else None
    shard_ranks, replicate_ranks = _layout(world_size, shard_size, hosts)
    rank = dist.get_rank()
    mine = {}
    for kind, layout in (("shard", shard_ranks), ("replicate", replicate_ranks)):
        for ranks in layout:
            group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                mine[kind] = group
    return mine["shard"], mine["replicate"]
