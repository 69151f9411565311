"""D x P x T = 2 x 2 x 2 in PyTorch equals one process (issue 46): eight ranks on a
("dp", "pp", "tp") mesh from tessera.torch.init_device_mesh train an nn.Sequential of two
Linear pairs per stage, cut into 2 pipeline stages (PipelineStage on the pp group,
Schedule1F1B), each stage's pairs column- then row-parallel on the tp group
(parallelize_module), its gradients averaged over the dp group, by tessera's FSDP on the dp
mesh (torch's 3-D recipe) or by an all_reduce per parameter. After a few steps of SGD with
momentum every parameter, gathered back from its tp shards, equals the one-process model
trained on the global batch within 1e-5 relative to its tensor's scale, and so do the losses.

Row-major ranks: rank = 4 dp + 2 pp + tp, so a tp group is two consecutive ranks.
"""

import unittest

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_testing

_MESH = (2, 2, 2)
_WIDTH, _HIDDEN = 4, 8
_BATCH = 16  # global: 8 per dp replica, 2 micro-batches of 4
_M = 2
_STEPS = 3
_TOLERANCE = 1e-5
# Which dim of each stage parameter the tp plan shards (None: replicated).
_SHARD_DIMS = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None,
               "4.weight": 0, "4.bias": 0, "6.weight": 1, "6.bias": None}


def _model():
    """Per stage: (Linear, ReLU, Linear, ReLU) twice; the same on every rank."""
    torch.manual_seed(0)
    layers = []
    for _ in range(2 * _MESH[1]):
        layers += [nn.Linear(_WIDTH, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def _batches():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(_BATCH, _WIDTH, generator=generator),
             torch.randn(_BATCH, _WIDTH, generator=generator)) for _ in range(_STEPS)]


def _optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _reference():
    model = _model()
    optimizer = _optimizer(model.parameters())
    losses = []
    for x, y in _batches():
        optimizer.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return model, losses


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _train(mesh, average):
    """Trains this rank's piece; returns the relative error of each parameter of its stage
    and of each step's loss (on the last stage's ranks) against one process."""
    from tessera.torch import pipelining
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    from tessera.torch.tensor_parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

    dp, pp, _ = mesh.get_coordinate()
    per_stage = len(_SHARD_DIMS)  # modules per stage (one weight and one bias each half)
    part = _model()[pp * per_stage:(pp + 1) * per_stage]
    part = nn.Sequential(*part)  # its own names: 0 .. 7
    plan = {str(i): ColwiseParallel() if i % 4 == 0 else RowwiseParallel()
            for i in range(0, per_stage, 2)}
    parallelize_module(part, mesh["tp"], plan)
    dp_group = mesh.get_group("dp")
    module = FSDP(part, device_mesh=mesh["dp"]) if average == "fsdp" else part
    stage = pipelining.PipelineStage(module, pp, _MESH[1], "cpu", group=mesh.get_group("pp"))
    schedule = pipelining.Schedule1F1B(stage, _M, loss_fn=nn.MSELoss())
    optimizer = _optimizer(module.parameters())
    rows = _BATCH // _MESH[0]
    reference, reference_losses = _reference()
    errors = {}
    for step, (x, y) in enumerate(_batches()):
        x, y = x[dp * rows:(dp + 1) * rows], y[dp * rows:(dp + 1) * rows]
        optimizer.zero_grad()
        losses = []
        if pp == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        if average == "all_reduce":
            for p in part.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= _MESH[0]
        optimizer.step()
        if pp == _MESH[1] - 1:
            loss = torch.stack(losses).mean()
            dist.all_reduce(loss, group=dp_group)
            errors[f"loss step {step}"] = _relative(loss / _MESH[0],
                                                   torch.tensor(reference_losses[step]))
    # FSDP's state dict holds this rank's tp shards whole (gathered over dp).
    local = module.state_dict() if average == "fsdp" else dict(part.named_parameters())
    full = dict(nn.Sequential(*reference[pp * per_stage:(pp + 1) * per_stage])
                .named_parameters())  # the stage's names: 0 .. 7
    tp_group = mesh.get_group("tp")
    for name, param in local.items():
        dim = _SHARD_DIMS[name]
        param = param.detach().contiguous()
        if dim is not None:
            parts = [torch.empty_like(param) for _ in range(_MESH[2])]
            dist.all_gather(parts, param, group=tp_group)
            param = torch.cat(parts, dim)
        errors[f"stage {pp} {name}"] = _relative(param, full[name].detach())
    return errors


def _dp_pp_tp(rank, world_size):
    from tessera.torch import init_device_mesh

    mesh = init_device_mesh("cpu", _MESH, mesh_dim_names=("dp", "pp", "tp"))
    return {"coordinate": mesh.get_coordinate(),
            "fsdp": _train(mesh, "fsdp"), "all_reduce": _train(mesh, "all_reduce")}


class DpPpTpTest(unittest.TestCase):
    def test_2x2x2_equals_one_process(self):
        results = torch_testing.run_ranks(_dp_pp_tp, 8, timeout_s=120)
        for rank, r in enumerate(results):
            self.assertEqual(r["coordinate"], [rank // 4, rank // 2 % 2, rank % 2])
            for average in ("fsdp", "all_reduce"):
                errors = r[average]
                # Every parameter of the stage; the losses on the last stage's ranks.
                self.assertEqual(len([k for k in errors if not k.startswith("loss")]),
                                 len(_SHARD_DIMS), f"rank {rank} {average}: {errors}")
                self.assertEqual(len([k for k in errors if k.startswith("loss")]),
                                 _STEPS if rank // 2 % 2 == 1 else 0)
                for name, error in errors.items():
                    self.assertLessEqual(error, _TOLERANCE, f"rank {rank} {average} {name}")


if __name__ == "__main__":
    torch_testing.main()
