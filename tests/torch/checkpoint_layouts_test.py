"""Checkpoints across layouts (issue 46, item 5) through tessera.torch.distributed_checkpoint:
a model trained and saved as D x P x T = 1 x 2 x 2 (a 1F1B pipeline of two stages, each
column- and row-parallel over two ranks) resumes as 2 x 1 x 2 (data parallel over two
tensor-parallel replicas), as 1 x 1 x 1 (one process, no torch.distributed) and, with FSDP
over the data-parallel dim, as 2 x 1 x 2 with FSDP; each equals one process trained on the
global batch throughout (SGD with momentum: every parameter and momentum buffer within 1e-5
of its tensor's scale). And what load() refuses, in words."""

import json
import os
import re
import shutil
import tempfile
import unittest

import torch
import torch.distributed as dist

import torch_testing

_DIMS = [8, 16, 8, 16, 8]  # 4 Linear layers, ReLU between: two column-row pairs
_BATCH = 16
_LR, _MOMENTUM = 0.05, 0.9


def _model():
    torch.manual_seed(0)
    layers = []
    for i in range(len(_DIMS) - 1):
        layers.append(torch.nn.Linear(_DIMS[i], _DIMS[i + 1]))
        if i < len(_DIMS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(_BATCH, _DIMS[0], generator=g), torch.randn(_BATCH, _DIMS[-1], generator=g)


def _optimizer(params):
    return torch.optim.SGD(params, lr=_LR, momentum=_MOMENTUM)


def _reference(steps):
    """One process on the global batch: (parameters, momentum buffers) by name after each of
    `steps` steps."""
    model = _model()
    optimizer = _optimizer(model.parameters())
    after = []
    for step in range(1, steps + 1):
        x, y = _batch(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        momenta = {n: optimizer.state[p]["momentum_buffer"].clone()
                   for n, p in model.named_parameters()}
        after.append((params, momenta))
    return after


def _tp_plan(module_names):
    """Column-parallel the first Linear of each pair, row-parallel the second."""
    from tessera.torch.tensor_parallel import ColwiseParallel, RowwiseParallel
    linears = [n for n in module_names if int(n) % 2 == 0]
    return {n: ColwiseParallel() if int(n) % 4 == 0 else RowwiseParallel() for n in linears}


def _state(model, optimizer):
    from tessera.torch.distributed_checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict)
    return {"model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer), "step": 0}


def _restore(model, optimizer, directory):
    import tessera.torch.distributed_checkpoint as dcp
    from tessera.torch.distributed_checkpoint.state_dict import (
        set_model_state_dict, set_optimizer_state_dict)
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return state["step"]


def _momentum_ready(model, optimizer):
    """Zero momentum buffers, so that get_optimizer_state_dict lists them for load() to fill
    (torch makes them at the first step, as torch's own DCP users do with a dummy step)."""
    for p in model.parameters():
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)


def _pipeline_tp(rank, world, directory, steps):
    """1 x 2 x 2: trains `steps` steps and saves them."""
    import tessera.torch.distributed_checkpoint as dcp
    from tessera.torch import init_device_mesh
    from tessera.torch.pipelining import Schedule1F1B, SplitPoint, pipeline
    from tessera.torch.tensor_parallel import parallelize_module

    mesh = init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
    pp = mesh.get_local_rank("pp")
    model = _model()
    x0, _ = _batch(1)
    pipe = pipeline(model, mb_args=(x0[:_BATCH // 2],), split_spec={"4": SplitPoint.BEGINNING})
    stage_module = pipe.get_stage_module(pp)
    names = [n for n, _ in stage_module.named_children()]
    parallelize_module(stage_module, mesh["tp"], _tp_plan(names))
    stage = pipe.build_stage(pp, "cpu", group=mesh.get_group("pp"))
    optimizer = _optimizer(stage_module.parameters())
    schedule = Schedule1F1B(stage, 2, loss_fn=torch.nn.functional.mse_loss)
    for step in range(1, steps + 1):
        x, y = _batch(step)
        optimizer.zero_grad()
        if pp == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()
    state = _state(stage_module, optimizer)
    state["step"] = steps
    dcp.save(state, checkpoint_id=directory)


def _data_tp(rank, world, directory, steps, out, fsdp):
    """2 x 1 x 2 (with FSDP over dp when fsdp): resumes `directory`, trains `steps` more steps
    and saves them to `out`."""
    import tessera.torch.distributed_checkpoint as dcp
    from tessera.torch import init_device_mesh
    from tessera.torch.tensor_parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp", "pp", "tp"))
    dp, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
    model = _model()
    parallelize_module(model, mesh["tp"], _tp_plan([n for n, _ in model.named_children()]))
    if fsdp:
        from tessera.torch.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, process_group=dp_group)
        optimizer = _optimizer(model.parameters())
        step = _restore_model_only(model, directory)
    else:
        optimizer = _optimizer(model.parameters())
        _momentum_ready(model, optimizer)
        step = _restore(model, optimizer, directory)
    half = _BATCH // 2
    for s in range(step + 1, step + steps + 1):
        x, y = _batch(s)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[dp * half:(dp + 1) * half]),
                                            y[dp * half:(dp + 1) * half])
        loss.backward()
        if not fsdp:
            for p in model.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= 2
        optimizer.step()
    if fsdp:
        from tessera.torch.distributed_checkpoint.state_dict import get_model_state_dict
        dcp.save({"model": get_model_state_dict(model), "step": step + steps},
                 checkpoint_id=out)
    else:
        state = _state(model, optimizer)
        state["step"] = step + steps
        dcp.save(state, checkpoint_id=out)


def _restore_model_only(model, directory):
    import tessera.torch.distributed_checkpoint as dcp
    from tessera.torch.distributed_checkpoint.state_dict import (
        get_model_state_dict, set_model_state_dict)
    state = {"model": get_model_state_dict(model), "step": 0}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    return state["step"]


def _failing_save(rank, world, directory):
    import tessera.torch.distributed_checkpoint as dcp
    try:
        dcp.save({"w": torch.full((4,), float(rank))}, checkpoint_id=directory)
    except RuntimeError as e:
        return str(e)
    return None


class CheckpointLayoutsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tessera-dcp-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _close(self, got, want, what):
        for name, tensor in want.items():
            self.assertIn(name, got, what)
            scale = max(float(tensor.abs().max()), 1e-6)
            err = float((got[name] - tensor).abs().max())
            self.assertLessEqual(err, 1e-5 * scale, f"{what}: {name}: off by {err}")

    def _load_plain(self, directory, with_optimizer=True):
        """The checkpoint as one process loads it (1 x 1 x 1, no torch.distributed)."""
        model = _model()
        optimizer = _optimizer(model.parameters())
        _momentum_ready(model, optimizer)
        if with_optimizer:
            step = _restore(model, optimizer, directory)
        else:
            step = _restore_model_only(model, directory)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        momenta = {n: optimizer.state[p]["momentum_buffer"].clone()
                   for n, p in model.named_parameters()}
        return step, params, momenta

    def test_a_pipeline_of_tensor_parallel_stages_resumes_data_parallel_and_alone(self):
        reference = _reference(4)
        first = os.path.join(self.dir, "pp-tp")
        torch_testing.run_ranks(_pipeline_tp, 4, args=(first, 2), timeout_s=90)
        step, params, momenta = self._load_plain(first)
        self.assertEqual(step, 2)
        self._close(params, reference[1][0], "1x2x2 loaded alone")
        self._close(momenta, reference[1][1], "1x2x2's momentum loaded alone")
        second = os.path.join(self.dir, "dp-tp")
        torch_testing.run_ranks(_data_tp, 4, args=(first, 2, second, False), timeout_s=90)
        # The data-parallel replicas' pieces are written once, by the first replica's ranks
        # (0 and 1): both halves of a column-parallel weight, one row-parallel bias (whole).
        with open(os.path.join(second, ".metadata")) as f:
            keys = json.load(f)["keys"]
        self.assertEqual([(p["file"], p["offsets"]) for p in keys["model.0.weight"]["pieces"]],
                         [("rank-0.pt", [0, 0]), ("rank-1.pt", [8, 0])])
        self.assertEqual([p["file"] for p in keys["model.2.bias"]["pieces"]], ["rank-0.pt"])
        self.assertEqual({p["file"] for k in keys.values() for p in k["pieces"]},
                         {"rank-0.pt", "rank-1.pt"})
        step, params, momenta = self._load_plain(second)
        self.assertEqual(step, 4)
        self._close(params, reference[3][0], "1x2x2 resumed as 2x1x2")
        self._close(momenta, reference[3][1], "2x1x2's momentum")

    def test_fsdp_over_tensor_parallel_resumes_a_pipeline_checkpoint(self):
        reference = _reference(3)
        first = os.path.join(self.dir, "pp-tp")
        torch_testing.run_ranks(_pipeline_tp, 4, args=(first, 2), timeout_s=90)
        # FSDP restarts the momentum (its optimizer state goes through FSDP's own functions):
        # compare the parameters after loading, before any step.
        second = os.path.join(self.dir, "fsdp-tp")
        torch_testing.run_ranks(_data_tp, 4, args=(first, 0, second, True), timeout_s=90)
        step, params, _ = self._load_plain(second, with_optimizer=False)
        self.assertEqual(step, 2)
        self._close(params, reference[1][0], "1x2x2 through FSDP x TP and back")

    def test_load_names_what_is_wrong(self):
        import tessera.torch.distributed_checkpoint as dcp
        directory = os.path.join(self.dir, "plain")
        dcp.save({"w": torch.arange(6.0).view(2, 3), "step": 7}, checkpoint_id=directory)
        state = {"w": torch.zeros(2, 3), "step": 0}
        dcp.load(state, checkpoint_id=directory)
        self.assertTrue(torch.equal(state["w"], torch.arange(6.0).view(2, 3)))
        self.assertEqual(state["step"], 7)
        cases = [
            ({"v": torch.zeros(2)}, "has no tensor 'v'"),
            ({"w": torch.zeros(3, 2)}, "'w' is [2, 3] in"),
            ({"w": torch.zeros(2, 3, dtype=torch.float64)}, "'w' is float32 in"),
        ]
        for bad, words in cases:
            with self.assertRaisesRegex(RuntimeError, re.escape(words)):
                dcp.load(bad, checkpoint_id=directory)
        with open(os.path.join(directory, "rank-0.pt"), "r+b") as f:
            f.seek(40)
            f.write(b"\xff")
        with self.assertRaisesRegex(RuntimeError, "rank-0.pt does not match its .metadata's "
                                                  "SHA-256"):
            dcp.load({"w": torch.zeros(2, 3)}, checkpoint_id=directory)
        with self.assertRaisesRegex(RuntimeError, r"\.metadata does not exist"):
            dcp.load({"w": torch.zeros(2, 3)}, checkpoint_id=self.dir)

    def test_a_rank_that_cannot_write_fails_every_rank_and_nothing_is_committed(self):
        directory = os.path.join(self.dir, "broken")
        os.makedirs(os.path.join(directory, "rank-1.pt"))  # rank 1's file cannot be replaced
        errors = torch_testing.run_ranks(_failing_save, 2, args=(directory,))
        for rank in range(2):
            self.assertIsNotNone(errors[rank])
            self.assertIn("rank 1 of 2 could not write its part of", errors[rank])
            self.assertIn("no .metadata written", errors[rank])
        self.assertFalse(os.path.exists(os.path.join(directory, ".metadata")))


if __name__ == "__main__":
    unittest.main()
