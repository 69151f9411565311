"""Checkpoints of tessera.torch.fsdp that reshard (issue 44): FULL_SHARD at world size 4 trains
5 steps, saves a sharded state dict (one file per rank) and the full optimizer state dict
(rank 0's file), and trains 5 more steps; loaded at world size 2 with SHARD_GRAD_OP (every
rank reads every rank's file) and at world size 1 into the plain nn.Module (through the full
state dict consolidated from the files), the next 5 steps give bitwise the same parameters
(torch.equal) as the uninterrupted run. SGD with momentum and weight decay: the momentum
buffers travel through the optimizer state dict.

Why bitwise can hold across world sizes: in the 5 steps after the checkpoint every rank trains
on the same batch, so each rank's gradient g is the same, and the average of w equal values
(g/w summed over w ranks, in any order) is exactly g for w = 1, 2 and 4 in binary floating
point. With different data per rank the sum of different gradients would be rounded in an
order that depends on the world size (the 5 steps before the checkpoint do use per-rank data).
Everything else is elementwise on each parameter's elements, wherever the shards cut them.
"""

import os
import shutil
import tempfile
import unittest

import torch

import fsdp_test
import torch_testing

STEPS = 5


def _optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=0.01)


def _steps(module, optimizer, rank, first, same_data):
    for step in range(first, first + STEPS):
        optimizer.zero_grad()
        fsdp_test._loss("mlp", module, 0 if same_data else rank, step).backward()
        optimizer.step()


def _full(fsdp):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        return fsdp.state_dict()


def _save_at_4(rank, world_size, directory):
    from tessera.torch.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                    StateDictType)
    fsdp = FSDP(fsdp_test._make("mlp"), auto_wrap_policy=fsdp_test._policy("mlp"),
                sharding_strategy=ShardingStrategy.FULL_SHARD)
    optimizer = _optimizer(fsdp.parameters())
    _steps(fsdp, optimizer, rank, 0, same_data=False)
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        torch.save(fsdp.state_dict(), os.path.join(directory, f"model.rank{rank}.pt"))
    full_osd = FSDP.full_optim_state_dict(fsdp, optimizer, rank0_only=True)
    if rank == 0:
        torch.save(full_osd, os.path.join(directory, "optim.pt"))
    saved = _full(fsdp)
    _steps(fsdp, optimizer, rank, STEPS, same_data=True)
    return saved, _full(fsdp)


def _load(directory, world_size):
    from tessera.torch.fsdp import merge_sharded_state_dicts
    return merge_sharded_state_dicts(
        torch.load(os.path.join(directory, f"model.rank{r}.pt")) for r in range(world_size))


def _resume_at_2(rank, world_size, directory):
    from tessera.torch.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                    StateDictType)
    torch.manual_seed(1)  # other initial values, all overwritten by the checkpoint
    fsdp = FSDP(fsdp_test._Mlp(), auto_wrap_policy=fsdp_test._policy("mlp"),
                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        fsdp.load_state_dict(_load(directory, 4))
    full_osd = torch.load(os.path.join(directory, "optim.pt")) if rank == 0 else None
    optimizer = _optimizer(fsdp.parameters())
    optimizer.load_state_dict(FSDP.scatter_full_optim_state_dict(full_osd, fsdp))
    loaded = _full(fsdp)
    _steps(fsdp, optimizer, rank, STEPS, same_data=True)
    return loaded, _full(fsdp)


def _resume_plain(directory):
    from tessera.torch.fsdp import full_state_dict_from_sharded
    torch.manual_seed(1)
    plain = fsdp_test._Mlp()
    plain.load_state_dict(full_state_dict_from_sharded(
        torch.load(os.path.join(directory, f"model.rank{r}.pt")) for r in range(4)))
    full_osd = torch.load(os.path.join(directory, "optim.pt"))
    # The full optimizer state dict is keyed by parameter names; the plain optimizer's by
    # the index of each parameter in its list (load_state_dict pairs each group's saved
    # indices with its parameters in order: sorted).
    index = {name: i for i, (name, _) in enumerate(plain.named_parameters())}
    optimizer = _optimizer(plain.parameters())
    optimizer.load_state_dict({
        "state": {index[name]: state for name, state in full_osd["state"].items()},
        "param_groups": [{**g, "params": sorted(index[n] for n in g["params"])}
                         for g in full_osd["param_groups"]]})
    _steps(plain, optimizer, 0, STEPS, same_data=True)
    return plain.state_dict()


def _round_trips(rank, world_size):
    """Adam's state (moments shaped like the parameters, a scalar step) through
    full_optim_state_dict and shard_full_optim_state_dict from FULL_SHARD to NO_SHARD; and a
    local state dict into a fresh model of the same layout. Returns what differs."""
    from tessera.torch.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                    StateDictType)
    differences = []
    fsdp = FSDP(fsdp_test._make("mlp"), auto_wrap_policy=fsdp_test._policy("mlp"))
    adam = torch.optim.Adam(fsdp.parameters(), lr=0.01)
    for step in range(2):
        adam.zero_grad()
        fsdp_test._loss("mlp", fsdp, rank, step).backward()
        adam.step()
    full_osd = FSDP.full_optim_state_dict(fsdp, adam, rank0_only=False)
    other = FSDP(fsdp_test._make("mlp"), auto_wrap_policy=fsdp_test._policy("mlp"),
                 sharding_strategy=ShardingStrategy.NO_SHARD)
    other_adam = torch.optim.Adam(other.parameters(), lr=0.01)
    other_adam.load_state_dict(FSDP.shard_full_optim_state_dict(full_osd, other))
    again = FSDP.full_optim_state_dict(other, other_adam, rank0_only=False)
    if again["param_groups"] != full_osd["param_groups"]:
        differences.append("param_groups")
    for name, state in full_osd["state"].items():
        for key, value in state.items():
            if not torch.equal(again["state"][name][key], value):
                differences.append(f"{name} {key}")
    with FSDP.state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT):
        local = fsdp.state_dict()
    fresh = FSDP(fsdp_test._Mlp(), auto_wrap_policy=fsdp_test._policy("mlp"))
    with FSDP.state_dict_type(fresh, StateDictType.LOCAL_STATE_DICT):
        fresh.load_state_dict(local)
    expected = _full(fsdp)
    for key, value in _full(fresh).items():
        if not torch.equal(value, expected[key]):
            differences.append(f"local {key}")
    return sorted(local), differences


