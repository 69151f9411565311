"""tessera.torch.fsdp.save_sharded_checkpoint and load_sharded_checkpoint (issue 44, item 3):
FULL_SHARD at world size 4 trains 5 steps and saves in the native sharded checkpoint format;
loaded at world size 2 with SHARD_GRAD_OP, and into the plain nn.Module, the parameters are
bitwise those saved; a flipped
byte in a rank file fails the load naming the file; and tessera-export-params (the C++
reader, unchanged but for accepting mode "fsdp") consolidates the directory into exactly the
full state dict.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import torch

import fsdp_test
import torch_testing

_RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""),
                         os.environ.get("TEST_WORKSPACE", "tessera"))
STEP = 5


def _full(fsdp):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        return fsdp.state_dict()


def _save_at_4(rank, world_size, directory):
    from tessera.torch.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                    save_sharded_checkpoint)
    fsdp = FSDP(fsdp_test._make("mlp"), auto_wrap_policy=fsdp_test._policy("mlp"),
                sharding_strategy=ShardingStrategy.FULL_SHARD)
    optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEP):
        optimizer.zero_grad()
        fsdp_test._loss("mlp", fsdp, rank, step).backward()
        optimizer.step()
    save_sharded_checkpoint(fsdp, directory, step=STEP)
    return _full(fsdp)


def _load_at_2(rank, world_size, directory):
    from tessera.torch.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy,
                                    load_sharded_checkpoint)
    torch.manual_seed(1)  # other initial values, all overwritten by the checkpoint
    fsdp = FSDP(fsdp_test._Mlp(), auto_wrap_policy=fsdp_test._policy("mlp"),
                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    load_sharded_checkpoint(fsdp, directory)
    return _full(fsdp)


def _load_error(rank, world_size, directory):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, load_sharded_checkpoint
    fsdp = FSDP(fsdp_test._Mlp(), auto_wrap_policy=fsdp_test._policy("mlp"))
    try:
        load_sharded_checkpoint(fsdp, directory, step=STEP)
    except RuntimeError as error:
        return str(error)
    return None


class NativeShardedCheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="fsdp-native-checkpoint-")
        cls.saved = torch_testing.run_ranks(_save_at_4, 4, args=(cls.directory,),
                                            timeout_s=120)[0]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)

    def _assert_bitwise(self, got, expected, what):
        self.assertEqual(sorted(got), sorted(expected), what)
        for key, tensor in expected.items():
            self.assertTrue(torch.equal(got[key], tensor), f"{what}: {key} differs")

    def test_manifest_lists_every_rank_and_parameter(self):
        with open(os.path.join(self.directory, f"step-{STEP:012d}", "MANIFEST.json")) as f:
            manifest = json.load(f)
        self.assertEqual((manifest["mode"], manifest["world_size"]), ("fsdp", 4))
        self.assertEqual([f["file"] for f in manifest["files"]],
                         [f"rank-{r}.ckpt" for r in range(4)])
        self.assertEqual(sorted(t["name"] for t in manifest["tensors"]), sorted(self.saved))

    def test_loads_at_world_size_2_with_shard_grad_op_bitwise(self):
        for rank, loaded in enumerate(torch_testing.run_ranks(
                _load_at_2, 2, args=(self.directory,), timeout_s=120)):
            self._assert_bitwise(loaded, self.saved, f"world size 2, rank {rank}")

    def test_loads_into_the_plain_module_through_the_full_state_dict(self):
        from tessera.torch.fsdp import full_state_dict_from_checkpoint
        plain = fsdp_test._Mlp()
        plain.load_state_dict(full_state_dict_from_checkpoint(self.directory))
        self._assert_bitwise(plain.state_dict(), self.saved, "plain module")

    def test_export_params_consolidates_the_full_state_dict(self):
        out = os.path.join(self.directory, "params.bin")
        subprocess.run([os.path.join(_RUNFILES, "tools/tessera-export-params"),
                        "--checkpoint-dir", self.directory, "--out", out], check=True,
                       timeout=60)
        with open(out + ".json") as f:
            manifest = json.load(f)
        flat = np.fromfile(out, dtype="<f4")
        exported = {p["name"]: torch.from_numpy(
            flat[p["offset"]:p["offset"] + int(np.prod(p["shape"]))].reshape(p["shape"]).copy())
            for p in manifest["parameters"]}
        self._assert_bitwise(exported, self.saved, "tessera-export-params")

    def test_flipped_byte_fails_naming_the_file(self):
        corrupted = tempfile.mkdtemp(prefix="fsdp-native-corrupted-")
        try:
            shutil.copytree(self.directory, corrupted, dirs_exist_ok=True)
            path = os.path.join(corrupted, f"step-{STEP:012d}", "rank-2.ckpt")
            with open(path, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0x10]))
            errors = torch_testing.run_ranks(_load_error, 1, args=(corrupted,))
            self.assertIsNotNone(errors[0])
            self.assertIn(f"checkpoint file {path} does not match its manifest's checksum",
                          errors[0])
            exported = subprocess.run(
                [os.path.join(_RUNFILES, "tools/tessera-export-params"), "--checkpoint-dir",
                 corrupted, "--out", os.path.join(corrupted, "params.bin")],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(exported.returncode, 1)
            self.assertIn(path, exported.stderr)
        finally:
            shutil.rmtree(corrupted, ignore_errors=True)


if __name__ == "__main__":
    torch_testing.main()
