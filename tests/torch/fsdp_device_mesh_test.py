"""tessera.torch.fsdp.FullyShardedDataParallel's device_mesh (torch 2.2+'s argument; issue 46,
item 3): at world size 4, HYBRID_SHARD and _HYBRID_SHARD_ZERO2 on a (replicate, shard) =
(2, 2) mesh train bitwise as with process_group=hybrid_groups(shard_size=2) (the same ranks in
the same groups), and FULL_SHARD on a 1-D mesh of the world as with the default group. The
units' groups are checked by their members; bad meshes by their messages.
"""

import unittest

import torch
import torch.distributed as dist

import fsdp_test
import torch_testing

WORLD_SIZE = 4
STEPS = 5


def _members(group):
    members = [None] * dist.get_world_size(group)
    dist.all_gather_object(members, dist.get_rank(), group=group)
    return members


def _trained(rank, **kwargs):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(fsdp_test._make("mlp"), auto_wrap_policy=fsdp_test._policy("mlp"), **kwargs)
    fsdp_test._train("mlp", model, rank, steps=STEPS)
    return model


def _same(a, b):
    a, b = a.state_dict(), b.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the test asserts on type and text)
        return f"{type(e).__name__}: {e}"
    return "no error"


def _mesh(rank, world_size):
    from tessera.torch import hybrid_groups, init_device_mesh
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    pair = hybrid_groups(shard_size=2)
    results = {}
    for strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        strategy = ShardingStrategy[strategy]
        by_mesh = _trained(rank, sharding_strategy=strategy, device_mesh=mesh)
        by_pair = _trained(rank, sharding_strategy=strategy, process_group=pair)
        results[f"{strategy.name} equal"] = _same(by_mesh, by_pair)
        units = [u for u in by_mesh.modules() if isinstance(u, FSDP)]
        results[f"{strategy.name} units"] = len(units)
        results[f"{strategy.name} shard groups"] = [_members(u.process_group) for u in units]
        results[f"{strategy.name} replicate groups"] = [_members(u._replicate_group)
                                                        for u in units]
    flat = init_device_mesh("cpu", (WORLD_SIZE,))
    results["FULL_SHARD 1-D equal"] = _same(_trained(rank, device_mesh=flat), _trained(rank))
    hybrid = ShardingStrategy.HYBRID_SHARD
    results["both"] = _message(lambda: FSDP(fsdp_test._make("mlp"), process_group=pair,
                                            sharding_strategy=hybrid, device_mesh=mesh))
    results["2-D for FULL_SHARD"] = _message(lambda: FSDP(fsdp_test._make("mlp"),
                                                          device_mesh=mesh))
    results["1-D for HYBRID_SHARD"] = _message(lambda: FSDP(fsdp_test._make("mlp"),
                                                            sharding_strategy=hybrid,
                                                            device_mesh=flat))
    return results


class DeviceMeshTest(unittest.TestCase):
    def test_mesh_stands_for_the_groups(self):
        for rank, r in enumerate(torch_testing.run_ranks(_mesh, WORLD_SIZE, timeout_s=120)):
            with self.subTest(rank=rank):
                for strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
                    self.assertTrue(r[f"{strategy} equal"], strategy)
                    units = r[f"{strategy} units"]
                    self.assertGreater(units, 1)  # the auto-wrapped units get the groups too
                    # Dim 1 (shard) within a "host" of consecutive ranks, dim 0 across.
                    host = rank // 2
                    self.assertEqual(r[f"{strategy} shard groups"],
                                     [[2 * host, 2 * host + 1]] * units)
                    self.assertEqual(r[f"{strategy} replicate groups"],
                                     [[rank % 2, rank % 2 + 2]] * units)
                self.assertTrue(r["FULL_SHARD 1-D equal"])
                self.assertEqual(r["both"], "ValueError: tessera FSDP: give process_group or "
                                            "device_mesh, not both")
                self.assertIn("ValueError: tessera FSDP: FULL_SHARD takes a 1-D device_mesh",
                              r["2-D for FULL_SHARD"])
                self.assertIn("mesh['dp']", r["2-D for FULL_SHARD"])
                self.assertIn("ValueError: tessera FSDP: HYBRID_SHARD takes a 2-D device_mesh "
                              "(replicate, shard)", r["1-D for HYBRID_SHARD"])


if __name__ == "__main__":
    torch_testing.main()