class RoundTripTest(unittest.TestCase):
    def test_adam_state_and_local_state_dict(self):
        for keys, differences in torch_testing.run_ranks(_round_trips, 2):
            self.assertEqual(differences, [])
            self.assertEqual(keys, ["flat_param", "layers.2.flat_param",
                                    "layers.4.flat_param"])


class ReshardingCheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="fsdp-checkpoint-")
        results = torch_testing.run_ranks(_save_at_4, 4, args=(cls.directory,), timeout_s=120)
        cls.saved, cls.expected = results[0]
        cls.at_2 = torch_testing.run_ranks(_resume_at_2, 2, args=(cls.directory,),
                                           timeout_s=120)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)

    def _assert_bitwise(self, got, expected, what):
        self.assertEqual(sorted(got), sorted(expected), what)
        for key, tensor in expected.items():
            self.assertTrue(torch.equal(got[key], tensor),
                            f"{what}: {key} differs by {(got[key] - tensor).abs().max()}")

    def test_sharded_files_hold_slices_by_name(self):
        from tessera.torch.fsdp import ShardedSlice
        rank1 = torch.load(os.path.join(self.directory, "model.rank1.pt"))
        self.assertEqual(sorted(rank1), sorted(self.expected))
        piece = rank1["layers.0.weight"]
        self.assertIsInstance(piece, ShardedSlice)
        self.assertEqual((piece.world_size, piece.rank, piece.strategy), (4, 1, "FULL_SHARD"))
        self.assertEqual(list(piece.full_shape), [fsdp_test.HIDDEN, fsdp_test.IN])

    def test_training_moved_the_parameters(self):
        self.assertFalse(all(torch.equal(self.saved[k], self.expected[k]) for k in self.saved))

    def test_loaded_at_world_size_2_exactly(self):
        for loaded, _ in self.at_2:
            self._assert_bitwise(loaded, self.saved, "loaded at world size 2")

    def test_resumed_at_world_size_2_with_shard_grad_op_is_bitwise_equal(self):
        for rank, (_, final) in enumerate(self.at_2):
            self._assert_bitwise(final, self.expected, f"world size 2, rank {rank}")

    def test_resumed_in_plain_module_is_bitwise_equal(self):
        self._assert_bitwise(_resume_plain(self.directory), self.expected, "plain module")

    def test_missing_rank_file_is_named(self):
        from tessera.torch.fsdp import full_state_dict_from_sharded
        with self.assertRaisesRegex(ValueError,
                                    r"'layers\.\d\.\w+': element \d+ of \d+ is in none of the 3"):
            full_state_dict_from_sharded(
                torch.load(os.path.join(self.directory, f"model.rank{r}.pt")) for r in range(3))


if __name__ == "__main__":
    torch_testing.main()
